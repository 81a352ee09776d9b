//! The count cache and learned context lengths in proxy-wasm shared data, so all worker
//! VMs share them. Host errors read as misses: the cache is an optimisation.

use super::host;
use crate::core::cache::{decode, decode_context, encode, encode_context, model_key, slot_key};
use crate::core::tokenize::Reply;

pub fn lookup(hash: u128, entries: u32) -> Option<Reply> {
    let value = host::get_shared(&slot_key(hash, entries)).ok()??;
    decode(hash, &value)
}

pub fn store(hash: u128, entries: u32, reply: Reply) {
    let _ = host::set_shared(&slot_key(hash, entries), &encode(hash, reply));
}

/// A context length learned from the tokenizer for this model.
pub fn learned_context(model: &str) -> Option<u64> {
    decode_context(&host::get_shared(&model_key(model)).ok()??)
}

pub fn learn_context(model: &str, max_model_len: u64) {
    if learned_context(model) != Some(max_model_len) {
        let _ = host::set_shared(&model_key(model), &encode_context(max_model_len));
    }
}
