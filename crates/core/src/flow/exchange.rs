//! One request through the filter: its states and the callbacks that move it.
//!
//! ```text
//! Passing ◄──────────────────────────── (not budgeted, decided, or any failure)
//! Buffering ── body ──► count::start ──► Waiting { awaited: Context | Count | Tail }
//!                                  │            │ reply: the awaited strategy goes on
//!                                  │            ▼
//!                                  └──────► conclude(Verdict) ──► Passing
//!                                  └─ a bound proves it ──► Sent { bound }
//! Sent ── the stream ends ──► Waiting { awaited: Check } ── reply ──► check::checked
//! ```
//!
//! A request resolves its route once, when its body is read; every later step runs on it.

use super::count;
use super::orphan::Orphan;
use super::partial;
use super::route::{Ctx, RouteId};
use super::state::{Awaited, Next, Pending, Verdict, Waiting};
use super::{
    Action, Host, Metric, Plugin, Reply, RequestBodyStep, RequestHead, RequestHeadStep, Step,
};
use crate::dialect::{classify_path, Endpoint};
use crate::reason::Reason;
use crate::report::Report;
use crate::request::{analyze_at, analyze_guessing, Request};
use crate::response::{Budget, Response};

#[derive(Debug, Default)]
enum State {
    /// Not held (or decided): everything passes.
    #[default]
    Passing,
    /// Collecting the body.
    Buffering,
    Waiting(Waiting),
    /// Sent upstream unchanged on a bound; counted once its stream ends.
    Sent {
        pending: Box<Pending>,
        bound: u64,
        band: bool,
    },
}

/// One request through the filter.
#[derive(Debug, Default)]
pub struct Exchange {
    state: State,
    endpoint: Endpoint,
    route: RouteId,
    /// What the report headers say, once concluded.
    pub(super) report: Option<Report>,
    /// The outcome counter a rewrite or a local reply counts once the host applied it.
    pub(super) applying: Option<Metric>,
    /// The report went out with a local reply.
    pub(super) replied: bool,
    /// What the request side knew, for the answer (set with the conclusion).
    pub(super) budget: Option<Budget>,
    pub(super) response: Response,
}

impl Exchange {
    pub fn new() -> Exchange {
        Exchange::default()
    }

    pub(super) fn ctx<'a>(&self, plugin: &'a Plugin, host: &'a mut dyn Host) -> Ctx<'a> {
        plugin.ctx(self.route, host)
    }

    /// Ends the request side unchanged (before any count, or on a host failure).
    fn unchanged(&mut self, plugin: &Plugin, host: &mut dyn Host, reason: Reason) {
        let mut ctx = self.ctx(plugin, host);
        self.conclude(&mut ctx, Verdict::unchanged(reason));
    }

    /// The request head arrived.
    pub fn on_headers(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        head: &RequestHead,
    ) -> RequestHeadStep {
        host.increment(Metric::Requests);
        let encoded =
            (head.content_encoding).is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"));
        let too_large = (head.content_length)
            .and_then(|l| l.trim().parse::<u64>().ok())
            .is_some_and(|l| l > plugin.config().max_body_bytes as u64);
        let reason = if head.method != Some("POST") {
            Some(Reason::Method)
        } else if encoded {
            Some(Reason::Encoding)
        } else if too_large {
            Some(Reason::TooLarge)
        } else {
            match classify_path(head.path.unwrap_or_default()) {
                Ok(_) if head.end_of_stream => Some(Reason::NotJson),
                Ok(e) => {
                    self.endpoint = e;
                    None
                }
                Err(reason) => Some(reason),
            }
        };
        match reason {
            Some(reason) => {
                self.unchanged(plugin, host, reason);
                RequestHeadStep::Continue
            }
            None => {
                self.state = State::Buffering;
                RequestHeadStep::Buffer
            }
        }
    }

    /// A body chunk arrived; `size` is all that is buffered so far.
    pub fn on_body_chunk(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> RequestBodyStep {
        match self.state {
            State::Buffering if size > plugin.config().max_body_bytes => {
                self.unchanged(plugin, host, Reason::TooLarge);
                RequestBodyStep::Continue
            }
            State::Buffering if end_of_stream => RequestBodyStep::Read,
            State::Buffering => RequestBodyStep::Buffer,
            State::Waiting(ref w) if !matches!(w.awaited, Awaited::Check { .. }) => {
                RequestBodyStep::Wait
            }
            _ => RequestBodyStep::Continue,
        }
    }

    /// The body ended with trailers (no end-of-stream body chunk): it is not budgeted.
    pub fn on_trailers(&mut self, plugin: &Plugin, host: &mut dyn Host) {
        if matches!(self.state, State::Buffering) {
            self.unchanged(plugin, host, Reason::NotJson);
        }
    }

    /// A host call failed before the flow decided: unchanged.
    pub fn on_host_error(&mut self, plugin: &Plugin, host: &mut dyn Host) {
        self.unchanged(plugin, host, Reason::Internal);
    }

    /// The complete body: its route is resolved here, once.
    pub fn on_body(&mut self, plugin: &Plugin, host: &mut dyn Host, body: Vec<u8>) -> Step {
        // The analysis reads only what every route shares with the top level (the model
        // filter counts the models the routes name).
        let analyzed = match analyze_guessing(&body, plugin.config(), self.endpoint) {
            Ok((req, guessed)) if guessed.is_empty() => Ok((req, None)),
            Ok((req, guessed)) => self.prove(plugin, host, req, &guessed, &body),
            Err(reason) => Err(reason),
        };
        let (req, found) = match analyzed {
            Ok(a) => a,
            Err(reason) => {
                self.unchanged(plugin, host, reason);
                return Step::Done(Action::Continue);
            }
        };
        self.route = plugin.resolve(Some(&req.model_name(&body)));
        let mut ctx = self.ctx(plugin, host);
        if let RouteId::Named(i) = self.route {
            ctx.host.increment_route(i, Metric::Requests);
        }
        let next = count::start(&mut ctx, req, body, found);
        self.advance(&mut ctx, next)
    }

    /// The complete body, read in part (`partial`): decided at once when it is a cache hit
    /// that reads none of what was not read, as [`Exchange::on_body`] would decide the whole
    /// body. `Err` with the bytes read: read the body whole and hand it to `on_body`.
    pub fn on_partial(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        partial: partial::Partial,
    ) -> Result<Step, Vec<u8>> {
        let (route, verdict) = partial::decide(plugin, host, self.endpoint, partial)?;
        self.route = route;
        let mut ctx = self.ctx(plugin, host);
        if let RouteId::Named(i) = self.route {
            ctx.host.increment_route(i, Metric::Requests);
        }
        ctx.count(Metric::CacheHits);
        Ok(self.conclude(&mut ctx, verdict))
    }

    /// A request analyzed on guesses of where long values end (`json::guess`) is the request
    /// once the guesses are proved (`count::prove`), and where they lay is remembered for a
    /// body of its length (`partial::layout`); otherwise it is analyzed again without
    /// guesses.
    fn prove(
        &self,
        plugin: &Plugin,
        host: &mut dyn Host,
        req: Request,
        guessed: &[usize],
        body: &[u8],
    ) -> Result<(Request, Option<count::Looked>), Reason> {
        // The route the guessed request names, for its key only: the exchange's route is
        // resolved once, from the request it goes on with.
        let route = plugin.resolve(Some(&req.model_name(body)));
        let mut ctx = plugin.ctx(route, host);
        match count::prove(&mut ctx, &req, body) {
            Some(looked) => {
                partial::learn(&req, guessed, body.len(), plugin.config());
                Ok((req, Some(looked)))
            }
            None => analyze_at(body, plugin.config(), self.endpoint).map(|req| (req, None)),
        }
    }

    /// Applies what a strategy asks.
    fn advance(&mut self, ctx: &mut Ctx, next: Next) -> Step {
        match next {
            Next::Wait(waiting) => {
                self.state = State::Waiting(waiting);
                Step::Wait
            }
            Next::Send(pending, bound) => {
                let verdict = Verdict::fits(ctx, &pending, bound);
                let step = self.conclude(ctx, verdict);
                self.state = State::Sent {
                    pending,
                    bound,
                    band: false,
                };
                step
            }
            Next::Band(pending, bound, verdict) => {
                ctx.count(Metric::CountSkipped);
                super::proof::anchor_bound(ctx, pending.link, bound);
                let step = self.conclude(ctx, verdict);
                self.state = State::Sent {
                    pending,
                    bound,
                    band: true,
                };
                step
            }
            Next::Conclude(verdict) => self.conclude(ctx, verdict),
        }
    }

    /// The reply to a call. `None`: not this exchange's call, or nothing to apply.
    pub fn on_reply(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        reply: &Reply,
    ) -> Option<Step> {
        match &self.state {
            State::Waiting(w) if w.token == reply.token => {}
            _ => return None,
        }
        let State::Waiting(waiting) = std::mem::take(&mut self.state) else {
            return None;
        };
        let mut ctx = self.ctx(plugin, host);
        let next = count::on_reply(&mut ctx, waiting, reply)?;
        Some(self.advance(&mut ctx, next))
    }

    /// The stream ended (the response is complete, or the stream was reset): a request sent
    /// on a bound is counted now, off its path and off its answer's, to check the bound and
    /// to anchor the conversation's next turn.
    pub fn on_stream_end(&mut self, plugin: &Plugin, host: &mut dyn Host) {
        // Any other state is left as it is: a call still out becomes an orphan on deletion.
        if !matches!(self.state, State::Sent { .. }) {
            return;
        }
        let State::Sent {
            pending,
            bound,
            band,
        } = std::mem::take(&mut self.state)
        else {
            return;
        };
        let mut ctx = self.ctx(plugin, host);
        if let Some(waiting) = super::check::start(&mut ctx, pending, bound, band) {
            self.state = State::Waiting(waiting);
        }
    }

    /// The answer reported its prompt (docs/spec.md §15a): a request sent on a bound is
    /// checked by it, and its conversation anchored, with no count; an exact count it
    /// differs from is counted and logged (once per route and model).
    pub(super) fn on_usage(&mut self, ctx: &mut Ctx, prompt: u64) {
        match std::mem::take(&mut self.state) {
            State::Sent {
                pending,
                bound,
                band,
            } => {
                ctx.count(Metric::UsageChecks);
                let sent = super::state::Sent::of(&pending, bound, band);
                let counted = crate::backend::Counted {
                    count: prompt,
                    window: None,
                };
                super::check::checked(ctx, &pending.model, sent, Ok(counted));
            }
            other => {
                self.state = other;
                let Some(budget) = self.budget.as_ref() else {
                    return;
                };
                let counted = budget.prompt.filter(|_| budget.exact);
                if counted.is_some_and(|p| p != prompt) {
                    ctx.count(Metric::UsageMismatch);
                    if ctx.set_flag(super::store::Flag::UsageMismatch, &budget.model) {
                        log::warn!(
                            "incontext: usage {prompt} != count {}: the tokenizer route does not count as the server",
                            counted.unwrap_or(0)
                        );
                    }
                }
            }
        }
    }

    /// The stream ended: what its call still needs when one is out (the request itself is
    /// let go). The exchange then passes everything.
    pub fn abandon(&mut self) -> Option<Orphan> {
        match std::mem::take(&mut self.state) {
            State::Waiting(w) => Orphan::of(w, self.route),
            _ => None,
        }
    }

    /// The token of the call that is out, if any.
    pub fn pending_token(&self) -> Option<u32> {
        match &self.state {
            State::Waiting(w) => Some(w.token),
            _ => None,
        }
    }

    /// Leaves the request side to its conclusion (the state is `Sent` afterwards when a bound
    /// sent it).
    pub(super) fn pass(&mut self) {
        self.state = State::Passing;
    }

    /// The host applied the rewrite or the local reply (`true`), or failed to (`false`: the
    /// request goes on unchanged). The request's outcome is counted here, once.
    pub fn applied(&mut self, plugin: &Plugin, host: &mut dyn Host, ok: bool) {
        let Some(metric) = self.applying.take() else {
            return;
        };
        let mut ctx = self.ctx(plugin, host);
        if ok {
            ctx.count(metric);
            return;
        }
        ctx.count(Metric::Unchanged(Reason::Internal));
        self.replied = false;
        if let Some(report) = self.report.as_mut() {
            *report = Report {
                action: "unchanged",
                reason: Some(Reason::Internal),
                max_tokens: None,
                ..report.clone()
            };
        }
    }
}
