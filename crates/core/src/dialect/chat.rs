//! OpenAI chat (`messages`; docs/spec.md §4, §5, §7): every cap field is a cap (a
//! `max_output_tokens` is written as `max_tokens`, which vLLM's chat endpoint reads); counted
//! by vLLM's `/tokenize` with the chat payload below, written from the raw request slices
//! without building a DOM: values are copied in compact form; only strings with escapes are
//! decoded and written again (so the payload reads as Python's `json.dumps(...,
//! ensure_ascii=False, separators=(",", ":"))` of the request would), and message /
//! `chat_template_kwargs` objects are rewritten member by member where a key has to change.
//! The estimate reads `messages` and `tools`; a rejection is OpenAI's
//! `context_length_exceeded`.

use super::{write_field, write_key};
use crate::caps::CapField;
use crate::config::Config;
use crate::estimate::estimate as rough;
use crate::json::compact::{compact, write_string};
use crate::json::find::Needle;
use crate::json::scan::{array_items, is_ws, scan, Member};
use crate::request::{raw, raw_bytes, Counting, Fields, Request};
use serde_json::value::RawValue;

/// A message's `cache_control` (sent by clients written for Anthropic-style caching) and a
/// content part's are never rendered; a lone text part renders as its text (docs/spec.md
/// §15b).
pub const CANON: super::canonical::Canon = super::canonical::Canon {
    ignored: &["cache_control"],
    text_block: Some("text"),
};

fn is_null(v: Option<&str>) -> bool {
    v.is_none_or(|v| v == "null")
}

/// Structured output and a forced tool choice constrain decoding, not the prompt the chat
/// template renders: they are counted like any request, unless the configuration says the
/// server's template reads them (`estimate_constrained`).
pub fn counting(body: &[u8], members: &[Member], f: &Fields, config: &Config) -> Counting {
    if !config.estimate_constrained {
        return Counting::Tokenize;
    }
    if !is_null(raw(body, members, f.response_format)) {
        return Counting::Estimate;
    }
    let tools = raw_bytes(body, members, f.tools).unwrap_or(b"null");
    let has_tools = tools
        .strip_prefix(b"[")
        .is_some_and(|items| items.iter().find(|b| !is_ws(**b)) != Some(&b']'));
    if has_tools {
        let choice = raw(body, members, f.tool_choice);
        let auto = is_null(choice)
            || choice
                .is_some_and(|c| serde_json::from_str::<String>(c).ok().as_deref() == Some("auto"));
        if !auto {
            return Counting::Estimate;
        }
    }
    Counting::Tokenize
}

/// Whether `tools` is left out of the count: `tool_choice: "none"` on a server that drops
/// them (`exclude_tools_when_tool_choice_none`).
pub fn omit_tools(body: &[u8], members: &[Member], f: &Fields, config: &Config) -> bool {
    let choice =
        raw(body, members, f.tool_choice).and_then(|c| serde_json::from_str::<String>(c).ok());
    config.exclude_tools_when_tool_choice_none && choice.as_deref() == Some("none")
}

/// The estimate over the raw `messages` and `tools` (when an array).
pub fn estimate(req: &Request, body: &[u8]) -> Option<u64> {
    let messages = req.raw(body, req.fields.messages)?;
    Some(match req.raw(body, req.fields.tools) {
        Some(t) if t.starts_with('[') => rough(&[messages, t]),
        _ => rough(&[messages]),
    })
}

/// Whether every message's content is text (T may then lower the count; docs/spec.md §5).
pub fn text_only(req: &Request, body: &[u8]) -> bool {
    let Some(messages) = req.raw(body, req.fields.messages) else {
        return true;
    };
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow, default)]
        content: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Part<'a> {
        #[serde(borrow, rename = "type", default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    let Ok(list) = serde_json::from_str::<Vec<Message>>(messages) else {
        return false;
    };
    list.iter().all(|m| match m.content.map(|c| c.get()) {
        None => true,
        Some(c) if c.starts_with('[') => serde_json::from_str::<Vec<Part>>(c)
            .map(|parts| parts.iter().all(|p| p.kind.as_deref() == Some("text")))
            .unwrap_or(false),
        Some(_) => true,
    })
}

/// The field to write and where: the caller's field (a `max_output_tokens` is written as
/// `max_tokens`), or `max_tokens` appended when there was no valid cap.
pub fn target(req: &Request) -> (Option<usize>, &'static str) {
    match req.cap {
        Some(c) if c.field == CapField::MaxOutputTokens => {
            (Some(c.member), CapField::MaxTokens.name())
        }
        Some(c) => (Some(c.member), c.field.name()),
        None => (None, CapField::MaxTokens.name()),
    }
}

/// The raw text of a member's key (with quotes).
fn key_text<'a>(object: &'a str, m: &Member) -> &'a str {
    let between = &object[m.key_start..m.value.start];
    between.trim_end().trim_end_matches(':').trim_end()
}

fn write_member(object: &str, m: &Member, key: Option<&str>, out: &mut Vec<u8>) -> Option<()> {
    match key {
        Some(k) => write_key(k, out),
        None => {
            write_string(key_text(object, m), out)?;
            out.push(b':');
        }
    }
    compact(&object[m.value.clone()], out)
}

/// A message, with `reasoning_content` renamed `reasoning` unless `reasoning` is non-null
/// (a null `reasoning` is dropped in favour of the renamed field).
fn write_message(message: &str, out: &mut Vec<u8>) -> Option<()> {
    if !message.starts_with('{') {
        return compact(message, out);
    }
    if compact_unless_reasoning(message, out)? {
        return Some(());
    }
    let members = scan(message.as_bytes()).ok()?;
    let value = |m: &Member| &message[m.value.clone()];
    let has_rc = members.iter().any(|m| m.key == "reasoning_content");
    let reasoning_set = members
        .iter()
        .rev()
        .find(|m| m.key == "reasoning")
        .is_some_and(|m| value(m) != "null");
    if !has_rc || reasoning_set {
        return compact(message, out);
    }
    out.push(b'{');
    let mut first = true;
    for m in members.iter().filter(|m| m.key != "reasoning") {
        if !first {
            out.push(b',');
        }
        first = false;
        let rename = (m.key == "reasoning_content").then_some("reasoning");
        write_member(message, m, rename, out)?;
    }
    out.push(b'}');
    Some(())
}

static REASONING_CONTENT: Needle = Needle::new(b"reasoning_content");

/// Compacts `text` into `out` and returns true, unless the compacted text names
/// `reasoning_content`: then `out` is left as it was and it returns false. Once compacted, a
/// key that is `reasoning_content`, however escaped, reads so literally.
fn compact_unless_reasoning(text: &str, out: &mut Vec<u8>) -> Option<bool> {
    let mark = out.len();
    compact(text, out)?;
    let named = out
        .get(mark..)
        .is_some_and(|written| REASONING_CONTENT.is_in(written));
    if named {
        out.truncate(mark);
    }
    Some(!named)
}

/// The `messages` array. Without a `reasoning_content` key (nearly always) that is the array
/// compacted as a whole; otherwise message by message.
fn write_messages(messages: &str, out: &mut Vec<u8>) -> Option<()> {
    if compact_unless_reasoning(messages, out)? {
        return Some(());
    }
    out.push(b'[');
    for (i, item) in array_items(messages.as_bytes())?.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_message(messages.get(item)?, out)?;
    }
    out.push(b']');
    Some(())
}

/// `chat_template_kwargs` with `documents` and `reasoning_effort` folded in as vLLM's chat
/// endpoint merges them (set top-level values win over the same keys), and `enable_thinking`
/// = `reasoning_effort != "none"` unless already there. Writes nothing when there is
/// nothing to write; `None` when a value is malformed.
fn write_template_kwargs(req: &Request, body: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let f = &req.fields;
    let given = req.raw(body, f.chat_template_kwargs);
    let set = |idx| req.raw(body, idx).filter(|v| *v != "null");
    let (documents, effort) = (set(f.documents), set(f.reasoning_effort));
    if documents.is_none() && effort.is_none() {
        return match given {
            Some(g) => {
                out.extend_from_slice(b",\"chat_template_kwargs\":");
                compact(g, out)
            }
            None => Some(()),
        };
    }
    let members = match given {
        None | Some("null") => Vec::new(),
        Some(g) if g.starts_with('{') => scan(g.as_bytes()).ok()?,
        Some(g) => {
            // Not an object: vLLM will judge it.
            out.extend_from_slice(b",\"chat_template_kwargs\":");
            return compact(g, out);
        }
    };
    let given = given.unwrap_or("{}");
    let thinking =
        effort.map(|e| serde_json::from_str::<String>(e).ok().as_deref() != Some("none"));
    out.extend_from_slice(b",\"chat_template_kwargs\":{");
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !first {
            out.push(b',');
        }
        first = false;
    };
    for m in &members {
        sep(out);
        let replaced = match m.key.as_str() {
            "documents" => documents,
            "reasoning_effort" => effort,
            _ => None,
        };
        match replaced {
            Some(v) => {
                write_key(&m.key, out);
                compact(v, out)?;
            }
            None => write_member(given, m, None, out)?,
        }
    }
    let has = |k: &str| members.iter().any(|m| m.key == k);
    for (key, value) in [("documents", documents), ("reasoning_effort", effort)] {
        if let Some(v) = value.filter(|_| !has(key)) {
            sep(out);
            write_key(key, out);
            compact(v, out)?;
        }
    }
    if let Some(t) = thinking.filter(|_| !has("enable_thinking")) {
        sep(out);
        write_key("enable_thinking", out);
        out.extend_from_slice(if t { b"true" } else { b"false" });
    }
    out.push(b'}');
    Some(())
}

/// The chat `/tokenize` payload (docs/spec.md §5). `None` when a field it needs is not of the
/// expected form.
pub fn payload(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let f = &req.fields;
    let tools = req
        .raw(body, f.tools)
        .filter(|t| t.starts_with('[') && !req.omit_tools);
    payload_of(req, body, req.raw(body, f.messages)?, tools)
}

/// The `/tokenize` payload of the messages after a conversation's counted prefix (its tail,
/// `messages`: a JSON array of them) as a conversation of their own, without the tools
/// (docs/spec.md §15): everything else that shapes the template's output stays.
pub fn tail_payload(req: &Request, body: &[u8], messages: &str) -> Option<Vec<u8>> {
    payload_of(req, body, messages, None)
}

fn payload_of(req: &Request, body: &[u8], messages: &str, tools: Option<&str>) -> Option<Vec<u8>> {
    let f = &req.fields;
    let mut out = Vec::with_capacity(messages.len() + 256);
    out.push(b'{');
    write_field(&mut out, "model", req.raw(body, f.model))?;
    if out.len() > 1 {
        out.push(b',');
    }
    out.extend_from_slice(b"\"messages\":");
    write_messages(messages, &mut out)?;
    write_field(&mut out, "tools", tools)?;
    let agp = req.raw(body, f.add_generation_prompt).or(Some("true"));
    write_field(&mut out, "add_generation_prompt", agp)?;
    for (name, idx) in [
        ("continue_final_message", f.continue_final_message),
        ("add_special_tokens", f.add_special_tokens),
        ("chat_template", f.chat_template),
    ] {
        write_field(&mut out, name, req.raw(body, idx))?;
    }
    write_template_kwargs(req, body, &mut out)?;
    for (name, idx) in [
        ("media_io_kwargs", f.media_io_kwargs),
        ("mm_processor_kwargs", f.mm_processor_kwargs),
    ] {
        write_field(&mut out, name, req.raw(body, idx))?;
    }
    out.push(b'}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_payload_has_the_tail_and_no_tools() {
        use crate::config::Config;
        use crate::request::analyze;
        let config = Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"max_tokens":9}"#;
        let req = analyze(body.as_bytes(), &config).unwrap();
        let tail = r#"[{"role":"assistant","reasoning_content":"r","content":"b"}]"#;
        assert_eq!(
            String::from_utf8(tail_payload(&req, body.as_bytes(), tail).unwrap()).unwrap(),
            r#"{"model":"m","messages":[{"role":"assistant","reasoning":"r","content":"b"}],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}"#
        );
    }

    #[test]
    fn escaped_spellings_are_seen() {
        use crate::config::Config;
        use crate::request::analyze;
        let config = Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap();
        let p = |body: &str| {
            let req = analyze(body.as_bytes(), &config).unwrap();
            String::from_utf8(payload(&req, body.as_bytes()).unwrap()).unwrap()
        };
        assert_eq!(
            p(r#"{"messages":[{"role":"assistant","reasoning\u005fcontent":"r","content":"a"}]}"#),
            r#"{"messages":[{"role":"assistant","reasoning":"r","content":"a"}],"add_generation_prompt":true}"#
        );
        assert_eq!(
            p(r#"{"messages":[],"reasoning_effort":"\u006eone"}"#),
            r#"{"messages":[],"add_generation_prompt":true,"chat_template_kwargs":{"reasoning_effort":"none","enable_thinking":false}}"#
        );
    }
}
