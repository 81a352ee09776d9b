//! Calls a filter configuration makes, not a stream: the count after a skipped request's
//! stream (docs/spec.md §15), and the call of a stream whose client left, made again (Envoy
//! cancelled the stream's own with it). Envoy cancels a stream's calls with the stream, so this one goes
//! out from Envoy's main thread: the stream hands it over ([`Calls::send`]), the configuration's
//! scheduler wakes the main thread, which sends what waits ([`Calls::take`], [`Calls::sent`]);
//! the answer ([`Calls::answered`]) goes to the request's orphan ([`Calls::adopt`]), which stores
//! it, whichever of the two comes first.
//!
//! Envoy moves a metric only through a stream: what such an answer counts waits in the
//! configuration's [`Deferred`] until its next stream applies it.

use crate::metrics::{Deferred, Metrics};
use crate::stream::{now_ms, CallAnswer, Shared};
use crate::table::TABLE;
use incontext_core::flow::{Call, Histogram, Host, Metric, Orphan, Reply};
use std::collections::HashMap;
use std::sync::Mutex;

/// A call to send, owned: the stream that made it is gone by then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// What a call waits for.
enum Waiting {
    /// Its orphan, once the stream is gone.
    Stream,
    Orphan(Orphan),
    /// Its answer came before its orphan.
    Answered(Option<u16>, usize, Vec<u8>),
}

/// An answer: status, body size, body.
type Answer = (Option<u16>, usize, Vec<u8>);

#[derive(Default)]
struct State {
    next: u32,
    queue: Vec<(u32, Outgoing)>,
    /// Envoy's callout id → the call's token.
    out: HashMap<u64, u32>,
    waiting: HashMap<u32, Waiting>,
    /// The calls taken are being sent: an answer may come inside the send that made it (a
    /// call that fails at once), before its id is known.
    sending: bool,
    /// Such answers, by Envoy's callout id, until the send returns (at most
    /// [`MAX_EARLY`]).
    early: Vec<(u64, Answer)>,
    /// The payload's size of each call not answered yet (Envoy holds a copy while it is out),
    /// and their sum (at most [`MAX_PAYLOAD_BYTES`]).
    payloads: HashMap<u32, usize>,
    held: usize,
}

impl State {
    /// Call `token` is answered or refused: Envoy no longer holds its payload.
    fn done(&mut self, token: u32) {
        if let Some(n) = self.payloads.remove(&token) {
            self.held -= n;
        }
    }
}

/// At most this many answers come inside their sends, in one batch of sends.
const MAX_EARLY: usize = 64;

/// Wakes Envoy's main thread (the configuration's scheduler).
pub type Wake = Box<dyn Fn() + Send + Sync>;

pub struct Calls {
    state: Mutex<State>,
    wake: Mutex<Option<Wake>>,
    /// [`MAX_PAYLOAD_BYTES`], or less in tests.
    max_payload: usize,
}

impl Default for Calls {
    fn default() -> Calls {
        Calls::with_max_payload(MAX_PAYLOAD_BYTES)
    }
}

/// At most this many calls wait at once; past it a call is not made (as a refused dispatch).
pub const MAX_WAITING: usize = 4096;

/// At most this many bytes of payload are out in calls of one configuration at once (a burst
/// of large prompts whose clients left, on a tokenizer that does not answer); past it a call
/// is not made.
pub const MAX_PAYLOAD_BYTES: usize = 256 << 20;

impl Calls {
    /// Calls of a configuration with at most `max_payload` bytes out at once.
    pub fn with_max_payload(max_payload: usize) -> Calls {
        Calls {
            state: Mutex::default(),
            wake: Mutex::default(),
            max_payload,
        }
    }

    /// How the main thread is woken; until set (and after [`Calls::close`]), no call is made.
    pub fn set_wake(&self, wake: Wake) {
        if let Ok(mut w) = self.wake.lock() {
            *w = Some(wake);
        }
    }

    /// The configuration is going: no call is made any more.
    pub fn close(&self) {
        if let Ok(mut w) = self.wake.lock() {
            *w = None;
        }
    }

    /// Hands a call over to the main thread; its token, `None` when it cannot be made.
    pub fn send(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32> {
        let wake = self.wake.lock().ok()?;
        let wake = wake.as_ref()?;
        let token = {
            let mut state = self.state.lock().ok()?;
            let size = call.body.as_ref().map_or(0, Vec::len);
            if state.waiting.len() >= MAX_WAITING || state.held + size > self.max_payload {
                return None;
            }
            let token = state.next;
            state.next = state.next.wrapping_add(1);
            let outgoing = Outgoing {
                cluster: cluster.to_string(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: call.body.clone().unwrap_or_default(),
                timeout_ms,
            };
            state.queue.push((token, outgoing));
            state.waiting.insert(token, Waiting::Stream);
            state.payloads.insert(token, size);
            state.held += size;
            token
        };
        wake();
        Some(token)
    }

    /// The calls to send now (on the main thread); [`Calls::sent`] for each, then
    /// [`Calls::all_sent`].
    pub fn take(&self) -> Vec<(u32, Outgoing)> {
        match self.state.lock() {
            Ok(mut state) => {
                state.sending = true;
                std::mem::take(&mut state.queue)
            }
            Err(_) => Vec::new(),
        }
    }

    /// Call `token` went out as Envoy's callout `id`; `None`: Envoy refused it. An answer
    /// that came inside the send is taken now.
    pub fn sent(&self, token: u32, id: Option<u64>, shared: &Shared) {
        let orphan = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            let Some(id) = id else {
                state.waiting.remove(&token);
                state.done(token);
                log::debug!("incontext: a count after its stream could not be sent");
                return;
            };
            let Some(at) = state.early.iter().position(|(early, _)| *early == id) else {
                state.out.insert(id, token);
                return;
            };
            let (_, answer) = state.early.swap_remove(at);
            state.done(token);
            match settle(&mut state, token, answer) {
                Some(delivery) => delivery,
                None => return,
            }
        };
        let (orphan, (status, size, body)) = orphan;
        deliver(orphan, shared, status, size, &body);
    }

    /// The calls taken are sent: answers that came inside a refused send are dropped.
    pub fn all_sent(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.sending = false;
            state.early.clear();
        }
    }

    /// The stream that handed call `token` over is gone without its orphan (a panic): the
    /// call's answer waits for nothing.
    pub fn forget(&self, token: u32) {
        if let Ok(mut state) = self.state.lock() {
            state.waiting.remove(&token);
        }
    }

    /// The orphan of the stream that made call `orphan.token()`: it stores the answer, now if
    /// it came already.
    pub fn adopt(&self, orphan: Orphan, shared: &Shared) {
        let token = orphan.token();
        let answered = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            match state.waiting.remove(&token) {
                Some(Waiting::Stream) => {
                    state.waiting.insert(token, Waiting::Orphan(orphan));
                    return;
                }
                Some(Waiting::Answered(status, size, body)) => (status, size, body),
                // Refused, or not this configuration's call.
                Some(Waiting::Orphan(_)) | None => return,
            }
        };
        let (status, size, body) = answered;
        deliver(orphan, shared, status, size, &body);
    }

    /// The answer to Envoy's callout `id`.
    pub fn answered(&self, id: u64, answer: &CallAnswer, shared: &Shared) {
        let owned = || (answer.status, answer.size, answer.body.to_vec());
        let orphan = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            let Some(token) = state.out.remove(&id) else {
                if state.sending && state.early.len() < MAX_EARLY {
                    state.early.push((id, owned()));
                }
                return;
            };
            state.done(token);
            match state.waiting.remove(&token) {
                Some(Waiting::Orphan(orphan)) => orphan,
                Some(Waiting::Stream) => {
                    let kept = Waiting::Answered(answer.status, answer.size, answer.body.to_vec());
                    state.waiting.insert(token, kept);
                    return;
                }
                Some(Waiting::Answered(..)) | None => return,
            }
        };
        deliver(orphan, shared, answer.status, answer.size, answer.body);
    }

    /// Calls waiting (handed over, sent, or answered before their orphan).
    pub fn waiting(&self) -> usize {
        self.state.lock().map(|s| s.waiting.len()).unwrap_or(0)
    }

    /// The bytes of payload of the calls out (not answered yet).
    pub fn payload_bytes(&self) -> usize {
        self.state.lock().map(|s| s.held).unwrap_or(0)
    }
}

/// The answer to call `token`: its orphan and the answer to deliver, or kept for the orphan
/// to come.
fn settle(state: &mut State, token: u32, answer: Answer) -> Option<(Orphan, Answer)> {
    match state.waiting.remove(&token) {
        Some(Waiting::Orphan(orphan)) => Some((orphan, answer)),
        Some(Waiting::Stream) => {
            let (status, size, body) = answer;
            state
                .waiting
                .insert(token, Waiting::Answered(status, size, body));
            None
        }
        Some(Waiting::Answered(..)) | None => None,
    }
}

/// Hands `orphan` the answer to its call: it stores what it reads.
fn deliver(orphan: Orphan, shared: &Shared, status: Option<u16>, size: usize, body: &[u8]) {
    let reply = Reply {
        token: orphan.token(),
        status,
        size,
        body,
    };
    let mut host = Detached {
        metrics: &shared.metrics,
        deferred: &shared.deferred,
        calls: None,
    };
    orphan.on_reply(&shared.plugin, &mut host, &reply);
}

/// The core's view of Envoy outside any stream: the shared table and the clock, metrics
/// deferred to the configuration's next stream, and calls made by the configuration (when
/// `calls` is given).
pub struct Detached<'a> {
    pub metrics: &'a Metrics,
    pub deferred: &'a Deferred,
    pub calls: Option<&'a Calls>,
}

impl Host for Detached<'_> {
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
        self.calls?.send(cluster, headers, call, timeout_ms)
    }

    fn increment(&mut self, metric: Metric) {
        if let Some(id) = self.metrics.counter(metric) {
            self.deferred.increment(id);
        }
    }

    fn now_ms(&mut self) -> Option<u64> {
        now_ms()
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        if let Some(id) = self.metrics.histogram(histogram) {
            self.deferred.record(id, value);
        }
    }

    fn increment_route(&mut self, route: usize, metric: Metric) {
        if let Some(id) = self.metrics.route_counter(route, metric) {
            self.deferred.increment(id);
        }
    }
}
