//! incontext's proxy-wasm glue: the ABI's exports (`abi`), the plugin's start-up (`Root`) and
//! the per-request callbacks (`http`), over `host`, which turns every host status into a
//! `Result`. Every decision is the core's (`incontext_core::flow`): this crate reads what the
//! host has, hands it to the flow, and applies what the flow returns. Any host error leaves
//! the request as it came.

#![cfg(target_arch = "wasm32")]

mod abi;
mod host;
mod http;
mod logger;
mod metrics;

use host::BufferType;
use incontext_core::config::Config;
use incontext_core::flow::Plugin;
use metrics::Metrics;
use std::rc::Rc;

/// What every request of one plugin instance shares.
pub struct Shared {
    pub plugin: Plugin,
    pub metrics: Metrics,
}

/// A plugin (root) context: its configuration, once valid.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<Shared>>,
}

impl Root {
    fn shared(&self) -> Option<Rc<Shared>> {
        self.shared.clone()
    }

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
}

/// WASI reactor start-up: static constructors, then the logger. Host calls are not allowed
/// here.
#[no_mangle]
pub extern "C" fn _initialize() {
    extern "C" {
        fn __wasm_call_ctors();
    }
    // SAFETY: the reactor's constructor entry point, called once by the host before anything
    // else.
    unsafe { __wasm_call_ctors() };
    logger::install();
}
