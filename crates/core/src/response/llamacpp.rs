//! llama.cpp's window error: `llama-server` answers a prompt that does not fit the slot's
//! context with 400 `{"error":{"type":"exceed_context_size_error","n_prompt_tokens":P,
//! "n_ctx":C,…}}` (the prompt alone is checked: `P >= n_ctx`; a cap is never refused). The
//! numbers are read from their members, never from the message.

use super::window::WindowError;
use serde_json::Value;

/// The window error in a llama.cpp error body.
pub fn window_error(body: &Value) -> Option<WindowError> {
    let error = body.get("error")?;
    if error.get("type")?.as_str()? != "exceed_context_size_error" {
        return None;
    }
    let prompt = error.get("n_prompt_tokens")?.as_u64()?;
    let context = error.get("n_ctx")?.as_u64().filter(|c| *c > 0)?;
    Some(WindowError {
        context: Some(context),
        prompt: Some(prompt),
        prompt_exact: true,
        prompt_exceeds: true,
        ..WindowError::default()
    })
}

#[cfg(test)]
mod tests {
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
