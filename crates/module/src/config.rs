//! A filter configuration: the `filter_config` Envoy hands over (the same plugin
//! configuration JSON as the wasm filter's), checked once when Envoy loads it.

use crate::metrics::{Define, Metrics};
use crate::stream::Shared;
use incontext_core::config::Config;
use incontext_core::flow::Plugin;

/// The `filter_name` the module answers to.
pub const FILTER_NAME: &str = "incontext";

/// The configuration of a filter named `name`, with its metrics defined; `Err` (the line to
/// log; Envoy then refuses the configuration) when it is not valid.
pub fn load(
    define: &mut dyn Define,
    name: &[u8],
    config: &[u8],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Shared, String> {
    if name != FILTER_NAME.as_bytes() {
        return Err(format!(
            "incontext: filter_name must be \"{FILTER_NAME}\" (the module has no other filter)"
        ));
    }
    let config = Config::load(config, env).map_err(|e| format!("incontext: {e}"))?;
    log::info!(
        "incontext {} (module): {}",
        env!("CARGO_PKG_VERSION"),
        config.summary()
    );
    let plugin = Plugin::new(config);
    let metrics = Metrics::define(define, plugin.route_names());
    Ok(Shared {
        plugin,
        metrics,
        calls: Default::default(),
        deferred: Default::default(),
    })
}
