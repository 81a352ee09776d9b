//! incontext's proxy-wasm glue. Every decision is the core's (`incontext_core::flow`): this
//! crate reads what the host has, hands it to the flow, and applies what the flow returns. Any
//! host error leaves the request as it came.
//!
//! * `filter`: the VM's contexts, the calls they wait for and the calls of gone streams;
//! * `http`: one stream's callbacks; `metrics`, `logger`: counters, gauges and logs;
//! * `proxy`: every host call, as a trait whose calls return a `Result`;
//! * `wasm` (wasm32 only): the ABI's imports behind that trait and its exports, the one
//!   place with `unsafe` code.
//!
//! All but `wasm` build and are tested natively, over a fake `Proxy`.

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]

pub mod filter;
mod http;
pub mod logger;
mod metrics;
pub mod proxy;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod wasm;

use incontext_core::flow::Plugin;
use metrics::Metrics;

/// What every request of one plugin instance shares.
pub struct Shared {
    pub plugin: Plugin,
    pub metrics: Metrics,
}
