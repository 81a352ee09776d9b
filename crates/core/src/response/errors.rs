//! The window-full signal in each client dialect (docs/spec.md §13): the bodies agents
//! recognise. Only numbers are interpolated, so no text needs JSON escaping.

/// Which error shape the client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Anthropic Messages: Claude Code compacts on "prompt is too long" and lowers
    /// `max_tokens` on "input length and `max_tokens` exceed context limit".
    Anthropic,
    /// OpenAI chat and completions: `context_length_exceeded`, `param` `messages`.
    OpenAi,
    /// OpenAI Responses: `context_length_exceeded`, `param` `input`.
    Responses,
}

impl Dialect {
    /// The error shape of a request form.
    pub fn of(form: crate::dialect::Form) -> Dialect {
        use crate::dialect::Form;
        match form {
            Form::Messages => Dialect::Anthropic,
            Form::Responses => Dialect::Responses,
            Form::Chat | Form::Completion => Dialect::OpenAi,
        }
    }
}

/// The prompt alone is longer than the window C.
pub fn prompt_too_long(dialect: Dialect, prompt: u64, context: u64) -> Vec<u8> {
    match dialect {
        Dialect::Anthropic => anthropic(&format!(
            "prompt is too long: {prompt} tokens > {context} maximum"
        )),
        _ => openai(
            dialect,
            &format!(
                "This model's maximum context length is {context} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."
            ),
        ),
    }
}

/// Prompt P and cap B together exceed the window C.
pub fn prompt_and_cap_too_long(dialect: Dialect, prompt: u64, cap: u64, context: u64) -> Vec<u8> {
    match dialect {
        Dialect::Anthropic => anthropic(&format!(
            "input length and `max_tokens` exceed context limit: {prompt} + {cap} > {context}, decrease input length or `max_tokens` and try again"
        )),
        _ => openai(
            dialect,
            &format!(
                "This model's maximum context length is {context} tokens. However, your messages resulted in {} tokens ({prompt} in the messages, {cap} in the completion). Please reduce the length of the messages or completion.",
                prompt.saturating_add(cap)
            ),
        ),
    }
}

/// Reject mode's answer in an OpenAI dialect (docs/spec.md §7, §14): fewer than `required`
/// output tokens are left in the window W. The prompt alone when P ≥ W, else the prompt and
/// the required output.
pub fn no_room(dialect: Dialect, window: u64, prompt: u64, required: u64) -> Vec<u8> {
    if prompt >= window {
        prompt_too_long(dialect, prompt, window)
    } else {
        prompt_and_cap_too_long(dialect, prompt, required, window)
    }
}

fn anthropic(message: &str) -> Vec<u8> {
    format!(
        r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"{message}"}}}}"#
    )
    .into_bytes()
}

/// OpenAI's error object with `code` `context_length_exceeded`.
pub fn openai(dialect: Dialect, message: &str) -> Vec<u8> {
    let param = match dialect {
        Dialect::Responses => "input",
        _ => "messages",
    };
    format!(
        r#"{{"error":{{"message":"{message}","type":"invalid_request_error","param":"{param}","code":"context_length_exceeded"}}}}"#
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn anthropic_bodies() {
        let v = json(&prompt_too_long(Dialect::Anthropic, 5009, 4096));
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            "prompt is too long: 5009 tokens > 4096 maximum"
        );
        let v = json(&prompt_and_cap_too_long(
            Dialect::Anthropic,
            3000,
            2000,
            4096,
        ));
        assert_eq!(
            v["error"]["message"],
            "input length and `max_tokens` exceed context limit: 3000 + 2000 > 4096, decrease input length or `max_tokens` and try again"
        );
    }

    #[test]
    fn openai_bodies() {
        for (d, param) in [(Dialect::OpenAi, "messages"), (Dialect::Responses, "input")] {
            let v = json(&prompt_too_long(d, 5009, 4096));
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            assert_eq!(v["error"]["param"], param);
            assert_eq!(
                v["error"]["message"],
                "This model's maximum context length is 4096 tokens. However, your messages resulted in 5009 tokens. Please reduce the length of the messages."
            );
            let v = json(&prompt_and_cap_too_long(d, 3000, 2000, 4096));
            assert_eq!(
                v["error"]["message"],
                "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens (3000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion."
            );
        }
    }

    #[test]
    fn reject_mode_answers_openai_s_window_error() {
        for (d, param) in [(Dialect::OpenAi, "messages"), (Dialect::Responses, "input")] {
            let v = json(&no_room(d, 4096, 4000, 4096));
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["param"], param);
            assert_eq!(v["error"]["type"], "invalid_request_error");
            assert_eq!(
                v["error"]["message"],
                "This model's maximum context length is 4096 tokens. However, your messages resulted in 8096 tokens (4000 in the messages, 4096 in the completion). Please reduce the length of the messages or completion."
            );
            for prompt in [4096, 5009] {
                let v = json(&no_room(d, 4096, prompt, 4096));
                assert_eq!(
                    v["error"]["message"],
                    format!("This model's maximum context length is 4096 tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages.")
                );
            }
        }
    }
}
