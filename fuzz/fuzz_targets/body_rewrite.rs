//! Body scanner + rule + rewrite (docs/spec.md §2–§5, §7).
//!
//! Input: a 6-byte header that picks the count, the config and the learned window, then the
//! request body (see fuzz/README.md). Properties checked:
//! * nothing panics (analyze, estimate, text_only, target, payload, cache_key, decide);
//! * analyze (skimming messages and tools) + Request::validate agree with serde_json on what
//!   is a JSON object, with the same members as a full scan;
//! * the outcome (rewrite or not, and the value) matches a reference model of the rule built
//!   from docs/spec.md §2/§3, with the caller cap parsed by the reference lax parser;
//! * a rewritten body parses, is an object, has exactly one top-level cap field — the right
//!   name, written plainly, an integer equal to `value` — every non-cap top-level member is
//!   byte-identical (key, spacing and value) and in the same order, the text before the first
//!   member and after the last one is kept, and rewriting the output again with the same count
//!   gives the identical bytes;
//! * a rejection body is the OpenAI-style error; the tokenize payload, when built, is JSON;
//! * the same body as an Anthropic Messages request (docs/spec.md §10): a rewrite has exactly
//!   one `max_tokens`, equal to the value, keeps every other member but `thinking` byte for
//!   byte, and leaves an enabled thinking budget below the new cap; a rejection is Anthropic's
//!   "prompt is too long" error.
#![no_main]

mod common;

use common::{has_surrogate_escape, is_cap_field, json_value, ref_cap, show, CAP_FIELDS};
use incontext_core::config::Config;
use incontext_core::plan::{decide, Count, Decision, Outcome, Source};
use incontext_core::reason::Reason;
use incontext_core::dialect::{Endpoint, Form};
use incontext_core::request::{analyze, analyze_at, Counting, Request};
use incontext_core::json::scan::{scan, Member};
use incontext_core::tokenize::{cache_key, payload};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use std::sync::OnceLock;

const R: u64 = 100;
const F: u64 = 10;

/// The configs: 0 C=32768; 1 the same with on_insufficient=reject; 2 C unknown (learned);
/// 3 W=16384 < C=32768.
fn configs() -> &'static [Config; 4] {
    static CONFIGS: OnceLock<[Config; 4]> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let base = r#"{"tokenizer":{"cluster":"vllm"},"min_output_tokens":100,"fallback_margin_tokens":10"#;
        let parse = |extra: &str| {
            Config::parse(format!("{base}{extra}}}").as_bytes()).expect("fixed config parses")
        };
        [
            parse(r#","context_length":32768"#),
            parse(r#","context_length":32768,"on_insufficient":"reject""#),
            parse(""),
            parse(r#","context_length":32768,"window_tokens":16384"#),
        ]
    })
}

struct Setup {
    kind: usize,
    count: Count,
    learned: Option<u64>,
}

/// Header: byte 0 flags (bits 0-1 source, 2-3 config, 4 max_model_len present, 5-6 token
/// scale), bytes 1-4 a u32 (little endian), byte 5 the max_model_len / learned selector.
fn setup(h: &[u8]) -> Setup {
    let flags = h[0];
    let n = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
    let source = match flags & 3 {
        0 => Source::Exact,
        1 => Source::Cache,
        _ => Source::Estimate,
    };
    let kind = usize::from((flags >> 2) & 3);
    let tokens = match (flags >> 5) & 3 {
        0 => u64::from(n % 33_000),
        1 => u64::from(n),
        2 => u64::MAX - u64::from(n),
        _ => u64::from(n % 200),
    };
    let sel = h[5];
    let max_model_len = (flags & 0x10 != 0).then(|| match sel {
        0 => 32768,
        s => u64::from(s) * 128,
    });
    let learned = (sel & 1 == 1).then_some(32768);
    Setup {
        kind,
        count: Count {
            tokens,
            source,
            max_model_len,
        },
        learned,
    }
}

/// What the reference model expects.
#[derive(Debug, PartialEq)]
enum Expect {
    Rewrite { value: u64, field: &'static str },
    Unchanged(Reason),
    Reject,
}

fn raw<'a>(body: &'a [u8], m: &Member) -> &'a str {
    std::str::from_utf8(&body[m.value.clone()]).expect("member value is UTF-8")
}

/// The reference caller cap: the smallest valid value among each field's last occurrence;
/// ties go to the earlier field name.
fn ref_caller_cap(body: &[u8], members: &[Member]) -> Option<(u64, &'static str)> {
    let mut best: Option<(u64, &'static str)> = None;
    for field in CAP_FIELDS {
        let Some(m) = members.iter().rev().find(|m| m.key == field) else {
            continue;
        };
        if let Some(v) = ref_cap(raw(body, m)) {
            if best.is_none_or(|(b, _)| v < b) {
                best = Some((v, field));
            }
        }
    }
    best
}

fn expect(req: &Request, body: &[u8], s: &Setup) -> Expect {
    let count = s.count;
    let (w, c): (u64, u64) = match s.kind {
        0 | 1 => (32768, 32768),
        3 => (16384, 32768),
        _ => match count.max_model_len.or(s.learned) {
            None => return Expect::Unchanged(Reason::NoWindow),
            Some(c) if F + R >= c => return Expect::Unchanged(Reason::WindowConfig),
            Some(c) => (c, c),
        },
    };
    let exact = count.source != Source::Estimate;
    let mut p = if exact {
        count.tokens
    } else {
        count.tokens.max(1)
    };
    if exact {
        if let Some(t) = req.truncate {
            if t < p && req.text_only(body) {
                p = t;
            }
        }
    }
    let margin = if exact { 0 } else { F };
    let cap = ref_caller_cap(body, &req.members);
    let mut value = i128::from(w) - i128::from(p) - i128::from(margin);
    if let Some((b, _)) = cap {
        value = value.min(i128::from(b));
    }
    if let Some(t) = req.truncate {
        value = value.min(i128::from(c) - i128::from(t));
    }
    let required = cap.map_or(R, |(b, _)| b.min(R));
    if value >= i128::from(required) {
        let field = match cap {
            Some((_, "max_output_tokens")) if req.form == Form::Chat => "max_tokens",
            Some((_, f)) => f,
            None => "max_tokens",
        };
        Expect::Rewrite {
            value: u64::try_from(value).expect("value fits"),
            field,
        }
    } else if exact && s.kind == 1 {
        Expect::Reject
    } else {
        Expect::Unchanged(Reason::Insufficient)
    }
}

/// docs/spec.md §5 reference: the payload as a JSON value, built from the request as a JSON value.
fn ref_payload(v: &Map<String, Value>, form: Form) -> Option<Value> {
    let mut out = Map::new();
    if let Some(m) = v.get("model") {
        out.insert("model".into(), m.clone());
    }
    let copy = |out: &mut Map<String, Value>, key: &str| {
        if let Some(x) = v.get(key) {
            out.insert(key.into(), x.clone());
        }
    };
    match form {
        // Anthropic and Responses requests go to the backend's own counter: no payload.
        Form::Messages | Form::Responses => return None,
        Form::Completion => {
            let prompt = match v.get("prompt")? {
                Value::Array(items) if items.len() == 1 => items[0].clone(),
                p => p.clone(),
            };
            out.insert("prompt".into(), prompt);
            copy(&mut out, "add_special_tokens");
        }
        Form::Chat => {
            let messages = v.get("messages")?.as_array()?;
            let messages = messages
                .iter()
                .map(|m| match m {
                    Value::Object(m)
                        if m.contains_key("reasoning_content")
                            && m.get("reasoning").is_none_or(Value::is_null) =>
                    {
                        let mut m = m.clone();
                        let rc = m.shift_remove("reasoning_content").expect("present");
                        m.insert("reasoning".into(), rc);
                        Value::Object(m)
                    }
                    other => other.clone(),
                })
                .collect();
            out.insert("messages".into(), Value::Array(messages));
            if let Some(t @ Value::Array(_)) = v.get("tools") {
                out.insert("tools".into(), t.clone());
            }
            let agp = v
                .get("add_generation_prompt")
                .cloned()
                .unwrap_or(Value::Bool(true));
            out.insert("add_generation_prompt".into(), agp);
            for key in [
                "continue_final_message",
                "add_special_tokens",
                "chat_template",
            ] {
                copy(&mut out, key);
            }
            // documents / reasoning_effort folded in (set top-level values win, as vLLM
            // merges them), enable_thinking = effort != "none" unless already there.
            let set = |k: &str| v.get(k).filter(|x| !x.is_null());
            let (documents, effort) = (set("documents"), set("reasoning_effort"));
            let given = v.get("chat_template_kwargs");
            let kwargs = if documents.is_none() && effort.is_none() {
                given.cloned()
            } else {
                match given {
                    Some(Value::Object(_)) | Some(Value::Null) | None => {
                        let mut k = match given {
                            Some(Value::Object(g)) => g.clone(),
                            _ => Map::new(),
                        };
                        if let Some(d) = documents {
                            k.insert("documents".into(), d.clone());
                        }
                        if let Some(e) = effort {
                            k.insert("reasoning_effort".into(), e.clone());
                            if !k.contains_key("enable_thinking") {
                                let thinking = e.as_str() != Some("none");
                                k.insert("enable_thinking".into(), Value::Bool(thinking));
                            }
                        }
                        Some(Value::Object(k))
                    }
                    other => other.cloned(),
                }
            };
            if let Some(k) = kwargs {
                out.insert("chat_template_kwargs".into(), k);
            }
            for key in ["media_io_kwargs", "mm_processor_kwargs"] {
                copy(&mut out, key);
            }
        }
    }
    Some(Value::Object(out))
}

fn check_payload(req: &Request, body: &[u8]) {
    let Some(p) = payload(req, body) else {
        // Only when the request holds valid JSON that serde_json's Value cannot hold either.
        assert!(
            matches!(json_value(body), Ok(None)),
            "no payload for a plain body: {}",
            show(body)
        );
        return;
    };
    let ctx = || format!("\ninput: {}\npayload: {}", show(body), show(&p));
    let got = match json_value(&p) {
        Err(e) => panic!("payload is not JSON ({e}){}", ctx()),
        Ok(None) => return,
        Ok(Some(v)) => v,
    };
    let Some(obj) = got.as_object() else {
        panic!("payload is not an object{}", ctx());
    };
    for f in CAP_FIELDS {
        assert!(!obj.contains_key(f), "payload carries a cap{}", ctx());
    }
    let Ok(Some(Value::Object(input))) = json_value(body) else {
        return;
    };
    let Some(want) = ref_payload(&input, req.form) else {
        panic!("reference has no payload{}", ctx());
    };
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys(&got), keys(&want), "payload key order{}", ctx());
    assert_eq!(
        got,
        want,
        "payload differs from the docs/spec.md §5 reference{}",
        ctx()
    );
}

/// (raw text from key to end of value) of the non-cap members, in order.
fn non_cap<'a>(body: &'a [u8], members: &[Member]) -> Vec<&'a [u8]> {
    members
        .iter()
        .filter(|m| !is_cap_field(&m.key))
        .map(|m| &body[m.key_start..m.value.end])
        .collect()
}

fn without_caps(v: Value) -> Value {
    match v {
        Value::Object(mut map) => {
            for f in CAP_FIELDS {
                map.shift_remove(f);
            }
            Value::Object(map)
        }
        other => other,
    }
}

fn check_rewrite(
    body: &[u8],
    req: &Request,
    s: &Setup,
    config: &Config,
    out: &[u8],
    value: u64,
    field: &str,
) {
    let ctx = || format!("\ninput: {}\noutput: {}", show(body), show(out));
    let out_members =
        scan(out).unwrap_or_else(|e| panic!("rewritten body does not scan: {e:?}{}", ctx()));

    // Exactly one cap member, the expected field, written plainly, an integer equal to value.
    let caps: Vec<&Member> = out_members
        .iter()
        .filter(|m| is_cap_field(&m.key))
        .collect();
    assert_eq!(caps.len(), 1, "not exactly one cap member{}", ctx());
    let cap = caps[0];
    assert_eq!(cap.key, field, "wrong cap field{}", ctx());
    assert_eq!(
        &out[cap.value.clone()],
        value.to_string().as_bytes(),
        "cap value text{}",
        ctx()
    );
    assert!(
        out[cap.key_start..].starts_with(format!("\"{field}\"").as_bytes()),
        "cap key not written plainly{}",
        ctx()
    );

    // Every non-cap member byte-identical and in order; text around the members kept.
    let in_members = &req.members;
    assert_eq!(
        non_cap(body, in_members),
        non_cap(out, &out_members),
        "non-cap members changed{}",
        ctx()
    );
    let open = in_members.first().map(|m| m.key_start);
    if let Some(open) = open {
        assert!(out.starts_with(&body[..open]), "prefix changed{}", ctx());
        let tail = &body[in_members.last().expect("non-empty").value.end..];
        assert!(out.ends_with(tail), "suffix changed{}", ctx());
    }

    // The output is a JSON object with that one integer cap, equal to the input without caps.
    match (json_value(out), json_value(body)) {
        (Err(e), _) => panic!("rewritten body is not JSON: {e}{}", ctx()),
        (Ok(Some(v)), input) => {
            let obj = v
                .as_object()
                .unwrap_or_else(|| panic!("rewritten body not an object{}", ctx()));
            for f in CAP_FIELDS {
                if f == field {
                    assert!(obj[f].is_u64(), "cap is not an integer{}", ctx());
                    assert_eq!(obj[f].as_u64(), Some(value), "cap value{}", ctx());
                } else {
                    assert!(!obj.contains_key(f), "extra cap field {f}{}", ctx());
                }
            }
            if let Ok(Some(input)) = input {
                assert_eq!(
                    without_caps(input),
                    without_caps(v),
                    "members differ{}",
                    ctx()
                );
            }
        }
        (Ok(None), _) => {} // valid JSON that serde_json's Value cannot hold; scan checked it
    }

    // Idempotence: the output, rewritten again with the same count, is unchanged.
    let again = analyze(out, config)
        .and_then(|r| r.validate(out).map(|()| r))
        .unwrap_or_else(|r| panic!("output not budgeted: {r:?}{}", ctx()));
    let d = decide(&again, out, config, s.count, s.learned);
    match d.outcome {
        Outcome::Rewrite { edit, value: v2 } => {
            let twice = edit.apply(out);
            assert_eq!(v2, value, "second rewrite value{}", ctx());
            assert_eq!(twice, out, "rewriting twice differs from once{}", ctx());
        }
        other => panic!("second pass not rewritten: {other:?}{}", ctx()),
    }
}

/// INCONTEXT_FUZZ_TRACE=1 prints each outcome (to see what a corpus reaches).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("INCONTEXT_FUZZ_TRACE").is_some())
}

fn check(data: &[u8]) {
    if data.len() < 6 {
        return;
    }
    let (h, body) = data.split_at(6);
    let s = setup(h);
    let config = &configs()[s.kind];

    // analyze skims messages/tools; validate completes the check (a cache hit skips it, its
    // key vouching for those bytes). Together they must judge the body as serde_json does.
    let skimmed = analyze(body, config);
    if let Ok(r) = &skimmed {
        let _ = cache_key(r, body, "vllm|vllm:8000|/tokenize", Some(32768)); // must not panic
    }
    let req = match skimmed.and_then(|r| r.validate(body).map(|()| r)) {
        Ok(req) => {
            assert_eq!(
                scan(body).ok().as_ref(),
                Some(&req.members),
                "skimmed members differ from a full scan: {}",
                show(body)
            );
            req
        }
        Err(reason) => {
            // analyze rejects exactly what serde_json says is not a JSON object.
            match (reason, json_value(body)) {
                (Reason::NotJson, Ok(Some(v))) => {
                    panic!("valid JSON {} called NotJson: {}", v, show(body))
                }
                // Valid JSON that serde_json cannot decode (a lone surrogate in a key): refused.
                (Reason::NotJson, Ok(None)) => assert!(
                    has_surrogate_escape(body),
                    "valid JSON called NotJson: {}",
                    show(body)
                ),
                (Reason::NotObject, Ok(Some(v))) => {
                    assert!(!v.is_object(), "object called NotObject: {}", show(body))
                }
                (Reason::NotObject, Err(e)) => {
                    panic!("invalid JSON ({e}) called NotObject: {}", show(body))
                }
                (Reason::NoCap, _) => {
                    let members = scan(body).expect("NoCap body scans");
                    assert_eq!(
                        ref_caller_cap(body, &members),
                        None,
                        "NoCap with a valid cap: {}",
                        show(body)
                    );
                }
                (Reason::Model, _) => panic!("model filter without models"),
                _ => {}
            }
            if trace() {
                eprintln!("outcome analyze:{reason:?}");
            }
            return;
        }
    };
    match json_value(body) {
        Err(e) => panic!("invalid JSON ({e}) accepted: {}", show(body)),
        Ok(Some(v)) => assert!(v.is_object(), "non-object accepted: {}", show(body)),
        Ok(None) => {}
    }
    // Members are in order and inside the body.
    let mut prev = 0;
    for m in &req.members {
        assert!(m.key_start >= prev && m.key_start < m.value.start && m.value.end <= body.len());
        assert_eq!(body[m.key_start], b'"');
        prev = m.value.end;
    }

    // The side computations never panic; their results are sane.
    let est = req.estimate(body);
    assert!(
        est.is_some_and(|n| n >= 1),
        "estimate {est:?} for {}",
        show(body)
    );
    let _ = req.text_only(body);
    let _ = req.target();
    let _ = cache_key(&req, body, "vllm/tokenize", config.context_length);
    if let Counting::Exact(n) = req.counting {
        assert!(n >= 1 || req.form == Form::Completion);
    }
    // The tokenize payload (built only for requests counted by the tokenizer).
    if req.counting == Counting::Tokenize {
        check_payload(&req, body);
    } else {
        let _ = payload(&req, body);
    }

    let want = expect(&req, body, &s);
    let d: Decision = decide(&req, body, config, s.count, s.learned);
    if trace() {
        let kind = match &d.outcome {
            Outcome::Rewrite { .. } => "rewrite".to_string(),
            Outcome::Reject { .. } => "reject".to_string(),
            Outcome::Unchanged(r) => format!("unchanged:{r:?}"),
        };
        eprintln!(
            "outcome {kind} {:?} {:?} cap={}",
            req.form,
            req.counting,
            req.cap.is_some()
        );
    }
    assert_eq!(d.source, s.count.source);
    match (&d.outcome, &want) {
        (Outcome::Rewrite { edit, value }, Expect::Rewrite { value: v, field }) => {
            assert_eq!(value, v, "value differs from the reference: {}", show(body));
            assert!(edit.end <= body.len(), "edit past the body");
            let out = edit.apply(body);
            // The in-place head (what the filter sends when it fits) is the built head.
            let mut copy = body.to_vec();
            if let Some(head) = edit.patch(&mut copy) {
                assert_eq!(head, edit.head(body).as_slice(), "patched head differs");
            }
            check_rewrite(body, &req, &s, config, &out, *value, field);
        }
        (Outcome::Reject { body: e }, Expect::Reject) => {
            let v: Value = serde_json::from_slice(e).expect("reject body is JSON");
            assert_eq!(v["error"]["code"], "context_length_exceeded");
        }
        (Outcome::Unchanged(got), Expect::Unchanged(w)) => assert_eq!(got, w),
        (got, w) => panic!(
            "outcome {got:?} but the reference expects {w:?}: {}",
            show(body)
        ),
    }
}

/// The body as an Anthropic Messages request.
fn check_messages(body: &[u8], s: &Setup) {
    let config = &configs()[s.kind];
    let Ok(req) = analyze_at(body, config, Endpoint::Messages) else {
        return;
    };
    if req.validate(body).is_err() {
        return;
    }
    let d = decide(&req, body, config, s.count, s.learned);
    match d.outcome {
        Outcome::Rewrite { edit, value } => {
            let out = edit.apply(body);
            // Valid JSON; `None` where serde_json cannot hold it (a lone surrogate escape).
            let v = json_value(&out).expect("rewritten body is JSON");
            let members = scan(&out).expect("rewritten body is an object");
            let caps: Vec<&Member> = members.iter().filter(|m| m.key == "max_tokens").collect();
            assert_eq!(caps.len(), 1, "one max_tokens: {}", show(&out));
            assert_eq!(&out[caps[0].value.clone()], value.to_string().as_bytes());
            let others = |text: &[u8]| -> Vec<(String, Vec<u8>)> {
                scan(text)
                    .expect("object")
                    .into_iter()
                    .filter(|m| m.key != "max_tokens" && m.key != "thinking")
                    .map(|m| (m.key.clone(), text[m.value.clone()].to_vec()))
                    .collect()
            };
            assert_eq!(others(body), others(&out), "members kept: {}", show(body));
            let thinking = v.as_ref().and_then(|v| v.get("thinking"));
            let enabled = thinking.and_then(|t| t.get("type")) == Some(&Value::from("enabled"));
            if let Some(budget) = thinking
                .and_then(|t| t.get("budget_tokens"))
                .and_then(Value::as_u64)
                .filter(|_| enabled)
            {
                assert!(budget < value, "budget {budget} >= max_tokens {value}: {}", show(&out));
            }
        }
        Outcome::Reject { body: e } => {
            let v: Value = serde_json::from_slice(&e).expect("reject body is JSON");
            assert_eq!(v["type"], "error");
            let message = v["error"]["message"].as_str().expect("a message");
            assert!(message.starts_with("prompt is too long: "), "{message}");
        }
        Outcome::Unchanged(_) => {}
    }
}

/// The body as an OpenAI Responses request: only `max_output_tokens` is a cap and is what a
/// rewrite writes; every other member is kept byte for byte; the count call's body is the
/// request less its caps and `stream`; a rejection is `context_length_exceeded` on `input`.
fn check_responses(body: &[u8], s: &Setup) {
    let config = &configs()[s.kind];
    let Ok(req) = analyze_at(body, config, Endpoint::Responses) else {
        return;
    };
    if req.validate(body).is_err() {
        return;
    }
    assert_eq!(req.form, Form::Responses);
    let members = |text: &[u8], skip: &dyn Fn(&str) -> bool| -> Vec<(String, Vec<u8>)> {
        scan(text)
            .expect("object")
            .into_iter()
            .filter(|m| !skip(&m.key))
            .map(|m| (m.key.clone(), text[m.value.clone()].to_vec()))
            .collect()
    };
    let payload = incontext_core::dialect::responses::payload(&req, body).expect("a payload");
    scan(&payload).expect("the count call's body is a JSON object");
    assert_eq!(
        members(&payload, &|_| false),
        members(body, &|k| k == "max_output_tokens" || k == "stream"),
        "count call body: {}",
        show(body)
    );
    let d = decide(&req, body, config, s.count, s.learned);
    match d.outcome {
        Outcome::Rewrite { edit, value } => {
            let out = edit.apply(body);
            json_value(&out).expect("rewritten body is JSON");
            let caps: Vec<Member> = scan(&out)
                .expect("object")
                .into_iter()
                .filter(|m| m.key == "max_output_tokens")
                .collect();
            assert_eq!(caps.len(), 1, "one max_output_tokens: {}", show(&out));
            assert_eq!(&out[caps[0].value.clone()], value.to_string().as_bytes());
            let not_cap = |k: &str| k == "max_output_tokens";
            assert_eq!(members(body, &not_cap), members(&out, &not_cap), "{}", show(body));
        }
        Outcome::Reject { body: e } => {
            let v: Value = serde_json::from_slice(&e).expect("reject body is JSON");
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["param"], "input");
        }
        Outcome::Unchanged(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 6 {
        let s = setup(&data[..6]);
        check_messages(&data[6..], &s);
        check_responses(&data[6..], &s);
    }
});
