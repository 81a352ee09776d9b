//! vLLM's render API (`vllm-render`, docs/spec.md §16): the GPU-less render server
//! (`vllm launch render`, llm-d's own Deployment) or `vllm serve --enable-scale-out`. Every
//! dialect is rendered by its own endpoint, given the request less its caps and `stream`
//! (`max_tokens: 1` where the API requires one); the count is the number of `token_ids`. The
//! window comes from `GET /v1/models`, and only from the request's own model there.

use super::{get, positive, post, Ask, Call, CallKind, Counted, Map, Server, MODELS_PATH};
use crate::dialect::{responses, Form};
use crate::request::Request;
use crate::response::window::{message, WindowError};
use crate::tokenize::Failure;
use serde_json::Value;

pub const CHAT_RENDER_PATH: &str = "/v1/chat/completions/render";
pub const COMPLETIONS_RENDER_PATH: &str = "/v1/completions/render";
pub const MESSAGES_RENDER_PATH: &str = "/v1/messages/render";
pub use super::vllm::RESPONSES_RENDER_PATH;

pub(super) struct Render;

impl Server for Render {
    /// The render call for any dialect.
    fn count_call(&self, a: &Ask) -> Option<Call> {
        let (req, body) = (a.req, a.body);
        let (path, payload) = match req.form {
            Form::Chat => (CHAT_RENDER_PATH, without_caps(req, body, false)?),
            Form::Completion => (COMPLETIONS_RENDER_PATH, without_caps(req, body, false)?),
            // Anthropic's schema requires `max_tokens`: one token, which any window holds.
            Form::Messages => (MESSAGES_RENDER_PATH, without_caps(req, body, true)?),
            Form::Responses => (RESPONSES_RENDER_PATH, responses::payload(req, body)?),
        };
        Some(post(path, payload, CallKind::TokenIds))
    }

    /// The render server counts whole requests only.
    fn counts_tails(&self) -> bool {
        false
    }

    fn window_call(&self) -> Call {
        get(MODELS_PATH, CallKind::ModelWindow)
    }

    /// vLLM's wordings: the render server is vLLM.
    fn window_error(&self, body: &Value) -> Option<WindowError> {
        super::vllm::window_error(message(body)?)
    }
}

/// The request as it stands less its caps, `stream` and `stream_options` (a render of a cap
/// larger than the window is refused; a stream would be answered as one), and with
/// `"max_tokens":1` when `one_token`.
fn without_caps(req: &Request, body: &[u8], one_token: bool) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + 16);
    out.push(b'{');
    for (i, m) in req.members.iter().enumerate() {
        if req.cap_members.contains(&i) || m.key == "stream" || m.key == "stream_options" {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(body.get(m.key_start..m.value.end)?);
    }
    if one_token {
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(b"\"max_tokens\":1");
    }
    out.push(b'}');
    Some(out)
}

/// A render answer: `{"token_ids": [...]}` (chat, Anthropic, Responses) or a list of one
/// such object (completions, one per prompt; the filter counts a single prompt).
pub(super) fn parse_token_ids(body: &[u8]) -> Result<Counted, Failure> {
    let value: Value = serde_json::from_slice(body).map_err(|_| Failure::BadJson)?;
    let rendered = match &value {
        Value::Object(_) => Some(&value),
        Value::Array(items) => match items.as_slice() {
            [one] => Some(one),
            _ => None,
        },
        _ => None,
    }
    .ok_or(Failure::Contract)?;
    let ids = rendered
        .get("token_ids")
        .and_then(Value::as_array)
        .ok_or(Failure::Contract)?;
    Ok(Counted {
        count: ids.len() as u64,
        window: None,
    })
}

/// The `max_model_len` of `model` in `/v1/models`. A render server that does not list the
/// request's model renders for another one: its window is not this model's (a contract
/// failure, so the estimate is used).
pub(super) fn parse_models(map: &Map, model: Option<&str>) -> Result<u64, Failure> {
    let model = model.ok_or(Failure::Contract)?;
    positive(
        map.get("data")
            .and_then(Value::as_array)
            .and_then(|data| {
                data.iter()
                    .find(|m| m.get("id").and_then(Value::as_str) == Some(model))
            })
            .and_then(|m| m.get("max_model_len")),
    )
    .ok_or(Failure::Contract)
}
