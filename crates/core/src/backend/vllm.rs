//! vLLM: `/tokenize` renders OpenAI chat and completion requests itself and reports the
//! window with the count; a Responses request is rendered by `/v1/responses/render` (served
//! with `--enable-scale-out`; 403 otherwise, a counted failure); `/v1/models` reports
//! `max_model_len` for the counts that do not.

use super::{messages_count, num, post, Ask, Call, CallKind, Counted, Server};
use crate::config::Config;
use crate::dialect::{chat, payload, responses, Form};
use crate::response::window::{first_match, message, Capture, Piece::*, WindowError, Wording};
use crate::tokenize::{check_context, parse_reply, Failure};
use serde_json::Value;

/// vLLM's renderer of a Responses request: the prompt's `token_ids`.
pub const RESPONSES_RENDER_PATH: &str = "/v1/responses/render";

pub(super) struct Vllm;

impl Server for Vllm {
    fn count_call(&self, a: &Ask) -> Option<Call> {
        let (req, body) = (a.req, a.body);
        match req.form {
            Form::Chat | Form::Completion => {
                Some(post(&a.t.path, payload(req, body)?, CallKind::Tokenize))
            }
            Form::Messages => Some(messages_count(body)),
            Form::Responses => Some(post(
                RESPONSES_RENDER_PATH,
                responses::payload(req, body)?,
                CallKind::TokenIds,
            )),
        }
    }

    /// `/tokenize` of those messages.
    fn chat_tail(&self, a: &Ask, messages: &[u8]) -> Option<Call> {
        let messages = std::str::from_utf8(messages).ok()?;
        let payload = chat::tail_payload(a.req, a.body, messages)?;
        Some(post(&a.t.path, payload, CallKind::Tokenize))
    }

    /// The renderer of those items alone.
    fn responses_tail(&self, a: &Ask, items: &[u8]) -> Option<Call> {
        let payload = responses::tail_body(a.req, a.body, items)?;
        Some(post(RESPONSES_RENDER_PATH, payload, CallKind::TokenIds))
    }

    /// `/tokenize` answers carry `max_model_len`; Anthropic's counter and the renderer do not.
    fn count_reports_window(&self, form: Form) -> bool {
        matches!(form, Form::Chat | Form::Completion)
    }

    /// `{"count", "max_model_len"}`: the count and the server's window.
    fn parse_tokenize(&self, config: &Config, body: &[u8]) -> Result<Counted, Failure> {
        let reply = parse_reply(body)?;
        check_context(reply.max_model_len, config.context_length)?;
        Ok(Counted {
            count: reply.count,
            window: Some(reply.max_model_len),
        })
    }

    fn window_error(&self, body: &Value) -> Option<WindowError> {
        window_error(message(body)?)
    }
}

// Window errors (docs/spec.md §13), as vLLM 0.32, 0.31 and 0.11 word them: their `message`, on
// every path (vLLM answers `/v1/messages` with the same text).

const MAX_MODEL_LEN: &str = "This model's maximum context length is ";
const CAPS: &[&str] = &["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// The window (capture `window`) and the prompt's size (capture `prompt`), exact unless vLLM
/// wrote "at least".
fn window_and_prompt(c: &[Capture], window: usize, prompt: usize) -> WindowError {
    WindowError {
        context: num(c, window),
        prompt: num(c, prompt),
        prompt_exact: c.get(prompt).is_some_and(|p| !p.at_least),
        ..WindowError::default()
    }
}

/// vLLM's wordings, in the order they are tried.
const WORDINGS: &[Wording] = &[
    // 0.32: the prompt alone is longer than the window.
    (
        &[
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens. However, your prompt contains "),
            AtLeast,
            Text(" input tokens, which exceeds this limit even without any output tokens."),
        ],
        |c| WindowError {
            prompt_exceeds: true,
            ..window_and_prompt(c, 0, 1)
        },
    ),
    // 0.32: the prompt text has more characters than the window's tokens could cover.
    (
        &[
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens. However, your prompt contains "),
            Num,
            Text(" characters (more than "),
            Num,
            Text(" characters, which is the upper bound for "),
            Num,
            Text(" input tokens)."),
        ],
        |c| WindowError {
            context: num(c, 0),
            prompt: num(c, 3).map(|p| p.saturating_add(1)),
            prompt_exact: false,
            prompt_exceeds: true,
            ..WindowError::default()
        },
    ),
    // 0.31 and 0.32: the cap alone is larger than the window (checked before the prompt).
    (
        &[
            OneOf(CAPS),
            Text("="),
            Num,
            Text(" cannot be greater than max_model_len="),
            Num,
            Text(". Please request fewer output tokens."),
        ],
        |c| WindowError {
            context: num(c, 2),
            cap: num(c, 1),
            ..WindowError::default()
        },
    ),
    // 0.31: the prompt text has more characters than the tokens the window leaves could cover.
    (
        &[
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens. However, you requested "),
            Num,
            Text(" output tokens and your prompt contains "),
            Num,
            Text(" characters (more than "),
            Num,
            Text(" characters, which is the upper bound for "),
            Num,
            Text(" input tokens)."),
        ],
        |c| WindowError {
            context: num(c, 0),
            prompt: num(c, 4).map(|p| p.saturating_add(1)),
            prompt_exact: false,
            // No output requested (a counter): the prompt alone is too long.
            prompt_exceeds: num(c, 1) == Some(0),
            cap: num(c, 1),
            ..WindowError::default()
        },
    ),
    // 0.31: prompt + cap exceed the window (a counter asks for 0 output tokens).
    (
        &[
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens. However, you requested "),
            Num,
            Text(" output tokens and your prompt contains "),
            AtLeast,
            Text(" input tokens, for a total of "),
            AtLeast,
            Text(" tokens. Please reduce the length of the input prompt or the number of requested output tokens."),
        ],
        |c| WindowError {
            prompt_exceeds: num(c, 1) == Some(0),
            cap: num(c, 1),
            ..window_and_prompt(c, 0, 2)
        },
    ),
    // 0.32: the engine's own check of the prompt.
    (
        &[
            Text("Input length ("),
            Num,
            Text(") exceeds model's maximum context length ("),
            Num,
            Text(")."),
        ],
        |c| WindowError::prompt_over(num(c, 1), num(c, 0)),
    ),
    // 0.11 chat: prompt + cap exceed the window.
    (
        &[
            Text("'max_tokens' or 'max_completion_tokens' is too large: "),
            Num,
            Text(". "),
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens and your request has "),
            Num,
            Text(" input tokens ("),
            Num,
            Text(" > "),
            Num,
            Text(" - "),
            Num,
            Text(")."),
        ],
        |c| WindowError {
            context: num(c, 1),
            prompt: num(c, 2),
            prompt_exact: true,
            cap: num(c, 0),
            ..WindowError::default()
        },
    ),
    // 0.11: the prompt is at least the limit it was checked against — the window in chat
    // (P >= C), the window less the cap in completions; which one, the message does not say.
    (
        &[
            Text(MAX_MODEL_LEN),
            Num,
            Text(" tokens. However, your request has "),
            Num,
            Text(" input tokens. Please reduce the length of the input messages."),
        ],
        |c| WindowError {
            limit: num(c, 0),
            prompt: num(c, 1),
            prompt_exact: true,
            ..WindowError::default()
        },
    ),
];

/// The window error in a vLLM error message.
pub(super) fn window_error(message: &str) -> Option<WindowError> {
    first_match(message, WORDINGS)
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn e(message: &str) -> WindowError {
        window_error(message).unwrap_or_else(|| panic!("not recognised: {message}"))
    }

    #[test]
    fn vllm_0_32_prompt_too_long() {
        let w = e("This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)");
        assert_eq!(w.context, Some(4096));
        assert_eq!(
            (w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(4097), false, true)
        );
        let w = e("This model's maximum context length is 4096 tokens. However, your prompt contains 5009 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.");
        assert_eq!((w.prompt, w.prompt_exact), (Some(5009), true));
        let w = e("This model's maximum context length is 4096 tokens. However, your prompt contains 90000 characters (more than 81920 characters, which is the upper bound for 4096 input tokens). Please reduce the length of the input prompt. (parameter=input_text, value=90000)");
        assert_eq!(
            (w.context, w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(4096), Some(4097), false, true)
        );
        let w = e("Input length (5000) exceeds model's maximum context length (4096).");
        assert_eq!(
            (w.context, w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(4096), Some(5000), true, true)
        );
    }

    #[test]
    fn vllm_cap_alone_each_field() {
        for (i, field) in CAPS.iter().enumerate() {
            let w = e(&format!("{field}=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter={field}, value=32000)"));
            assert_eq!(
                (w.context, w.cap, w.prompt, w.prompt_exceeds),
                (Some(4096), Some(32000), None, false),
                "{i}"
            );
        }
    }

    #[test]
    fn vllm_0_31_prompt_plus_cap() {
        let w = e("This model's maximum context length is 512 tokens. However, you requested 200 output tokens and your prompt contains at least 313 input tokens, for a total of at least 513 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=313)");
        assert_eq!(
            (w.context, w.cap, w.prompt, w.prompt_exact, w.prompt_exceeds),
            (Some(512), Some(200), Some(313), false, false)
        );
    }

    #[test]
    fn vllm_0_31_counter_and_characters() {
        let w = e("This model's maximum context length is 4096 tokens. However, you requested 0 output tokens and your prompt contains at least 4097 input tokens, for a total of at least 4097 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=4097)");
        assert_eq!(
            (w.prompt, w.prompt_exceeds, w.cap),
            (Some(4097), true, Some(0))
        );
        let w = e("This model's maximum context length is 4096 tokens. However, you requested 96 output tokens and your prompt contains 90000 characters (more than 80000 characters, which is the upper bound for 4000 input tokens). Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_text, value=90000)");
        assert_eq!(
            (w.context, w.prompt, w.prompt_exact, w.prompt_exceeds, w.cap),
            (Some(4096), Some(4001), false, false, Some(96))
        );
    }

    #[test]
    fn vllm_0_11() {
        let w = e("'max_tokens' or 'max_completion_tokens' is too large: 200. This model's maximum context length is 512 tokens and your request has 430 input tokens (200 > 512 - 430).");
        assert_eq!(
            (w.context, w.cap, w.prompt, w.prompt_exact),
            (Some(512), Some(200), Some(430), true)
        );
        let w = e("This model's maximum context length is 312 tokens. However, your request has 430 input tokens. Please reduce the length of the input messages.");
        assert_eq!(
            (w.context, w.limit, w.prompt, w.prompt_exceeds),
            (None, Some(312), Some(430), false)
        );
    }

    #[test]
    fn look_alikes_are_not_window_errors() {
        for m in [
            "truncate_prompt_tokens=5000 cannot be greater than max_model_len = 4096. Please request a smaller truncation size.",
            "This model's maximum context length is 4096 tokens.",
            "This model's maximum context length is 4096 tokens. However, your prompt contains many input tokens, which exceeds this limit even without any output tokens.",
            "max_tokens=-1 cannot be greater than max_model_len=4096. Please request fewer output tokens.",
            "temperature=5 cannot be greater than max_model_len=4096. Please request fewer output tokens.",
            "Error: This model's maximum context length is 4096 tokens. However, your prompt contains 5000 input tokens, which exceeds this limit even without any output tokens.",
            "",
        ] {
            assert_eq!(window_error(m), None, "{m}");
        }
    }
}
