//! incontext's core: the whole request flow as values, with no proxy-wasm dependency.
//!
//! `flow` owns "request → count → outcome" and reaches the cache, learned windows, dispatch
//! and counters through the small `flow::Host` trait. Two axes are explicit types: the request
//! `dialect` (OpenAI chat, completions, Anthropic Messages) and the tokenizer `backend` (vLLM,
//! SGLang, llama.cpp). `json` is the byte-level JSON toolkit everything else is built on.
//! The contract is docs/spec.md.

pub mod backend;
pub mod bound;
pub mod cache;
pub mod caps;
pub mod config;
pub mod dialect;
pub mod estimate;
pub mod flow;
pub mod json;
pub mod plan;
pub mod reason;
pub mod report;
pub mod request;
pub mod response;
pub mod rewrite;
pub mod rule;
pub mod tokenize;
