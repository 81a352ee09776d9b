//! OpenAI completion (`prompt`, no `messages`; docs/spec.md §4, §5, §7): every cap field is a
//! cap, and one is required (vLLM's `/v1/completions` defaults `max_tokens` to 16, so without
//! one there is nothing to budget). A prompt of token ids is counted by length with no call;
//! a string prompt by `/tokenize`; a batch of strings is estimated. The rejection is chat's
//! OpenAI error.

use super::write_field;
use crate::estimate::estimate as rough;
use crate::json::scan::{array_items, Member};
use crate::reason::Reason;
use crate::request::{raw, Counting, Fields, Request};
use serde_json::value::RawValue;

/// A completion without a valid cap passes unchanged (`no_cap`).
pub const REQUIRES_CAP: bool = true;

/// A prompt is no conversation: nothing is canonical.
pub const CANON: super::canonical::Canon = super::canonical::Canon {
    ignored: &[],
    text_block: None,
};

/// How the prompt is counted: token ids by length, one string by the tokenizer, a batch of
/// strings by the estimate.
pub fn counting(body: &[u8], members: &[Member], f: &Fields) -> Result<Counting, Reason> {
    let prompt = raw(body, members, f.prompt).ok_or(Reason::Shape)?;
    if prompt.starts_with('"') {
        return Ok(Counting::Tokenize);
    }
    let items: Vec<&RawValue> = serde_json::from_str(prompt).map_err(|_| Reason::Shape)?;
    let ids = |v: &RawValue| {
        serde_json::from_str::<Vec<u64>>(v.get())
            .ok()
            .map(|ids| ids.len() as u64)
    };
    match items.first().and_then(|i| i.get().as_bytes().first()) {
        // A single list of token ids.
        Some(b'0'..=b'9') => serde_json::from_str::<Vec<u64>>(prompt)
            .map(|v| Counting::Exact(v.len() as u64))
            .map_err(|_| Reason::Shape),
        // A batch of token-id lists: the longest one binds.
        Some(b'[') => items
            .iter()
            .map(|i| ids(i).filter(|n| *n > 0))
            .collect::<Option<Vec<u64>>>()
            .and_then(|v| v.into_iter().max())
            .map(Counting::Exact)
            .ok_or(Reason::Shape),
        // One string in a list is the plain string prompt; a batch is estimated.
        Some(b'"') if items.iter().all(|i| i.get().starts_with('"')) => Ok(if items.len() == 1 {
            Counting::Tokenize
        } else {
            Counting::Estimate
        }),
        _ => Err(Reason::Shape),
    }
}

/// The estimate over the raw `prompt`; of a batch, the longest prompt binds.
pub fn estimate(req: &Request, body: &[u8]) -> Option<u64> {
    let prompt = req.raw(body, req.fields.prompt)?;
    if prompt.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(prompt).ok()?;
        items.iter().map(|i| rough(&[i.get()])).max()
    } else {
        Some(rough(&[prompt]))
    }
}

/// The completion `/tokenize` payload: `model`, `prompt` (one string, also from a list of
/// one), and `add_special_tokens` when present.
pub fn payload(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let f = &req.fields;
    let mut prompt = req.raw(body, f.prompt)?;
    let mut out = Vec::with_capacity(prompt.len() + 64);
    out.push(b'{');
    write_field(&mut out, "model", req.raw(body, f.model))?;
    if prompt.starts_with('[') {
        match array_items(prompt.as_bytes())?.as_slice() {
            [one] => prompt = prompt.get(one.clone())?,
            _ => return None,
        }
    }
    write_field(&mut out, "prompt", Some(prompt))?;
    write_field(
        &mut out,
        "add_special_tokens",
        req.raw(body, f.add_special_tokens),
    )?;
    out.push(b'}');
    Some(out)
}
