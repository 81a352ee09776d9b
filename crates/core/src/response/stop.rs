//! The Anthropic stop reason (docs/spec.md §13): `"max_tokens"` becomes
//! `"model_context_window_exceeded"` when the window, not the caller, ended the answer — the
//! filter wrote the cap because of the window and the answer used all of it
//! (`usage.output_tokens` = that cap, in the same JSON body or the same `message_delta`
//! event). Answers stream through: complete SSE events pass as they arrive (a partial event
//! waits for its end, which is when a client reads it; lines end with LF, CRLF or CR alike); a
//! JSON body passes up to its first top-level `stop_reason` or `usage` member, and the short
//! rest from there at its end. No other byte changes. Anything unexpected passes unchanged.

use crate::json::find::contains;
use crate::json::scan::scan;
use serde_json::Value;
use std::ops::Range;

/// Anthropic's stop reason when the context window ended the answer.
pub const WINDOW_STOP: &str = "model_context_window_exceeded";

/// The most an editor holds back; beyond it, everything passes unchanged.
pub const MAX_HELD: usize = 64 * 1024;

/// What to do with a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Let it pass as it came.
    Keep,
    /// Send these bytes instead (held bytes before it included; possibly none).
    Replace(Vec<u8>),
}

/// An answer's editor: it reads the answer chunk by chunk and may hold back its last bytes.
pub trait Editor {
    /// One chunk of the answer; `end`: the answer ends with it (what is held goes with it).
    fn chunk(&mut self, chunk: &[u8], end: bool) -> Edit;
    /// Whether the stop reason was swapped since the last call.
    fn take_edited(&mut self) -> bool;
    /// How many bytes it holds back (sent with a later chunk, or at the end).
    fn held(&self) -> usize;
    /// Gives up: the bytes it holds, unchanged; everything after passes as it comes.
    fn release(&mut self) -> Vec<u8>;
}

/// `text` with `range` replaced by the window's stop reason (a JSON string).
fn swap(text: &[u8], range: Range<usize>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() + WINDOW_STOP.len());
    out.extend_from_slice(text.get(..range.start)?);
    out.push(b'"');
    out.extend_from_slice(WINDOW_STOP.as_bytes());
    out.push(b'"');
    out.extend_from_slice(text.get(range.end..)?);
    Some(out)
}

/// The value of the last member `key` of the object `text`, and its range.
fn member<'t>(text: &'t [u8], key: &str) -> Option<(&'t [u8], Range<usize>)> {
    let members = scan(text).ok()?;
    let range = members.iter().rev().find(|m| m.key == key)?.value.clone();
    Some((text.get(range.clone())?, range))
}

/// Whether `usage` (raw JSON) reports exactly `cap` output tokens.
fn used_all(usage: &[u8], cap: u64) -> bool {
    serde_json::from_slice::<Value>(usage)
        .ok()
        .and_then(|u| u.get("output_tokens")?.as_u64())
        == Some(cap)
}

/// An object whose `stop_reason` is at its top level (a Messages answer's tail).
fn edit_message(object: &[u8], cap: u64) -> Option<Vec<u8>> {
    let (stop, range) = member(object, "stop_reason")?;
    if stop != b"\"max_tokens\"" || !used_all(member(object, "usage")?.0, cap) {
        return None;
    }
    swap(object, range)
}

/// A `message_delta` event's data: `delta.stop_reason` beside `usage`.
fn edit_delta(data: &[u8], cap: u64) -> Option<Vec<u8>> {
    let members = scan(data).ok()?;
    let get = |key: &str| {
        let range = members.iter().rev().find(|m| m.key == key)?.value.clone();
        Some((data.get(range.clone())?, range))
    };
    if get("type")?.0 != b"\"message_delta\"" || !used_all(get("usage")?.0, cap) {
        return None;
    }
    let (delta, at) = get("delta")?;
    let (stop, inner) = member(delta, "stop_reason")?;
    if stop != b"\"max_tokens\"" {
        return None;
    }
    swap(data, at.start + inner.start..at.start + inner.end)
}

/// The JSON answer's editor.
#[derive(Debug)]
pub struct Json {
    cap: u64,
    /// Bytes of the body seen so far.
    seen: usize,
    depth: usize,
    in_string: bool,
    escape: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// The top-level key being read (its first bytes).
    key: Option<Vec<u8>>,
    /// Where holding starts (a top-level key's opening quote), and whether that key is one
    /// that decides (`stop_reason`, `usage`) or only being read.
    hold: Option<(usize, bool)>,
    /// The bytes not sent yet (from the hold's start, or from a key released meanwhile).
    held: Vec<u8>,
    /// Done: everything else passes.
    off: bool,
    /// The stop reason was swapped (reported once).
    edited: bool,
}

impl Json {
    pub fn new(cap: u64) -> Json {
        Json {
            cap,
            seen: 0,
            depth: 0,
            in_string: false,
            escape: false,
            expect_key: false,
            key: None,
            hold: None,
            held: Vec::new(),
            off: false,
            edited: false,
        }
    }

    fn step(&mut self, b: u8, at: usize) {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    if let Some((start, false)) = self.hold {
                        let decides = key == b"stop_reason" || key == b"usage";
                        self.hold = decides.then_some((start, true));
                    }
                }
                return;
            }
            if let Some(key) = self.key.as_mut() {
                if key.len() < 16 {
                    key.push(b);
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.key = Some(Vec::new());
                    if self.hold.is_none() {
                        self.hold = Some((at, false));
                    }
                }
            }
            b'{' | b'[' => {
                self.depth = self.depth.saturating_add(1);
                self.expect_key = self.depth == 1 && b == b'{';
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
    }

    /// The held tail (`"stop_reason":…}`), edited when it decides so.
    fn finish(&self, held: &[u8]) -> Option<Vec<u8>> {
        if !matches!(self.hold, Some((_, true))) {
            return None;
        }
        let mut object = Vec::with_capacity(held.len() + 1);
        object.push(b'{');
        object.extend_from_slice(held);
        let edited = edit_message(&object, self.cap)?;
        Some(edited.get(1..)?.to_vec())
    }
}

impl Editor for Json {
    fn chunk(&mut self, chunk: &[u8], end: bool) -> Edit {
        if self.off {
            return Edit::Keep;
        }
        let base = self.seen;
        for (i, &b) in chunk.iter().enumerate() {
            self.step(b, base.saturating_add(i));
        }
        self.seen = base.saturating_add(chunk.len());
        // Everything before `emitted` was sent; the bytes from `boundary` on are held.
        let emitted = base.saturating_sub(self.held.len());
        let boundary = self.hold.map_or(self.seen, |(start, _)| start);
        if self.held.is_empty() && boundary == self.seen {
            self.off = end;
            return Edit::Keep;
        }
        self.held.extend_from_slice(chunk);
        let send = boundary.saturating_sub(emitted).min(self.held.len());
        let mut out: Vec<u8> = self.held.drain(..send).collect();
        if end {
            self.off = true;
            let held = std::mem::take(&mut self.held);
            match self.finish(&held) {
                Some(edited) => {
                    self.edited = true;
                    out.extend_from_slice(&edited);
                }
                None => out.extend_from_slice(&held),
            }
        } else if self.held.len() > MAX_HELD {
            out.append(&mut self.release());
        }
        Edit::Replace(out)
    }

    fn take_edited(&mut self) -> bool {
        std::mem::take(&mut self.edited)
    }

    fn held(&self) -> usize {
        self.held.len()
    }

    fn release(&mut self) -> Vec<u8> {
        self.off = true;
        std::mem::take(&mut self.held)
    }
}

/// The ends of the events in `data`, in order: each just after the blank line that ends it.
/// Lines end with CRLF, LF or CR (the SSE framing). A CR at the end of `data` ends its line
/// there; an LF after it, in a later chunk, then reads as a blank line of its own, an empty
/// event (which nothing edits).
fn event_ends(data: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut line_start = 0;
    memchr::memchr2_iter(b'\r', b'\n', data).filter_map(move |at| {
        if at < line_start {
            return None; // the LF of a CRLF
        }
        let crlf = data.get(at) == Some(&b'\r') && data.get(at + 1) == Some(&b'\n');
        let end = at + 1 + usize::from(crlf);
        let blank = at == line_start;
        line_start = end;
        blank.then_some(end)
    })
}

/// The lines of `event`, each without its end (CRLF, LF or CR).
fn lines(event: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for at in memchr::memchr2_iter(b'\r', b'\n', event) {
        if at < start {
            continue; // the LF of a CRLF
        }
        out.push(start..at);
        let crlf = event.get(at) == Some(&b'\r') && event.get(at + 1) == Some(&b'\n');
        start = at + 1 + usize::from(crlf);
    }
    if start < event.len() {
        out.push(start..event.len());
    }
    out
}

/// One complete event (its lines and the blank line after them), edited when it is the
/// `message_delta` the rule applies to.
fn edit_event(event: &[u8], cap: u64) -> Option<Vec<u8>> {
    let mut data_line: Option<Range<usize>> = None;
    for line in lines(event) {
        let text = event.get(line.clone())?;
        if let Some(rest) = text.strip_prefix(b"data:") {
            if data_line.is_some() {
                return None; // a multi-line data field: left as it is
            }
            let lead = usize::from(rest.first() == Some(&b' '));
            data_line = Some(line.start + 5 + lead..line.end);
        } else if let Some(name) = text.strip_prefix(b"event:") {
            if name.trim_ascii() != b"message_delta" {
                return None;
            }
        }
    }
    let data = data_line?;
    let edited = edit_delta(event.get(data.clone())?, cap)?;
    let mut out = Vec::with_capacity(event.len() + WINDOW_STOP.len());
    out.extend_from_slice(event.get(..data.start)?);
    out.extend_from_slice(&edited);
    out.extend_from_slice(event.get(data.end..)?);
    Some(out)
}

/// The SSE answer's editor: rewrites the `message_delta` event, then steps aside.
#[derive(Debug)]
pub struct Sse {
    cap: u64,
    /// The partial event at the end of what arrived.
    carry: Vec<u8>,
    off: bool,
    /// The stop reason was swapped (reported once).
    edited: bool,
}

impl Sse {
    pub fn new(cap: u64) -> Sse {
        Sse {
            cap,
            carry: Vec::new(),
            off: false,
            edited: false,
        }
    }

    /// The complete events in `data` with the `message_delta` edited; `None` when nothing
    /// changed.
    fn events(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if !contains(data, b"message_delta") {
            return None;
        }
        let mut start = 0;
        let ends = event_ends(data).chain((!data.is_empty()).then_some(data.len()));
        for end in ends {
            if end <= start {
                continue;
            }
            let event = data.get(start..end)?;
            if contains(event, b"message_delta") {
                if let Some(edited) = edit_event(event, self.cap) {
                    self.off = true;
                    self.edited = true;
                    let mut out = Vec::with_capacity(data.len() + WINDOW_STOP.len());
                    out.extend_from_slice(data.get(..start)?);
                    out.extend_from_slice(&edited);
                    out.extend_from_slice(data.get(end..)?);
                    return Some(out);
                }
            }
            start = end;
        }
        None
    }
}

impl Editor for Sse {
    fn chunk(&mut self, chunk: &[u8], end: bool) -> Edit {
        if self.off {
            if self.carry.is_empty() {
                return Edit::Keep;
            }
            let mut out = std::mem::take(&mut self.carry);
            out.extend_from_slice(chunk);
            return Edit::Replace(out);
        }
        let fresh = self.carry.is_empty();
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(chunk);
        let cut = if end {
            data.len()
        } else {
            event_ends(&data).last().unwrap_or(0)
        };
        let rest = data.split_off(cut);
        let edited = self.events(&data);
        let changed = edited.is_some();
        let mut out = edited.unwrap_or(data);
        if self.off || end || rest.len() > MAX_HELD {
            self.off = true;
            out.extend_from_slice(&rest);
        } else {
            self.carry = rest;
        }
        if fresh && !changed && self.carry.is_empty() {
            Edit::Keep
        } else {
            Edit::Replace(out)
        }
    }

    fn take_edited(&mut self) -> bool {
        std::mem::take(&mut self.edited)
    }

    fn held(&self) -> usize {
        self.carry.len()
    }

    fn release(&mut self) -> Vec<u8> {
        self.off = true;
        std::mem::take(&mut self.carry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM 0.32's non-streamed Messages answer (compact, fields in its model's order).
    const JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"a \"stop_reason\":\"max_tokens\" quote, {\"usage\":1}"}],"model":"m","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3000,"output_tokens":1096}}"#;

    fn run_json(cap: u64, body: &[u8], splits: &[usize]) -> (Vec<u8>, bool) {
        run(Json::new(cap), body, splits)
    }

    /// Feeds `body` to the editor cut at `splits`: what the client receives, and whether the
    /// editor changed it.
    fn run(mut e: impl Editor, body: &[u8], splits: &[usize]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut edited = false;
        let mut start = 0;
        let mut cuts: Vec<usize> = splits.to_vec();
        cuts.push(body.len());
        for (i, &cut) in cuts.iter().enumerate() {
            let chunk = &body[start..cut];
            match e.chunk(chunk, i + 1 == cuts.len()) {
                Edit::Keep => out.extend_from_slice(chunk),
                Edit::Replace(r) => out.extend_from_slice(&r),
            }
            edited |= e.take_edited();
            start = cut;
        }
        (out, edited)
    }

    #[test]
    fn json_answer_ended_by_the_window() {
        let want = JSON.replacen(
            r#""stop_reason":"max_tokens","stop_sequence""#,
            r#""stop_reason":"model_context_window_exceeded","stop_sequence""#,
            1,
        );
        assert_eq!(
            run_json(1096, JSON.as_bytes(), &[]),
            (want.clone().into_bytes(), true)
        );
        // Split anywhere, one or two cuts: the same bytes.
        for a in 0..=JSON.len() {
            assert_eq!(
                run_json(1096, JSON.as_bytes(), &[a]).0,
                want.as_bytes(),
                "cut {a}"
            );
        }
        for a in (0..JSON.len()).step_by(7) {
            for b in (a..JSON.len()).step_by(5) {
                assert_eq!(
                    run_json(1096, JSON.as_bytes(), &[a, b]).0,
                    want.as_bytes(),
                    "cuts {a} {b}"
                );
            }
        }
        // The bytes before `stop_reason` pass with their own chunk.
        let at = JSON.find(r#""stop_reason""#).unwrap();
        let mut e = Json::new(1096);
        match e.chunk(&JSON.as_bytes()[..at + 3], false) {
            Edit::Replace(r) => assert_eq!(r, &JSON.as_bytes()[..at]),
            Edit::Keep => panic!("the key is held"),
        }
    }

    #[test]
    fn json_answers_left_alone() {
        // The caller's own cap (fewer tokens than the written cap were used, or another one).
        for cap in [1095, 1097] {
            assert_eq!(
                run_json(cap, JSON.as_bytes(), &[40]),
                (JSON.as_bytes().to_vec(), false)
            );
        }
        // Another stop reason; usage first; spaced JSON; no usage.
        let other = JSON.replace(
            r#""stop_reason":"max_tokens""#,
            r#""stop_reason":"end_turn""#,
        );
        assert_eq!(run_json(1096, other.as_bytes(), &[]).0, other.as_bytes());
        let spaced =
            r#"{ "usage" : {"output_tokens": 8}, "content": [], "stop_reason" : "max_tokens" }"#;
        let (out, edited) = run_json(8, spaced.as_bytes(), &[3, 30]);
        assert!(edited);
        assert_eq!(
            out,
            spaced
                .replace(r#""max_tokens""#, r#""model_context_window_exceeded""#)
                .as_bytes()
        );
        let no_usage = r#"{"stop_reason":"max_tokens"}"#;
        assert_eq!(run_json(8, no_usage.as_bytes(), &[]).0, no_usage.as_bytes());
        // Truncated, not JSON, not an object: unchanged.
        for body in [&JSON[..JSON.len() - 9], "nope", "[1,2]", ""] {
            assert_eq!(
                run_json(1096, body.as_bytes(), &[2.min(body.len())]).0,
                body.as_bytes(),
                "{body}"
            );
        }
        // A tail over the bound passes unchanged, without waiting for the end.
        let big = format!(
            r#"{{"stop_reason":"max_tokens","x":"{}","usage":{{"output_tokens":8}}}}"#,
            "a".repeat(MAX_HELD + 10)
        );
        let mut e = Json::new(8);
        let (head, tail) = big.as_bytes().split_at(MAX_HELD + 20);
        assert_eq!(e.chunk(head, false), Edit::Replace(head.to_vec()));
        assert_eq!(e.chunk(tail, true), Edit::Keep);
    }

    /// vLLM 0.32's stream: `event: <type>\ndata: <json>\n\n`.
    fn stream(output: u64) -> String {
        [
            r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":3000,"output_tokens":0}}}"#,
            r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"message_delta \"stop_reason\":\"max_tokens\""}}"#,
            r#"event: content_block_stop
data: {"type":"content_block_stop","index":0}"#,
            &format!(
                r#"event: message_delta
data: {{"type":"message_delta","delta":{{"stop_reason":"max_tokens","stop_sequence":null}},"usage":{{"input_tokens":3000,"output_tokens":{output}}}}}"#
            ),
            r#"event: message_stop
data: {"type":"message_stop"}"#,
        ]
        .iter()
        .map(|e| format!("{e}\n\n"))
        .collect()
    }

    fn run_sse(cap: u64, body: &[u8], splits: &[usize]) -> (Vec<u8>, bool) {
        run(Sse::new(cap), body, splits)
    }

    #[test]
    fn sse_message_delta_ended_by_the_window() {
        let body = stream(1096);
        let want = body.replacen(
            r#"{"stop_reason":"max_tokens","stop_sequence":null}"#,
            r#"{"stop_reason":"model_context_window_exceeded","stop_sequence":null}"#,
            1,
        );
        assert_ne!(want, body);
        assert_eq!(
            run_sse(1096, body.as_bytes(), &[]),
            (want.clone().into_bytes(), true)
        );
        for a in 0..=body.len() {
            assert_eq!(
                run_sse(1096, body.as_bytes(), &[a]).0,
                want.as_bytes(),
                "cut {a}"
            );
        }
        for a in (0..body.len()).step_by(11) {
            for b in (a..body.len()).step_by(13) {
                assert_eq!(
                    run_sse(1096, body.as_bytes(), &[a, b]).0,
                    want.as_bytes(),
                    "cuts {a} {b}"
                );
            }
        }
        // CRLF line endings and `data:` without the space.
        let crlf = body.replace("\n", "\r\n").replace("data: ", "data:");
        let (out, edited) = run_sse(1096, crlf.as_bytes(), &[100, 700]);
        assert!(edited);
        assert!(String::from_utf8(out).unwrap().contains(
            r#"data:{"type":"message_delta","delta":{"stop_reason":"model_context_window_exceeded""#
        ));
    }

    #[test]
    fn sse_events_pass_as_they_arrive() {
        let body = stream(1096);
        let mut e = Sse::new(1096);
        // Whole events in a chunk pass untouched, at once.
        let first = body.find("\n\n").unwrap() + 2;
        assert_eq!(e.chunk(&body.as_bytes()[..first], false), Edit::Keep);
        // A partial event waits for its end; the complete ones before it go.
        let second = first + body[first..].find("\n\n").unwrap() + 2;
        match e.chunk(&body.as_bytes()[first..second + 5], false) {
            Edit::Replace(r) => assert_eq!(r, &body.as_bytes()[first..second]),
            Edit::Keep => panic!("the partial event is held"),
        }
        // After the message_delta, the editor steps aside.
        let mut e = Sse::new(1096);
        let delta_end = body.find("event: message_stop").unwrap();
        assert!(matches!(
            e.chunk(&body.as_bytes()[..delta_end], false),
            Edit::Replace(_)
        ));
        assert_eq!(e.chunk(&body.as_bytes()[delta_end..], true), Edit::Keep);
    }

    #[test]
    fn sse_left_alone() {
        // The caller's own cap ended it.
        let body = stream(500);
        assert_eq!(
            run_sse(1096, body.as_bytes(), &[300]),
            (body.clone().into_bytes(), false)
        );
        // A stream that ends mid-event passes as it came.
        let full = stream(1096);
        let cut = full.find(r#""output_tokens":1096"#).unwrap();
        assert_eq!(
            run_sse(1096, &full.as_bytes()[..cut], &[200]).0,
            &full.as_bytes()[..cut]
        );
        // No blank line ever: passed once over the bound, unchanged.
        let mut e = Sse::new(8);
        let long = "data: x".repeat(MAX_HELD / 8);
        assert!(matches!(e.chunk(long.as_bytes(), false), Edit::Replace(r) if r.is_empty()));
        let more = "y".repeat(MAX_HELD);
        match e.chunk(more.as_bytes(), false) {
            Edit::Replace(r) => assert_eq!(r.len(), long.len() + more.len()),
            Edit::Keep => panic!(),
        }
        assert_eq!(e.chunk(b"z\n\n", true), Edit::Keep);
        // Two data lines, or an event named otherwise: left as they are.
        let two = "event: message_delta\ndata: {\"type\":\"message_delta\",\ndata: \"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":8}}\n\n";
        assert_eq!(run_sse(8, two.as_bytes(), &[]).0, two.as_bytes());
        let named = "event: other\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":8}}\n\n";
        assert_eq!(run_sse(8, named.as_bytes(), &[]).0, named.as_bytes());
        // Data-only events (no event line) are read by their type.
        let bare = "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":8}}\n\n";
        assert!(run_sse(8, bare.as_bytes(), &[9]).1);
    }

    /// `body` (LF-framed) with every line end made `end`.
    fn framed(body: &str, end: &str) -> String {
        body.replace('\n', end)
    }

    #[test]
    fn sse_lines_end_with_lf_crlf_or_cr_alike() {
        let body = stream(1096);
        let want = body.replacen(
            r#"{"stop_reason":"max_tokens","stop_sequence":null}"#,
            r#"{"stop_reason":"model_context_window_exceeded","stop_sequence":null}"#,
            1,
        );
        for end in ["\n", "\r\n", "\r"] {
            let body = framed(&body, end);
            let want = framed(&want, end);
            assert_eq!(
                run_sse(1096, body.as_bytes(), &[]),
                (want.clone().into_bytes(), true),
                "{end:?}"
            );
            // Split at every byte, and at pairs of places: the same bytes, edited.
            for a in 0..=body.len() {
                assert_eq!(
                    run_sse(1096, body.as_bytes(), &[a]),
                    (want.clone().into_bytes(), true),
                    "{end:?} cut {a}"
                );
            }
            for a in (0..body.len()).step_by(11) {
                for b in (a..body.len()).step_by(13) {
                    assert_eq!(
                        run_sse(1096, body.as_bytes(), &[a, b]).0,
                        want.as_bytes(),
                        "{end:?} cuts {a} {b}"
                    );
                }
            }
            // Every event passes when its blank line has arrived, whatever the framing.
            let mut e = Sse::new(1096);
            let first = body.find(&format!("{end}{end}")).unwrap() + 2 * end.len();
            assert_eq!(e.chunk(&body.as_bytes()[..first], false), Edit::Keep);
            assert_eq!(e.held(), 0, "{end:?}");
            match e.chunk(&body.as_bytes()[first..first + 9], false) {
                Edit::Replace(r) => assert!(r.is_empty()),
                Edit::Keep => panic!("{end:?}: a partial event is held"),
            }
            assert_eq!(e.held(), 9);
        }
        // Mixed line ends in one stream; a CRLF whose LF comes in the next chunk.
        let mixed = "event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":8}}\r\n\nevent: message_stop\rdata: {}\r\r";
        let (out, edited) = run_sse(8, mixed.as_bytes(), &[]);
        assert!(edited);
        assert_eq!(
            out,
            mixed
                .replace("\"max_tokens\"", "\"model_context_window_exceeded\"")
                .as_bytes()
        );
        let crlf = framed(&stream(1096), "\r\n");
        let cut = crlf.find("\r\n\r\nevent: message_stop").unwrap() + 3;
        let mut e = Sse::new(1096);
        match e.chunk(&crlf.as_bytes()[..cut], false) {
            Edit::Replace(r) => {
                assert!(e.take_edited(), "the event ended at the blank line's CR");
                assert!(r.ends_with(
                    b"null},\"usage\":{\"input_tokens\":3000,\"output_tokens\":1096}}\r\n\r"
                ));
            }
            Edit::Keep => panic!("the message_delta is edited"),
        }
        assert_eq!(e.held(), 0);
        assert_eq!(e.chunk(&crlf.as_bytes()[cut..], true), Edit::Keep);
    }

    #[test]
    fn sse_event_ends_and_lines() {
        let ends = |d: &str| event_ends(d.as_bytes()).collect::<Vec<_>>();
        assert_eq!(ends("a\n\nb\r\rc\r\n\r\nd"), [3, 6, 11]);
        assert_eq!(ends("\n\r\n\r"), [1, 3, 4]);
        assert_eq!(ends("a\r"), Vec::<usize>::new());
        assert_eq!(ends("a\r\n\n"), [4]);
        assert_eq!(ends("a\n\r\n"), [4]);
        assert_eq!(ends(""), Vec::<usize>::new());
        let lines = |d: &str| lines(d.as_bytes());
        assert_eq!(lines("a\r\nbc\rd\ne"), [0..1, 3..5, 6..7, 8..9]);
        assert_eq!(lines("\na\r\n"), [0..0, 1..2]);
        assert_eq!(lines(""), Vec::<Range<usize>>::new());
    }

    #[test]
    fn what_is_held_goes_at_the_end() {
        // A JSON body whose last chunk never comes: the end (trailers) releases the tail.
        let want = JSON.replacen(
            r#""stop_reason":"max_tokens""#,
            r#""stop_reason":"model_context_window_exceeded""#,
            1,
        );
        let mut e = Json::new(1096);
        let at = JSON.find(r#""stop_reason""#).unwrap();
        let mut out = match e.chunk(JSON.as_bytes(), false) {
            Edit::Replace(r) => r,
            Edit::Keep => panic!("the tail is held"),
        };
        assert_eq!(out, &JSON.as_bytes()[..at]);
        assert_eq!(e.held(), JSON.len() - at);
        match e.chunk(b"", true) {
            Edit::Replace(r) => out.extend_from_slice(&r),
            Edit::Keep => panic!("the tail goes"),
        }
        assert!(e.take_edited());
        assert_eq!((out, e.held()), (want.into_bytes(), 0));
        // A stream whose last event, the message_delta, has no blank line.
        let full = stream(1096);
        let body = full[..full.find("event: message_stop").unwrap()].trim_end();
        let delta = body.len() - body.find("event: message_delta").unwrap();
        let mut e = Sse::new(1096);
        let mut out = match e.chunk(body.as_bytes(), false) {
            Edit::Replace(r) => r,
            Edit::Keep => panic!("the partial event is held"),
        };
        assert_eq!(e.held(), delta);
        match e.chunk(b"", true) {
            Edit::Replace(r) => out.extend_from_slice(&r),
            Edit::Keep => panic!("the partial event goes"),
        }
        assert!(e.take_edited());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            body.replace(
                r#"{"stop_reason":"max_tokens","#,
                r#"{"stop_reason":"model_context_window_exceeded","#
            )
        );
        // Released unchanged: everything after passes.
        let mut e = Json::new(1096);
        let _ = e.chunk(&JSON.as_bytes()[..at + 5], false);
        assert_eq!(e.release(), &JSON.as_bytes()[at..at + 5]);
        assert_eq!((e.held(), e.chunk(b"rest", true)), (0, Edit::Keep));
    }
}
