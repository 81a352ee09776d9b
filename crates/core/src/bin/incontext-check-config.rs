//! Validates incontext plugin configurations with the filter's own validator.
//!
//! Usage: `incontext-check-config FILE...` (or `-` for standard input). Each file holds the
//! configuration JSON. Exit 0 when all are valid; 1 with one line per invalid file.

#![deny(
    clippy::indexing_slicing,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

use incontext_core::config::Config;
use std::io::Read;
use std::process::ExitCode;

fn read(path: &str) -> std::io::Result<Vec<u8>> {
    if path == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        Ok(buf)
    } else {
        std::fs::read(path)
    }
}

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: incontext-check-config FILE... (- for stdin)");
        return ExitCode::from(2);
    }
    let mut ok = true;
    for path in &paths {
        match read(path) {
            Ok(bytes) => match Config::parse(&bytes) {
                Ok(_) => println!("{path}: valid"),
                Err(e) => {
                    println!("{path}: {e}");
                    ok = false;
                }
            },
            Err(e) => {
                println!("{path}: cannot read: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
