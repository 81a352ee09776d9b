#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The glue crate's promise: every host call goes through `host.rs` (which turns statuses
//! into `Result`s), and nothing in the glue unwraps or panics.

use std::fs;
use std::path::Path;

fn glue_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../filter/src");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).expect("the glue crate's sources") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, fs::read_to_string(&path).expect("readable source")));
        }
    }
    assert!(
        out.iter().any(|(n, _)| n == "http.rs"),
        "glue sources not found in {dir:?}"
    );
    out
}

#[test]
fn host_calls_only_in_host_rs() {
    for (name, text) in glue_sources() {
        if name == "host.rs" {
            continue;
        }
        for needle in ["hostcalls", "wasm_import_module", "proxy_wasm"] {
            assert!(
                !text.contains(needle),
                "{name} names `{needle}`: host calls belong in host.rs"
            );
        }
    }
}

#[test]
fn glue_never_unwraps_or_panics() {
    for (name, text) in glue_sources() {
        for needle in [
            ".unwrap()",
            ".expect(",
            "panic!(",
            "unreachable!(",
            "todo!(",
        ] {
            assert!(!text.contains(needle), "{name} contains `{needle}`");
        }
    }
}
