//! incontext: an Envoy proxy-wasm HTTP filter that gives every LLM request a viable output
//! budget. `core` is pure and tested natively; `filter` is the thin proxy-wasm host layer.

pub mod core;

#[cfg(target_arch = "wasm32")]
pub mod filter;
