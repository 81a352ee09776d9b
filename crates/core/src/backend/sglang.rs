//! SGLang: `/tokenize` renders a chat from the members it reads (sent alone) and a prompt
//! as vLLM's does; the window comes from `/v1/models`.

use super::{messages_count, num, post, Ask, Call, CallKind, Server};
use crate::dialect::payload;
use crate::dialect::Form;
use crate::request::Request;
use crate::response::window::{first_match, message, Piece::*, WindowError, Wording};
use serde_json::Value;

pub(super) struct Sglang;

/// `/tokenize` answers are read by the provided `parse_tokenize`: the `max_model_len` there is
/// the tokenizer's limit, not the server's window.
impl Server for Sglang {
    fn count_call(&self, a: &Ask) -> Option<Call> {
        let (req, body) = (a.req, a.body);
        match req.form {
            Form::Chat => Some(post(
                &a.t.path,
                sglang_chat(req, body, None)?,
                CallKind::Tokenize,
            )),
            Form::Completion => Some(post(&a.t.path, payload(req, body)?, CallKind::Tokenize)),
            Form::Messages => Some(messages_count(body)),
            // SGLang has no renderer of a Responses request: the estimate.
            Form::Responses => None,
        }
    }

    /// `/tokenize` of those messages alone, without the tools.
    fn chat_tail(&self, a: &Ask, messages: &[u8]) -> Option<Call> {
        let payload = sglang_chat(a.req, a.body, Some(messages))?;
        Some(post(&a.t.path, payload, CallKind::Tokenize))
    }

    fn window_error(&self, body: &Value) -> Option<WindowError> {
        window_error(message(body)?)
    }
}

/// SGLang's `/tokenize` for a chat: it renders `messages` with `tools` (left out when
/// `tool_choice` is `"none"`), `reasoning_effort` and `chat_template_kwargs` itself. With
/// `tail`, those messages alone, without the tools.
fn sglang_chat(req: &Request, body: &[u8], tail: Option<&[u8]>) -> Option<Vec<u8>> {
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
        let raw = match (name, tail) {
            ("messages", Some(tail)) => tail,
            ("tools" | "tool_choice", Some(_)) => continue,
            _ => match req.raw_bytes(body, idx) {
                Some(raw) => raw,
                None => continue,
            },
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

// Window errors (docs/spec.md §13): SGLang's `TokenizerManager` and chat serving, the message
// of its `{"object":"error",…}` body.

/// SGLang's wordings, in the order they are tried.
const WORDINGS: &[Wording] = &[
    (
        &[
            Text("The input ("),
            Num,
            Text(" tokens) is longer than the model's context length ("),
            Num,
            Text(" tokens)."),
        ],
        |c| WindowError::prompt_over(num(c, 1), num(c, 0)),
    ),
    (
        &[
            Text("Requested token count exceeds the model's maximum context length of "),
            Num,
            Text(" tokens. You requested a total of "),
            Num,
            Text(" tokens: "),
            Num,
            Text(" tokens from the input messages and "),
            Num,
            Text(" tokens for the completion."),
        ],
        |c| WindowError {
            context: num(c, 0),
            prompt: num(c, 2),
            prompt_exact: true,
            cap: num(c, 3),
            ..WindowError::default()
        },
    ),
    (
        &[
            Text("max_completion_tokens is too large: "),
            Num,
            Text(".This model supports at most "),
            Num,
            Text(" completion tokens."),
        ],
        |c| WindowError {
            context: num(c, 1),
            cap: num(c, 0),
            ..WindowError::default()
        },
    ),
];

/// The window error in an SGLang error message.
pub(super) fn window_error(message: &str) -> Option<WindowError> {
    first_match(message, WORDINGS)
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn sglang_wordings() {
        let w = window_error(
            "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        )
        .unwrap();
        assert_eq!(
            (w.context, w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(4096), Some(5000), true, true)
        );
        let w = window_error("Requested token count exceeds the model's maximum context length of 512 tokens. You requested a total of 630 tokens: 430 tokens from the input messages and 200 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.").unwrap();
        assert_eq!(
            (w.context, w.prompt, w.cap, w.prompt_exceeds),
            (Some(512), Some(430), Some(200), false)
        );
        let w = window_error("max_completion_tokens is too large: 32000.This model supports at most 512 completion tokens.").unwrap();
        assert_eq!((w.context, w.cap, w.prompt), (Some(512), Some(32000), None));
        for m in [
            "The input (many tokens) is longer than the model's context length (4096 tokens).",
            "Requested token count exceeds the model's maximum context length.",
            "max_new_tokens is too large: 5.",
        ] {
            assert_eq!(window_error(m), None, "{m}");
        }
    }
}
