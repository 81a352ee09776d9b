//! A server's full context in a stream already under way (docs/spec.md §13): llama-server
//! ends every answer it is generating when the KV cache its slots share fills, with an SSE
//! error event (`crate::backend::llamacpp`). This editor puts the dialect's end of an answer
//! the window ended in its place:
//!
//! * Anthropic: the open content block's `content_block_stop`, a `message_delta` with
//!   `stop_reason` `model_context_window_exceeded` (its `output_tokens` the stream's
//!   `content_block_delta` events: llama-server sends one a token) and `message_stop`;
//! * OpenAI chat and completions: a last chunk with `finish_reason` `length` (its choice
//!   carries both chat's empty `delta` and completions' empty `text`), then `data: [DONE]`;
//! * Responses: `response.failed` with `error.code` `context_length_exceeded`, which
//!   Responses clients read as a full window.
//!
//! Every other event passes as it comes. An event is held only while it may be that error:
//! its first line (up to [`MAX_FIRST_LINE`] bytes) names it, and only an `event: error` or a
//! `data: {"error"…` event waits for its blank line, up to [`MAX_EVENT`] bytes. Lines end with
//! LF, CRLF or CR alike.

use super::errors::Dialect;
use super::stop::{Edit, Editor, WINDOW_STOP};
use crate::backend;
use crate::config::Backend;
use serde_json::Value;

/// An event that may be the error is held up to this many bytes; past it, it passes.
pub const MAX_EVENT: usize = 4096;
/// An event's first line is read up to this many bytes to name it.
pub const MAX_FIRST_LINE: usize = 64;

/// Responses' message for `context_length_exceeded` in a stream.
const RESPONSES_MESSAGE: &str =
    "Your input exceeds the context window of this model. Please adjust your input and try again.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At an event's start: its first line is read (held).
    Start,
    /// Inside an event that passes, to its blank line.
    Passing,
    /// Inside an event that may be the error: held to its blank line.
    Holding,
    /// The error was replaced, or the editor gave up: the rest passes.
    Done,
}

/// The editor of one stream.
#[derive(Debug)]
pub struct Overflow {
    backend: Backend,
    dialect: Dialect,
    state: State,
    held: Vec<u8>,
    /// The bytes read are at a line's start.
    line_start: bool,
    /// The last byte read was CR (an LF after it ends no line).
    after_cr: bool,
    /// Anthropic: content blocks started and stopped, and deltas.
    started: u64,
    stopped: u64,
    deltas: u64,
    edited: bool,
}

impl Overflow {
    pub fn new(backend: Backend, dialect: Dialect) -> Overflow {
        Overflow {
            backend,
            dialect,
            state: State::Start,
            held: Vec::new(),
            line_start: true,
            after_cr: false,
            started: 0,
            stopped: 0,
            deltas: 0,
            edited: false,
        }
    }

    /// Reads one byte's line ending: whether it ends a line, and whether that line was
    /// blank (the event's end).
    fn feed(&mut self, b: u8) -> (bool, bool) {
        match b {
            b'\n' if self.after_cr => {
                self.after_cr = false;
                (false, false)
            }
            b'\r' | b'\n' => {
                self.after_cr = b == b'\r';
                let blank = self.line_start;
                self.line_start = true;
                (true, blank)
            }
            _ => {
                self.after_cr = false;
                self.line_start = false;
                (false, false)
            }
        }
    }

    /// The held first line names the event: held to its end if it may be the error, else
    /// passed (and counted, for Anthropic's end).
    fn name(&mut self, out: &mut Vec<u8>, ended: bool) {
        let line = self.held.trim_ascii_end();
        let error = line == b"event: error"
            || line == b"event:error"
            || line.starts_with(b"data: {\"error\"")
            || line.starts_with(b"data:{\"error\"");
        if error && !ended {
            self.state = State::Holding;
            return;
        }
        let count =
            |name: &[u8]| line.strip_prefix(b"event:").map(<[u8]>::trim_ascii) == Some(name);
        if count(b"content_block_start") {
            self.started += 1;
        } else if count(b"content_block_stop") {
            self.stopped += 1;
        } else if count(b"content_block_delta") {
            self.deltas += 1;
        }
        out.append(&mut self.held);
        self.state = if ended { State::Start } else { State::Passing };
    }

    /// A held event reached its blank line: its replacement if it is the server's full
    /// context, else itself.
    fn finish(&mut self, out: &mut Vec<u8>) {
        let event = std::mem::take(&mut self.held);
        match self.end_for(&event) {
            Some(end) => {
                out.extend_from_slice(&end);
                self.edited = true;
                self.state = State::Done;
            }
            None => {
                out.extend_from_slice(&event);
                self.state = State::Start;
            }
        }
    }

    fn end_for(&self, event: &[u8]) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(event).ok()?;
        let mut named = false;
        let mut data = Vec::new();
        for line in text.split(['\r', '\n']).filter(|l| !l.is_empty()) {
            if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            } else if line.strip_prefix("event:").map(str::trim) == Some("error") {
                named = true;
            } else {
                return None;
            }
        }
        let value: Value = serde_json::from_str(&data.join("\n")).ok()?;
        let error = if named { &value } else { value.get("error")? };
        backend::context_full(self.backend, error).then(|| self.end())
    }

    /// The dialect's end of an answer the window ended.
    fn end(&self) -> Vec<u8> {
        match self.dialect {
            Dialect::Anthropic => {
                let mut out = String::new();
                if self.started > self.stopped {
                    out += &format!(
                        "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{}}}\n\n",
                        self.started - 1
                    );
                }
                out += &format!(
                    "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{WINDOW_STOP}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}\n\n",
                    self.deltas
                );
                out += "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
                out.into_bytes()
            }
            Dialect::OpenAi => b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n".to_vec(),
            Dialect::Responses => format!(
                "event: response.failed\ndata: {{\"type\":\"response.failed\",\"response\":{{\"object\":\"response\",\"status\":\"failed\",\"error\":{{\"code\":\"context_length_exceeded\",\"message\":\"{RESPONSES_MESSAGE}\"}}}}}}\n\n"
            )
            .into_bytes(),
        }
    }
}

impl Editor for Overflow {
    fn chunk(&mut self, chunk: &[u8], end: bool) -> Edit {
        let held_before = !self.held.is_empty();
        let mut out = Vec::with_capacity(chunk.len() + self.held.len());
        let mut edited = false;
        for (i, &b) in chunk.iter().enumerate() {
            match self.state {
                State::Done => {
                    let mut rest = &chunk[i..];
                    // The LF of a replaced event's last CRLF goes with it.
                    if std::mem::take(&mut self.after_cr) {
                        rest = rest.strip_prefix(b"\n").unwrap_or(rest);
                    }
                    out.extend_from_slice(rest);
                    break;
                }
                State::Passing => {
                    out.push(b);
                    if self.feed(b).1 {
                        self.state = State::Start;
                    }
                }
                State::Start => {
                    let crlf = b == b'\n' && self.after_cr;
                    let (eol, blank) = self.feed(b);
                    if self.held.is_empty() && (crlf || blank) {
                        // Between events: a CRLF's LF, or a blank line.
                        out.push(b);
                        continue;
                    }
                    self.held.push(b);
                    if eol || self.held.len() > MAX_FIRST_LINE {
                        self.name(&mut out, blank);
                    }
                }
                State::Holding => {
                    self.held.push(b);
                    if self.feed(b).1 {
                        self.finish(&mut out);
                        edited |= self.edited;
                    } else if self.held.len() > MAX_EVENT {
                        out.append(&mut self.held);
                        self.state = State::Passing;
                    }
                }
            }
        }
        if end {
            out.append(&mut self.held);
            self.state = State::Done;
            self.after_cr = false;
        }
        if !held_before && self.held.is_empty() && !edited && out.len() == chunk.len() {
            return Edit::Keep;
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
        self.state = State::Done;
        self.after_cr = false;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
#[path = "overflow_tests.rs"]
mod tests;
