//! The request flow (docs/spec.md §2–§16) as a small explicit state machine over values. The
//! glue drives an [`Exchange`] from the host's callbacks and applies what it returns; it
//! decides nothing. The host is reached only through [`Host`].
//!
//! The modules use each other in one direction, from the driver down:
//!
//! * [`exchange`]: the states of one request and the callbacks that move it between them.
//!   It is the only driver: it calls the strategies and applies what they return;
//! * [`answer`]: the upstream's answer (docs/spec.md §13): what its bytes told, its usage
//!   held against an exact count;
//! * [`orphan`]: a call whose request is gone;
//! * [`partial`]: a hit decided on a body read in part;
//! * one module per strategy, each returning what to do next (`Next`) and naming
//!   only modules below it: [`count`] (the cache, the exact count, the estimate; a bound may
//!   prove the outcome first), [`proof`] (the byte and tail bounds, the cap from a bound),
//!   [`check`] (the count after a skipped request), [`conclude`] (every path ends in one
//!   `Verdict`, which sets the report, the counter and what the answer side needs
//!   together), [`context`] (learning C);
//! * `state`: the values they pass: a request held or sent, a call in flight and what it
//!   awaits, what to do next, how a request ends;
//! * [`store`]: every shared-data table (counts, anchors, learned context lengths, flags),
//!   each bounded;
//! * [`route`]: the plugin and its routes; a request resolves its route once;
//! * `metric`: the counters and histograms.
//!
//! No module but this one names `exchange`, and no two use each other (a test reads the
//! sources and holds them to it).
//!
//! docs/design.md draws the states and the calls.

mod answer;
mod check;
mod conclude;
mod context;
mod count;
mod exchange;
mod metric;
mod orphan;
pub mod partial;
mod proof;
mod route;
mod state;
mod store;
#[cfg(test)]
mod tests;

pub use crate::backend::Call;
pub use exchange::Exchange;
pub use metric::{Histogram, Metric};
pub use orphan::Orphan;
pub use route::Plugin;

use crate::rewrite::Edit;
use crate::tokenize::Failure;

/// Tokenizer replies larger than this are not read (a contract failure).
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// What the flow needs from its host. Host errors are the host's to absorb: a failed read is
/// a miss, a failed write is forgotten, a failed dispatch is `None`.
pub trait Host {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>>;
    fn set_shared(&mut self, key: &str, value: &[u8]);
    /// Sends `call` to the tokenizer cluster with these headers; the token its reply carries.
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32>;
    fn increment(&mut self, metric: Metric);
    /// The host's clock in milliseconds, when it has one.
    fn now_ms(&mut self) -> Option<u64> {
        None
    }
    fn record(&mut self, _histogram: Histogram, _value: u64) {}
    /// The same metric, for the route (docs/spec.md §16) the request went to; `increment`
    /// counts it for the whole configuration too.
    fn increment_route(&mut self, route: usize, metric: Metric) {
        let _ = (route, metric);
    }
}

/// The request head as the flow reads it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'a> {
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// The request has no body.
    pub end_of_stream: bool,
}

/// What to do with the request headers.
///
/// They always go on: the proxy-wasm host turns a paused request head into "pause head and
/// body" (StopAllIterationAndWatermark), so a filter that held the headers would never see the
/// body. A buffer filter after incontext holds them until the body is decided (docs/spec.md
/// §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestHeadStep {
    /// The request is not budgeted.
    Continue,
    /// Remove `content-length` (the body may change length; the buffer filter after incontext,
    /// or Envoy's framing, sets it again) and buffer the body.
    Buffer,
}

/// What to do with a request body chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBodyStep {
    /// Let it go on (the request is not, or no longer, held).
    Continue,
    /// Keep buffering.
    Buffer,
    /// The body is complete: read it and call [`Exchange::on_body`].
    Read,
    /// Still waiting for the tokenizer.
    Wait,
}

/// The result of a step that may wait for the tokenizer.
#[derive(Debug)]
pub enum Step {
    /// A call is out: hold the request until its reply.
    Wait,
    Done(Action),
}

/// What to do with a held request. After a [`Action::Rewrite`] or [`Action::Reply`] the glue
/// tells the exchange whether the host applied it ([`Exchange::applied`]): that is when the
/// request's outcome is counted.
#[derive(Debug)]
pub enum Action {
    /// Resume it as it came.
    Continue,
    /// Replace the head of its body, then resume.
    Rewrite(Rewrite),
    /// Answer it locally; it never reaches the upstream.
    Reply(LocalReply),
}

/// A rewritten body: `head()` replaces the first `end` bytes of the buffered body.
#[derive(Debug)]
pub struct Rewrite {
    body: Vec<u8>,
    edit: Edit,
}

impl Rewrite {
    /// `(end, head)`: what replaces `body[..end]` (written over the filter's own copy of the
    /// body when it fits there).
    pub fn head(&mut self) -> (usize, std::borrow::Cow<'_, [u8]>) {
        (self.edit.end, self.edit.write_head(&mut self.body))
    }

    /// The body as the filter read it, the edit not applied, and the edit.
    pub fn into_parts(self) -> (Vec<u8>, Edit) {
        (self.body, self.edit)
    }

    /// The edit over the body as it came, for a host that writes it in place.
    pub fn edit(&self) -> &Edit {
        &self.edit
    }

    /// The whole rewritten body, for a host that replaces a body whole: written over the
    /// filter's own copy when the new head fits there (the tail moves down once), else built.
    pub fn into_body(mut self) -> Vec<u8> {
        let end = self.edit.end;
        match self.edit.patch(&mut self.body).map(<[u8]>::len) {
            Some(len) if len <= end && end <= self.body.len() => {
                self.body.drain(len..end);
                self.body
            }
            _ => self.edit.apply(&self.body),
        }
    }
}

/// A local answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The reply to a tokenizer call, as the host delivered it.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    pub token: u32,
    /// The HTTP status; `None` when there was no response.
    pub status: Option<u16>,
    /// The body's full size; `body` is what was read of it.
    pub size: usize,
    pub body: &'a [u8],
}

impl Reply<'_> {
    /// Applies `parse` to a body that is not too large.
    fn read<T>(&self, parse: impl FnOnce(&[u8]) -> Result<T, Failure>) -> Result<T, Failure> {
        if self.size > MAX_REPLY_BYTES {
            return Err(Failure::Contract);
        }
        parse(self.body)
    }
}
