//! incontext's core: the whole request flow as values, with no proxy-wasm dependency.
//!
//! `flow` owns "request → count → outcome" and reaches the cache, learned windows, dispatch
//! and counters through the small `flow::Host` trait. Two axes are explicit types: the request
//! `dialect` (OpenAI chat, completions, Anthropic Messages) and the tokenizer `backend` (vLLM,
//! SGLang, llama.cpp). `json` is the byte-level JSON toolkit everything else is built on.
//! The contract is docs/spec.md.

#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

pub mod backend;
pub mod bound;
pub mod cache;
pub mod caps;
pub mod config;
pub mod dialect;
pub mod digest;
pub mod estimate;
pub mod flow;
pub mod json;
pub mod plan;
pub mod publish;
pub mod reason;
pub mod report;
pub mod request;
pub mod reshape;
#[allow(clippy::indexing_slicing, clippy::unreachable)]
pub mod response;
pub mod rewrite;
pub mod rule;
pub mod table;
pub mod tokenize;

/// The line a glue logs for a panic: where it happened, never its message (which could quote
/// a request).
pub fn panic_line(location: Option<&std::panic::Location<'_>>) -> String {
    match location {
        Some(l) => format!(
            "incontext: panicked at {}:{}:{}",
            l.file(),
            l.line(),
            l.column()
        ),
        None => "incontext: panicked".to_string(),
    }
}
