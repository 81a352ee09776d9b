//! The canonical form of one message of a conversation (Responses: one input item), which the
//! conversation's prefix chain hashes (docs/spec.md §15b): two serializations of a message
//! share it only where the server renders them to the same tokens, so a conversation whose
//! client writes an earlier message again in another form still finds its earlier count.
//!
//! The form is the message's own bytes with two edits, each of which leaves a JSON object
//! that the server renders as it renders the message:
//! * the members each dialect names as never rendered (Anthropic's and OpenAI's
//!   `cache_control`) taken out, with the comma before them, of the message and of its content
//!   blocks only (never inside a tool call's arguments, which are rendered);
//! * a `content` array that holds one text block and nothing else replaced by that block's
//!   text, when it is not empty: the server renders a lone text block as the string it holds.
//!
//! Everything else stays as it came, white space and member order included: two forms that
//! differ there have two canonical forms and are told apart (a count more, never a wrong
//! bound). Clients write each message the same way every turn but for those two edits
//! (bench/sessions/recorded). Which forms are equal is shown against the real server by
//! tests/vllm/test_vllm_forms.py.

use crate::json::compact::{compact, write_string};
use crate::json::scan::{array_items, scan, Member};
use std::ops::Range;

/// What a dialect's messages may carry that the server renders alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canon {
    /// Members of a message, or of one of its content blocks, that the server never renders.
    pub ignored: &'static [&'static str],
    /// The `type` of a content block that, alone in `content`, renders as its `text`.
    pub text_block: Option<&'static str>,
}

impl Canon {
    fn ignores(&self, key: &str) -> bool {
        self.ignored.contains(&key)
    }
}

/// Appends the canonical form of `raw` (one valid JSON value, a message or input item) to
/// `out`; `None` when it is not an object. A message that holds neither an ignored member's
/// name nor a `"text"` key is its own canonical form, found by two substring searches;
/// any other is read member by member and written with the edits above, and as it came
/// where an edit cannot be made cleanly (duplicate members, an ignored member first among
/// several): at worst a prefix not found, never two renderings under one form.
pub fn write(canon: &Canon, raw: &[u8], out: &mut Vec<u8>) -> Option<()> {
    if !raw.starts_with(b"{") {
        return None;
    }
    let edits = if may_edit(canon, raw) {
        edits(canon, raw).unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut at = 0;
    for (range, with) in &edits {
        out.extend_from_slice(raw.get(at..range.start)?);
        out.extend_from_slice(with);
        at = range.end;
    }
    out.extend_from_slice(raw.get(at..)?);
    Some(())
}

/// Whether `raw` may hold anything to edit: an ignored member's name, or a text block.
fn may_edit(canon: &Canon, raw: &[u8]) -> bool {
    let finds = |needle: &[u8]| memchr::memmem::find(raw, needle).is_some();
    canon.ignored.iter().any(|k| finds(k.as_bytes()))
        || (canon.text_block.is_some() && finds(b"\"text\""))
}

/// A range of the message and what replaces it.
type Edit<'a> = (Range<usize>, &'a [u8]);

/// The edits of the message `raw`, in order and apart; `None` where they cannot be made
/// cleanly.
fn edits<'a>(canon: &Canon, raw: &'a [u8]) -> Option<Vec<Edit<'a>>> {
    let members = members(raw)?;
    if members.iter().filter(|m| m.key == "content").count() > 1 {
        return None;
    }
    let mut edits = Vec::new();
    for (i, m) in members.iter().enumerate() {
        if canon.ignores(&m.key) {
            edits.push(removal(&members, i, 0)?);
        } else if m.key == "content" {
            content_edits(canon, raw, m.value.clone(), &mut edits)?;
        }
    }
    let apart = edits.windows(2).all(|w| match w {
        [a, b] => a.0.end <= b.0.start,
        _ => true,
    });
    apart.then_some(edits)
}

/// The edits of a `content` value at `value` in the message: a lone text block as its text,
/// else the ignored members of its blocks taken out.
fn content_edits<'a>(
    canon: &Canon,
    raw: &'a [u8],
    value: Range<usize>,
    edits: &mut Vec<Edit<'a>>,
) -> Option<()> {
    let content = raw.get(value.clone())?;
    if !content.starts_with(b"[") {
        return Some(());
    }
    let items = array_items(content)?;
    if let [only] = items.as_slice() {
        if let Some(text) = lone_text(canon, content.get(only.clone())?) {
            edits.push((value, text));
            return Some(());
        }
    }
    for item in items {
        let block = content.get(item.clone())?;
        if block.starts_with(b"{") {
            let block_members = members(block)?;
            for (i, m) in block_members.iter().enumerate() {
                if canon.ignores(&m.key) {
                    edits.push(removal(&block_members, i, value.start + item.start)?);
                }
            }
        }
    }
    Some(())
}

/// The removal of member `i` of an object whose members are `members` (at `at` in the
/// message), with the comma before it; `None` when it is the first of several (no comma
/// before it to take).
fn removal(members: &[Member], i: usize, at: usize) -> Option<Edit<'static>> {
    let m = members.get(i)?;
    let range = match i.checked_sub(1).and_then(|p| members.get(p)) {
        Some(before) => before.value.end..m.value.end,
        None if members.len() == 1 => m.key_start..m.value.end,
        None => return None,
    };
    Some((at + range.start..at + range.end, &[]))
}

/// Writes the object `raw` without the ignored members, each member's value by `value`.
fn object(
    canon: &Canon,
    raw: &[u8],
    out: &mut Vec<u8>,
    mut value: impl FnMut(&Canon, &str, &[u8], &mut Vec<u8>) -> Option<()>,
) -> Option<()> {
    let members = members(raw)?;
    out.push(b'{');
    let mut first = true;
    for m in members.iter().filter(|m| !canon.ignores(&m.key)) {
        if !first {
            out.push(b',');
        }
        first = false;
        key(raw, m.key_start, out)?;
        value(canon, &m.key, raw.get(m.value.clone())?, out)?;
    }
    out.push(b'}');
    Some(())
}

/// The members of the object `raw`.
fn members(raw: &[u8]) -> Option<Vec<Member>> {
    scan(raw).ok()
}

/// `"key":`, the key token that opens at `at` written as vLLM reads it.
fn key(raw: &[u8], at: usize, out: &mut Vec<u8>) -> Option<()> {
    let mut i = at + 1;
    loop {
        match raw.get(i)? {
            b'\\' => i += 2,
            b'"' => break,
            _ => i += 1,
        }
    }
    write_string(std::str::from_utf8(raw.get(at..=i)?).ok()?, out)?;
    out.push(b':');
    Some(())
}

/// The raw string `text` of a block that is a text block and nothing else (ignored members
/// aside), when that text is not empty (vLLM's Anthropic conversion drops an empty block, and
/// with it a message that held only that).
fn lone_text<'a>(canon: &Canon, block: &'a [u8]) -> Option<&'a [u8]> {
    let kind = canon.text_block?;
    if !block.starts_with(b"{") {
        return None;
    }
    let members = members(block)?;
    let mut kept = members.iter().filter(|m| !canon.ignores(&m.key));
    let (a, b) = (kept.next()?, kept.next()?);
    if kept.next().is_some() {
        return None;
    }
    let (type_member, text_member) = match (a.key.as_str(), b.key.as_str()) {
        ("type", "text") => (a, b),
        ("text", "type") => (b, a),
        _ => return None,
    };
    let kind_raw = block.get(type_member.value.clone())?;
    let mut decoded = Vec::new();
    compact(std::str::from_utf8(kind_raw).ok()?, &mut decoded)?;
    let text = block.get(text_member.value.clone())?;
    (decoded.get(1..decoded.len().checked_sub(1)?) == Some(kind.as_bytes())
        && decoded.first() == Some(&b'"')
        && text.starts_with(b"\"")
        && text != b"\"\"")
        .then_some(text)
}

/// A message's text block by block, where its content is text only: a string, or an array of
/// text blocks (none empty). `shape` digests the rest of its canonical form (role, name, …);
/// `texts` each text as the server parses it. The server renders such a content as its texts
/// joined by a newline (a lone one as itself), so a message sent again with some of its
/// blocks left out, and nothing else changed, renders to a subsequence of the text it had
/// (docs/spec.md §15b): Qwen Code drops the date reminder of its newest message once a newer
/// one comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Texts {
    pub shape: u64,
    pub texts: Vec<u64>,
}

/// See [`Texts`]; `None` for a message whose content is anything but text, or empty.
pub fn texts(canon: &Canon, raw: &[u8]) -> Option<Texts> {
    let digest = text_digest;
    let mut content = None;
    let mut rest = Vec::new();
    object(canon, raw, &mut rest, |_, key, value, out| {
        if key == "content" {
            content = Some(value.to_vec());
            Some(())
        } else {
            compact(std::str::from_utf8(value).ok()?, out)
        }
    })?;
    let content = content?;
    let texts = if content.starts_with(b"[") {
        let items = array_items(&content)?;
        let mut texts = Vec::with_capacity(items.len());
        for item in items {
            texts.push(digest(lone_text(canon, content.get(item)?)?)?);
        }
        texts
    } else if content.starts_with(b"\"") && content != b"\"\"" {
        vec![digest(&content)?]
    } else {
        return None;
    };
    (!texts.is_empty()).then(|| Texts {
        shape: crate::digest::digest(&rest) as u64,
        texts,
    })
}

/// The digest [`Texts`] keeps of a text: its JSON string as the server parses it.
fn text_digest(text: &[u8]) -> Option<u64> {
    let mut out = Vec::with_capacity(text.len());
    compact(std::str::from_utf8(text).ok()?, &mut out)?;
    Some(crate::digest::digest(&out) as u64)
}

/// The message `raw`, whose content is an array of text blocks, written with a block left out
/// for each digest in `drop` (texts as [`Texts`] digests them), everything else as it came;
/// `None` unless each digest finds a block of its own and a block remains.
pub fn without(canon: &Canon, raw: &[u8], drop: &[u64]) -> Option<Vec<u8>> {
    let members = members(raw)?;
    let mut contents = members.iter().filter(|m| m.key == "content");
    let value = contents.next()?.value.clone();
    if contents.next().is_some() {
        return None;
    }
    let content = raw.get(value.clone())?;
    if !content.starts_with(b"[") {
        return None;
    }
    let mut left = drop.to_vec();
    let mut kept = Vec::new();
    for item in array_items(content)? {
        let block = content.get(item)?;
        let digest = text_digest(lone_text(canon, block)?)?;
        match left.iter().position(|d| *d == digest) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => kept.push(block),
        }
    }
    if !left.is_empty() || kept.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(raw.get(..value.start)?);
    out.push(b'[');
    for (i, block) in kept.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(block);
    }
    out.push(b']');
    out.extend_from_slice(raw.get(value.end..)?);
    Some(out)
}

impl Texts {
    /// The texts of `earlier` that `self`, a shorter subsequence of them, leaves out (see
    /// [`Texts::leaves_out`]), in order.
    pub fn left_out(&self, earlier: &Texts) -> Vec<u64> {
        let mut now = self.texts.iter().peekable();
        earlier
            .texts
            .iter()
            .filter(|e| {
                let kept = now.peek() == Some(e);
                if kept {
                    now.next();
                }
                !kept
            })
            .copied()
            .collect()
    }

    /// Whether `self` is `earlier` with one or more of its blocks left out: the same shape,
    /// and its texts a shorter subsequence of `earlier`'s.
    pub fn leaves_out(&self, earlier: &Texts) -> bool {
        if self.shape != earlier.shape || self.texts.len() >= earlier.texts.len() {
            return false;
        }
        let mut rest = earlier.texts.iter();
        self.texts.iter().all(|t| rest.any(|e| e == t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: Canon = Canon {
        ignored: &["cache_control"],
        text_block: Some("text"),
    };
    const PLAIN: Canon = Canon {
        ignored: &[],
        text_block: None,
    };

    fn canonical(canon: &Canon, raw: &str) -> String {
        let mut out = Vec::new();
        write(canon, raw.as_bytes(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_lone_text_block_is_its_text() {
        let string = r#"{"role":"user","content":"hi\nthere"}"#;
        for form in [
            string,
            r#"{"role":"user","content":[{"type":"text","text":"hi\nthere"}]}"#,
            r#"{"role":"user","content":[{"text":"hi\nthere","type":"text"}]}"#,
            r#"{"role":"user","content":[{"type":"text","text":"hi\nthere","cache_control":{"type":"ephemeral"}}]}"#,
            r#"{"role":"user","content":[{"type":"text","cache_control":{"type":"ephemeral","ttl":"1h"},"text":"hi\nthere"}]}"#,
            r#"{"role":"user","content":"hi\nthere","cache_control":{"type":"ephemeral"}}"#,
        ] {
            assert_eq!(canonical(&CHAT, form), string, "{form}");
        }
    }

    #[test]
    fn forms_that_may_render_otherwise_stay_apart() {
        let string = canonical(&CHAT, r#"{"role":"user","content":"ab"}"#);
        for other in [
            // Two blocks render with a separator between them.
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
            // A block with any other member, or of another type, is not its text.
            r#"{"role":"user","content":[{"type":"text","text":"ab","citations":[]}]}"#,
            r#"{"role":"user","content":[{"type":"input_text","text":"ab"}]}"#,
            r#"{"role":"user","content":[{"type":"text","text":["ab"]}]}"#,
            r#"{"role":"user","content":[{"type":"text"}]}"#,
            r#"{"role":"user","content":[{"type":"text","text":""}]}"#,
            r#"{"role":"user","content":["ab"]}"#,
            r#"{"content":"ab","role":"user"}"#,
            r#"{"role":"user","content":"ab","name":"x"}"#,
            r#"{"role":"assistant","content":"ab"}"#,
            // Written otherwise: white space, escapes, or cache_control first among several.
            r#"{ "role":"user","content":"ab"}"#,
            r#"{"role":"user","content":"\u0061b"}"#,
            r#"{"cache_control":{},"role":"user","content":"ab"}"#,
        ] {
            assert_ne!(canonical(&CHAT, other), string, "{other}");
        }
        // An empty block is dropped with its message, an empty string is not.
        assert_ne!(
            canonical(
                &CHAT,
                r#"{"role":"user","content":[{"type":"text","text":""}]}"#
            ),
            canonical(&CHAT, r#"{"role":"user","content":""}"#)
        );
        // A dialect without a text block keeps the array.
        assert_eq!(
            canonical(&PLAIN, r#"{"content":[{"type":"text","text":"a"}]}"#),
            r#"{"content":[{"type":"text","text":"a"}]}"#
        );
    }

    #[test]
    fn ignored_members_go_only_where_the_server_drops_them() {
        // In a block of several, the block's own cache_control goes.
        assert_eq!(
            canonical(
                &CHAT,
                r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]}"#
            ),
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#
        );
        // Inside a tool call's input or arguments it is data, rendered: it stays.
        let tool_use = r#"{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"cache_control":1}}]}"#;
        assert_eq!(canonical(&CHAT, tool_use), tool_use);
        let args = r#"{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"cache_control\":1}"},"cache_control":{}}]}"#;
        assert_eq!(canonical(&CHAT, args), args);
    }

    #[test]
    fn the_blocks_left_out_are_named_and_can_be_left_out_of_another_message() {
        let texts = |raw: &str| texts(&CHAT, raw.as_bytes()).unwrap();
        let digest = |t: &str| text_digest(format!("{t:?}").as_bytes()).unwrap();
        let earlier = texts(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"<date>"},{"type":"text","text":"b"}]}"#,
        );
        let now = texts(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        );
        assert_eq!(now.left_out(&earlier), vec![digest("<date>")]);
        assert_eq!(
            texts(r#"{"role":"user","content":"b"}"#).left_out(&earlier),
            vec![digest("a"), digest("<date>")]
        );
        // The newest message carries the block again: written without it, as it came else.
        let newest = r#"{"role":"user", "content":[{"type":"text","text":"<date>","cache_control":{}},{"text":"c","type":"text"}],"x":1}"#;
        let out = without(&CHAT, newest.as_bytes(), &[digest("<date>")]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"role":"user", "content":[{"text":"c","type":"text"}],"x":1}"#
        );
        for (raw, drop) in [
            // A block not there, a block asked for twice, nothing left, not text only.
            (newest, vec![digest("d")]),
            (newest, vec![digest("<date>"), digest("<date>")]),
            (
                r#"{"role":"user","content":[{"type":"text","text":"<date>"}]}"#,
                vec![digest("<date>")],
            ),
            (
                r#"{"role":"user","content":"<date>"}"#,
                vec![digest("<date>")],
            ),
            (
                r#"{"role":"user","content":[{"type":"text","text":"<date>"},{"type":"image_url","image_url":{}}]}"#,
                vec![digest("<date>")],
            ),
        ] {
            assert_eq!(without(&CHAT, raw.as_bytes(), &drop), None, "{raw}");
        }
    }

    #[test]
    fn a_message_that_leaves_out_blocks_is_told() {
        let texts = |raw: &str| texts(&CHAT, raw.as_bytes()).unwrap();
        let newest = texts(
            r#"{"role":"user","content":[{"type":"text","text":"<date>"},{"type":"text","text":"go","cache_control":{}}]}"#,
        );
        assert_eq!(newest.texts.len(), 2);
        for later in [
            r#"{"role":"user","content":[{"type":"text","text":"go"}]}"#,
            r#"{"role":"user","content":"go"}"#,
            r#"{"role":"user","content":"<date>"}"#,
        ] {
            assert!(texts(later).leaves_out(&newest), "{later}");
        }
        for other in [
            // Nothing left out, another text, another order, another role, more members.
            r#"{"role":"user","content":[{"type":"text","text":"<date>"},{"type":"text","text":"go"}]}"#,
            r#"{"role":"user","content":"og"}"#,
            r#"{"role":"assistant","content":"go"}"#,
            r#"{"role":"user","content":"go","name":"n"}"#,
        ] {
            assert!(!texts(other).leaves_out(&newest), "{other}");
        }
        let three = texts(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"text","text":"c"}]}"#,
        );
        assert!(texts(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"c"}]}"#
        )
        .leaves_out(&three));
        assert!(!texts(
            r#"{"role":"user","content":[{"type":"text","text":"c"},{"type":"text","text":"a"}]}"#
        )
        .leaves_out(&three));
        // Only text is told block by block.
        for none in [
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]}"#,
            r#"{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"a"}]}"#,
            r#"{"role":"user","content":""}"#,
            r#"{"role":"user","content":[]}"#,
            r#"{"role":"user"}"#,
        ] {
            assert_eq!(super::texts(&CHAT, none.as_bytes()), None, "{none}");
        }
    }

    #[test]
    fn what_is_not_an_object_has_no_form() {
        let mut out = Vec::new();
        assert_eq!(write(&CHAT, br#"["user","hi"]"#, &mut out), None);
        assert_eq!(write(&CHAT, br#""hi""#, &mut out), None);
    }

    /// A model of how vLLM renders an Anthropic or chat message's content (its conversion
    /// to chat messages, then a template that takes content as a string): a string as it
    /// is; the text blocks that are not empty, one alone as its text, several joined by a
    /// newline; no text at all drops the content. Every other member is rendered as it
    /// parses, but `cache_control`, which is never read.
    fn rendered(raw: &str) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let Value::Object(message) = serde_json::from_str::<Value>(raw).unwrap() else {
            unreachable!()
        };
        let mut out = Map::new();
        for (key, value) in message {
            match (key.as_str(), value) {
                ("cache_control", _) => {}
                ("content", Value::Array(blocks)) => {
                    let texts: Vec<String> = blocks
                        .iter()
                        .filter_map(|b| b.get("text").and_then(Value::as_str))
                        .filter(|t| !t.is_empty())
                        .map(str::to_string)
                        .collect();
                    if !texts.is_empty() {
                        out.insert(key, json!(texts.join("\n")));
                    }
                }
                (_, value) => {
                    out.insert(key, value);
                }
            }
        }
        Value::Object(out)
    }

    fn text() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec!["", "a", "b", "a\\nb", "\\u0061"])
    }

    /// One text block, in either member order, with or without `cache_control`.
    fn block() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        (text(), any::<bool>(), any::<bool>()).prop_map(|(t, swap, cached)| {
            let cache = if cached {
                r#","cache_control":{"type":"ephemeral"}"#
            } else {
                ""
            };
            if swap {
                format!(r#"{{"text":"{t}"{cache},"type":"text"}}"#)
            } else {
                format!(r#"{{"type":"text" , "text":"{t}"{cache}}}"#)
            }
        })
    }

    fn message() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let content = prop_oneof![
            text().prop_map(|t| format!(r#""{t}""#)),
            proptest::collection::vec(block(), 0..3).prop_map(|b| format!("[{}]", b.join(","))),
        ];
        let role = proptest::sample::select(vec!["user", "assistant"]);
        (role, content, any::<bool>()).prop_map(|(role, content, cached)| {
            let cache = if cached {
                r#", "cache_control":{"type":"ephemeral"}"#
            } else {
                ""
            };
            format!(r#"{{"role":"{role}","content":{content}{cache}}}"#)
        })
    }

    proptest::proptest! {
        /// Two messages share a canonical form only where the model renders them alike.
        #[test]
        fn one_form_is_one_rendering(a in message(), b in message()) {
            let (ca, cb) = (canonical(&CHAT, &a), canonical(&CHAT, &b));
            if ca == cb {
                proptest::prop_assert_eq!(rendered(&a), rendered(&b), "{} ~ {}", a, b);
            }
            // The form renders as the message does.
            proptest::prop_assert_eq!(rendered(&ca), rendered(&a));
        }
    }
}
