//! One HTTP stream's callbacks: each reads what Envoy has, hands it to the core's `Exchange`,
//! and applies the step it returns. The request head is held (StopIteration) while its body
//! is buffered and decided, so nothing goes upstream before the decision; a held request is
//! held to its end and goes on whole, with its Content-Length (as the buffer filter after the
//! wasm filter sends it). Every panic is caught here ([`Stream::guard`]) and the stream then
//! passes everything as it comes.

use crate::calls::{Calls, Detached};
use crate::envoy::{Body, Envoy, Headers};
use crate::metrics::{Deferred, Metrics};
use crate::part;
use crate::splice::{self, Written};
use crate::table::TABLE;
use incontext_core::flow::partial;
use incontext_core::flow::{
    Action, Call, Exchange, Histogram, Host, Metric, Plugin, Reply, RequestBodyStep, RequestHead,
    RequestHeadStep, Rewrite, Step, MAX_REPLY_BYTES,
};
use incontext_core::response;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// What every stream of one filter configuration shares.
pub struct Shared {
    pub plugin: Plugin,
    pub metrics: Metrics,
    /// The calls made after their stream.
    pub calls: Calls,
    /// What their answers counted, until a stream applies it.
    pub deferred: Deferred,
}

/// What to do with a header block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadStatus {
    Continue,
    /// Hold the headers until the filter resumes the stream.
    Stop,
}

/// What to do with a body chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataStatus {
    /// Let it, and whatever was buffered and held, go on.
    Continue,
    /// Keep it in Envoy's buffer; the stream stays held.
    Buffer,
    /// Stop: the request was answered locally.
    Stop,
}

/// The core's view of Envoy, for one stream.
struct View<'a> {
    envoy: &'a mut dyn Envoy,
    metrics: &'a Metrics,
    /// Calls go out on behalf of the configuration (the stream is ending), and the token of
    /// the one handed over is kept here.
    later: Option<(&'a Calls, &'a Cell<Option<u32>>)>,
}

/// The clock, in milliseconds since the epoch.
pub fn now_ms() -> Option<u64> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    u64::try_from(since.as_millis()).ok()
}

impl Host for View<'_> {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>> {
        TABLE.get(key)
    }

    fn set_shared(&mut self, key: &str, value: &[u8]) {
        TABLE.set(key, value);
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32> {
        if let Some((calls, handed)) = self.later {
            let token = calls.send(cluster, headers, call, timeout_ms);
            if token.is_some() {
                handed.set(token);
            }
            return token;
        }
        let body = call.body.as_deref().unwrap_or_default();
        let id = self.envoy.callout(cluster, headers, body, timeout_ms)?;
        // An id past u32 cannot be told apart: its answer will find no call waiting.
        u32::try_from(id).ok()
    }

    fn increment(&mut self, metric: Metric) {
        if let Some(id) = self.metrics.counter(metric) {
            self.envoy.increment(id, 1);
        }
    }

    fn now_ms(&mut self) -> Option<u64> {
        now_ms()
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        if let Some(id) = self.metrics.histogram(histogram) {
            self.envoy.record(id, value);
        }
    }

    fn increment_route(&mut self, route: usize, metric: Metric) {
        if let Some(id) = self.metrics.route_counter(route, metric) {
            self.envoy.increment(id, 1);
        }
    }
}

/// How the request body a step was decided on was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyRead {
    Whole,
    /// Without the interiors of its long values (`part`).
    InPart,
}

/// A long prompt seen before, read in part and decided when it is a hit that reads none of
/// what was not read (`incontext_core::flow::partial`); `None`: read it whole.
fn in_part(exchange: &mut Exchange, plugin: &Plugin, view: &mut View, size: usize) -> Option<Step> {
    let spans = partial::layout(size);
    if spans.is_empty() {
        return None;
    }
    let read = part::read(view.envoy, &spans)?;
    match exchange.on_partial(plugin, view, read) {
        Ok(step) => Some(step),
        Err(buffer) => {
            part::give_back(buffer);
            None
        }
    }
}

/// What a step left the request as.
enum Held {
    /// Still held: a call is out.
    Waiting,
    /// Resume it (as it came, or rewritten).
    Go,
    /// Answered locally.
    Answered,
}

/// Sets the Content-Length of a held request that came without one (chunked, or HTTP/2) to
/// the body Envoy holds.
fn frame(envoy: &mut dyn Envoy) {
    let n = envoy.body_size(Body::Request).to_string();
    if !envoy.set_header(Headers::Request, "content-length", Some(&n)) {
        log::warn!("incontext: cannot set the request's content-length");
    }
}

/// Writes a rewrite over the held request's body (in place when it fits, else whole) and
/// gives it its new Content-Length (none to write when the request declared that length);
/// `false` when Envoy refused (the body is then as it came, unless the Content-Length was
/// refused after it). `read`: how the body was read.
fn rewrite_body(
    envoy: &mut dyn Envoy,
    rewrite: Rewrite,
    read: BodyRead,
    declared: Option<usize>,
) -> bool {
    let written = splice::in_place(envoy, Body::Request, rewrite.edit());
    let body = match (written, read) {
        (Written::InPlace { len }, _) => {
            recycle(rewrite, read);
            return set_length(envoy, len, declared);
        }
        (Written::Failed, _) => {
            recycle(rewrite, read);
            return false;
        }
        (Written::NotInPlace, BodyRead::Whole) => rewrite.into_body(),
        // What was read lacks the values' interiors: Envoy's body is as it came.
        (Written::NotInPlace, BodyRead::InPart) => {
            let whole = envoy.read_body(Body::Request);
            let (buffer, edit) = rewrite.into_parts();
            part::give_back(buffer);
            match whole {
                Some(whole) => edit.apply(&whole),
                None => return false,
            }
        }
    };
    envoy.replace_body(Body::Request, &body) && set_length(envoy, body.len(), declared)
}

/// Writes what the exchange has to publish (docs/spec.md §9a) as the stream's filter state
/// `incontext.*`: before the request goes on, and when the answer's usage comes. A value
/// Envoy refuses is left out.
fn publish(exchange: &mut Exchange, envoy: &mut dyn Envoy) {
    for (name, value) in exchange.published() {
        if !envoy.set_filter_state(name, &value) {
            log::debug!("incontext: cannot publish {name}");
        }
    }
}

/// Gives the request's body its length: nothing to write when its Content-Length declared it.
fn set_length(envoy: &mut dyn Envoy, len: usize, declared: Option<usize>) -> bool {
    declared == Some(len)
        || envoy.set_header(Headers::Request, "content-length", Some(&len.to_string()))
}

/// A body read in part gives its buffer back for the next one (`part`).
fn recycle(rewrite: Rewrite, read: BodyRead) {
    if read == BodyRead::InPart {
        part::give_back(rewrite.into_parts().0);
    }
}

/// Hands the exchange the answer's bytes Envoy holds (what it buffered and, in a body
/// callback, the chunk that arrived) and puts back what it returns; a host failure leaves the
/// rest of the answer unwatched.
fn edit_answer(exchange: &mut Exchange, plugin: &Plugin, view: &mut View, end_of_stream: bool) {
    let Some(data) = view.envoy.read_body(Body::Response) else {
        log::warn!("incontext: cannot read the answer");
        exchange.on_response_host_error();
        return;
    };
    match exchange.on_response_data(plugin, view, &data, end_of_stream) {
        response::Edit::Keep => {}
        response::Edit::Replace(out) => {
            if !view.envoy.replace_body(Body::Response, &out) {
                log::warn!("incontext: cannot replace the answer");
                exchange.on_response_host_error();
            }
        }
    }
}

/// The answer to a tokenizer call, as Envoy delivered it.
#[derive(Debug, Clone, Copy)]
pub struct CallAnswer<'a> {
    /// `None`: no answer (a reset, a timeout, an answer over Envoy's buffer limit).
    pub status: Option<u16>,
    /// The body's full size; `body` holds it when it is not over [`MAX_REPLY_BYTES`].
    pub size: usize,
    pub body: &'a [u8],
}

/// One HTTP stream.
pub struct Stream {
    shared: Arc<Shared>,
    exchange: Exchange,
    /// The request came with a content-length (else, held, it gets one when it goes on).
    length: bool,
    /// Its value, when it is a length.
    declared: Option<usize>,
    /// The request head is held: the request goes on whole, once it has ended.
    held: bool,
    /// A panic was caught: everything passes as it comes.
    broken: bool,
    /// The call made on behalf of the configuration after the stream, when one was.
    handed: Cell<Option<u32>>,
}

impl Stream {
    pub fn new(shared: Arc<Shared>) -> Stream {
        Stream {
            shared,
            exchange: Exchange::new(),
            length: false,
            declared: None,
            held: false,
            broken: false,
            handed: Cell::new(None),
        }
    }

    /// Runs `f`; after a panic in it (or in any earlier callback of the stream) `pass`. A
    /// panic is counted (`incontext_panics`) and the request resumed when `resume`; the panic
    /// hook has logged where it happened.
    pub fn guard<T>(
        &mut self,
        envoy: &mut dyn Envoy,
        pass: T,
        resume: bool,
        f: impl FnOnce(&mut Stream, &mut dyn Envoy) -> T,
    ) -> T {
        if self.broken {
            return pass;
        }
        match catch_unwind(AssertUnwindSafe(|| f(self, &mut *envoy))) {
            Ok(out) => out,
            Err(_) => {
                self.broken = true;
                if let Some(id) = self.shared.metrics.panics {
                    envoy.increment(id, 1);
                }
                if resume {
                    envoy.resume_request();
                }
                pass
            }
        }
    }

    /// Runs `f` with the exchange, the plugin and the host view.
    fn with<T>(
        &mut self,
        envoy: &mut dyn Envoy,
        f: impl FnOnce(&mut Exchange, &Plugin, &mut View) -> T,
    ) -> T {
        let mut view = View {
            envoy,
            metrics: &self.shared.metrics,
            later: None,
        };
        let out = f(&mut self.exchange, &self.shared.plugin, &mut view);
        publish(&mut self.exchange, view.envoy);
        out
    }

    /// Applies a step decided on a body read as `read`, and tells the exchange whether Envoy
    /// applied it.
    fn apply(&mut self, envoy: &mut dyn Envoy, step: Step, read: BodyRead) -> Held {
        let (length, declared) = (self.length, self.declared);
        self.with(envoy, |exchange, plugin, view| {
            let (held, applied) = match step {
                Step::Wait => return Held::Waiting,
                Step::Done(Action::Continue) => {
                    if !length {
                        frame(view.envoy);
                    }
                    return Held::Go;
                }
                Step::Done(Action::Rewrite(rewrite)) => {
                    let ok = rewrite_body(view.envoy, rewrite, read, declared);
                    if !ok {
                        log::warn!("incontext: cannot replace the body");
                    }
                    (Held::Go, ok)
                }
                Step::Done(Action::Reply(reply)) => {
                    // Counted and published first: Envoy may end the stream inside
                    // `send_response`.
                    exchange.applied(plugin, view, true);
                    publish(exchange, view.envoy);
                    let headers: Vec<(&str, &str)> = reply
                        .headers
                        .iter()
                        .map(|(k, v)| (*k, v.as_str()))
                        .collect();
                    view.envoy
                        .send_response(reply.status, &headers, &reply.body);
                    return Held::Answered;
                }
            };
            exchange.applied(plugin, view, applied);
            held
        })
    }

    pub fn request_headers(&mut self, envoy: &mut dyn Envoy, end_of_stream: bool) -> HeadStatus {
        self.shared.deferred.apply(envoy);
        let mut read = |name| envoy.header(Headers::Request, name);
        let (method, path, encoding, length) = (
            read(":method"),
            read(":path"),
            read("content-encoding"),
            read("content-length"),
        );
        self.length = length.is_some();
        self.declared = length.as_deref().and_then(|l| l.parse().ok());
        let head = RequestHead {
            method: method.as_deref(),
            path: path.as_deref(),
            content_encoding: encoding.as_deref(),
            content_length: length.as_deref(),
            end_of_stream,
        };
        let status = self.with(envoy, |exchange, plugin, view| {
            match exchange.on_headers(plugin, view, &head) {
                RequestHeadStep::Continue => HeadStatus::Continue,
                // Held with its body; it goes on with its Content-Length.
                RequestHeadStep::Buffer => HeadStatus::Stop,
            }
        });
        self.held = status == HeadStatus::Stop;
        status
    }

    /// The flow lets the request go: a held one goes on once it has ended, whole, with its
    /// Content-Length.
    fn pass(&mut self, envoy: &mut dyn Envoy, end_of_stream: bool) -> DataStatus {
        if !self.held {
            return DataStatus::Continue;
        }
        if !end_of_stream {
            return DataStatus::Buffer;
        }
        if !self.length {
            frame(envoy);
        }
        DataStatus::Continue
    }

    pub fn request_body(&mut self, envoy: &mut dyn Envoy, end_of_stream: bool) -> DataStatus {
        let read = self.with(envoy, |exchange, plugin, view| {
            let size = view.envoy.body_size(Body::Request);
            match exchange.on_body_chunk(plugin, view, size, end_of_stream) {
                RequestBodyStep::Continue => return Err(None),
                RequestBodyStep::Buffer | RequestBodyStep::Wait => {
                    return Err(Some(DataStatus::Buffer))
                }
                RequestBodyStep::Read => {}
            }
            if let Some(step) = in_part(exchange, plugin, view, size) {
                return Ok((step, BodyRead::InPart));
            }
            let Some(body) = view.envoy.read_body(Body::Request) else {
                log::warn!("incontext: cannot read the body");
                exchange.on_host_error(plugin, view);
                return Err(None);
            };
            Ok((exchange.on_body(plugin, view, body), BodyRead::Whole))
        });
        let (step, how) = match read {
            Ok(step) => step,
            Err(Some(status)) => return status,
            Err(None) => return self.pass(envoy, end_of_stream),
        };
        match self.apply(envoy, step, how) {
            Held::Waiting => DataStatus::Buffer,
            Held::Go => DataStatus::Continue,
            Held::Answered => DataStatus::Stop,
        }
    }

    /// The request ends in trailers: a held request goes on whole (its body was not
    /// budgeted, or is decided already).
    pub fn request_trailers(&mut self, envoy: &mut dyn Envoy) {
        self.with(envoy, |exchange, plugin, view| {
            exchange.on_trailers(plugin, view)
        });
        if self.held && !self.length {
            frame(envoy);
        }
    }

    /// The answer to call `id`.
    pub fn callout_done(&mut self, envoy: &mut dyn Envoy, id: u64, answer: &CallAnswer) {
        let Ok(token) = u32::try_from(id) else {
            return;
        };
        let body = if answer.size > MAX_REPLY_BYTES {
            &[][..]
        } else {
            answer.body
        };
        let reply = Reply {
            token,
            status: answer.status,
            size: answer.size,
            body,
        };
        let step = self.with(envoy, |exchange, plugin, view| {
            exchange.on_reply(plugin, view, &reply)
        });
        if let Some(step) = step {
            if let Held::Go = self.apply(envoy, step, BodyRead::Whole) {
                envoy.resume_request();
            }
        }
    }

    pub fn response_headers(&mut self, envoy: &mut dyn Envoy, end_of_stream: bool) -> HeadStatus {
        self.with(envoy, |exchange, plugin, view| {
            for (name, value) in exchange.response_headers(plugin) {
                view.envoy.add_header(Headers::Response, name, &value);
            }
            let mut read = |name| view.envoy.header(Headers::Response, name);
            let (status, kind, encoding, length, trailer) = (
                read(":status"),
                read("content-type"),
                read("content-encoding"),
                read("content-length"),
                read("trailer"),
            );
            let head = response::Head {
                status: status.and_then(|s| s.trim().parse().ok()),
                content_type: kind.as_deref(),
                content_encoding: encoding.as_deref(),
                content_length: length.as_deref(),
                end_of_stream,
                trailers: trailer.is_some(),
            };
            match exchange.on_response_head(plugin, &head) {
                response::HeadStep::Pass | response::HeadStep::Observe => {}
                // The body may change length.
                response::HeadStep::Hold | response::HeadStep::Watch => {
                    if !view
                        .envoy
                        .set_header(Headers::Response, "content-length", None)
                    {
                        log::warn!("incontext: cannot remove the answer's content-length");
                        exchange.on_response_host_error();
                    }
                }
            }
            HeadStatus::Continue
        })
    }

    pub fn response_body(&mut self, envoy: &mut dyn Envoy, end_of_stream: bool) -> DataStatus {
        self.with(envoy, |exchange, plugin, view| {
            let size = view.envoy.body_size(Body::Response);
            match exchange.on_response_body(size, end_of_stream) {
                response::BodyStep::Continue => return DataStatus::Continue,
                response::BodyStep::Buffer => return DataStatus::Buffer,
                response::BodyStep::Read => {}
            }
            edit_answer(exchange, plugin, view, end_of_stream);
            DataStatus::Continue
        })
    }

    /// The answer ends in trailers: the end of its body, with no more bytes. What the
    /// exchange holds (an error body Envoy buffered, a watched answer's held tail) goes out
    /// before them, edited as at the end of a body.
    pub fn response_trailers(&mut self, envoy: &mut dyn Envoy) {
        self.with(envoy, |exchange, plugin, view| {
            if exchange.on_response_body(0, true) == response::BodyStep::Read {
                edit_answer(exchange, plugin, view, true);
            }
        })
    }

    /// The stream is complete (answered, or reset): a request sent on a bound is counted now,
    /// by a call of the configuration (Envoy would cancel the stream's own with it).
    pub fn complete(&mut self, envoy: &mut dyn Envoy) {
        let shared = self.shared.clone();
        let mut view = View {
            envoy,
            metrics: &shared.metrics,
            later: Some((&shared.calls, &self.handed)),
        };
        self.exchange.on_stream_end(&shared.plugin, &mut view);
    }

    /// The stream is gone. A count made after it goes on without it (its answer is stored);
    /// a call of the stream's own still out (its client left) was cancelled by Envoy with the
    /// stream: it is made again by the configuration, and its answer stored likewise
    /// (docs/module.md).
    pub fn destroyed(mut self) {
        let shared = self.shared.clone();
        if self.broken {
            // A panic left the exchange: a call it handed over waits for nothing.
            if let Some(token) = self.handed.get() {
                shared.calls.forget(token);
            }
            return;
        }
        let orphan = if self.handed.get().is_some() {
            self.exchange.abandon()
        } else {
            let mut host = Detached {
                metrics: &shared.metrics,
                deferred: &shared.deferred,
                calls: Some(&shared.calls),
            };
            self.exchange.abandon_again(&shared.plugin, &mut host)
        };
        if let Some(orphan) = orphan {
            shared.calls.adopt(orphan, &shared);
        }
    }
}
