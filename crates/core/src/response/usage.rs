//! The prompt size the server reports in its own answer (docs/spec.md §15a), read as the
//! answer passes, never held: Anthropic `message_start` (`input_tokens` +
//! `cache_read_input_tokens` + `cache_creation_input_tokens`), Responses `response.completed`
//! (`usage.input_tokens`), OpenAI chunks or JSON bodies with `usage` (`prompt_tokens`).
//!
//! Memory is bounded whatever the answer: of a streamed event line, or of a JSON body, only
//! the last [`WINDOW`] bytes are kept (a `usage` object comes last in each of these shapes,
//! and is small).

use crate::json::scan::{scan, skip_ws};
use crate::json::skim::container_end;

/// What is kept of the current line (streamed) or of the body (JSON).
pub const WINDOW: usize = 4096;

const KEY: &[u8] = b"\"usage\":";
const DATA: &[u8] = b"data:";

/// Watches one answer for its usage.
#[derive(Debug, Clone)]
pub struct Usage {
    /// A streamed answer (SSE): usage is looked for in each line.
    stream: bool,
    /// The last bytes of the current line (stream) or of the body (JSON).
    kept: Vec<u8>,
    /// The first bytes of the current line (stream): whether it is a `data:` line.
    start: Vec<u8>,
    /// The previous byte was a CR (a CRLF's LF ends no second line).
    after_cr: bool,
    found: Option<u64>,
}

impl Usage {
    pub fn new(stream: bool) -> Usage {
        Usage {
            stream,
            kept: Vec::new(),
            start: Vec::new(),
            after_cr: false,
            found: None,
        }
    }

    /// The usage found so far.
    pub fn found(&self) -> Option<u64> {
        self.found
    }

    /// Reads a chunk of the answer; the prompt tokens once found (then nothing more is read).
    pub fn feed(&mut self, data: &[u8], end_of_stream: bool) -> Option<u64> {
        if self.found.is_some() {
            return self.found;
        }
        if self.stream {
            let mut rest = data;
            while let Some(at) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                let (line, tail) = rest.split_at(at);
                let cr = tail.first() == Some(&b'\r');
                let skip = self.after_cr && line.is_empty() && !cr;
                self.after_cr = cr;
                if !skip {
                    self.keep(line);
                    self.end_line();
                    if self.found.is_some() {
                        return self.found;
                    }
                }
                rest = tail.get(1..).unwrap_or_default();
            }
            if !rest.is_empty() {
                self.after_cr = false;
            }
            self.keep(rest);
            if end_of_stream {
                self.end_line();
            }
        } else {
            self.keep(data);
            if end_of_stream {
                self.found = read(&self.kept);
                self.kept = Vec::new();
            }
        }
        self.found
    }

    /// Keeps the last [`WINDOW`] bytes of what was kept and `data` (and a line's start).
    fn keep(&mut self, data: &[u8]) {
        let room = DATA.len().saturating_sub(self.start.len());
        self.start.extend(data.iter().take(room));
        let start = data.len().saturating_sub(WINDOW);
        self.kept
            .extend_from_slice(data.get(start..).unwrap_or_default());
        let over = self.kept.len().saturating_sub(WINDOW);
        if over > 0 {
            self.kept.drain(..over);
        }
    }

    fn end_line(&mut self) {
        if self.start == DATA {
            self.found = read(&self.kept);
        }
        self.kept.clear();
        self.start.clear();
    }
}

/// The prompt tokens of the last `"usage":{…}` object in `text`, if it parses and says.
fn read(text: &[u8]) -> Option<u64> {
    let at = text.windows(KEY.len()).rposition(|w| w == KEY)?;
    let start = skip_ws(text, at + KEY.len());
    let object = text.get(start..container_end(text, start)?)?;
    let members = scan(object).ok()?;
    let number = |key: &str| {
        let m = members.iter().rev().find(|m| m.key == key)?;
        let digits = object.get(m.value.clone())?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse::<u64>().ok()
    };
    if let Some(p) = number("prompt_tokens") {
        return Some(p);
    }
    number("input_tokens")?
        .checked_add(number("cache_read_input_tokens").unwrap_or(0))?
        .checked_add(number("cache_creation_input_tokens").unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":1200,\"cache_read_input_tokens\":800,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\n";
    const OPENAI: &str = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":2345,\"completion_tokens\":7,\"total_tokens\":2352}}\n\ndata: [DONE]\n\n";
    const RESPONSES: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"\\\"usage\\\": {\\\"prompt_tokens\\\": 1}\"}]}],\"usage\":{\"input_tokens\":321,\"input_tokens_details\":{\"cached_tokens\":300},\"output_tokens\":9}}}\n\n";
    const JSON: &str = "{\"id\":\"c\",\"choices\":[{\"message\":{\"content\":\"usage\"}}],\"usage\":{\"prompt_tokens\":77,\"completion_tokens\":3}}";

    fn whole(text: &str, stream: bool) -> Option<u64> {
        Usage::new(stream).feed(text.as_bytes(), true)
    }

    /// Fed one byte at a time, with `eol` for every LF.
    fn bytewise(text: &str, stream: bool, eol: &str) -> Option<u64> {
        let text = text.replace('\n', eol);
        let mut u = Usage::new(stream);
        let bytes = text.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            u.feed(&[*b], i + 1 == bytes.len());
        }
        u.found()
    }

    #[test]
    fn each_dialect_reports_its_prompt() {
        assert_eq!(whole(ANTHROPIC, true), Some(2005));
        assert_eq!(whole(OPENAI, true), Some(2345));
        assert_eq!(whole(RESPONSES, true), Some(321));
        assert_eq!(whole(JSON, false), Some(77));
        for eol in ["\n", "\r\n", "\r"] {
            assert_eq!(bytewise(ANTHROPIC, true, eol), Some(2005), "{eol:?}");
            assert_eq!(bytewise(OPENAI, true, eol), Some(2345), "{eol:?}");
            assert_eq!(bytewise(RESPONSES, true, eol), Some(321), "{eol:?}");
        }
        assert_eq!(bytewise(JSON, false, "\n"), Some(77));
    }

    #[test]
    fn an_answer_without_usage_or_cut_off_reports_none() {
        assert_eq!(
            whole("data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true),
            None
        );
        let cut = &OPENAI[..OPENAI.find("\"prompt_tokens\":23").unwrap() + 18];
        assert_eq!(Usage::new(true).feed(cut.as_bytes(), false), None);
        assert_eq!(whole("{\"usage\":{\"prompt_tokens\":-1}}", false), None);
        assert_eq!(whole("{\"usage\":{\"prompt_tokens\":\"7\"}}", false), None);
        assert_eq!(whole("{\"usage\":{\"completion_tokens\":7}}", false), None);
        assert_eq!(whole("{\"usage\":", false), None);
        assert_eq!(whole("not json at all", false), None);
    }

    #[test]
    fn memory_stays_bounded() {
        let mut u = Usage::new(false);
        let big = "x".repeat(1 << 20);
        u.feed(b"{\"content\":\"", false);
        u.feed(big.as_bytes(), false);
        assert!(u.kept.len() <= WINDOW);
        assert_eq!(
            u.feed(b"\",\"usage\":{\"prompt_tokens\":5}}", true),
            Some(5)
        );
        let mut s = Usage::new(true);
        s.feed(b"data: {\"x\":\"", false);
        s.feed(big.as_bytes(), false);
        assert!(s.kept.len() <= WINDOW);
        assert_eq!(
            s.feed(b"\",\"usage\":{\"prompt_tokens\":6}}\n", false),
            Some(6)
        );
    }
}
