//! The byte-level JSON toolkit: a validating scanner of top-level members (`scan`), the skim
//! that only finds a value's end (`skim`, over the 64-byte block masks of `blocks`), the
//! compactor of the tokenizer payload (`compact`) and a vector substring search (`find`).

pub mod blocks;
pub mod compact;
pub mod find;
pub mod scan;
pub mod skim;
