//! From a count to a decision: resolves the window, applies the rule, and produces the
//! rewritten body, the unchanged verdict, or the rejection (docs/spec.md §2, §5, §7).

use super::config::{Config, OnInsufficient};
use super::reason::Reason;
use super::request::Request;
use super::rewrite::{splice_edit, Edit};
pub use super::rule::Inputs;
use super::rule::{evaluate, Verdict};

/// Where P came from (the `x-incontext-source` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Exact,
    Cache,
    Estimate,
    /// An upper bound that proved the outcome without a count (docs/spec.md §15).
    Bound,
    /// A lower bound: the server said the prompt has at least this many tokens (a counter
    /// that refused it as too long).
    AtLeast,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Exact => "exact",
            Source::Cache => "cache",
            Source::Estimate => "estimate",
            Source::Bound => "bound",
            Source::AtLeast => "at_least",
        }
    }
}

/// A prompt count and what came with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub tokens: u64,
    pub source: Source,
    /// The tokenizer's `max_model_len`, when this count came from it.
    pub max_model_len: Option<u64>,
}

/// What to do with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Replace the head of the body: `edit.apply(body)` is the whole new body.
    Rewrite {
        edit: Edit,
        value: u64,
    },
    Unchanged(Reason),
    /// Answer 400 with this body.
    Reject {
        body: Vec<u8>,
    },
}

/// The outcome plus the prompt count that led to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub prompt: u64,
    pub source: Source,
    /// What the rule was given, when it ran (W and C were known).
    pub inputs: Option<Inputs>,
}

/// Resolves (W, C): configured, or from a learned context length. C falls back to W when
/// unknown (W ≤ C, so the truncation limit is then only stricter).
pub fn window(config: &Config, learned: Option<u64>) -> Result<(u64, u64), Reason> {
    if let Some(c) = config.context_length {
        return Ok((config.window().unwrap_or(c), c));
    }
    if let Some(c) = learned {
        let w = config.window_with(c);
        return match config.check_against(w) {
            Ok(()) => Ok((w, c)),
            Err(_) => Err(Reason::WindowConfig),
        };
    }
    match config.window_tokens {
        Some(w) => Ok((w, w)),
        None => Err(Reason::NoWindow),
    }
}

/// Decides a request given its count. `learned` is a context length learned earlier (used
/// when the count did not bring one and `context_length` is not configured).
pub fn decide(
    req: &Request,
    body: &[u8],
    config: &Config,
    count: Count,
    learned: Option<u64>,
) -> Decision {
    let exact = count.source != Source::Estimate;
    let mut prompt = count.tokens;
    if !exact {
        prompt = prompt.max(1);
    }
    let unchanged = |reason, prompt| Decision {
        outcome: Outcome::Unchanged(reason),
        prompt,
        source: count.source,
        inputs: None,
    };
    let (w, c) = match window(config, count.max_model_len.or(learned)) {
        Ok(wc) => wc,
        Err(reason) => return unchanged(reason, prompt),
    };
    if exact {
        if let Some(t) = req.truncate {
            if t < prompt && req.text_only(body) {
                prompt = t;
            }
        }
    }
    let inputs = Inputs {
        exact,
        cap: req.cap.map(|c| c.value),
        truncate: req.truncate,
        ..Inputs::of(config, (w, c), prompt)
    };
    let outcome = match evaluate(&inputs) {
        Verdict::Rewrite(value) => match req.form.companion_edit(req, body, value) {
            Ok(replace) => {
                let (target, field) = req.target();
                let replace = replace.as_ref().map(|(i, v)| (*i, v.as_slice()));
                let edit = splice_edit(
                    body,
                    &req.members,
                    &req.cap_members,
                    target,
                    field,
                    value,
                    replace,
                );
                Outcome::Rewrite { edit, value }
            }
            Err(reason) => Outcome::Unchanged(reason),
        },
        Verdict::Insufficient { value, required } => {
            if exact && config.on_insufficient == OnInsufficient::Reject {
                Outcome::Reject {
                    body: req.form.reject_body(w, prompt, value, required),
                }
            } else {
                Outcome::Unchanged(Reason::Insufficient)
            }
        }
    };
    Decision {
        outcome,
        prompt,
        source: count.source,
        inputs: Some(inputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::analyze;
    use serde_json::Value;

    fn cfg(extra: &str) -> Config {
        Config::parse(format!(r#"{{"tokenizer":{{"cluster":"v"}}{extra}}}"#).as_bytes()).unwrap()
    }

    fn run(config: &Config, body: &str, tokens: u64, source: Source, mml: Option<u64>) -> Decision {
        let req = analyze(body.as_bytes(), config).unwrap();
        decide(
            &req,
            body.as_bytes(),
            config,
            Count {
                tokens,
                source,
                max_model_len: mml,
            },
            None,
        )
    }

    fn rewritten(body: &str, d: &Decision) -> (Value, u64) {
        match &d.outcome {
            Outcome::Rewrite { edit, value } => (
                serde_json::from_slice(&edit.apply(body.as_bytes())).unwrap(),
                *value,
            ),
            other => panic!("not rewritten: {other:?}"),
        }
    }

    const CHAT: &str =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":65536}"#;

    #[test]
    fn exact_rewrite_and_boundary() {
        let c = cfg(r#","context_length":32768"#);
        let (v, value) = rewritten(
            CHAT,
            &run(&c, CHAT, 32768 - 4096, Source::Exact, Some(32768)),
        );
        assert_eq!(value, 4096);
        assert_eq!(v["max_tokens"], 4096);
        let d = run(&c, CHAT, 32768 - 4095, Source::Exact, Some(32768));
        assert_eq!(d.outcome, Outcome::Unchanged(Reason::Insufficient));
        assert_eq!(d.prompt, 32768 - 4095);
    }

    #[test]
    fn estimate_uses_margin_and_never_rejects() {
        let c = cfg(r#","context_length":32768,"on_insufficient":"reject""#);
        let (_, value) = rewritten(CHAT, &run(&c, CHAT, 0, Source::Estimate, None));
        assert_eq!(value, 32768 - 1 - 1024);
        let d = run(&c, CHAT, 30000, Source::Estimate, None);
        assert_eq!(d.outcome, Outcome::Unchanged(Reason::Insufficient));
        let d = run(&c, CHAT, 30000, Source::Exact, Some(32768));
        match d.outcome {
            Outcome::Reject { body } => {
                let v: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(v["error"]["code"], "context_length_exceeded");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn learned_window() {
        let c = cfg(r#","min_output_tokens":100,"fallback_margin_tokens":10"#);
        let (_, value) = rewritten(CHAT, &run(&c, CHAT, 400, Source::Exact, Some(512)));
        assert_eq!(value, 112);
        // estimate without any learned window: unchanged
        let d = run(&c, CHAT, 400, Source::Estimate, None);
        assert_eq!(d.outcome, Outcome::Unchanged(Reason::NoWindow));
        // learned window too small for F + R
        let d = run(&c, CHAT, 1, Source::Exact, Some(110));
        assert_eq!(d.outcome, Outcome::Unchanged(Reason::WindowConfig));
    }

    #[test]
    fn truncate_lowers_count_and_limits_value() {
        let c = cfg(r#","context_length":1000,"min_output_tokens":10,"fallback_margin_tokens":10"#);
        let body = r#"{"messages":[{"role":"user","content":"x"}],"truncate_prompt_tokens":900}"#;
        let d = run(&c, body, 5000, Source::Exact, Some(1000));
        assert_eq!(d.prompt, 900);
        assert_eq!(rewritten(body, &d).1, 100);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::json::scan::scan;
    use crate::request::analyze;
    use proptest::prelude::*;

    fn member() -> impl Strategy<Value = (String, String)> {
        let key = prop_oneof![
            Just("max_tokens"),
            Just("max_completion_tokens"),
            Just("max_output_tokens"),
            Just("model"),
            Just("stream"),
            Just("temperature"),
        ];
        let value = prop_oneof![
            Just("5"),
            Just("\"7\""),
            Just("0"),
            Just("null"),
            Just("true"),
            Just("1e400"),
            Just("[1, {\"x\": \"y\"}]"),
            Just("\"m\""),
            Just("65536"),
        ];
        (key, value).prop_map(|(k, v)| (k.to_string(), v.to_string()))
    }

    proptest! {
        /// Any mix of members around `messages`: the rewrite parses, has exactly one cap,
        /// keeps every other member byte for byte and in order, and is idempotent.
        #[test]
        fn rewrite_keeps_everything_else(before in proptest::collection::vec(member(), 0..4),
                                         after in proptest::collection::vec(member(), 0..4),
                                         spaces in 0usize..3, tokens in 0u64..40_000) {
            let ws = " ".repeat(spaces);
            let mut parts: Vec<String> = before.iter().map(|(k, v)| format!("\"{k}\":{ws}{v}")).collect();
            parts.push("\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]".to_string());
            parts.extend(after.iter().map(|(k, v)| format!("\"{k}\":{ws}{v}")));
            let body = format!("{{{ws}{}{ws}}}", parts.join(&format!(",{ws}")));
            let config = Config::parse(br#"{"tokenizer":{"cluster":"v"},"context_length":32768,"min_output_tokens":10,"fallback_margin_tokens":0}"#).unwrap();
            let req = analyze(body.as_bytes(), &config).unwrap();
            let count = Count { tokens, source: Source::Exact, max_model_len: Some(32768) };
            let d = decide(&req, body.as_bytes(), &config, count, None);
            let Outcome::Rewrite { edit, value } = d.outcome else { return Ok(()) };
            let out = edit.apply(body.as_bytes());
            let _valid: &serde_json::value::RawValue = serde_json::from_slice(&out).unwrap();
            let caps = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
            let out_members = scan(&out).unwrap();
            let cap_members: Vec<_> = out_members.iter().filter(|m| caps.contains(&m.key.as_str())).collect();
            prop_assert_eq!(cap_members.len(), 1);
            let written = value.to_string();
            prop_assert_eq!(&out[cap_members[0].value.clone()], written.as_bytes());
            let others = |text: &[u8]| -> Vec<(String, Vec<u8>)> {
                scan(text).unwrap().into_iter().filter(|m| !caps.contains(&m.key.as_str()))
                    .map(|m| (m.key.clone(), text[m.value.clone()].to_vec())).collect()
            };
            prop_assert_eq!(others(body.as_bytes()), others(&out));
            let req2 = analyze(&out, &config).unwrap();
            let d2 = decide(&req2, &out, &config, count, None);
            let Outcome::Rewrite { edit: edit2, .. } = d2.outcome else { panic!("second pass not rewritten") };
            prop_assert_eq!(edit2.apply(&out), out);
        }
    }
}
