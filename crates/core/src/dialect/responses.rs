//! OpenAI Responses (a path ending in `/v1/responses`; docs/spec.md §14): the only cap is
//! `max_output_tokens`, and none is required (Codex CLI sends none); the cap written is
//! `max_output_tokens`. A request that continues server-side state the filter cannot see
//! (`previous_response_id`, `conversation`, a stored `prompt` template) passes unchanged
//! (`stateful`). Counted by the server's own renderer with the request as it is, less its
//! caps and `stream` ([`payload`]); the estimate reads `input`, `instructions` and `tools`; a
//! rejection is OpenAI's `context_length_exceeded` with `param` `input`.

use crate::bound::{arguments_growth, BLOCK, MESSAGE};
use crate::caps::CapField;
use crate::estimate::estimate as rough;
use crate::json::scan::{array_items, scan, Member};
use crate::reason::Reason;
use crate::request::{raw, Fields, Request};

/// Only `max_output_tokens` is a cap here (vLLM's Responses API reads no other).
pub fn is_cap(field: CapField) -> bool {
    field == CapField::MaxOutputTokens
}

/// A request without a cap is budgeted: the server would use the rest of the window.
pub const REQUIRES_CAP: bool = false;

/// Members the server never renders into the prompt: bookkeeping for the client and the
/// server's storage (Codex sends its turn's ids in `client_metadata`, a new value every turn).
pub const UNRENDERED: &[&str] = &[
    "client_metadata",
    "metadata",
    "prompt_cache_key",
    "store",
    "include",
    "user",
    "safety_identifier",
    "service_tier",
    "background",
];

/// Input items are compared as the server parses them, nothing left out: clients send each
/// item again as it was (docs/spec.md §15b).
pub const CANON: super::canonical::Canon = super::canonical::Canon {
    ignored: &[],
    text_block: None,
};

/// `Err(Stateful)` when the request continues state the filter cannot count: its prompt is
/// more than its body.
pub fn stateless(body: &[u8], members: &[Member], f: &Fields) -> Result<(), Reason> {
    let set = |idx: Option<usize>| raw(body, members, idx).is_some_and(|v| v.trim() != "null");
    if [f.previous_response_id, f.conversation, f.prompt]
        .into_iter()
        .any(set)
    {
        Err(Reason::Stateful)
    } else {
        Ok(())
    }
}

/// The estimate over the raw `input`, `instructions` and `tools` (when an array).
pub fn estimate(req: &Request, body: &[u8]) -> Option<u64> {
    let f = &req.fields;
    let mut parts = vec![req.raw(body, f.input)?];
    parts.extend(req.raw(body, f.instructions).filter(|i| i.starts_with('"')));
    parts.extend(req.raw(body, f.tools).filter(|t| t.starts_with('[')));
    Some(rough(&parts))
}

/// The field to write and where: `max_output_tokens`, in place of the caller's or first.
pub fn target(req: &Request) -> (Option<usize>, &'static str) {
    (req.cap.map(|c| c.member), CapField::MaxOutputTokens.name())
}

/// Whether member `i` stays in the count call: every member but the caps and `stream`.
fn counted(req: &Request, i: usize, m: &Member) -> bool {
    m.key != "stream" && !req.cap_members.contains(&i)
}

/// The count call's body: the request without its caps and without `stream`, members as they
/// stand in the body (vLLM's render refuses a cap larger than the window and answers a stream
/// with a stream). A plain function: every renderer of a Responses request takes this body.
pub fn payload(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    out.push(b'{');
    for (i, m) in req.members.iter().enumerate() {
        if !counted(req, i, m) {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(body.get(m.key_start..m.value.end)?);
    }
    out.push(b'}');
    Some(out)
}

/// The raw value of the last member `key` of an object's `members` (as the server's parser
/// keeps it).
fn member<'a>(raw: &'a [u8], members: &[Member], key: &str) -> Option<&'a [u8]> {
    let m = members.iter().rev().find(|m| m.key == key)?;
    raw.get(m.value.clone())
}

/// The plain string a raw JSON value holds: a string without escapes (the names of types
/// and roles); `None` for anything else, which the bound then does not read.
fn string(raw: Option<&[u8]>) -> Option<&str> {
    let inner = raw?.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    (!inner.contains(&b'\\'))
        .then(|| std::str::from_utf8(inner).ok())
        .flatten()
}

/// The parts of a content that is text: a string (none), or an array of text parts.
fn text_parts(content: Option<&[u8]>) -> Option<u64> {
    let raw = content?;
    if raw.starts_with(b"\"") {
        return Some(0);
    }
    let parts = array_items(raw)?;
    for p in &parts {
        let part = raw.get(p.clone())?;
        let kind = string(member(part, &scan(part).ok()?, "type"))?;
        if !matches!(kind, "input_text" | "output_text" | "text") {
            return None;
        }
    }
    Some(parts.len() as u64)
}

/// The token bound of one input item (docs/spec.md §15b) and whether it is the assistant's;
/// `None` where the bound's assumptions do not hold. The server turns the items into chat
/// messages (a function call or reasoning joins the assistant message before it) and renders
/// those, so an item is bounded as the message it becomes: its bytes, what re-serializing a
/// call's arguments adds, and the template's text around a message and a block. Items the
/// byte bound cannot see through (images, files, encrypted reasoning, other tools' calls)
/// have none.
pub fn item_bound(raw: &[u8]) -> Option<(u64, bool)> {
    if !raw.starts_with(b"{") {
        return None;
    }
    let members = scan(raw).ok()?;
    let get = |key: &str| member(raw, &members, key);
    let bytes = raw.len() as u64;
    let kind = match get("type") {
        None => "message",
        some => string(some)?,
    };
    let absent = |v: Option<&[u8]>| v.is_none_or(|v| v == b"null");
    match kind {
        "message" => {
            let role = string(get("role"))?;
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return None;
            }
            let parts = text_parts(get("content"))?;
            Some((bytes + MESSAGE + BLOCK * parts, role == "assistant"))
        }
        "function_call" => {
            let arguments = std::str::from_utf8(get("arguments")?).ok()?;
            let growth = arguments_growth(Some(serde_json::from_str(arguments).ok()?));
            Some((bytes + growth + MESSAGE + BLOCK, true))
        }
        "function_call_output" if get("output").is_some_and(|o| o.starts_with(b"\"")) => {
            Some((bytes + MESSAGE + BLOCK, false))
        }
        "reasoning" if absent(get("encrypted_content")) => Some((bytes + MESSAGE + BLOCK, true)),
        _ => None,
    }
}

/// The render call's body for the input items after a conversation's counted prefix (its
/// tail, `items`: a JSON array of them) as a conversation of their own (docs/spec.md §15b):
/// the request's other members as they came, without its caps and `stream` (as [`payload`]),
/// and without the instructions and the tools, which render before the first item and which
/// the prefix's count holds already.
pub fn tail_body(req: &Request, body: &[u8], items: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(items.len() + 256);
    out.push(b'{');
    for (i, m) in req.members.iter().enumerate() {
        let outside = matches!(
            m.key.as_str(),
            "input" | "instructions" | "tools" | "tool_choice"
        );
        if outside || !counted(req, i, m) {
            continue;
        }
        out.extend_from_slice(body.get(m.key_start..m.value.end)?);
        out.push(b',');
    }
    super::write_key("input", &mut out);
    out.extend_from_slice(items);
    out.push(b'}');
    Some(out)
}

/// What the count depends on, for the cache key: each member the count call carries, as it
/// stands in the body (a re-spaced body may cost an extra call, never a wrong count).
pub fn key_parts<'a>(req: &'a Request, body: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    req.members
        .iter()
        .enumerate()
        .filter(|(i, m)| counted(req, *i, m))
        .filter_map(|(_, m)| body.get(m.key_start..m.value.end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::dialect::{Endpoint, Form};
    use crate::request::analyze_at;
    use serde_json::Value;

    fn an(body: &str) -> Result<Request, Reason> {
        let c = Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap();
        analyze_at(body.as_bytes(), &c, Endpoint::Responses)
    }

    #[test]
    fn only_max_output_tokens_is_a_cap_and_none_is_needed() {
        let r =
            an(r#"{"model":"m","input":"hi","max_tokens":5,"max_output_tokens":"900"}"#).unwrap();
        assert_eq!(r.form, Form::Responses);
        assert_eq!(
            r.cap.map(|c| (c.field, c.value, c.member)),
            Some((CapField::MaxOutputTokens, 900, 3))
        );
        assert_eq!(r.cap_members, vec![3]);
        assert_eq!(r.target(), (Some(3), "max_output_tokens"));
        let r = an(r#"{"input":[{"role":"user","content":"hi"}],"stream":true}"#).unwrap();
        assert_eq!(r.cap, None);
        assert_eq!(r.target(), (None, "max_output_tokens"));
        assert_eq!(r.truncate, None);
        assert_eq!(an(r#"{"model":"m"}"#).unwrap_err(), Reason::Shape);
        assert_eq!(
            an(r#"{"messages":[],"max_tokens":5}"#).unwrap_err(),
            Reason::Shape
        );
    }

    #[test]
    fn stateful_requests_are_left_alone() {
        for body in [
            r#"{"input":"hi","previous_response_id":"resp_1"}"#,
            r#"{"input":"hi","conversation":"conv_1"}"#,
            r#"{"input":"hi","conversation":{"id":"conv_1"}}"#,
            r#"{"input":"hi","prompt":{"id":"pmpt_1"}}"#,
        ] {
            assert_eq!(an(body).unwrap_err(), Reason::Stateful, "{body}");
        }
        for body in [
            r#"{"input":"hi","previous_response_id":null,"conversation":null,"prompt":null}"#,
            r#"{"input":"hi","store":true}"#,
        ] {
            assert!(an(body).is_ok(), "{body}");
        }
    }

    #[test]
    fn payload_drops_caps_and_stream_only() {
        let body = r#"{"model":"m", "stream" : true,"input":"hi","max_output_tokens":32000,"tools":[],"max_output_tokens":null,"store":false}"#;
        let r = an(body).unwrap();
        let p = payload(&r, body.as_bytes()).unwrap();
        assert_eq!(
            std::str::from_utf8(&p).unwrap(),
            r#"{"model":"m","input":"hi","tools":[],"store":false}"#
        );
        let v: Value = serde_json::from_slice(&p).unwrap();
        assert!(v.get("stream").is_none());
        let only_caps = r#"{"max_output_tokens":5,"input":"x"}"#;
        let r = an(only_caps).unwrap();
        assert_eq!(
            payload(&r, only_caps.as_bytes()).unwrap(),
            br#"{"input":"x"}"#
        );
    }

    #[test]
    fn estimate_reads_input_instructions_and_tools() {
        let body = r#"{"instructions":"aaaa","input":[{"role":"user","content":"bb"}],"tools":[{"type":"function","name":"t"}]}"#;
        let r = an(body).unwrap();
        let all = rough(&[
            r#"[{"role":"user","content":"bb"}]"#,
            r#""aaaa""#,
            r#"[{"type":"function","name":"t"}]"#,
        ]);
        assert_eq!(r.estimate(body.as_bytes()), Some(all));
        assert!(!r.text_only(body.as_bytes()));
    }
}
