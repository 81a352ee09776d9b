//! vLLM: `/tokenize` renders every OpenAI dialect itself and reports the window with the
//! count; `/v1/models` reports `max_model_len` for an Anthropic count.

use super::{get, post, Call, CallKind, Counted, MODELS_PATH};
use crate::config::{Config, TokenizerConfig};
use crate::dialect::payload;
use crate::dialect::Form;
use crate::request::Request;
use crate::tokenize::{check_context, Failure};

/// The count call for an OpenAI dialect.
pub(super) fn count_call(t: &TokenizerConfig, req: &Request, body: &[u8]) -> Option<Call> {
    Some(post(&t.path, payload(req, body)?, CallKind::Tokenize))
}

pub(super) fn window_call() -> Call {
    get(MODELS_PATH, CallKind::Models)
}

/// `/tokenize` answers carry `max_model_len`; Anthropic's counter does not.
pub(super) fn count_reports_window(form: Form) -> bool {
    form != Form::Messages
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
