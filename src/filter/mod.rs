//! The thin proxy-wasm layer: plugin start-up, the per-request state machine, the tokenizer
//! call, the shared-data cache, counters and response headers. Every host call goes through
//! `host`, which returns errors instead of panicking; every error leaves the request as it came.

mod cache;
mod host;
mod http;
mod logger;
mod metrics;

use crate::core::config::Config;
use metrics::Metrics;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use std::cell::Cell;
use std::rc::Rc;

/// What every request of one plugin instance shares.
pub struct Shared {
    pub config: Config,
    pub metrics: Metrics,
    /// cluster|authority|path: part of the cache key.
    pub route: String,
    /// Whether the "learned window too small" error was already logged.
    pub warned_window: Cell<bool>,
}

struct Root {
    shared: Option<Rc<Shared>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        logger::follow_host_level();
        let bytes = match host::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                log::error!(
                    "incontext: cannot read the plugin configuration (host status {})",
                    e.0
                );
                return false;
            }
        };
        let parsed = Config::parse(&bytes).and_then(|mut c| {
            c.resolve_env(|name| std::env::var(name).ok())?;
            Ok(c)
        });
        match parsed {
            Ok(config) => {
                let t = &config.tokenizer;
                let route = format!("{}|{}|{}", t.cluster, t.authority, t.path);
                log::info!(
                    "incontext {}: configured; tokenizer cluster {}, context_length {:?}, window {:?}, reserve {}, margin {}",
                    env!("CARGO_PKG_VERSION"),
                    t.cluster,
                    config.context_length,
                    config.window(),
                    config.min_output_tokens,
                    config.fallback_margin_tokens
                );
                self.shared = Some(Rc::new(Shared {
                    config,
                    metrics: Metrics::define(),
                    route,
                    warned_window: Cell::new(false),
                }));
                true
            }
            Err(e) => {
                log::error!("incontext: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(http::Http::new(self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

proxy_wasm::main! {{
    logger::install();
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { shared: None }) });
}}
