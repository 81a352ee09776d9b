//! incontext as a native Envoy dynamic module (`envoy.filters.http.dynamic_modules`). Every
//! decision is the core's (`incontext_core::flow`), driven as the proxy-wasm glue
//! (crates/filter) drives it: this crate reads what Envoy has, hands it to the flow, and
//! applies what the flow returns. Any host failure, and any panic, leaves the request as it
//! came.
//!
//! * `stream`: one HTTP stream's callbacks, over [`envoy::Envoy`];
//! * `calls`: the calls a configuration makes after their stream, from Envoy's main thread;
//! * `config`: a filter configuration: the plugin configuration JSON, its metrics;
//! * `table`: the process-wide shared data (counts, anchors, learned windows);
//! * `metrics`: counter and histogram ids;
//! * `part`: a request body read from Envoy's slices in part (a long prompt's hit);
//! * `splice`: a rewrite written over the body Envoy holds, in place;
//! * `abi` (not in unit tests): Envoy's ABI, bound by hand, behind those traits, and the event
//!   hooks Envoy calls; the one place with `unsafe` code.
//!
//! All but `abi` is tested natively over a fake Envoy.

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

#[cfg(not(test))]
#[allow(unsafe_code)]
mod abi;
pub mod calls;
pub mod config;
pub mod envoy;
pub mod metrics;
pub mod part;
pub mod splice;
pub mod stream;
pub mod table;
#[cfg(test)]
mod tests;

/// The version of Envoy's dynamic-module ABI the bindings in `abi.rs` follow (abi/bound.h).
pub const ABI_VERSION: &str = "v0.1.0";
