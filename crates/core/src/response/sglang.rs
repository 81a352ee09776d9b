//! SGLang's window errors (its `TokenizerManager` and chat serving; the message of its
//! `{"object":"error",…}` body).

use super::window::{matches, Piece::*, WindowError};

/// The window error in an SGLang error message.
pub fn window_error(message: &str) -> Option<WindowError> {
    if let Some(c) = matches(
        message,
        &[
            Text("The input ("),
            Num,
            Text(" tokens) is longer than the model's context length ("),
            Num,
            Text(" tokens)."),
        ],
    ) {
        return Some(WindowError {
            context: Some(c[1].value),
            prompt: Some(c[0].value),
            prompt_exact: true,
            prompt_exceeds: true,
            ..WindowError::default()
        });
    }
    if let Some(c) = matches(
        message,
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
    ) {
        return Some(WindowError {
            context: Some(c[0].value),
            prompt: Some(c[2].value),
            prompt_exact: true,
            cap: Some(c[3].value),
            ..WindowError::default()
        });
    }
    if let Some(c) = matches(
        message,
        &[
            Text("max_completion_tokens is too large: "),
            Num,
            Text(".This model supports at most "),
            Num,
            Text(" completion tokens."),
        ],
    ) {
        return Some(WindowError {
            context: Some(c[1].value),
            cap: Some(c[0].value),
            ..WindowError::default()
        });
    }
    None
}

#[cfg(test)]
mod tests {
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
