//! A stream as Envoy holds it for the module, and Envoy's re-entrancy. Envoy calls hooks
//! inside hooks: `send_response` runs the encode hooks inline, `continue_decoding` can end in
//! a local reply of a later filter (its encode hooks, then the stream's completion), a call
//! that fails at once is answered inside the hook that made it, and a stream can be destroyed
//! inside any of them. So:
//!
//! * the calls through which Envoy re-enters the stream (`send_response`, `resume_request`)
//!   are made once the hook has let go of the stream ([`Deferred`]): the hooks Envoy runs
//!   inside them find it free and run as any other;
//! * an answer or the stream's completion that arrives while the stream is busy anyway is
//!   kept and handed to it as soon as the hook that had it lets go;
//! * a destruction while any hook runs is carried out once the outermost returns
//!   ([`After::Free`]).
//!
//! Nothing else re-enters a stream; a hook that still finds it busy is left out, logged.

use crate::envoy::{Body, Envoy, Headers};
use crate::stream::{CallAnswer, Stream};
use std::cell::{Cell, RefCell};

/// At most this many answers wait for a busy stream (it has one call out at a time).
const MAX_KEPT_ANSWERS: usize = 4;

/// A call's answer kept until the stream is free.
struct Kept {
    id: u64,
    status: Option<u16>,
    size: usize,
    body: Vec<u8>,
}

/// One stream of the module.
pub struct Slot {
    stream: RefCell<Stream>,
    /// Hooks of this stream now running (more than one when Envoy nests them).
    depth: Cell<u32>,
    /// Envoy destroyed the stream while a hook ran.
    doomed: Cell<bool>,
    answers: RefCell<Vec<Kept>>,
    /// The stream completed while it was busy.
    completed: Cell<bool>,
}

/// What the caller does with the slot once a hook has returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Keep,
    /// Envoy destroyed the stream meanwhile: free it (and call [`Slot::destroyed`]).
    Free,
}

/// A local reply held back: status, headers, body.
type LocalReply = (u32, Vec<(String, String)>, Vec<u8>);

/// The stream's Envoy for one hook, with the calls through which Envoy re-enters the stream
/// held back until the hook has let go of it.
struct Deferred<'a> {
    envoy: &'a mut dyn Envoy,
    reply: Option<LocalReply>,
    resume: bool,
}

impl Deferred<'_> {
    /// Makes the call held back: a local reply (after which the stream may be gone: nothing
    /// else is made), or the request's resumption.
    fn flush(self) {
        if let Some((status, headers, body)) = self.reply {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.envoy.send_response(status, &headers, &body);
        } else if self.resume {
            self.envoy.resume_request();
        }
    }
}

impl Envoy for Deferred<'_> {
    fn header(&mut self, map: Headers, name: &str) -> Option<String> {
        self.envoy.header(map, name)
    }
    fn set_header(&mut self, map: Headers, name: &str, value: Option<&str>) -> bool {
        self.envoy.set_header(map, name, value)
    }
    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> bool {
        self.envoy.add_header(map, name, value)
    }
    fn body_size(&mut self, body: Body) -> usize {
        self.envoy.body_size(body)
    }
    fn read_body(&mut self, body: Body) -> Option<Vec<u8>> {
        self.envoy.read_body(body)
    }
    fn replace_body(&mut self, body: Body, data: &[u8]) -> bool {
        self.envoy.replace_body(body, data)
    }
    fn body_chunks(&mut self, body: Body, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool {
        self.envoy.body_chunks(body, f)
    }
    fn drain_body(&mut self, body: Body, n: usize) -> bool {
        self.envoy.drain_body(body, n)
    }
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.reply = Some((status, headers, body.to_vec()));
    }
    fn callout(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u64> {
        self.envoy.callout(cluster, headers, body, timeout_ms)
    }
    fn set_filter_state(&mut self, key: &str, value: &str) -> bool {
        // Before the held-back resumption or reply: a filter after this one reads it.
        self.envoy.set_filter_state(key, value)
    }
    fn resume_request(&mut self) {
        self.resume = true;
    }
    fn increment(&mut self, counter: usize, by: u64) {
        self.envoy.increment(counter, by);
    }
    fn record(&mut self, histogram: usize, value: u64) {
        self.envoy.record(histogram, value);
    }
}

impl Slot {
    pub fn new(stream: Stream) -> Slot {
        Slot {
            stream: RefCell::new(stream),
            depth: Cell::new(0),
            doomed: Cell::new(false),
            answers: RefCell::new(Vec::new()),
            completed: Cell::new(false),
        }
    }

    /// Runs a hook on the stream with Envoy's `envoy`; `None` when the stream is busy (the
    /// hook is left out). `go`: what a request hook answers instead when the request is to go
    /// on by the time it returns (an answer that came inside it decided it): the request is
    /// let go by the hook's status rather than resumed inside it.
    pub fn run<T>(
        &self,
        envoy: &mut dyn Envoy,
        go: Option<T>,
        hook: impl FnOnce(&mut Stream, &mut dyn Envoy) -> T,
    ) -> (Option<T>, After) {
        let busy = || {
            log::debug!("incontext: a hook of a busy stream was left out");
            None
        };
        self.enter(envoy, go.map(Some), |s, e| Some(hook(s, e)), busy)
    }

    /// The answer to call `id`: handed to the stream now, or once it is free.
    pub fn answer(&self, envoy: &mut dyn Envoy, id: u64, answer: &CallAnswer) -> After {
        let run = |s: &mut Stream, e: &mut dyn Envoy| {
            s.guard(e, (), true, |s, e| s.callout_done(e, id, answer))
        };
        let busy = || {
            let mut kept = self.answers.borrow_mut();
            if kept.len() < MAX_KEPT_ANSWERS {
                kept.push(Kept {
                    id,
                    status: answer.status,
                    size: answer.size,
                    body: answer.body.to_vec(),
                });
            }
        };
        self.enter(envoy, None, run, busy).1
    }

    /// The stream completed: handed to it now, or once it is free.
    pub fn complete(&self, envoy: &mut dyn Envoy) -> After {
        let run = |s: &mut Stream, e: &mut dyn Envoy| s.guard(e, (), false, |s, e| s.complete(e));
        self.enter(envoy, None, run, || self.completed.set(true)).1
    }

    /// Envoy destroys the stream: [`After::Free`] now, or, inside a hook, once the outermost
    /// returns.
    pub fn destroy(&self) -> After {
        if self.depth.get() > 0 {
            self.doomed.set(true);
            After::Keep
        } else {
            After::Free
        }
    }

    /// The slot is freed: its stream is gone.
    pub fn destroyed(self) {
        self.stream.into_inner().destroyed();
    }

    fn enter<T>(
        &self,
        envoy: &mut dyn Envoy,
        go: Option<T>,
        run: impl FnOnce(&mut Stream, &mut dyn Envoy) -> T,
        busy: impl FnOnce() -> T,
    ) -> (T, After) {
        self.depth.set(self.depth.get() + 1);
        let out = match self.stream.try_borrow_mut() {
            Ok(mut stream) => {
                let mut deferred = Deferred {
                    envoy,
                    reply: None,
                    resume: false,
                };
                let mut out = run(&mut stream, &mut deferred);
                self.catch_up(&mut stream, &mut deferred);
                drop(stream);
                if let Some(go) = go.filter(|_| deferred.resume) {
                    deferred.resume = false;
                    out = go;
                }
                deferred.flush();
                out
            }
            Err(_) => busy(),
        };
        self.depth.set(self.depth.get() - 1);
        let after = if self.depth.get() == 0 && self.doomed.get() {
            After::Free
        } else {
            After::Keep
        };
        (out, after)
    }

    /// Hands the stream what arrived while it was busy.
    fn catch_up(&self, stream: &mut Stream, envoy: &mut dyn Envoy) {
        loop {
            let kept = std::mem::take(&mut *self.answers.borrow_mut());
            if kept.is_empty() {
                break;
            }
            for k in kept {
                let answer = CallAnswer {
                    status: k.status,
                    size: k.size,
                    body: &k.body,
                };
                stream.guard(envoy, (), true, |s, e| s.callout_done(e, k.id, &answer));
            }
        }
        if self.completed.replace(false) {
            stream.guard(envoy, (), false, |s, e| s.complete(e));
        }
    }
}
