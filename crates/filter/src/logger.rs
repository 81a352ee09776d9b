//! How the filter's `log` records reach the host's log. Messages carry counts, decisions and
//! error kinds only: never prompts, bodies, header values or tokenizer text. The level follows
//! the host's, re-read on every request (Envoy filters wasm logs by its own level, which an
//! operator may change at run time through the admin endpoint's `/logging`).

use crate::proxy::LogLevel;

/// The `log` crate's level as the ABI's.
pub fn host_level(level: log::Level) -> LogLevel {
    match level {
        log::Level::Error => LogLevel::Error,
        log::Level::Warn => LogLevel::Warn,
        log::Level::Info => LogLevel::Info,
        log::Level::Debug => LogLevel::Debug,
        log::Level::Trace => LogLevel::Trace,
    }
}

/// What to format, given the host's level (0 trace … 5 critical; `None`: it did not say).
pub fn filter_for(host: Option<u32>) -> log::LevelFilter {
    match host {
        Some(0) => log::LevelFilter::Trace,
        Some(1) => log::LevelFilter::Debug,
        Some(2) | None => log::LevelFilter::Info,
        Some(3) => log::LevelFilter::Warn,
        Some(_) => log::LevelFilter::Error,
    }
}

/// Formats only what the host will print.
pub fn follow(host: Option<u32>) {
    let filter = filter_for(host);
    if log::max_level() != filter {
        log::set_max_level(filter);
    }
}

pub use incontext_core::panic_line;
