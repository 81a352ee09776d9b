//! Probe filter: each mode adds one step of incontext's per-request work, nothing else.
//!
//! The mode is the value of `"probe"` in the plugin configuration (the rest is ignored):
//!
//!   none     every callback returns Continue (the cost of a wasm HTTP context)
//!   buffer   drop content-length, pause the body until end of stream, continue
//!   read     buffer + copy the whole body into the VM
//!   write    read + replace the first 32 bytes with themselves (a head splice)
//!   report   write + 4 response headers + 3 counter increments (what incontext reports)
//!   lookups  report + the 3 request-header reads and the shared-data read incontext makes
//!   head     lookups, but the splice replaces the whole body up to its last 20 bytes (what
//!            incontext writes back when the cap member comes last, as in the bench bodies)
//!
//! The probe is test code for the benchmark only: errors are ignored, as there is no traffic
//! it could break that matters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Mode {
    None,
    Buffer,
    Read,
    Write,
    Report,
    Lookups,
    Head,
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { mode: Mode::None, metrics: [0; 3] })
    });
}}

struct Root {
    mode: Mode,
    metrics: [u32; 3],
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        let mode = ["none", "buffer", "read", "write", "report", "lookups", "head"]
            .iter()
            .position(|m| {
                text.contains(&format!("\"probe\": \"{m}\""))
                    || text.contains(&format!("\"probe\":\"{m}\""))
            });
        self.mode = match mode {
            Some(0) => Mode::None,
            Some(1) => Mode::Buffer,
            Some(2) => Mode::Read,
            Some(3) => Mode::Write,
            Some(4) => Mode::Report,
            Some(5) => Mode::Lookups,
            Some(6) => Mode::Head,
            _ => return false,
        };
        for (i, name) in ["probe_requests", "probe_hits", "probe_rewritten"]
            .iter()
            .enumerate()
        {
            self.metrics[i] = hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0);
        }
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Probe {
            mode: self.mode,
            metrics: self.metrics,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Probe {
    mode: Mode,
    metrics: [u32; 3],
}

impl Context for Probe {}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        if self.mode >= Mode::Lookups {
            for name in [":method", "content-encoding", "content-length"] {
                let _ = hostcalls::get_map_value(MapType::HttpRequestHeaders, name);
            }
        }
        if self.mode >= Mode::Buffer {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", None);
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::None {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        if self.mode >= Mode::Read {
            let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)
                .ok()
                .flatten()
                .unwrap_or_default();
            let head = if self.mode == Mode::Head {
                body.len().saturating_sub(20)
            } else {
                32
            };
            if self.mode >= Mode::Write && body.len() >= head {
                let _ = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, head, &body[..head]);
            }
        }
        if self.mode >= Mode::Lookups {
            let _ = hostcalls::get_shared_data("incontext:probe-slot-17");
        }
        if self.mode >= Mode::Report {
            for m in self.metrics {
                let _ = hostcalls::increment_metric(m, 1);
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if self.mode >= Mode::Report {
            for (k, v) in [
                ("x-incontext-action", "rewritten"),
                ("x-incontext-prompt-tokens", "1000"),
                ("x-incontext-source", "cache"),
                ("x-incontext-max-tokens", "31768"),
            ] {
                let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, k, v);
            }
        }
        Action::Continue
    }
}
