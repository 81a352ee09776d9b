//! The `/tokenize` payload (docs/spec.md §5), written from the raw request slices without building a
//! DOM: values are copied in compact form; only strings with escapes are decoded and written
//! again (so the payload reads as Python's `json.dumps(..., ensure_ascii=False,
//! separators=(",", ":"))` of the request would), and message / `chat_template_kwargs`
//! objects are rewritten member by member where a key has to change.

use super::request::{Form, Request};
use crate::json::compact::{compact, write_string};
use crate::json::find::contains;
use crate::json::scan::{array_items, scan, Member};

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

fn write_key(key: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
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

/// Compacts `text` into `out` and returns true, unless the compacted text names
/// `reasoning_content`: then `out` is left as it was and it returns false. Once compacted, a
/// key that is `reasoning_content`, however escaped, reads so literally.
fn compact_unless_reasoning(text: &str, out: &mut Vec<u8>) -> Option<bool> {
    let mark = out.len();
    compact(text, out)?;
    let named = out
        .get(mark..)
        .is_some_and(|written| contains(written, b"reasoning_content"));
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

/// Builds the `/tokenize` payload. `None` when a field it needs is not of the expected form
/// (the caller then uses the estimate).
pub fn payload(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    let f = &req.fields;
    let mut out = Vec::with_capacity(
        req.raw_bytes(body, f.messages.or(f.prompt))
            .map_or(64, |m| m.len() + 256),
    );
    out.push(b'{');
    let field = |out: &mut Vec<u8>, name: &str, raw: Option<&str>| -> Option<()> {
        if let Some(raw) = raw {
            if out.len() > 1 {
                out.push(b',');
            }
            write_key(name, out);
            compact(raw, out)?;
        }
        Some(())
    };
    field(&mut out, "model", req.raw(body, f.model))?;
    match req.form {
        Form::Completion => {
            let mut prompt = req.raw(body, f.prompt)?;
            if prompt.starts_with('[') {
                match array_items(prompt.as_bytes())?.as_slice() {
                    [one] => prompt = prompt.get(one.clone())?,
                    _ => return None,
                }
            }
            field(&mut out, "prompt", Some(prompt))?;
            field(
                &mut out,
                "add_special_tokens",
                req.raw(body, f.add_special_tokens),
            )?;
        }
        // Anthropic requests go to the backend's own counter as they are.
        Form::Messages => return None,
        Form::Chat => {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(b"\"messages\":");
            write_messages(req.raw(body, f.messages)?, &mut out)?;
            let tools = req
                .raw(body, f.tools)
                .filter(|t| t.starts_with('[') && !req.omit_tools);
            field(&mut out, "tools", tools)?;
            let agp = req.raw(body, f.add_generation_prompt).or(Some("true"));
            field(&mut out, "add_generation_prompt", agp)?;
            field(
                &mut out,
                "continue_final_message",
                req.raw(body, f.continue_final_message),
            )?;
            field(
                &mut out,
                "add_special_tokens",
                req.raw(body, f.add_special_tokens),
            )?;
            field(&mut out, "chat_template", req.raw(body, f.chat_template))?;
            write_template_kwargs(req, body, &mut out)?;
            field(
                &mut out,
                "media_io_kwargs",
                req.raw(body, f.media_io_kwargs),
            )?;
            field(
                &mut out,
                "mm_processor_kwargs",
                req.raw(body, f.mm_processor_kwargs),
            )?;
        }
    }
    out.push(b'}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
