//! llama.cpp: its own counters for a chat and a Responses request, `/tokenize` of the
//! content for a string prompt;
//! the per-slot window from `/props`.

use super::{
    get, messages_count, object, positive, post, Ask, Call, CallKind, Counted, Map, Server,
};
use crate::dialect::messages::tail_object;
use crate::dialect::{responses, Form};
use crate::json::scan::array_items;
use crate::request::Request;
use crate::response::window::WindowError;
use crate::tokenize::Failure;
use serde_json::Value;

/// llama.cpp's counter for an OpenAI chat request.
pub const LLAMACPP_CHAT_COUNT_PATH: &str = "/v1/chat/completions/input_tokens";
/// llama.cpp's counter for an OpenAI Responses request.
pub const LLAMACPP_RESPONSES_COUNT_PATH: &str = "/v1/responses/input_tokens";
/// llama.cpp's server properties (`default_generation_settings.n_ctx`).
pub const LLAMACPP_PROPS_PATH: &str = "/props";

pub(super) struct Llamacpp;

impl Server for Llamacpp {
    fn count_call(&self, a: &Ask) -> Option<Call> {
        let (req, body) = (a.req, a.body);
        match req.form {
            Form::Chat => Some(post(
                LLAMACPP_CHAT_COUNT_PATH,
                body.to_vec(),
                CallKind::InputTokens,
            )),
            Form::Completion => Some(post(
                &a.t.path,
                llamacpp_content(req, body)?,
                CallKind::TokenList,
            )),
            Form::Messages => Some(messages_count(body)),
            Form::Responses => Some(post(
                LLAMACPP_RESPONSES_COUNT_PATH,
                responses::payload(req, body)?,
                CallKind::InputTokens,
            )),
        }
    }

    /// Its counter with those messages alone, without the tools.
    fn chat_tail(&self, a: &Ask, messages: &[u8]) -> Option<Call> {
        let payload = tail_object(a.req, a.body, "messages", messages, |k| {
            matches!(k, "messages" | "tools" | "tool_choice")
        })?;
        Some(post(
            LLAMACPP_CHAT_COUNT_PATH,
            payload,
            CallKind::InputTokens,
        ))
    }

    fn window_call(&self) -> Call {
        get(LLAMACPP_PROPS_PATH, CallKind::Props)
    }

    fn window_error(&self, body: &Value) -> Option<WindowError> {
        window_error(body)
    }

    fn fills_mid_answer(&self) -> bool {
        true
    }

    fn context_full(&self, error: &Value) -> bool {
        context_full(error)
    }
}

/// `{"tokens": [...]}`.
pub(super) fn parse_token_list(body: &[u8]) -> Result<Counted, Failure> {
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
pub(super) fn parse_props(map: &Map) -> Result<u64, Failure> {
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

// Window errors (docs/spec.md §13): `llama-server` answers a prompt that does not fit the
// slot's context with 400 `{"error":{"type":"exceed_context_size_error","n_prompt_tokens":P,
// "n_ctx":C,…}}` (the prompt alone is checked, `P >= n_ctx`; a cap is never refused). The
// numbers are read from their members, never from the message.
//
// When its slots share one KV cache (`--kv-unified`, the default with automatic slots) and
// the cache fills while answers are under way, its decode fails and it ends every answer
// being processed with `{"code":500,"message":"Context size has been exceeded.","type":
// "server_error"}` (server-context.cpp, `send_error` with `ERROR_TYPE_SERVER`): the whole
// answer, status 500, before any output; after it, in the started stream, the SSE event
// `data: {"error":{…}}` (OpenAI's forms) or `event: error` with that object as its data
// (Anthropic's), and the stream ends. It names no numbers.

/// The message of llama-server's full context.
pub const CONTEXT_FULL: &str = "Context size has been exceeded.";

/// Whether an error object is llama-server's full context.
pub(super) fn context_full(error: &Value) -> bool {
    error.get("type").and_then(Value::as_str) == Some("server_error")
        && error.get("message").and_then(Value::as_str) == Some(CONTEXT_FULL)
}

/// The window error in a llama.cpp error body: `exceed_context_size_error` with its numbers,
/// or the full context before any output, which names none (the filter's P, B and C word it;
/// no window is learned from it).
pub(super) fn window_error(body: &Value) -> Option<WindowError> {
    let error = body.get("error")?;
    if context_full(error) {
        return Some(WindowError::default());
    }
    if error.get("type")?.as_str()? != "exceed_context_size_error" {
        return None;
    }
    let prompt = error.get("n_prompt_tokens")?.as_u64()?;
    let context = error.get("n_ctx")?.as_u64().filter(|c| *c > 0)?;
    Some(WindowError::prompt_over(Some(context), Some(prompt)))
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn parse(text: &str) -> Option<WindowError> {
        window_error(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn llamacpp_exceed_context_size() {
        let w = parse(r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#).unwrap();
        assert_eq!(
            (w.context, w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(4096), Some(5000), true, true)
        );
        for other in [
            r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens)","type":"invalid_request_error"}}"#,
            r#"{"error":{"type":"exceed_context_size_error","n_prompt_tokens":"5000","n_ctx":4096}}"#,
            r#"{"error":{"type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":0}}"#,
            r#"{"error":{"type":"exceed_context_size_error"}}"#,
            r#"{"type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}"#,
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
