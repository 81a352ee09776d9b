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
//! * `slot`: a stream as Envoy holds it, through hooks Envoy calls inside hooks;
//! * `splice`: a rewrite written over the body Envoy holds, in place;
//! * `abi` (not in unit tests): Envoy's ABI, bound by hand, behind those traits, and the event
//!   hooks Envoy calls; the one place with `unsafe` code.
//!
//! All but `abi` is tested natively over a fake Envoy.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]

// Every panic is caught where Envoy calls the module (`catch_unwind`), which only unwinding
// makes possible: built with `panic = "abort"` (the workspace's release profile) a panic would
// take Envoy's process down. The module is built for Envoy's host; a wasm check of the
// workspace type-checks it only.
#[cfg(all(panic = "abort", not(target_family = "wasm")))]
compile_error!(
    "incontext-module needs panic = \"unwind\": build it with the `module` profile \
     (scripts/build-module.sh: cargo build --profile module -p incontext-module)"
);

#[cfg(not(test))]
#[allow(unsafe_code)]
mod abi;
pub mod calls;
pub mod config;
pub mod envoy;
pub mod metrics;
pub mod part;
pub mod slot;
pub mod splice;
pub mod stream;
pub mod table;
#[cfg(test)]
mod tests;

// What crosses Envoy's threads: a configuration (`stream::Shared`, behind an `Arc` that Envoy
// holds as a raw pointer) is used by every worker's streams and by the main thread (its
// calls); a count's `Orphan` goes from the worker whose stream made it to the main thread; the
// table is the process's. Raw pointers hide these from the compiler, so it is asked here: a
// `Cell` or an `Rc` in any of them fails the build.
const _: () = {
    const fn crosses_threads<T: Send + Sync>() {}
    crosses_threads::<stream::Shared>();
    crosses_threads::<incontext_core::flow::Plugin>();
    crosses_threads::<metrics::Metrics>();
    crosses_threads::<metrics::Deferred>();
    crosses_threads::<calls::Calls>();
    crosses_threads::<calls::Wake>();
    crosses_threads::<incontext_core::flow::Orphan>();
    crosses_threads::<table::Table>();
};

/// The version of Envoy's dynamic-module ABI the bindings in `abi.rs` follow (abi/bound.h).
pub const ABI_VERSION: &str = "v0.1.0";
