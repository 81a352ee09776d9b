//! One request through the filter: its states and the callbacks that move it. The exchange
//! is the only driver: each strategy returns what to do next ([`Next`]) and the exchange
//! applies it, calling the strategy the value names.
//!
//! ```text
//! Passing ◄──────────────────────────── (not budgeted, decided, or any failure)
//! Buffering ── body ──► count::start ──► Waiting { awaited: Context | Count | Tail }
//!                                  │            │ reply: the awaited strategy goes on
//!                                  │            ▼       (Tail: proof; Whole ─► count::whole)
//!                                  └──────► conclude(Verdict) ──► Passing
//!                                  └─ a bound proves it ──► Sent { bound }
//! Sent ── the stream ends ──► Waiting { awaited: Check } ── reply ──► check::checked
//! ```
//!
//! A request resolves its route once, when its body is read; every later step runs on it.

use super::orphan::Orphan;
use super::route::{Ctx, RouteId};
use super::state::{Awaited, Next, Pending, Sent, Verdict, Waiting};
use super::{answer, check, count, partial, proof};
use super::{
    Action, Host, Metric, Plugin, Reply, RequestBodyStep, RequestHead, RequestHeadStep, Step,
};
use crate::dialect::{classify_path, Endpoint};
use crate::publish::{Decision, Publication};
use crate::reason::Reason;
use crate::report::Report;
use crate::request::{analyze_at, analyze_guessing, Request};
use crate::response::{self, Budget, Response};

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
    applying: Option<Metric>,
    /// The report went out with a local reply.
    replied: bool,
    /// What the request side knew, for the answer (set with the conclusion).
    pub(super) budget: Option<Budget>,
    response: Response,
    /// What is still to publish to the host (docs/spec.md §9a).
    publication: Publication,
}

impl Exchange {
    pub fn new() -> Exchange {
        Exchange::default()
    }

    fn ctx<'a>(&self, plugin: &'a Plugin, host: &'a mut dyn Host) -> Ctx<'a> {
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
                ctx.count(Metric::CountSkipped);
                proof::anchor_bound(ctx, pending.link, bound);
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
                proof::anchor_bound(ctx, pending.link, bound);
                let step = self.conclude(ctx, verdict);
                self.state = State::Sent {
                    pending,
                    bound,
                    band: true,
                };
                step
            }
            Next::Whole(pending) => {
                let next = count::whole(ctx, pending);
                self.advance(ctx, next)
            }
            Next::Conclude(verdict) => self.conclude(ctx, verdict),
        }
    }

    /// Ends the request side with `verdict`: the report, the counter (for a rewrite or a
    /// local reply, once the host applied it) and the budget, together. A request concludes
    /// once; a later verdict changes nothing.
    fn conclude(&mut self, ctx: &mut Ctx, verdict: Verdict) -> Step {
        self.pass();
        // The first conclusion stands.
        if self.report.is_some() {
            return Step::Done(Action::Continue);
        }
        let concluded = verdict.conclude(ctx);
        self.report = Some(concluded.report);
        self.budget = concluded.budget;
        self.applying = concluded.applying;
        self.replied = concluded.replied;
        if self.applying.is_none() {
            self.decide(true);
        }
        concluded.step
    }

    /// The decision is final: it is published (with the budget's cap when it is the one that
    /// went upstream).
    fn decide(&mut self, cap_sent: bool) {
        let Some(report) = self.report.as_ref() else {
            return;
        };
        let budget = self.budget.as_ref();
        let window = budget.and_then(|b| b.context);
        let cap = budget.and_then(|b| b.cap).filter(|_| cap_sent);
        self.publication.decide(Decision::of(report, window, cap));
    }

    /// The values to publish that were not handed out yet (docs/spec.md §9a): the decision
    /// once the request is decided (a rewrite or a local reply once the host applied it), the
    /// answer's usage once it reported the prompt. The glue writes them as they come.
    pub fn published(&mut self) -> Vec<(&'static str, String)> {
        self.publication.take()
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
        let Waiting {
            kind,
            awaited,
            pending,
            ..
        } = waiting;
        let next = match awaited {
            Awaited::Context => count::on_context(&mut ctx, pending, reply),
            Awaited::Count => count::on_count(&mut ctx, pending, kind, reply),
            Awaited::Tail(needs) => {
                let counted = count::on_path(&mut ctx, &pending, kind, reply);
                proof::tail_counted(&mut ctx, pending, needs, counted)
            }
            Awaited::Check { bound, band } => {
                let counted = count::parse(&ctx, kind, reply);
                let sent = Sent::of(&pending, bound, band);
                check::checked(&mut ctx, &pending.model, sent, counted);
                return None;
            }
        };
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
        if let Some(waiting) = check::start(&mut ctx, pending, bound, band) {
            self.state = State::Waiting(waiting);
        }
    }

    /// The answer reported its prompt (docs/spec.md §15a): a request sent on a bound is
    /// checked by it, and its conversation anchored, with no count; an exact count it
    /// differs from is counted and logged (once per route and model).
    fn on_usage(&mut self, ctx: &mut Ctx, prompt: u64) {
        match std::mem::take(&mut self.state) {
            State::Sent {
                pending,
                bound,
                band,
            } => {
                ctx.count(Metric::UsageChecks);
                let sent = Sent::of(&pending, bound, band);
                let counted = crate::backend::Counted {
                    count: prompt,
                    window: None,
                };
                check::checked(ctx, &pending.model, sent, Ok(counted));
            }
            other => {
                self.state = other;
                answer::usage(ctx, self.budget.as_ref(), prompt);
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

    /// The stream ended and the host cancelled its call with it: the call is made again
    /// through `host` and its orphan waits for that one ([`Orphan::again`]). The exchange then
    /// passes everything.
    pub fn abandon_again(&mut self, plugin: &Plugin, host: &mut dyn Host) -> Option<Orphan> {
        match std::mem::take(&mut self.state) {
            State::Waiting(w) => {
                let mut ctx = self.ctx(plugin, host);
                Orphan::again(&mut ctx, w, self.route)
            }
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
    fn pass(&mut self) {
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
            self.decide(true);
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
        // The cap the budget names is the one the filter wrote, which did not go upstream.
        self.decide(false);
    }

    /// The upstream's answer head: what to do with its body.
    pub fn on_response_head(
        &mut self,
        plugin: &Plugin,
        head: &response::Head,
    ) -> response::HeadStep {
        if self.replied {
            return response::HeadStep::Pass;
        }
        let translate = plugin.config().translate_errors;
        self.response
            .on_headers(self.budget.as_ref(), translate, head)
    }

    /// A host call on the answer failed: the rest of it passes as it comes.
    pub fn on_response_host_error(&mut self) {
        self.response = response::Response::default();
    }

    /// An answer body chunk arrived; `size` is what the host buffered.
    pub fn on_response_body(&mut self, size: usize, end_of_stream: bool) -> response::BodyStep {
        self.response.on_body(size, end_of_stream)
    }

    /// Whether the filter holds part of the answer (see [`response::Response::holds`]).
    pub fn response_holds(&self) -> bool {
        self.response.holds()
    }

    /// Whether a host that adds bytes only to what it still buffers keeps the chunk just read
    /// ([`response::Response::host_keeps`]).
    pub fn response_host_keeps(&self) -> bool {
        self.response.host_keeps()
    }

    /// The bytes [`response::BodyStep::Read`] asked for: what to send instead, if anything.
    /// A translated window error teaches the context length it names.
    pub fn on_response_data(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        data: &[u8],
        end_of_stream: bool,
    ) -> response::Edit {
        let out = self
            .response
            .on_data(self.budget.as_ref(), data, end_of_stream);
        let mut ctx = self.ctx(plugin, host);
        if let Some(prompt) = answer::told(&mut ctx, self.budget.as_ref(), &out) {
            self.publication.usage(prompt);
            self.on_usage(&mut ctx, prompt);
        }
        out.edit
    }

    /// The headers to add to the upstream's response.
    pub fn response_headers(&self, plugin: &Plugin) -> Vec<(&'static str, String)> {
        if !plugin.config().response_headers || self.replied {
            return Vec::new();
        }
        answer::headers(self.report.as_ref())
    }
}
