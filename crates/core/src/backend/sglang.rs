//! SGLang: `/tokenize` renders a chat from the members it reads (sent alone) and a prompt
//! as vLLM's does; the window comes from `/v1/models`.

use super::{get, post, Call, CallKind, Counted, MODELS_PATH};
use crate::config::TokenizerConfig;
use crate::dialect::payload;
use crate::dialect::Form;
use crate::request::Request;
use crate::tokenize::Failure;

/// The count call for an OpenAI dialect.
pub(super) fn count_call(t: &TokenizerConfig, req: &Request, body: &[u8]) -> Option<Call> {
    match req.form {
        Form::Chat => Some(post(&t.path, sglang_chat(req, body)?, CallKind::Tokenize)),
        Form::Completion => Some(post(&t.path, payload(req, body)?, CallKind::Tokenize)),
        // Counted by Anthropic's counter, shared by every backend.
        Form::Messages => None,
        // SGLang has no renderer of a Responses request: the estimate.
        Form::Responses => None,
    }
}

pub(super) fn window_call() -> Call {
    get(MODELS_PATH, CallKind::Models)
}

/// `{"count", ...}`: the `max_model_len` there is the tokenizer's limit, not the server's
/// window, so it is not read.
pub(super) fn parse_tokenize(status: Option<u16>, body: &[u8]) -> Result<Counted, Failure> {
    let reply = crate::tokenize::parse_reply(status, body, None)?;
    Ok(Counted {
        count: reply.count,
        window: None,
    })
}

/// SGLang's `/tokenize` for a chat: it renders `messages` with `tools` (left out when
/// `tool_choice` is `"none"`), `reasoning_effort` and `chat_template_kwargs` itself.
fn sglang_chat(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let f = &req.fields;
    let mut out = Vec::with_capacity(
        req.raw_bytes(body, f.messages)
            .map_or(64, |m| m.len() + 128),
    );
    out.push(b'{');
    let mut first = true;
    for (name, idx) in [
        ("model", f.model),
        ("messages", f.messages),
        ("tools", f.tools),
        ("tool_choice", f.tool_choice),
        ("reasoning_effort", f.reasoning_effort),
        ("chat_template_kwargs", f.chat_template_kwargs),
    ] {
        let Some(raw) = req.raw_bytes(body, idx) else {
            continue;
        };
        if name == "tools" && !raw.starts_with(b"[") {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(raw);
    }
    out.push(b'}');
    Some(out)
}
