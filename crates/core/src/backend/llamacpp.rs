//! llama.cpp: its own counters for a chat and a Responses request, `/tokenize` of the
//! content for a string prompt;
//! the per-slot window from `/props`.

use super::{get, object, positive, post, status_ok, Call, CallKind, Counted};
use crate::config::TokenizerConfig;
use crate::dialect::{responses, Form};
use crate::json::scan::array_items;
use crate::request::Request;
use crate::tokenize::Failure;
use serde_json::Value;

/// llama.cpp's counter for an OpenAI chat request.
pub const LLAMACPP_CHAT_COUNT_PATH: &str = "/v1/chat/completions/input_tokens";
/// llama.cpp's counter for an OpenAI Responses request.
pub const LLAMACPP_RESPONSES_COUNT_PATH: &str = "/v1/responses/input_tokens";
/// llama.cpp's server properties (`default_generation_settings.n_ctx`).
pub const LLAMACPP_PROPS_PATH: &str = "/props";

/// The count call for an OpenAI dialect.
pub(super) fn count_call(t: &TokenizerConfig, req: &Request, body: &[u8]) -> Option<Call> {
    match req.form {
        Form::Chat => Some(post(
            LLAMACPP_CHAT_COUNT_PATH,
            body.to_vec(),
            CallKind::InputTokens,
        )),
        Form::Completion => Some(post(
            &t.path,
            llamacpp_content(req, body)?,
            CallKind::TokenList,
        )),
        Form::Responses => Some(post(
            LLAMACPP_RESPONSES_COUNT_PATH,
            responses::payload(req, body)?,
            CallKind::InputTokens,
        )),
        // Counted by Anthropic's counter, shared by every backend.
        Form::Messages => None,
    }
}

pub(super) fn window_call() -> Call {
    get(LLAMACPP_PROPS_PATH, CallKind::Props)
}

/// `{"tokens": [...]}`.
pub(super) fn parse_token_list(status: Option<u16>, body: &[u8]) -> Result<Counted, Failure> {
    status_ok(status)?;
    let map = object(body)?;
    let tokens = map
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or(Failure::Contract)?;
    Ok(Counted {
        count: tokens.len() as u64,
        window: None,
    })
}

/// The per-slot `n_ctx` of `/props`.
pub(super) fn parse_props(map: &serde_json::Map<String, Value>) -> Result<u64, Failure> {
    positive(
        map.get("default_generation_settings")
            .and_then(|s| s.get("n_ctx")),
    )
    .ok_or(Failure::Contract)
}

/// llama.cpp's `/tokenize` for a string prompt (or a list of one string).
fn llamacpp_content(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let mut prompt = req.raw_bytes(body, req.fields.prompt)?;
    if prompt.starts_with(b"[") {
        match array_items(prompt)?.as_slice() {
            [one] => prompt = prompt.get(one.clone())?,
            _ => return None,
        }
    }
    if !prompt.starts_with(b"\"") {
        return None;
    }
    let mut out = Vec::with_capacity(prompt.len() + 16);
    out.extend_from_slice(b"{\"content\":");
    out.extend_from_slice(prompt);
    out.push(b'}');
    Some(out)
}
