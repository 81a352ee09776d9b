//! The response side (docs/spec.md §13): what the filter does with the upstream's answer to a
//! request it budgeted. Three things, each decided here and applied by the glue:
//!
//! * an error answer (4xx, at most [`MAX_ERROR_BYTES`]) that is one of the backend's window
//!   errors reaches the client as its dialect's window-full signal (`errors`), chosen by what
//!   the filter knows of the prompt; every other answer passes byte for byte;
//! * an Anthropic answer ended by the window the filter wrote reports
//!   `model_context_window_exceeded` (`stop`), streamed through;
//! * a stream a server ends with an error event when its context fills reaches the client as
//!   the dialect's end of an answer the window ended (`overflow`);
//! * the window the server named is learned (the flow stores it).
//!
//! Successful answers are never held: only error answers are buffered, and only those of
//! budgeted requests. Each backend's wordings are in its own module (`backend::vllm`, `sglang`, `llamacpp`).
//!
//! An answer may end in trailers instead of a last body chunk: the trailers are its end, and
//! what the filter holds goes out before them, edited as at the end of a body. A host that
//! can add bytes only to what it still buffers (proxy-wasm) keeps what passed the editor
//! before held bytes ([`Response::host_keeps`]): always for an error or a JSON answer, and for
//! a stream only when its head announced trailers, so that a stream's complete events reach
//! the client as they arrive.

pub mod errors;
pub mod overflow;
pub mod stop;
pub mod usage;
pub mod window;

pub use errors::Dialect;
pub use stop::{Edit, Editor};
pub use window::WindowError;

use crate::config::Backend;

/// Error bodies larger than this pass byte for byte.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// What the request side knew when its request went upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub dialect: Dialect,
    pub backend: Backend,
    /// The request's model (a window the server names is learned for it).
    pub model: String,
    /// P as the filter counted it (`exact`: by the server's counter, else the estimate).
    pub prompt: Option<u64>,
    pub exact: bool,
    /// The prompt is known to exceed the window: the counter refused it as too long, or an
    /// exact P ≥ C.
    pub too_long: bool,
    /// C as the filter knew it.
    pub context: Option<u64>,
    /// The cap that went upstream: the one the filter wrote, else the caller's B.
    pub cap: Option<u64>,
    /// Anthropic: the cap the filter wrote because the window left no more (below the
    /// caller's B); an answer that uses all of it was ended by the window.
    pub window_cap: Option<u64>,
    /// Read the prompt size the answer reports (`usage`), for the flow (docs/spec.md §15a).
    pub usage: bool,
}

/// The answer's head as the flow reads it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Head<'a> {
    pub status: Option<u16>,
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// The answer has no body.
    pub end_of_stream: bool,
    /// The head announces trailers (a `Trailer` header).
    pub trailers: bool,
}

/// What to do with the answer's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadStep {
    /// Nothing: the answer passes as it came (no body callback needs the filter).
    Pass,
    /// An error answer that may be translated: remove `content-length` (the body may
    /// change) and let the headers go; the body is buffered.
    Hold,
    /// An answer whose stop reason may change: remove `content-length`; every chunk is
    /// handed to [`Response::on_data`] and passes at once, unless the editor holds bytes
    /// back after it ([`Response::holds`]).
    Watch,
    /// An answer only read (its usage): every chunk is handed to [`Response::on_data`] and
    /// passes at once, unchanged; the headers stay as they are.
    Observe,
}

/// What to do with an answer's body chunk; `size` is all that is buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStep {
    /// Let it (and anything buffered) go on unchanged.
    Continue,
    /// Keep buffering (an error answer before its end).
    Buffer,
    /// Read the buffered bytes and hand them to [`Response::on_data`].
    Read,
}

/// The outcome of reading the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    pub edit: Edit,
    /// The answer was translated: the window error's facts (the window to learn).
    pub translated: Option<WindowError>,
    /// The stop reason was changed.
    pub window_stop: bool,
    /// The prompt tokens the answer reported, the first time they are read.
    pub usage: Option<u64>,
}

impl Data {
    fn keep() -> Data {
        Data {
            edit: Edit::Keep,
            translated: None,
            window_stop: false,
            usage: None,
        }
    }
}

#[derive(Debug, Default)]
enum Mode {
    #[default]
    Pass,
    Error,
    Json(stop::Json),
    Sse(stop::Sse),
    /// Only read, for its usage.
    Observe,
}

impl Mode {
    fn editor(&mut self) -> Option<&mut dyn Editor> {
        match self {
            Mode::Json(e) => Some(e),
            Mode::Sse(e) => Some(e),
            Mode::Pass | Mode::Error | Mode::Observe => None,
        }
    }
}

/// One answer through the filter.
#[derive(Debug, Default)]
pub struct Response {
    mode: Mode,
    /// The answer's usage, while it is looked for.
    usage: Option<usage::Usage>,
    /// The bytes the host keeps while the editor holds bytes after them (what passed the
    /// editor since it last held nothing).
    waiting: usize,
    /// The head announced trailers.
    trailers: bool,
    /// A stream whose server may end it when its context fills.
    overflow: Option<overflow::Overflow>,
}

fn is_identity(encoding: Option<&str>) -> bool {
    encoding.is_none_or(|e| e.trim().is_empty() || e.trim().eq_ignore_ascii_case("identity"))
}

fn media_type(content_type: Option<&str>) -> String {
    content_type
        .and_then(|t| t.split(';').next())
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

impl Response {
    /// The answer's head. `budget` is what the request side knew (`None`: the request was
    /// not budgeted, and its answer is none of the filter's business).
    pub fn on_headers(
        &mut self,
        budget: Option<&Budget>,
        translate: bool,
        head: &Head,
    ) -> HeadStep {
        self.mode = Mode::Pass;
        self.usage = None;
        self.waiting = 0;
        self.trailers = head.trailers;
        self.overflow = None;
        let Some(budget) = budget else {
            return HeadStep::Pass;
        };
        if head.end_of_stream || !is_identity(head.content_encoding) {
            return HeadStep::Pass;
        }
        let media = media_type(head.content_type);
        let fills = crate::backend::fills_mid_answer(budget.backend);
        match head.status {
            Some(status @ 400..=500) if translate && (status < 500 || fills) => {
                let small = head.content_length.is_none_or(|l| {
                    l.trim()
                        .parse::<usize>()
                        .is_ok_and(|l| l <= MAX_ERROR_BYTES)
                });
                if small && (media.is_empty() || media.ends_with("json")) {
                    self.mode = Mode::Error;
                    return HeadStep::Hold;
                }
                HeadStep::Pass
            }
            Some(200) => {
                let stream = media == "text/event-stream";
                if !stream && !media.ends_with("json") {
                    return HeadStep::Pass;
                }
                if budget.usage {
                    self.usage = Some(usage::Usage::new(stream));
                }
                if stream && fills && translate {
                    self.overflow = Some(overflow::Overflow::new(budget.backend, budget.dialect));
                }
                let step = match budget.window_cap {
                    Some(cap) if budget.dialect == Dialect::Anthropic => {
                        self.mode = match stream {
                            true => Mode::Sse(stop::Sse::new(cap)),
                            false => Mode::Json(stop::Json::new(cap)),
                        };
                        HeadStep::Watch
                    }
                    _ if budget.usage => {
                        self.mode = Mode::Observe;
                        HeadStep::Observe
                    }
                    _ => HeadStep::Pass,
                };
                match self.overflow {
                    Some(_) => HeadStep::Watch,
                    None => step,
                }
            }
            _ => HeadStep::Pass,
        }
    }

    /// A body chunk arrived; `size` is what is buffered (the whole body so far when
    /// holding, else this chunk).
    pub fn on_body(&mut self, size: usize, end_of_stream: bool) -> BodyStep {
        if self.overflow.is_some() {
            return BodyStep::Read;
        }
        match self.mode {
            Mode::Pass => BodyStep::Continue,
            Mode::Error if size > MAX_ERROR_BYTES => {
                self.mode = Mode::Pass;
                BodyStep::Continue
            }
            Mode::Error if !end_of_stream => BodyStep::Buffer,
            Mode::Error | Mode::Json(_) | Mode::Sse(_) => BodyStep::Read,
            // Read until the usage is found.
            Mode::Observe if self.usage.as_ref().is_some_and(|u| u.found().is_none()) => {
                BodyStep::Read
            }
            Mode::Observe => BodyStep::Continue,
        }
    }

    /// The bytes [`BodyStep::Read`] asked for: the whole error body at its end, or the
    /// chunk of a watched answer. At trailers (`end_of_stream`): what the host buffers of an
    /// error, or nothing new of a watched answer (whatever its editor holds goes then).
    pub fn on_data(&mut self, budget: Option<&Budget>, data: &[u8], end_of_stream: bool) -> Data {
        let usage = match self.usage.as_mut() {
            Some(u) if u.found().is_none() => u.feed(data, end_of_stream),
            _ => None,
        };
        Data {
            usage,
            ..self.edit(budget, data, end_of_stream)
        }
    }

    /// The mode's edit, then the stream's full context.
    fn edit(&mut self, budget: Option<&Budget>, data: &[u8], end_of_stream: bool) -> Data {
        let mut out = self.edit_mode(budget, data, end_of_stream);
        if let Some(o) = self.overflow.as_mut() {
            let passed = match &out.edit {
                Edit::Keep => data,
                Edit::Replace(r) => r,
            };
            if let Edit::Replace(r) = o.chunk(passed, end_of_stream) {
                out.edit = Edit::Replace(r);
            }
            out.window_stop |= o.take_edited();
        }
        out
    }

    fn edit_mode(&mut self, budget: Option<&Budget>, data: &[u8], end_of_stream: bool) -> Data {
        let bounded = matches!(self.mode, Mode::Sse(_));
        let keeps = self.keeps_passed();
        if let Some(editor) = self.mode.editor() {
            let mut edit = editor.chunk(data, end_of_stream);
            let window_stop = editor.take_edited();
            let sent = match &edit {
                Edit::Keep => data.len(),
                Edit::Replace(r) => r.len(),
            };
            // What the host keeps while the editor holds bytes back.
            let mut waiting = match keeps {
                true => self.waiting.saturating_add(sent),
                false => 0,
            };
            // An SSE stream waits only up to the bound (a JSON body is read whole by its
            // client anyway): beyond it, everything passes unchanged.
            if bounded
                && editor.held() > 0
                && waiting.saturating_add(editor.held()) > stop::MAX_HELD
            {
                let mut out = match edit {
                    Edit::Keep => data.to_vec(),
                    Edit::Replace(r) => r,
                };
                out.append(&mut editor.release());
                edit = Edit::Replace(out);
                waiting = 0;
            }
            self.waiting = if editor.held() > 0 { waiting } else { 0 };
            return Data {
                edit,
                window_stop,
                ..Data::keep()
            };
        }
        match self.mode {
            Mode::Error if data.len() <= MAX_ERROR_BYTES => {
                self.mode = Mode::Pass;
                let Some(budget) = budget else {
                    return Data::keep();
                };
                match window::parse(budget.backend, data)
                    .and_then(|e| Some((translate(budget, &e)?, e)))
                {
                    Some((body, e)) => Data {
                        edit: Edit::Replace(body),
                        translated: Some(e),
                        ..Data::keep()
                    },
                    None => Data::keep(),
                }
            }
            Mode::Pass | Mode::Observe => Data::keep(),
            Mode::Error | Mode::Json(_) | Mode::Sse(_) => {
                self.mode = Mode::Pass;
                Data::keep()
            }
        }
    }

    /// Whether the filter holds part of the answer: an error body being buffered, or bytes an
    /// editor holds back. After a body chunk, the host must then keep that chunk (as edited)
    /// with what it kept before, and hand only the next chunk's bytes to [`Response::on_data`];
    /// at the trailers, the glue hands over what the host buffers of an error, or nothing new
    /// of a watched answer, with `end_of_stream`, and adds what comes back to what the host
    /// keeps.
    pub fn holds(&self) -> bool {
        (match &self.mode {
            Mode::Pass | Mode::Observe => false,
            Mode::Error => true,
            Mode::Json(e) => e.held() > 0,
            Mode::Sse(e) => e.held() > 0,
        }) || self.overflow.as_ref().is_some_and(|o| o.held() > 0)
    }

    /// Whether a host that adds bytes at the trailers only to what it still buffers must keep
    /// the chunk just read (as edited) with what it kept before: while the filter holds bytes
    /// of an error or a JSON answer, and of a stream whose head announced trailers. A stream's
    /// complete events otherwise pass at once, and only its partial event waits: if trailers
    /// it did not announce end it then, that event cannot go before them on such a host (no
    /// client dispatches an event cut before its blank line).
    pub fn host_keeps(&self) -> bool {
        self.holds() && self.keeps_passed()
    }

    fn keeps_passed(&self) -> bool {
        !(matches!(self.mode, Mode::Sse(_)) || self.overflow.is_some()) || self.trailers
    }
}

/// The dialect's error for a window error, chosen by what is known (docs/spec.md §13):
/// "prompt too long" when the prompt alone exceeds C (the server said so, the counter
/// refused it, or an exact P ≥ C, the filter's or the server's), else "prompt + cap too
/// long". P is the exact count where
/// one exists, else the larger of the server's lower bound and the estimate; C is the
/// window the server named, else the filter's. `None` when a number the error needs is
/// unknown: the answer then passes unchanged.
pub fn translate(budget: &Budget, e: &WindowError) -> Option<Vec<u8>> {
    let cap = e.cap.or(budget.cap);
    let context = e
        .context
        .or(budget.context)
        .or_else(|| e.limit?.checked_add(cap?))?;
    let prompt = if budget.exact {
        budget.prompt
    } else if e.prompt_exact {
        e.prompt
    } else {
        match (e.prompt, budget.prompt) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }?;
    let exact = budget.exact || e.prompt_exact;
    let too_long = e.prompt_exceeds || budget.too_long || (exact && prompt >= context);
    if too_long {
        return Some(errors::prompt_too_long(budget.dialect, prompt, context));
    }
    Some(errors::prompt_and_cap_too_long(
        budget.dialect,
        prompt,
        cap?,
        context,
    ))
}

#[cfg(test)]
mod tests;
