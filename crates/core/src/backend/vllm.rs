//! vLLM: `/tokenize` renders OpenAI chat and completion requests itself and reports the
//! window with the count; a Responses request is rendered by `/v1/responses/render` (served
//! with `--enable-scale-out`; 403 otherwise, a counted failure); `/v1/models` reports
//! `max_model_len` for the counts that do not.

use super::{get, object, post, status_ok, Call, CallKind, Counted, MODELS_PATH};
use crate::config::{Config, TokenizerConfig};
use crate::dialect::{payload, responses, Form};
use crate::request::Request;
use crate::tokenize::{check_context, Failure};
use serde_json::Value;

/// vLLM's renderer of a Responses request: the prompt's `token_ids`.
pub const RESPONSES_RENDER_PATH: &str = "/v1/responses/render";

/// The count call for an OpenAI dialect.
pub(super) fn count_call(t: &TokenizerConfig, req: &Request, body: &[u8]) -> Option<Call> {
    match req.form {
        Form::Responses => Some(post(
            RESPONSES_RENDER_PATH,
            responses::payload(req, body)?,
            CallKind::TokenIds,
        )),
        _ => Some(post(&t.path, payload(req, body)?, CallKind::Tokenize)),
    }
}

/// `{"token_ids": [...], ...}` (a render answer): the count is their number.
pub(super) fn parse_token_ids(status: Option<u16>, body: &[u8]) -> Result<Counted, Failure> {
    status_ok(status)?;
    let ids = object(body)?
        .get("token_ids")
        .and_then(Value::as_array)
        .map(Vec::len)
        .ok_or(Failure::Contract)?;
    Ok(Counted {
        count: ids as u64,
        window: None,
    })
}

pub(super) fn window_call() -> Call {
    get(MODELS_PATH, CallKind::Models)
}

/// `/tokenize` answers carry `max_model_len`; Anthropic's counter and the renderer do not.
pub(super) fn count_reports_window(form: Form) -> bool {
    matches!(form, Form::Chat | Form::Completion)
}

/// `{"count", "max_model_len"}`: the count and the server's window.
pub(super) fn parse_tokenize(
    config: &Config,
    status: Option<u16>,
    body: &[u8],
) -> Result<Counted, Failure> {
    let reply = crate::tokenize::parse_reply(status, body, None)?;
    check_context(reply.max_model_len, config.context_length)?;
    Ok(Counted {
        count: reply.count,
        window: Some(reply.max_model_len),
    })
}
