//! The byte-level JSON toolkit: a validating scanner of top-level members (`scan`), the skim
//! that only finds a value's end (`skim`, over the 64-byte block masks of `blocks`, or `guess`
//! from where a long value that began the same way ended before), the
//! compactor of the tokenizer payload (`compact`), a vector substring search (`find`), and the
//! `serde` reader of a parsed value that reports the path of its errors (`path`).

pub mod blocks;
pub mod compact;
pub mod find;
pub mod guess;
pub mod path;
pub mod scan;
pub mod skim;
