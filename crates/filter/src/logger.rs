//! A `log` backend over the host's log call that never panics. Messages carry counts,
//! decisions and error kinds only: never prompts, bodies, header values or tokenizer text.

use super::host;
use super::host::LogLevel;

struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Error => LogLevel::Error,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Info => LogLevel::Info,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Trace => LogLevel::Trace,
        };
        host::log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

static LOGGER: HostLogger = HostLogger;

/// Installs the logger. Host calls are not allowed while the module initialises, so the
/// host's level is read later, in `on_configure`.
pub fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Formats only what the host will print: Envoy filters wasm logs by its own level.
pub fn follow_host_level() {
    let filter = match host::log_level() {
        Some(0) => log::LevelFilter::Trace,
        Some(1) => log::LevelFilter::Debug,
        Some(2) | None => log::LevelFilter::Info,
        Some(3) => log::LevelFilter::Warn,
        Some(_) => log::LevelFilter::Error,
    };
    log::set_max_level(filter);
}
