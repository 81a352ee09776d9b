//! A server's window error (docs/spec.md §13): what the server said about the window, read
//! from a 4xx body by the wording of the backend that answered. Each backend's wordings live
//! in its module (`backend::vllm`, `sglang`, `llamacpp`); this module holds what they share:
//! the error's facts, where the message sits in the body, and a small template matcher.

use crate::config::Backend;
use serde_json::Value;

/// What a window error tells. Numbers the server did not name are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowError {
    /// C: the context length the server named.
    pub context: Option<u64>,
    /// A prompt limit the server named that is not C (vLLM 0.11's completions check the
    /// prompt against C − B and call that "the maximum context length").
    pub limit: Option<u64>,
    /// P as the server named it.
    pub prompt: Option<u64>,
    /// Whether `prompt` is the whole count (else a lower bound: "at least").
    pub prompt_exact: bool,
    /// The server says the prompt alone exceeds the window.
    pub prompt_exceeds: bool,
    /// B as the server named it.
    pub cap: Option<u64>,
}

impl WindowError {
    /// The prompt alone, `prompt` tokens counted exactly, exceeds the window `context`.
    pub fn prompt_over(context: Option<u64>, prompt: Option<u64>) -> WindowError {
        WindowError {
            context,
            prompt,
            prompt_exact: true,
            prompt_exceeds: true,
            ..WindowError::default()
        }
    }
}

/// The window error in an error body, by the wording of `backend`; `None` for any other
/// body (other errors, look-alikes, bodies that are not JSON).
pub fn parse(backend: Backend, body: &[u8]) -> Option<WindowError> {
    let value: Value = serde_json::from_slice(body).ok()?;
    crate::backend::window_error(backend, &value)
}

/// The error message: `error.message` (OpenAI's shape, and Anthropic's, which vLLM also
/// answers on `/v1/messages`), or a top-level `message` (SGLang's `{"object":"error",…}`).
pub fn message(value: &Value) -> Option<&str> {
    let error = value.get("error");
    error
        .and_then(|e| e.get("message"))
        .or_else(|| {
            value
                .get("message")
                .filter(|_| error.is_none_or(Value::is_string))
        })
        .and_then(Value::as_str)
}

/// One piece of a wording.
#[derive(Debug, Clone, Copy)]
pub enum Piece {
    /// Literal text.
    Text(&'static str),
    /// An unsigned integer.
    Num,
    /// An unsigned integer, maybe preceded by "at least " (a lower bound).
    AtLeast,
    /// One of these literal alternatives (its index is captured).
    OneOf(&'static [&'static str]),
}

/// A captured value: a number (with whether "at least" preceded it) or an alternative's
/// index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    pub value: u64,
    pub at_least: bool,
}

/// One wording a server gives a window error: its pieces, and the error its captures make.
pub type Wording = (&'static [Piece], fn(&[Capture]) -> WindowError);

/// The error of the first of `wordings` that `message` matches.
pub fn first_match(message: &str, wordings: &[Wording]) -> Option<WindowError> {
    wordings
        .iter()
        .find_map(|(pieces, error)| matches(message, pieces).map(|c| error(&c)))
}

/// Matches `text` against `pieces` from its start; whatever follows the last piece is
/// ignored (vLLM appends " (parameter=…, value=…)"). The captures in order.
pub fn matches(text: &str, pieces: &[Piece]) -> Option<Vec<Capture>> {
    let mut rest = text;
    let mut out = Vec::new();
    for piece in pieces {
        match *piece {
            Piece::Text(t) => rest = rest.strip_prefix(t)?,
            Piece::Num | Piece::AtLeast => {
                let mut at_least = false;
                if matches!(piece, Piece::AtLeast) {
                    if let Some(r) = rest.strip_prefix("at least ") {
                        rest = r;
                        at_least = true;
                    }
                }
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                if digits == 0 || digits > 19 {
                    return None;
                }
                let value = rest.get(..digits)?.parse::<u64>().ok()?;
                rest = rest.get(digits..)?;
                out.push(Capture { value, at_least });
            }
            Piece::OneOf(alternatives) => {
                let (i, r) = alternatives
                    .iter()
                    .enumerate()
                    .find_map(|(i, a)| rest.strip_prefix(a).map(|r| (i, r)))?;
                rest = r;
                out.push(Capture {
                    value: i as u64,
                    at_least: false,
                });
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Piece::*;

    #[test]
    fn templates() {
        let t = [Text("a "), AtLeast, Text(" b "), Num, Text(".")];
        let c = matches("a at least 5 b 7. tail", &t).unwrap();
        assert_eq!(
            c,
            vec![
                Capture {
                    value: 5,
                    at_least: true
                },
                Capture {
                    value: 7,
                    at_least: false
                }
            ]
        );
        assert!(matches("a 5 b x.", &t).is_none());
        assert!(matches("a -5 b 7.", &t).is_none());
        assert!(matches("a 99999999999999999999 b 7.", &t).is_none());
        assert!(matches("xa 5 b 7.", &t).is_none());
        let c = matches(
            "max_completion_tokens=9",
            &[
                OneOf(&["max_tokens", "max_completion_tokens"]),
                Text("="),
                Num,
            ],
        )
        .unwrap();
        assert_eq!((c[0].value, c[1].value), (1, 9));
    }

    #[test]
    fn message_in_each_shape() {
        let v: Value = serde_json::from_str(r#"{"error":{"message":"m","code":400}}"#).unwrap();
        assert_eq!(message(&v), Some("m"));
        let v: Value =
            serde_json::from_str(r#"{"type":"error","error":{"type":"x","message":"a"}}"#).unwrap();
        assert_eq!(message(&v), Some("a"));
        let v: Value =
            serde_json::from_str(r#"{"object":"error","message":"s","code":400}"#).unwrap();
        assert_eq!(message(&v), Some("s"));
        let v: Value = serde_json::from_str(r#"{"error":{"message":7}}"#).unwrap();
        assert_eq!(message(&v), None);
        let v: Value = serde_json::from_str(r#"[1]"#).unwrap();
        assert_eq!(message(&v), None);
        assert_eq!(parse(Backend::Vllm, b"not json"), None);
    }
}
