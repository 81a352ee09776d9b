//! incontext's proxy-wasm glue: plugin start-up and the per-request callbacks, over `host`,
//! which turns every host status into a `Result`. Every decision is the core's
//! (`incontext_core::flow`); this crate only reads what the host has, hands it to the flow,
//! and applies what the flow returns. Any host error leaves the request as it came.

#![cfg(target_arch = "wasm32")]

mod host;
mod http;
mod logger;
mod metrics;

use incontext_core::config::Config;
use incontext_core::flow::Plugin;
use metrics::Metrics;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use std::rc::Rc;

/// What every request of one plugin instance shares.
pub struct Shared {
    pub plugin: Plugin,
    pub metrics: Metrics,
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
                log::info!(
                    "incontext {}: {}",
                    env!("CARGO_PKG_VERSION"),
                    config.summary()
                );
                self.shared = Some(Rc::new(Shared {
                    plugin: Plugin::new(config),
                    metrics: Metrics::define(),
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
