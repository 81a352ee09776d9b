//! The pure core: no host calls, everything testable natively.

pub mod blocks;
pub mod cache;
pub mod caps;
pub mod compact;
pub mod config;
pub mod estimate;
pub mod find;
pub mod payload;
pub mod plan;
pub mod reason;
pub mod request;
pub mod rewrite;
pub mod rule;
pub mod scan;
pub mod skim;
pub mod tokenize;
