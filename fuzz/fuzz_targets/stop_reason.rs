//! The Anthropic stop reason watcher (docs/spec.md §13, crates/core/src/response/stop.rs).
//!
//! Input: byte 0 = flags (bit 0: an SSE stream, else a JSON body; bit 1: the answer ends in
//! trailers, after its last chunk; bits 2–3: how many cuts; bit 4: its usage is read too),
//! bytes 1–2 the cap the window
//! wrote (u16, little endian), bytes 3–8 three cut places (u16 each, modulo the body's length
//! + 1), then the answer's body. Properties checked:
//! * nothing panics (the editors, and the answer through `Response` with the host keeping
//!   what passed while the filter holds bytes, as the glue drives Envoy);
//! * the client gets the body byte for byte, except at most one `"max_tokens"` that becomes
//!   `"model_context_window_exceeded"`, counted once;
//! * the same bytes however the body is cut, and whether it ends with its last chunk or with
//!   trailers; through `Response` as from the editor alone, nothing held at the end;
//! * exactly where a reference reads the rule (written from the spec: SSE lines end with LF,
//!   CRLF or CR; a blank line ends an event; the `message_delta` event's one data line, or a
//!   JSON body's last top-level `stop_reason` and `usage`): `stop_reason` `"max_tokens"` and
//!   `usage.output_tokens` equal to the cap. Where the body has a `\u` escape the reference's
//!   parser may read it otherwise, and a JSON body's editor reads only its tail (the rest
//!   passes as it came, JSON or not): there only the first two properties are checked.
#![no_main]

mod common;

use common::{show, MemberList};
use incontext_core::config::Backend;
use incontext_core::response::stop::{Json, Sse};
use incontext_core::response::{BodyStep, Budget, Dialect, Edit, Editor, Head, HeadStep, Response};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const FROM: &[u8] = b"\"max_tokens\"";
const TO: &[u8] = b"\"model_context_window_exceeded\"";

/// `usage` reports exactly `cap` output tokens.
fn used_all(usage: &str, cap: u64) -> bool {
    serde_json::from_str::<Value>(usage)
        .ok()
        .and_then(|u| u.get("output_tokens")?.as_u64())
        == Some(cap)
}

/// Where `inner` starts in `outer` (a subslice of it).
fn offset(outer: &[u8], inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

/// The offset of the `"max_tokens"` to rewrite in a JSON body.
fn json_rule(body: &[u8], cap: u64) -> Option<usize> {
    let members: MemberList = serde_json::from_slice(body).ok()?;
    let stop = members.last("stop_reason")?;
    if stop.get().as_bytes() != FROM || !used_all(members.last("usage")?.get(), cap) {
        return None;
    }
    Some(offset(body, stop.get()))
}

/// The lines of `text` (ranges without their ends): LF, CRLF and CR end a line.
fn lines(text: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < text.len() {
        match text[i] {
            b'\r' | b'\n' => {
                out.push((start, i));
                i += if text[i] == b'\r' && text.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// The events of a stream: each from its first line to the blank line after it; what follows
/// the last blank line is an event too (the stream ended there).
fn events(text: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut empty = true;
    let mut i = 0;
    while i < text.len() {
        if matches!(text[i], b'\r' | b'\n') {
            let end = i + if text[i] == b'\r' && text.get(i + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            if empty {
                out.push((start, end));
                start = end;
            }
            empty = true;
            i = end;
        } else {
            empty = false;
            i += 1;
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// The offset of the `"max_tokens"` to rewrite in a stream: the first `message_delta` event
/// the rule applies to.
fn sse_rule(body: &[u8], cap: u64) -> Option<usize> {
    events(body).into_iter().find_map(|(start, end)| {
        let event = &body[start..end];
        let mut data = Vec::new();
        for (a, b) in lines(event) {
            let line = &event[a..b];
            if let Some(rest) = line.strip_prefix(b"data:") {
                data.push(rest.strip_prefix(b" ").unwrap_or(rest));
            } else if let Some(name) = line.strip_prefix(b"event:") {
                if name.trim_ascii() != b"message_delta" {
                    return None;
                }
            }
        }
        let [data] = data[..] else {
            return None;
        };
        let members: MemberList = serde_json::from_slice(data).ok()?;
        if members.last("type")?.get() != "\"message_delta\""
            || !used_all(members.last("usage")?.get(), cap)
        {
            return None;
        }
        let delta: MemberList = serde_json::from_str(members.last("delta")?.get()).ok()?;
        let stop = delta.last("stop_reason")?;
        (stop.get().as_bytes() == FROM).then(|| offset(body, stop.get()))
    })
}

/// The body with the `"max_tokens"` at `at` rewritten.
fn rewritten(body: &[u8], at: usize) -> Vec<u8> {
    [&body[..at], TO, &body[at + FROM.len()..]].concat()
}

/// Chunks of `body` at `cuts`; with `trailers`, an empty last chunk ends it.
fn chunks<'b>(body: &'b [u8], cuts: &[usize], trailers: bool) -> Vec<&'b [u8]> {
    let mut edges: Vec<usize> = cuts.to_vec();
    edges.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for e in edges.into_iter().chain([body.len()]) {
        out.push(&body[start..e]);
        start = e;
    }
    if trailers {
        out.push(&[]);
    }
    out
}

/// The editor alone: what passes, and how many edits it reported.
fn through_editor(editor: &mut dyn Editor, chunks: &[&[u8]]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut edits = 0;
    for (i, chunk) in chunks.iter().enumerate() {
        match editor.chunk(chunk, i + 1 == chunks.len()) {
            Edit::Keep => out.extend_from_slice(chunk),
            Edit::Replace(r) => out.extend_from_slice(&r),
        }
        edits += usize::from(editor.take_edited());
    }
    assert_eq!(editor.held(), 0, "held after the end");
    (out, edits)
}

/// The answer through `Response`, the host keeping what passed while the filter holds bytes
/// (as the glue drives Envoy); the trailers end it when `trailers`.
fn through_response(
    usage: bool,
    sse: bool,
    cap: u64,
    body: &[u8],
    cuts: &[usize],
    trailers: bool,
) -> (Vec<u8>, usize) {
    let budget = Budget {
        dialect: Dialect::Anthropic,
        backend: Backend::Vllm,
        model: "m".into(),
        prompt: Some(1000),
        exact: true,
        too_long: false,
        context: Some(4096),
        cap: Some(cap),
        window_cap: Some(cap),
        usage,
    };
    let head = Head {
        status: Some(200),
        content_type: Some(if sse {
            "text/event-stream"
        } else {
            "application/json"
        }),
        // Announced: the host keeps what passed before held bytes, so they can go before
        // the trailers.
        trailers,
        ..Head::default()
    };
    let mut r = Response::default();
    assert_eq!(r.on_headers(Some(&budget), true, &head), HeadStep::Watch);
    let pieces = chunks(body, cuts, false);
    let (mut out, mut buffer, mut kept, mut edits) = (Vec::new(), Vec::new(), 0usize, 0);
    let mut read = |r: &mut Response, buffer: &mut Vec<u8>, kept: &mut usize, end: bool| {
        let d = r.on_data(Some(&budget), &buffer[*kept..], end);
        assert!(d.translated.is_none());
        edits += usize::from(d.window_stop);
        if let Edit::Replace(new) = d.edit {
            buffer.truncate(*kept);
            buffer.extend_from_slice(&new);
        }
        *kept = if r.host_keeps() { buffer.len() } else { 0 };
    };
    for (i, piece) in pieces.iter().enumerate() {
        buffer.extend_from_slice(piece);
        let end = !trailers && i + 1 == pieces.len();
        assert_eq!(r.on_body(buffer.len(), end), BodyStep::Read);
        read(&mut r, &mut buffer, &mut kept, end);
        if !r.host_keeps() {
            out.append(&mut buffer);
        }
    }
    if trailers && r.host_keeps() {
        read(&mut r, &mut buffer, &mut kept, true);
    }
    assert!(!r.holds(), "held after the trailers");
    out.append(&mut buffer);
    (out, edits)
}

fn check(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let flags = data[0];
    let (sse, trailers) = (flags & 1 == 1, flags & 2 == 2);
    let cap = u64::from(u16::from_le_bytes([data[1], data[2]]));
    let body = &data[9..];
    let cuts: Vec<usize> = data[3..9]
        .chunks(2)
        .take(usize::from((flags >> 2) & 3))
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (body.len() + 1))
        .collect();
    let editor = || -> Box<dyn Editor> {
        if sse {
            Box::new(Sse::new(cap))
        } else {
            Box::new(Json::new(cap))
        }
    };
    let whole = through_editor(&mut *editor(), &[body]);
    let cut = through_editor(&mut *editor(), &chunks(body, &cuts, trailers));
    let ctx = || {
        format!(
            "sse {sse}, cap {cap}, cuts {cuts:?}, trailers {trailers}: {}",
            show(body)
        )
    };
    assert_eq!(cut, whole, "cut otherwise: {}", ctx());
    let hosted = through_response(flags & 0x10 != 0, sse, cap, body, &cuts, trailers);
    assert_eq!(hosted, whole, "through Response: {}", ctx());
    let (out, edits) = whole;
    // Byte for byte, or one "max_tokens" rewritten.
    let at = if out == body {
        assert_eq!(edits, 0, "{}", ctx());
        None
    } else {
        assert_eq!(edits, 1, "{}", ctx());
        let at = (0..body.len())
            .find(|&i| body.get(i..i + FROM.len()) == Some(FROM) && rewritten(body, i) == out)
            .unwrap_or_else(|| {
                panic!("not one stop reason rewritten: {} -> {}", ctx(), show(&out))
            });
        Some(at)
    };
    // The reference's parser may read a `\u` escape otherwise; a JSON body's editor reads its
    // tail alone (what comes before it passes as it came, JSON or not).
    let json = || {
        std::str::from_utf8(body)
            .is_ok_and(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok())
    };
    if body.windows(2).any(|w| w == b"\\u") || (!sse && !json()) {
        return;
    }
    let want = if sse {
        sse_rule(body, cap)
    } else {
        json_rule(body, cap)
    };
    assert_eq!(at, want, "{}", ctx());
}

fuzz_target!(|data: &[u8]| check(data));
