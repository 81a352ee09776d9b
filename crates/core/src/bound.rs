//! Counting only when the count can change the decision (docs/spec.md §15).
//!
//! A conversation's prefix is identified by a hash chain over its messages (Responses: its
//! input items): link `i` hashes link `i − 1` and the canonical form of message `i`
//! (`dialect::canonical`: two forms share it only where the server renders them alike),
//! seeded by everything else that can change the prompt (every other top-level member except
//! the caps, the stream switches and what the dialect never renders, the tokenizer route and
//! C). After an exact count the filter keeps
//! `(link n, count)` in a direct-mapped table in shared data, like the count cache: the next
//! turn, whose messages start with these n, finds it and bounds its own prompt by
//!
//! ```text
//! P_hi = count(prefix) + TAIL + RESTYLE·k_r + Σ over the new messages of bound(message)
//! bound(message) = bytes + Σ over its tool-call arguments of (separators + FLOAT·floats)
//!                  + MESSAGE + BLOCK·(content blocks + tool calls)
//! ```
//!
//! Why this is an upper bound (vLLM, byte-level BPE tokenizers such as Qwen3's):
//! * every token of a byte-level BPE covers at least one byte of the rendered text, and the
//!   template's special tokens (`<|im_start|>`, `<tool_call>`, …) cover several, so a text
//!   renders to at most as many tokens as it has bytes;
//! * a message's text renders from its JSON with escapes resolved (never longer than the raw
//!   bytes), except tool-call arguments (OpenAI `arguments`, Anthropic `input`), which vLLM
//!   parses and writes again with Python's `json.dumps`: strings come out no longer than they
//!   came in, but every `,` and `:` gains a space and a float is printed by its repr (at most
//!   FLOAT bytes: `1e15` → `1000000000000000.0`), hence one byte per separator and FLOAT per
//!   float on top of the raw bytes;
//! * the template's own text around a message (role header, `<tool_response>` wrappers,
//!   `<tool_call>` JSON frame) is covered by MESSAGE per message and BLOCK per content block or
//!   tool call;
//! * the special tokens between messages cut the BPE, so the prompt's count is the sum of its
//!   messages' counts and the prefix count carries over, except where the template renders an
//!   earlier message differently once later messages exist: Qwen3 strips the reasoning of
//!   assistant turns before the last user query, which only shortens them; RESTYLE per prefix
//!   message that carries reasoning covers the tokens at the new seam;
//! * the earlier count included its own generation prompt, and TAIL covers this one's.
//!
//! Where that bound of the new messages leaves too little room, their exact count does better:
//! the backend counts the new messages alone (the tail: rendered by the server's own template
//! as a conversation of their own, without the system prompt and the tools), and
//!
//! ```text
//! P_hi = count(prefix) + count(tail) + SEAM + RESTYLE·k_r
//! ```
//!
//! which holds for the same reasons: the special tokens between messages cut the BPE, so the
//! tail renders to the same tokens in both conversations, except at the seam, where the full
//! conversation may render a little more than the tail alone (Qwen3 gives its final assistant
//! message an empty think block once a user query precedes it): SEAM covers that. The tail's
//! own count includes one generation prompt, as the prompt does. A tail whose assistant
//! messages carry reasoning is not counted alone (the template may render it only in the full
//! conversation), nor is one the byte bound cannot see through.
//!
//! Content the bound cannot see through — images, audio, files, documents, roles other than
//! system, user, assistant and tool, Anthropic blocks other than text, thinking, tool_use and
//! tool_result with text — makes the request count as before. So does every backend other
//! than vLLM. The bound is checked, not trusted: the flow counts every skipped request after it
//! went upstream and turns skipping off for the route on any count above its bound.

use crate::dialect::Form;
use crate::digest::update_framed;
use crate::json::find::Needle;
use crate::json::scan::skip_ws;
use crate::json::skim::container_end;
use crate::request::Request;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;
use xxhash_rust::xxh3::Xxh3;

/// The generation prompt (`<|im_start|>assistant\n`, an empty think block).
pub const TAIL: u64 = 16;
/// The template's text around one message.
pub const MESSAGE: u64 = 32;
/// The template's text around one content block or tool call.
pub const BLOCK: u64 = 48;
/// Python's repr of a float is at most this long (`-1.2345678901234567e-308`).
pub const FLOAT: u64 = 24;
/// Re-rendering seam of an earlier message whose reasoning the template may drop.
pub const RESTYLE: u64 = 8;
/// What the full conversation may render at the seam beyond its prefix's and its tail's counts.
pub const SEAM: u64 = 16;
/// Bytes per token guessed for a tail before counting it: a tail is counted alone only when
/// this guess leaves room for the cap (a guess, never a bound: it only decides which count
/// to ask for).
pub const GUESS_BYTES_PER_TOKEN: u64 = 4;
/// How many prefix lengths are probed, newest first.
pub const MAX_PROBES: usize = 16;

/// The members that never change the prompt: the caps and the streaming switches, and those
/// the dialect names as never rendered.
fn unrelated(form: Form, key: &str) -> bool {
    matches!(
        key,
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" | "stream" | "stream_options"
    ) || form.unrendered(key)
}

/// The request's messages and the chain over them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// `links[i]` identifies messages `0..=i` in this context.
    pub links: Vec<u128>,
    /// Each message's raw range in the body.
    pub items: Vec<Range<usize>>,
}

/// The seed: everything but the messages that determines the prompt, plus route and C.
fn seed(req: &Request, body: &[u8], scope: &str, context_length: Option<u64>) -> u128 {
    let mut h = Xxh3::new();
    let mut field = |bytes: &[u8]| update_framed(&mut h, bytes);
    field(scope.as_bytes());
    field(&context_length.unwrap_or(0).to_le_bytes());
    field(&[req.form as u8]);
    for (i, m) in req.members.iter().enumerate() {
        if Some(i) == req.form.conversation(&req.fields) || unrelated(req.form, &m.key) {
            continue;
        }
        field(m.key.as_bytes());
        field(body.get(m.value.clone()).unwrap_or_default());
    }
    h.digest128()
}

/// The items of the array at `range` when every item is an object, found by skimming: the
/// body was validated before (`Request::validate`).
fn objects(body: &[u8], range: Range<usize>) -> Option<Vec<Range<usize>>> {
    let mut items = Vec::new();
    let mut i = skip_ws(body, range.start);
    if body.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(body, i + 1);
    if body.get(i) == Some(&b']') {
        return Some(items);
    }
    loop {
        if body.get(i) != Some(&b'{') {
            return None;
        }
        let end = container_end(body, i).filter(|e| *e <= range.end)?;
        items.push(i..end);
        i = skip_ws(body, end);
        match body.get(i) {
            Some(b',') => i = skip_ws(body, i + 1),
            Some(b']') => return Some(items),
            _ => return None,
        }
    }
}

/// The chain of a chat, Anthropic or Responses request whose body was validated; `None` when
/// its messages (input items) are not an array of objects. Each link hashes its message's
/// canonical form (`dialect::canonical`): a message the client writes again in another form
/// that the server renders alike keeps its link.
pub fn chain(
    req: &Request,
    body: &[u8],
    scope: &str,
    context_length: Option<u64>,
) -> Option<Chain> {
    let range = req
        .members
        .get(req.form.conversation(&req.fields)?)?
        .value
        .clone();
    let items = objects(body, range)?;
    let canon = req.form.canon();
    let mut link = seed(req, body, scope, context_length);
    let mut form = Vec::new();
    let mut links = Vec::with_capacity(items.len());
    for r in &items {
        form.clear();
        crate::dialect::canonical::write(canon, body.get(r.clone())?, &mut form)?;
        let mut h = Xxh3::new();
        h.update(&link.to_le_bytes());
        update_framed(&mut h, &form);
        link = h.digest128();
        links.push(link);
    }
    Some(Chain { links, items })
}

/// What the table keeps for one prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Prompt tokens of the request that ended with this prefix: exact, or an upper bound.
    pub tokens: u64,
    pub exact: bool,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// What re-serialising the JSON text `json` with Python's `json.dumps` may add to its length:
/// a space after each `,` and `:` outside strings, and up to FLOAT bytes for each float (a
/// number with a fraction or an exponent; integers print as they came). Strings never grow:
/// escapes are resolved and written again no longer. Text that is not JSON is replaced by
/// `{}` in vLLM, which the message overhead covers.
pub fn reserialized_growth(json: &[u8]) -> u64 {
    let mut growth = 0;
    let mut i = 0;
    while let Some(&b) = json.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = json.get(i).filter(|c| **c != b'"') {
                    i += if c == b'\\' { 2 } else { 1 };
                }
            }
            b',' | b':' => growth += 1,
            b'-' | b'0'..=b'9' => {
                let mut float = false;
                while let Some(&n) = json
                    .get(i + 1)
                    .filter(|n| matches!(n, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
                {
                    float |= matches!(n, b'.' | b'e' | b'E');
                    i += 1;
                }
                if float {
                    growth += FLOAT;
                }
            }
            _ => {}
        }
        i += 1;
    }
    growth
}

/// The growth of a tool call's arguments: a JSON string holding JSON text (OpenAI), or the
/// JSON value itself (Anthropic's `input`).
pub(crate) fn arguments_growth(arguments: Option<&RawValue>) -> u64 {
    let Some(raw) = arguments.map(|a| a.get()) else {
        return 0;
    };
    if raw.starts_with('"') {
        serde_json::from_str::<Cow<str>>(raw).map_or(0, |text| reserialized_growth(text.as_bytes()))
    } else {
        reserialized_growth(raw.as_bytes())
    }
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

/// Blocks of a content array, when it is one; `None` when one of them is not an object.
fn blocks(content: Option<&RawValue>) -> Option<Vec<Block<'_>>> {
    match content.map(|c| c.get()) {
        Some(c) if c.starts_with('[') => {
            let parts: Vec<&RawValue> = serde_json::from_str(c).ok()?;
            parts.iter().map(|p| object(p.get())).collect()
        }
        _ => Some(Vec::new()),
    }
}

/// `text` as `T` when it is a JSON object (serde would also read a struct from an array of
/// its fields).
fn object<'a, T: Deserialize<'a>>(text: &'a str) -> Option<T> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Whether a tool result's content is text only.
fn text_only(content: Option<&RawValue>) -> bool {
    blocks(content).is_some_and(|b| b.iter().all(|b| b.kind == "text"))
}

/// The token bound of one new message, `None` where the bound's assumptions do not hold.
pub fn message_bound(form: Form, raw: &[u8]) -> Option<u64> {
    bound_and_role(form, raw).map(|(bound, _)| bound)
}

/// The token bound of one new message and whether it is the assistant's.
fn bound_and_role(form: Form, raw: &[u8]) -> Option<(u64, bool)> {
    if form == Form::Responses {
        return crate::dialect::responses::item_bound(raw);
    }
    let m: Message = object(std::str::from_utf8(raw).ok()?)?;
    let bound = bound_of(form, raw.len() as u64, &m)?;
    Some((bound, m.role == "assistant"))
}

fn bound_of(form: Form, bytes: u64, m: &Message) -> Option<u64> {
    match form {
        Form::Chat => {
            if !matches!(m.role.as_ref(), "system" | "user" | "assistant" | "tool") {
                return None;
            }
            let parts = blocks(m.content)?;
            if !parts.iter().all(|p| p.kind == "text") {
                return None;
            }
            let calls: Vec<ToolCall> = match m.tool_calls.map(|t| t.get()) {
                None | Some("null") => Vec::new(),
                Some(t) => serde_json::from_str(t).ok()?,
            };
            let growth: u64 = calls
                .iter()
                .map(|c| arguments_growth(c.function.as_ref().and_then(|f| f.arguments)))
                .sum();
            let blocks = parts.len() as u64 + calls.len() as u64;
            Some(bytes + growth + MESSAGE + BLOCK * blocks)
        }
        Form::Messages => {
            if !matches!(m.role.as_ref(), "user" | "assistant") || m.tool_calls.is_some() {
                return None;
            }
            let parts = blocks(m.content)?;
            let mut growth = 0;
            for b in &parts {
                match b.kind.as_ref() {
                    "text" | "thinking" => {}
                    "tool_use" => growth += arguments_growth(b.input),
                    // An assistant's tool result is rendered as Python's str() of it.
                    "tool_result" if m.role == "user" && text_only(b.content) => {}
                    _ => return None,
                }
            }
            Some(bytes + growth + MESSAGE + BLOCK * parts.len() as u64)
        }
        Form::Completion | Form::Responses => None,
    }
}

/// Whether an earlier message may render differently once later messages exist (it carries
/// reasoning the template drops before the last user query).
fn restyles(raw: &[u8]) -> bool {
    static THINK: Needle = Needle::new(b"think");
    static REASONING: Needle = Needle::new(b"reasoning");
    THINK.is_in(raw) || REASONING.is_in(raw)
}

/// The restyling allowance of the first `k` messages: RESTYLE per message that carries
/// reasoning.
fn restyled(body: &[u8], chain: &Chain, k: usize) -> Option<u64> {
    let mut total: u64 = 0;
    for r in chain.items.get(..k)? {
        if restyles(body.get(r.clone())?) {
            total = total.checked_add(RESTYLE)?;
        }
    }
    Some(total)
}

/// What the messages after the first `k` bound the prompt by, given the exact count (or
/// bound) `prefix_tokens` of those `k`: P_hi from their bytes, and the tail to count alone
/// where that may prove more. `None` where the bound's assumptions do not hold.
pub fn bounds<'c>(
    form: Form,
    body: &[u8],
    chain: &'c Chain,
    k: usize,
    prefix_tokens: u64,
) -> Option<Bounds<'c>> {
    let restyled = restyled(body, chain, k)?;
    let items = chain.items.get(k..)?;
    let mut p_hi = prefix_tokens.checked_add(TAIL)?.checked_add(restyled)?;
    let mut bytes: u64 = 0;
    let mut alone = !items.is_empty();
    for r in items {
        let raw = body.get(r.clone())?;
        let (bound, assistant) = bound_and_role(form, raw)?;
        p_hi = p_hi.checked_add(bound)?;
        bytes = bytes.checked_add(raw.len() as u64)?;
        alone = alone && !(assistant && restyles(raw));
    }
    let base = prefix_tokens.checked_add(SEAM)?.checked_add(restyled)?;
    let tail = alone.then_some(Tail { items, base, bytes });
    Some(Bounds { p_hi, tail })
}

/// See [`bounds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds<'c> {
    /// P_hi from the bytes of the messages after the prefix.
    pub p_hi: u64,
    /// Those messages, to count alone; `None` where they may not be counted alone: there are
    /// none, or an assistant message of them carries reasoning.
    pub tail: Option<Tail<'c>>,
}

/// A tail to count alone (see [`bounds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail<'c> {
    /// The tail's messages, as raw ranges of the body.
    pub items: &'c [Range<usize>],
    /// What the tail's count adds to for P_hi.
    pub base: u64,
    /// The tail's raw bytes.
    pub bytes: u64,
}

impl Tail<'_> {
    /// Whether counting the tail may prove that `need` output tokens fit `w`: by the guess of
    /// GUESS_BYTES_PER_TOKEN bytes a token (a guess: it only spares a count that would not
    /// prove it).
    pub fn may_prove(&self, need: u64, w: u64) -> bool {
        self.base
            .saturating_add(self.bytes / GUESS_BYTES_PER_TOKEN)
            .saturating_add(need)
            <= w
    }
}

/// Writes the tail's messages as one JSON array (raw, as they stand in the body).
pub fn tail_array(body: &[u8], items: &[Range<usize>]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(items.iter().map(|r| r.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, r) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(body.get(r.clone())?);
    }
    out.push(b']');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::dialect::Endpoint;
    use crate::request::analyze_at;

    fn config() -> Config {
        Config::parse(br#"{"tokenizer":{"cluster":"v"},"context_length":40960}"#).unwrap()
    }

    fn chain_of(body: &str, endpoint: Endpoint, scope: &str) -> Chain {
        let req = analyze_at(body.as_bytes(), &config(), endpoint).unwrap();
        chain(&req, body.as_bytes(), scope, Some(40960)).unwrap()
    }

    fn upper_bound(form: Form, body: &[u8], chain: &Chain, k: usize, p: u64) -> Option<u64> {
        bounds(form, body, chain, k, p).map(|b| b.p_hi)
    }

    fn tail<'c>(form: Form, body: &[u8], chain: &'c Chain, k: usize, p: u64) -> Option<Tail<'c>> {
        bounds(form, body, chain, k, p)?.tail
    }

    const A: &str = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"tools":[],"max_tokens":10}"#;
    const B: &str = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}],"tools":[],"max_tokens":99,"stream":true}"#;

    #[test]
    fn a_grown_conversation_shares_its_prefix_links() {
        let a = chain_of(A, Endpoint::OpenAi, "r");
        let b = chain_of(B, Endpoint::OpenAi, "r");
        assert_eq!(a.links.len(), 2);
        assert_eq!(b.links.len(), 3);
        assert_eq!(
            a.links[..],
            b.links[..2],
            "caps and stream are not in the seed"
        );
        // Another route, other tools, another model, an edited message: nothing shared.
        assert_ne!(chain_of(A, Endpoint::OpenAi, "q").links[0], a.links[0]);
        let tools = A.replace(r#""tools":[]"#, r#""tools":[{}]"#);
        assert_ne!(chain_of(&tools, Endpoint::OpenAi, "r").links[1], a.links[1]);
        let model = A.replace(r#""model":"m""#, r#""model":"n""#);
        assert_ne!(chain_of(&model, Endpoint::OpenAi, "r").links[1], a.links[1]);
        let edited = B.replace(r#""content":"s""#, r#""content":"t""#);
        let e = chain_of(&edited, Endpoint::OpenAi, "r");
        assert!(e.links.iter().all(|l| !a.links.contains(l)));
        // The same messages in the Anthropic dialect are another conversation.
        let m = chain_of(A, Endpoint::Messages, "r");
        assert_ne!(m.links[1], a.links[1]);
        // The links identify positions: a reordered history shares nothing past the change.
        let swapped = r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"system","content":"s"}],"tools":[]}"#;
        let s = chain_of(swapped, Endpoint::OpenAi, "r");
        assert!(s.links.iter().all(|l| !a.links.contains(l)));
    }

    #[test]
    fn messages_are_split_by_skimming() {
        let spaced = br#"{"messages": [ {"role":"user","content":"a]"} ,
            {"role":"assistant","content":"}"}  ]}"#;
        let items = objects(spaced, 13..spaced.len() - 1).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            &spaced[items[0].clone()],
            br#"{"role":"user","content":"a]"}"#
        );
        assert_eq!(
            &spaced[items[1].clone()],
            br#"{"role":"assistant","content":"}"}"#
        );
        let text = br#"[]"#;
        assert_eq!(objects(text, 0..2), Some(vec![]));
        for text in [&br#"[1]"#[..], br#"[{},"x"]"#, br#"{"a":1}"#, br#"[{}"#] {
            assert_eq!(
                objects(text, 0..text.len()),
                None,
                "{:?}",
                std::str::from_utf8(text)
            );
        }
    }

    #[test]
    fn message_bounds() {
        let user = br#"{"role":"user","content":"hello"}"#;
        assert_eq!(
            message_bound(Form::Chat, user),
            Some(user.len() as u64 + MESSAGE)
        );
        let call = br#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1e15,\"b\":[1,2]}"}}]}"#;
        assert_eq!(
            message_bound(Form::Chat, call),
            Some(call.len() as u64 + 4 + FLOAT + MESSAGE + BLOCK),
            "four separators and one float"
        );
        let parts =
            br#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#;
        assert_eq!(
            message_bound(Form::Chat, parts),
            Some(parts.len() as u64 + MESSAGE + 2 * BLOCK)
        );
        // What the bound cannot see through.
        for raw in [
            &br#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}"#[..],
            br#"{"role":"developer","content":"x"}"#,
            br#"{"content":"x"}"#,
            br#"{"role":"user","content":"x""#,
            // Not an object (serde would read the fields from an array).
            br#"["assistant"]"#,
            br#" ["user", "hi"]"#,
            br#"{"role":"user","content":[["text"]]}"#,
        ] {
            assert_eq!(message_bound(Form::Chat, raw), None);
            assert_eq!(message_bound(Form::Messages, raw), None);
        }
        let tool_use = br#"{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":[1,2]}}]}"#;
        assert_eq!(
            message_bound(Form::Messages, tool_use),
            Some(tool_use.len() as u64 + 2 + MESSAGE + BLOCK)
        );
        let result = br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"ok"}]}]}"#;
        assert!(message_bound(Form::Messages, result).is_some());
        for raw in [
            &br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]}]}"#[..],
            br#"{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}"#,
            br#"{"role":"user","content":[{"type":"image","source":{}}]}"#,
            br#"{"role":"user","content":[{"type":"redacted_thinking","data":"x"}]}"#,
            br#"{"role":"system","content":"x"}"#,
        ] {
            assert_eq!(message_bound(Form::Messages, raw), None);
        }
    }

    /// Python's json.dumps of these texts (default separators, ensure_ascii off), checked by
    /// hand: growth must cover each.
    #[test]
    fn reserialized_growth_covers_python() {
        let cases: [(&str, &str); 7] = [
            (r#"{"a":1,"b":[1,2,3]}"#, r#"{"a": 1, "b": [1, 2, 3]}"#),
            (r#"[1e15]"#, r#"[1000000000000000.0]"#),
            (r#"{"x":-1.5e-300}"#, r#"{"x": -1.5e-300}"#),
            (r#"{"s":"a,b:c\"d"}"#, r#"{"s": "a,b:c\"d"}"#),
            (r#"{"u":"\u00e9"}"#, r#"{"u": "é"}"#),
            (r#"  { "a" : 1 }  "#, r#"{"a": 1}"#),
            (r#"[0.1,2E3,-0]"#, r#"[0.1, 2000.0, 0]"#),
        ];
        for (raw, python) in cases {
            let bound = raw.len() as u64 + reserialized_growth(raw.as_bytes());
            assert!(
                bound >= python.len() as u64,
                "{raw}: {bound} < {}",
                python.len()
            );
        }
        assert_eq!(
            reserialized_growth(br#"{"s":"a,b:c"}"#),
            1,
            "inside strings nothing"
        );
    }

    #[test]
    fn a_tail_is_what_follows_the_counted_prefix() {
        let b = chain_of(B, Endpoint::OpenAi, "r");
        let t = tail(Form::Chat, B.as_bytes(), &b, 2, 100).unwrap();
        assert_eq!(t.items, &b.items[2..]);
        let assistant = br#"{"role":"assistant","content":"yo"}"#;
        assert_eq!(t.bytes, assistant.len() as u64);
        assert_eq!(t.base, 100 + SEAM);
        assert_eq!(
            tail_array(B.as_bytes(), t.items).unwrap(),
            [&b"["[..], assistant, b"]"].concat()
        );
        let two = tail(Form::Chat, B.as_bytes(), &b, 1, 100).unwrap();
        let array = tail_array(B.as_bytes(), two.items).unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&array).unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), 2);
        // Nothing new: nothing to count.
        assert_eq!(tail(Form::Chat, B.as_bytes(), &b, 3, 100), None);
        // The guess: a quarter of the bytes a token.
        assert!(two.may_prove(1000, two.base + two.bytes / 4 + 1000));
        assert!(!two.may_prove(1000, two.base + two.bytes / 4 + 999));
    }

    #[test]
    fn tails_the_template_may_render_otherwise_are_not_counted_alone() {
        let reasoning = B.replace(
            r#"{"role":"assistant","content":"yo"}"#,
            r#"{"role":"assistant","content":"yo","reasoning_content":"r"}"#,
        );
        let c = chain_of(&reasoning, Endpoint::OpenAi, "r");
        assert_eq!(tail(Form::Chat, reasoning.as_bytes(), &c, 2, 100), None);
        let think = B.replace(r#""content":"yo""#, r#""content":"<think>a</think>yo""#);
        let c = chain_of(&think, Endpoint::OpenAi, "r");
        assert_eq!(tail(Form::Chat, think.as_bytes(), &c, 2, 100), None);
        // A user's words about thinking render the same anywhere.
        let user = B.replace(r#""content":"hi""#, r#""content":"think about it""#);
        let c = chain_of(&user, Endpoint::OpenAi, "r");
        assert!(tail(Form::Chat, user.as_bytes(), &c, 1, 100).is_some());
        // What the byte bound cannot see through is not counted alone either.
        let image = B.replace(
            r#"{"role":"assistant","content":"yo"}"#,
            r#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}"#,
        );
        let c = chain_of(&image, Endpoint::OpenAi, "r");
        assert_eq!(tail(Form::Chat, image.as_bytes(), &c, 2, 100), None);
        // The prefix's reasoning is restyled as in the byte bound.
        let earlier = B.replace(
            r#"{"role":"user","content":"hi"}"#,
            r#"{"role":"assistant","content":"x","reasoning_content":"r"}"#,
        );
        let c = chain_of(&earlier, Endpoint::OpenAi, "r");
        let t = tail(Form::Chat, earlier.as_bytes(), &c, 2, 100).unwrap();
        assert_eq!(t.base, 100 + SEAM + RESTYLE);
    }

    #[test]
    fn the_bound_adds_tail_new_messages_and_restyled_prefix() {
        let b = chain_of(B, Endpoint::OpenAi, "r");
        let assistant = br#"{"role":"assistant","content":"yo"}"#.len() as u64;
        assert_eq!(
            upper_bound(Form::Chat, B.as_bytes(), &b, 2, 100),
            Some(100 + TAIL + assistant + MESSAGE)
        );
        assert_eq!(
            upper_bound(Form::Chat, B.as_bytes(), &b, 3, 100),
            Some(100 + TAIL)
        );
        let thinking = B.replace(
            r#"{"role":"user","content":"hi"}"#,
            r#"{"role":"assistant","content":"x","reasoning_content":"r"}"#,
        );
        let t = chain_of(&thinking, Endpoint::OpenAi, "r");
        assert_eq!(
            upper_bound(Form::Chat, thinking.as_bytes(), &t, 3, 100),
            Some(100 + TAIL + RESTYLE)
        );
        assert_eq!(upper_bound(Form::Chat, B.as_bytes(), &b, 4, 100), None);
    }
}
