//! The byte bound over new messages (docs/spec.md §15, crates/core/src/bound.rs).
//!
//! Input: byte 0 picks the dialect (bit 0: chat or Anthropic Messages) and the prefix length
//! k (the rest of the byte, modulo the messages + 2); bytes 1–8 the prefix's count (u64,
//! little endian); bytes 9–12 the tokens a tail must prove (u32) and 13–16 the window (u32);
//! the rest is the request body, and also, alone, one message. Properties checked:
//! * nothing panics (chain, bounds, tail_array, message_bound, reserialized_growth,
//!   Tail::may_prove);
//! * `reserialized_growth` of JSON text lies between its separators (one byte each, outside
//!   strings) and those plus FLOAT per number, and equals the separators without numbers;
//! * a message's bound, when there is one, is at least its bytes + MESSAGE + BLOCK per content
//!   block, and only for the roles and blocks the bound reads;
//! * the chain has one link per message; P_hi is exactly the prefix's count + TAIL + RESTYLE
//!   per prefix message with reasoning + the new messages' bounds, `None` exactly when a new
//!   message has no bound or a sum overflows; the tail is the new messages (none: no tail; an
//!   assistant one with reasoning: no tail) with their raw bytes, base = count + SEAM +
//!   RESTYLE·k_r, and its array is the messages as they stand in the body;
#![no_main]

mod common;

use common::{show, MemberList};
use incontext_core::bound::{
    bounds, chain, message_bound, reserialized_growth, BLOCK,
    FLOAT, MESSAGE, RESTYLE, SEAM, TAIL,
};
use incontext_core::config::Config;
use incontext_core::dialect::{Endpoint, Form};
use incontext_core::request::analyze_at;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::OnceLock;

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        Config::parse(br#"{"tokenizer":{"cluster":"v"},"context_length":40960}"#)
            .expect("the fuzz config parses")
    })
}

/// Separators (`,` and `:`) and numbers of a JSON value, counted on the parsed value.
fn shape(v: &Value) -> (u64, u64) {
    match v {
        Value::Number(_) => (0, 1),
        Value::Array(items) => {
            items
                .iter()
                .fold((items.len().saturating_sub(1) as u64, 0), |(s, n), item| {
                    let (a, b) = shape(item);
                    (s + a, n + b)
                })
        }
        Value::Object(members) => members.values().fold(
            ((members.len() + members.len().saturating_sub(1)) as u64, 0),
            |(s, n), item| {
                let (a, b) = shape(item);
                (s + a, n + b)
            },
        ),
        _ => (0, 0),
    }
}

fn check_growth(text: &[u8]) {
    let growth = reserialized_growth(text);
    let (Ok(v), Ok(raw)) = (
        serde_json::from_slice::<Value>(text),
        serde_json::from_slice::<&RawValue>(text),
    ) else {
        return;
    };
    let (separators, numbers) = shape(&v);
    assert!(
        separators <= growth,
        "growth {growth}, {separators} separators: {}",
        show(text)
    );
    // A repeated key leaves the value with fewer members than the text.
    if has_duplicates(raw) {
        return;
    }
    assert!(
        growth <= separators + FLOAT * numbers,
        "growth {growth}, {separators} separators, {numbers} numbers: {}",
        show(text)
    );
    if numbers == 0 {
        assert_eq!(growth, separators, "{}", show(text));
    }
}

/// Whether an object anywhere in the value repeats a key.
fn has_duplicates(raw: &RawValue) -> bool {
    let text = raw.get();
    if text.starts_with('{') {
        let Ok(members) = serde_json::from_str::<MemberList>(text) else {
            return true;
        };
        let mut keys: Vec<&String> = members.0.iter().map(|(k, _)| k).collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        return keys.len() != n || members.0.iter().any(|(_, v)| has_duplicates(v));
    }
    if text.starts_with('[') {
        let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(text) else {
            return true;
        };
        return items.iter().any(|v| has_duplicates(v));
    }
    false
}

fn check_message(form: Form, raw: &[u8]) {
    let Some(b) = message_bound(form, raw) else {
        return;
    };
    let v: Value = match serde_json::from_slice(raw) {
        Ok(v) => v,
        // JSON whose numbers a `Value` cannot hold (`1e400`) is still JSON: the grammar alone
        // is checked, and the floor without the blocks.
        Err(e) => {
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(raw).is_ok(),
                "a bound for a message that is not JSON ({e}): {}",
                show(raw)
            );
            assert!(b >= raw.len() as u64 + MESSAGE, "bound {b}: {}", show(raw));
            check_role(form, raw, bare_role(raw).as_deref());
            return;
        }
    };
    check_role(form, raw, v["role"].as_str());
    let blocks = v["content"].as_array().map_or(0, Vec::len) as u64;
    let floor = raw.len() as u64 + MESSAGE + BLOCK * blocks;
    assert!(b >= floor, "bound {b} below {floor}: {}", show(raw));
    if form == Form::Chat {
        let text_only = v["content"]
            .as_array()
            .is_none_or(|parts| parts.iter().all(|p| p["type"] == "text"));
        assert!(text_only, "a bound over a non-text part: {}", show(raw));
    }
}

fn check_role(form: Form, raw: &[u8], role: Option<&str>) {
    let role = role.unwrap_or_else(|| panic!("no role: {}", show(raw)));
    let roles: &[&str] = match form {
        Form::Chat => &["system", "user", "assistant", "tool"],
        _ => &["user", "assistant"],
    };
    assert!(roles.contains(&role), "role {role}: {}", show(raw));
}

/// A message's role.
fn role_of(raw: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Value>(raw) {
        Ok(v) => v["role"].as_str().map(str::to_string),
        Err(_) => bare_role(raw),
    }
}

/// A message's role, read without the rest of it: a `Value` cannot hold every JSON number
/// (`1e400`), a message with one still has a role.
fn bare_role(raw: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Role {
        role: Option<String>,
    }
    serde_json::from_slice::<Role>(raw).ok()?.role
}

fn restyles(raw: &[u8]) -> bool {
    let has = |needle: &[u8]| raw.windows(needle.len()).any(|w| w == needle);
    has(b"think") || has(b"reasoning")
}

fn check_request(data: &[u8], body: &[u8]) {
    let form_bit = data[0] & 1;
    let (endpoint, form) = if form_bit == 0 {
        (Endpoint::OpenAi, Form::Chat)
    } else {
        (Endpoint::Messages, Form::Messages)
    };
    let Ok(req) = analyze_at(body, config(), endpoint) else {
        return;
    };
    if req.form != form || req.validate(body).is_err() {
        return;
    }
    let Some(c) = chain(&req, body, "route", Some(40960)) else {
        return;
    };
    assert_eq!(c.links.len(), c.items.len());
    let k = usize::from(data[0] >> 1) % (c.items.len() + 2);
    let prefix = u64::from_le_bytes(data[1..9].try_into().expect("8 bytes"));
    let need = u64::from(u32::from_le_bytes(data[9..13].try_into().expect("4 bytes")));
    let w = u64::from(u32::from_le_bytes(
        data[13..17].try_into().expect("4 bytes"),
    ));
    let got = bounds(form, body, &c, k, prefix);
    if k > c.items.len() {
        assert!(got.is_none(), "k {k} past {} messages", c.items.len());
        return;
    }
    let raws: Vec<&[u8]> = c.items.iter().map(|r| &body[r.clone()]).collect();
    let restyled = raws[..k].iter().filter(|r| restyles(r)).count() as u64 * RESTYLE;
    let mut want = prefix
        .checked_add(TAIL)
        .and_then(|p| p.checked_add(restyled));
    for raw in &raws[k..] {
        check_message(form, raw);
        want = want.and_then(|p| p.checked_add(message_bound(form, raw)?));
    }
    let base = prefix
        .checked_add(SEAM)
        .and_then(|p| p.checked_add(restyled));
    let want = want.filter(|_| base.is_some());
    match (&got, want) {
        (None, None) => return,
        (Some(b), Some(p)) => assert_eq!(b.p_hi, p, "{}", show(body)),
        _ => panic!(
            "bounds {:?}, expected P_hi {want:?}: {}",
            got.map(|b| b.p_hi),
            show(body)
        ),
    }
    let b = got.expect("checked");
    let new = &raws[k..];
    let alone = !new.is_empty()
        && !new
            .iter()
            .any(|r| restyles(r) && role_of(r).as_deref() == Some("assistant"));
    let Some(tail) = b.tail else {
        assert!(
            !alone,
            "no tail for {} new messages: {}",
            new.len(),
            show(body)
        );
        return;
    };
    assert!(
        alone,
        "a tail that may not be counted alone: {}",
        show(body)
    );
    assert_eq!(tail.items, &c.items[k..]);
    assert_eq!(Some(tail.base), base);
    assert_eq!(tail.bytes, new.iter().map(|r| r.len() as u64).sum::<u64>());
    assert_eq!(
        tail.may_prove(need, w),
        tail.base
            .saturating_add(tail.bytes / 4)
            .saturating_add(need)
            <= w
    );
    let array = incontext_core::bound::tail_array(body, tail.items).expect("ranges in the body");
    let items: Vec<&RawValue> = serde_json::from_slice(&array)
        .unwrap_or_else(|e| panic!("the tail array is not JSON ({e}): {}", show(&array)));
    assert_eq!(items.len(), new.len());
    for (item, raw) in items.iter().zip(new) {
        assert_eq!(item.get().as_bytes(), *raw);
    }
}

fn check(data: &[u8]) {
    if data.len() < 17 {
        return;
    }
    let body = &data[17..];
    check_growth(body);
    check_message(Form::Chat, body);
    check_message(Form::Messages, body);
    check_request(data, body);
}

fuzz_target!(|data: &[u8]| check(data));
