//! The exact count (docs/spec.md §5): the `/tokenize` payload built from the request, the response
//! contract, and the cache key (docs/spec.md §6).

pub use super::dialect::payload;
use super::dialect::{responses, Form};
use super::request::Request;
use crate::digest::{digest, update_framed, update_framed_with};
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

/// Why a tokenizer answer could not be used (the `incontext_tokenizer_failures_<kind>` counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The call could not be dispatched.
    Dispatch,
    /// No response (connection reset, cluster unreachable without a status).
    Transport,
    /// Envoy answered 504: the call timed out.
    Timeout,
    /// Any other non-2xx status.
    Status,
    /// The body is not JSON.
    BadJson,
    /// `count` or `max_model_len` missing or of the wrong type.
    Contract,
    /// `max_model_len` differs from the configured `context_length`.
    Mismatch,
}

impl Failure {
    pub const ALL: [Failure; 7] = [
        Failure::Dispatch,
        Failure::Transport,
        Failure::Timeout,
        Failure::Status,
        Failure::BadJson,
        Failure::Contract,
        Failure::Mismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Dispatch => "dispatch",
            Failure::Transport => "transport",
            Failure::Timeout => "timeout",
            Failure::Status => "status",
            Failure::BadJson => "bad_json",
            Failure::Contract => "contract",
            Failure::Mismatch => "mismatch",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What the tokenizer told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub count: u64,
    pub max_model_len: u64,
}

/// The HTTP status gate every tokenizer answer passes first; `None` when there was no
/// response.
pub fn check_status(status: Option<u16>) -> Result<(), Failure> {
    match status {
        None => Err(Failure::Transport),
        Some(504) => Err(Failure::Timeout),
        Some(s) if !(200..300).contains(&s) => Err(Failure::Status),
        Some(_) => Ok(()),
    }
}

/// Checks a `/tokenize` answer's body (its status passed) against the contract.
pub fn parse_reply(body: &[u8]) -> Result<Reply, Failure> {
    #[derive(serde::Deserialize)]
    struct Raw {
        count: Option<Value>,
        max_model_len: Option<Value>,
    }
    // Valid UTF-8 throughout: serde skips ignored members without checking their bytes.
    if std::str::from_utf8(body).is_err() {
        return Err(Failure::BadJson);
    }
    // The reply must be an object (a derived struct would also accept an array of fields).
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => Failure::Contract,
                Err(_) => Failure::BadJson,
            },
        );
    }
    let raw: Raw = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            Failure::Contract // valid JSON of another shape (an array, a string…)
        } else {
            Failure::BadJson
        }
    })?;
    let count = raw
        .count
        .as_ref()
        .and_then(Value::as_u64)
        .ok_or(Failure::Contract)?;
    let max_model_len = raw
        .max_model_len
        .as_ref()
        .and_then(Value::as_u64)
        .filter(|m| *m > 0)
        .ok_or(Failure::Contract)?;
    Ok(Reply {
        count,
        max_model_len,
    })
}

/// A reply (fresh or cached) must match the configured context length.
pub fn check_context(max_model_len: u64, context_length: Option<u64>) -> Result<(), Failure> {
    match context_length {
        Some(c) if c != max_model_len => Err(Failure::Mismatch),
        _ => Ok(()),
    }
}

/// The cache key: a 128-bit hash of everything the payload is built from (the raw request
/// slices, so a hit never builds the payload; a long one as its digest), the tokenizer route
/// and C.
pub fn cache_key(req: &Request, body: &[u8], route: &str, context_length: Option<u64>) -> u128 {
    cache_key_with(req, body, route, context_length, &[])
}

/// A long member value whose digest (`digest::digest` of its bytes) was made before: its
/// bytes need not be in the body the key is made from (a body read in part, `flow::partial`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub span: std::ops::Range<usize>,
    pub digest: u128,
}

/// [`cache_key`], a value whose span is `known` hashed as its known digest.
pub fn cache_key_with(
    req: &Request,
    body: &[u8],
    route: &str,
    context_length: Option<u64>,
    known: &[Known],
) -> u128 {
    let f = &req.fields;
    let mut h = Xxh3::new();
    let field = |h: &mut Xxh3, tag: u8, bytes: &[u8]| {
        h.update(&[tag]);
        update_framed(h, bytes);
    };
    field(&mut h, 0, route.as_bytes());
    field(&mut h, 1, &context_length.unwrap_or(0).to_le_bytes());
    field(&mut h, 2, &[req.form as u8]);
    if req.form == Form::Responses {
        for part in responses::key_parts(req, body) {
            field(&mut h, 16, part);
        }
        return h.digest128();
    }
    let parts = [
        f.model,
        f.messages,
        f.prompt,
        f.tools,
        f.add_generation_prompt,
        f.continue_final_message,
        f.add_special_tokens,
        f.chat_template,
        f.chat_template_kwargs,
        f.media_io_kwargs,
        f.mm_processor_kwargs,
        f.documents,
        f.reasoning_effort,
        f.tool_choice,
        f.system,
        f.thinking,
        f.output_config,
    ];
    for (i, idx) in parts.into_iter().enumerate() {
        let span = idx.and_then(|m| req.members.get(m)).map(|m| &m.value);
        match span.and_then(|s| body.get(s.clone())) {
            Some(bytes) => {
                h.update(&[16 + i as u8]);
                let made = known.iter().find(|k| Some(&k.span) == span);
                update_framed_with(&mut h, bytes, |b| {
                    made.map_or_else(|| digest(b), |k| k.digest)
                });
            }
            None => field(&mut h, 64 + i as u8, b""),
        }
    }
    h.digest128()
}

#[cfg(test)]
mod reply_tests {
    use super::*;

    #[test]
    fn invalid_utf8_in_an_ignored_member_is_bad_json() {
        let body = b"{\"t\":\"t\xf0ken\",\"count\":6,\"max_model_len\":512}";
        assert_eq!(parse_reply(body), Err(Failure::BadJson));
        let ok = br#"{"t":"token","count":6,"max_model_len":512}"#;
        assert_eq!(parse_reply(ok).map(|r| r.count), Ok(6));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::request::analyze;

    fn req(body: &str) -> Request {
        analyze(
            body.as_bytes(),
            &Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap(),
        )
        .unwrap()
    }

    fn payload_of(body: &str) -> String {
        String::from_utf8(payload(&req(body), body.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn chat_payload_order_and_defaults() {
        let body = r#"{"stream":true, "messages": [ {"role":"user", "content":"你好 \u00e9"} ], "model":"m",
            "max_tokens":9, "chat_template_kwargs":{"x":1}, "add_special_tokens":false, "tools":[]}"#;
        assert_eq!(
            payload_of(body),
            r#"{"model":"m","messages":[{"role":"user","content":"你好 é"}],"tools":[],"add_generation_prompt":true,"add_special_tokens":false,"chat_template_kwargs":{"x":1}}"#
        );
    }

    #[test]
    fn folds_reasoning_effort_and_documents() {
        let body = r#"{"model":"m","messages":[],"reasoning_effort":"none","documents":[{"t":"d"}],"chat_template_kwargs":{"z":0}}"#;
        assert_eq!(
            payload_of(body),
            r#"{"model":"m","messages":[],"add_generation_prompt":true,"chat_template_kwargs":{"z":0,"documents":[{"t":"d"}],"reasoning_effort":"none","enable_thinking":false}}"#
        );
        let body = r#"{"messages":[],"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false,"reasoning_effort":"low"}}"#;
        assert_eq!(
            payload_of(body),
            r#"{"messages":[],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false,"reasoning_effort":"high"}}"#
        );
        let body = r#"{"messages":[],"reasoning_effort":"low"}"#;
        assert_eq!(
            payload_of(body),
            r#"{"messages":[],"add_generation_prompt":true,"chat_template_kwargs":{"reasoning_effort":"low","enable_thinking":true}}"#
        );
    }

    #[test]
    fn renames_reasoning_content() {
        let body = r#"{"messages":[{"role":"assistant","reasoning":null,"content":"a","reasoning_content":"r"},
            {"role":"assistant","reasoning":"kept","reasoning_content":"x"}],"add_generation_prompt":false}"#;
        assert_eq!(
            payload_of(body),
            r#"{"messages":[{"role":"assistant","content":"a","reasoning":"r"},{"role":"assistant","reasoning":"kept","reasoning_content":"x"}],"add_generation_prompt":false}"#
        );
    }

    #[test]
    fn completion_payload() {
        assert_eq!(
            payload_of(
                r#"{"model":"m","prompt":"hi","max_tokens":5,"add_special_tokens":true,"echo":true}"#
            ),
            r#"{"model":"m","prompt":"hi","add_special_tokens":true}"#
        );
        assert_eq!(
            payload_of(r#"{"prompt":["hi"],"max_tokens":5}"#),
            r#"{"prompt":"hi"}"#
        );
    }

    #[test]
    fn reply_contract() {
        assert_eq!(
            parse_reply(br#"{"count":5,"max_model_len":512,"tokens":[1]}"#),
            Ok(Reply {
                count: 5,
                max_model_len: 512
            })
        );
        assert_eq!(
            parse_reply(br#"{"count":0,"max_model_len":512}"#),
            Ok(Reply {
                count: 0,
                max_model_len: 512
            })
        );
        assert_eq!(check_context(512, Some(512)), Ok(()));
        assert_eq!(check_context(512, None), Ok(()));
        assert_eq!(check_context(512, Some(1024)), Err(Failure::Mismatch));
        assert_eq!(check_status(None), Err(Failure::Transport));
        assert_eq!(check_status(Some(504)), Err(Failure::Timeout));
        for status in [199, 300, 404, 500, 503] {
            assert_eq!(check_status(Some(status)), Err(Failure::Status), "{status}");
        }
        for status in [200, 201, 299] {
            assert_eq!(check_status(Some(status)), Ok(()), "{status}");
        }
        assert_eq!(parse_reply(b"<html>"), Err(Failure::BadJson));
        assert_eq!(parse_reply(b""), Err(Failure::BadJson));
        for bad in [
            r#"{"count":-1,"max_model_len":512}"#,
            r#"{"count":true,"max_model_len":512}"#,
            r#"{"count":1.5,"max_model_len":512}"#,
            r#"{"count":"5","max_model_len":512}"#,
            r#"{"count":5,"max_model_len":0}"#,
            r#"{"count":5}"#,
            r#"{"max_model_len":5}"#,
            r#"[1]"#,
            r#"[5, 32768]"#,
            "null",
            r#""x""#,
        ] {
            assert_eq!(parse_reply(bad.as_bytes()), Err(Failure::Contract), "{bad}");
        }
    }

    #[test]
    fn cache_key_depends_on_inputs_not_on_caps() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5}"#;
        let b = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"stream":true}"#;
        let c = r#"{"model":"m","messages":[{"role":"user","content":"y"}],"max_tokens":5}"#;
        let key = |s: &str, route: &str, ctx| cache_key(&req(s), s.as_bytes(), route, ctx);
        assert_eq!(key(a, "r", None), key(b, "r", None));
        assert_ne!(key(a, "r", None), key(c, "r", None));
        assert_ne!(key(a, "r", None), key(a, "r2", None));
        assert_ne!(key(a, "r", None), key(a, "r", Some(512)));
    }

    #[test]
    fn failure_names() {
        for (i, f) in Failure::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
            assert!(!f.as_str().is_empty());
        }
    }
}
