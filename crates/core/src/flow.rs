//! The request flow (docs/spec.md §2–§12) as values: request head → hold or pass; body →
//! dialect → count (cache, the backend's count call, or the estimate) → outcome. The host is
//! reached only through [`Host`]: shared data (the count cache and learned windows), dispatch
//! of tokenizer calls, and counters. The glue drives an [`Exchange`] from proxy-wasm callbacks
//! and applies what it returns; it decides nothing.
//!
//! Order of decisions for a complete body: analyze (shape, dialect, caps, model filter) →
//! token ids or forced estimate: validate, count → otherwise: cache lookup (a hit skips
//! validation: only validated bodies are ever stored) → validate → window call when the count
//! will not report the window and none is known → count call → answer: store, learn the
//! window, decide; failure: estimate + margin → decide (rule, thinking budget, reject).

pub use crate::backend::Call;
use crate::backend::{self, CallKind, Counted};
use crate::bound;
use crate::cache;
use crate::config::{Backend, Config, OnInsufficient};
use crate::dialect::{classify_path, Endpoint, Form};
use crate::plan::{decide, Count, Decision, Outcome, Source};
use crate::reason::Reason;
use crate::report::Report;
use crate::request::{analyze_at, Counting, Request};
use crate::response::{self, Budget, Dialect, Response, WindowError};
use crate::rewrite::Edit;
use crate::tokenize::{cache_key, Failure, Reply};
use std::cell::Cell;

/// Tokenizer answers larger than this are not read (a contract failure).
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// What the flow counts (the `incontext_*` counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Requests,
    Rewritten,
    Rejected,
    TokenizerCalls,
    CacheHits,
    CacheMisses,
    Estimates,
    Unchanged(Reason),
    Failure(Failure),
    /// A count call on the request's path.
    CountCalls,
    /// A request whose count a bound made unnecessary (docs/spec.md §15).
    CountSkipped,
    /// A skipped request counted after it went upstream.
    BoundChecks,
    /// A check whose count exceeded the bound: skipping is off for that route.
    BoundViolations,
    /// A count of a conversation's new messages alone, on the request's path.
    TailCounts,
    /// A server's window error reached the client as its dialect's (docs/spec.md §13).
    Translated,
    /// An Anthropic answer ended by the window reports `model_context_window_exceeded`.
    WindowStop,
}

/// What the flow measures (Envoy histograms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Histogram {
    /// Milliseconds from a count call's dispatch on the request's path to its answer.
    CountMs,
}

/// What the flow needs from its host. Host errors are the host's to absorb: a failed read is
/// a miss, a failed write is forgotten, a failed dispatch is `None`.
pub trait Host {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>>;
    fn set_shared(&mut self, key: &str, value: &[u8]);
    /// Sends `call` to the tokenizer cluster with these headers; the token its answer carries.
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

/// A host whose metrics also count for one route.
struct RouteHost<'h> {
    host: &'h mut dyn Host,
    route: usize,
}

impl Host for RouteHost<'_> {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>> {
        self.host.get_shared(key)
    }
    fn set_shared(&mut self, key: &str, value: &[u8]) {
        self.host.set_shared(key, value)
    }
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32> {
        self.host.dispatch(cluster, headers, call, timeout_ms)
    }
    fn increment(&mut self, metric: Metric) {
        self.host.increment(metric);
        self.host.increment_route(self.route, metric);
    }
    fn now_ms(&mut self) -> Option<u64> {
        self.host.now_ms()
    }
    fn record(&mut self, histogram: Histogram, value: u64) {
        self.host.record(histogram, value)
    }
    fn increment_route(&mut self, route: usize, metric: Metric) {
        self.host.increment_route(route, metric);
    }
}

/// Runs `step` on the route `route` names (with its metrics counted for it too), or on
/// `plugin` itself.
fn on_route<T>(
    plugin: &Plugin,
    route: Option<usize>,
    host: &mut dyn Host,
    step: impl FnOnce(&Plugin, &mut dyn Host) -> T,
) -> T {
    match route.and_then(|i| Some((i, plugin.routes.get(i)?))) {
        Some((route, scoped)) => step(scoped, &mut RouteHost { host, route }),
        None => step(plugin, host),
    }
}

/// One plugin configuration: what every request it filters shares.
#[derive(Debug)]
pub struct Plugin {
    pub config: Config,
    /// backend|cluster|authority|path: scopes every shared-data key.
    scope: String,
    /// Whether "the learned window is too small" was logged already.
    warned_window: Cell<bool>,
    /// One per route of the configuration, in order: each its own scope.
    routes: Vec<Plugin>,
}

impl Plugin {
    pub fn new(config: Config) -> Plugin {
        Plugin::scoped(config, String::new())
    }

    /// A plugin whose shared-data keys start with `prefix` (a route's own scope).
    fn scoped(config: Config, prefix: String) -> Plugin {
        let t = &config.tokenizer;
        let scope = format!(
            "{prefix}{}|{}|{}|{}",
            t.backend.as_str(),
            t.cluster,
            t.authority,
            t.path
        );
        let routes = (config.routes.iter().cloned().enumerate())
            .map(|(i, route)| Plugin::scoped(route, format!("routes[{i}]|")))
            .collect();
        Plugin {
            config,
            scope,
            warned_window: Cell::new(false),
            routes,
        }
    }

    /// The number of routes (each has its own counters).
    pub fn routes(&self) -> usize {
        self.routes.len()
    }

    /// Whether a bound may stand in for this request's count (docs/spec.md §15).
    fn skipping(&self, req: &Request) -> bool {
        self.config.skip_count
            && self.config.tokenizer.backend == Backend::Vllm
            && matches!(req.form, Form::Chat | Form::Messages)
            && req.truncate.is_none()
    }

    /// The context length learned for `model` behind this plugin's tokenizer, and whether it
    /// is fresh (learned or confirmed within `window_ttl_ms`).
    fn learned_at(&self, host: &mut dyn Host, model: &str) -> Option<(u64, bool)> {
        let (c, at) =
            cache::decode_context(&host.get_shared(&cache::model_key(&self.scope, model))?)?;
        // A host without a clock keeps every learned window fresh.
        let age = host.now_ms().map_or(0, |now| now.saturating_sub(at));
        Some((c, age <= self.config.window_ttl_ms))
    }

    /// The learned context length, fresh or not (better than none for a decision).
    fn learned(&self, host: &mut dyn Host, model: &str) -> Option<u64> {
        self.learned_at(host, model).map(|(c, _)| c)
    }

    /// A fresh learned context length (a stale one is learned again).
    fn learned_fresh(&self, host: &mut dyn Host, model: &str) -> Option<u64> {
        self.learned_at(host, model)
            .filter(|(_, fresh)| *fresh)
            .map(|(c, _)| c)
    }

    /// Learns (or confirms) C for `model`: written when it changed or when the stored one is
    /// half its lifetime old, so a count that reports the window keeps it fresh.
    fn learn(&self, host: &mut dyn Host, model: &str, c: u64) {
        let now = host.now_ms().unwrap_or(0);
        let current = host
            .get_shared(&cache::model_key(&self.scope, model))
            .and_then(|v| cache::decode_context(&v));
        let keep = current.is_some_and(|(old, at)| {
            old == c && now.saturating_sub(at) <= self.config.window_ttl_ms / 2
        });
        if !keep {
            host.set_shared(
                &cache::model_key(&self.scope, model),
                &cache::encode_context(c, now),
            );
        }
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
pub enum HeadStep {
    /// The request is not budgeted.
    Continue,
    /// Remove `content-length` (the body may change length; the buffer filter after incontext,
    /// or Envoy's framing, sets it again) and buffer the body.
    Buffer,
}

/// What to do with a body chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStep {
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
    /// A call is out: hold the request until its answer.
    Wait,
    Done(Action),
}

/// What to do with a held request.
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
}

/// A local answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// A request held while its call is out.
#[derive(Debug)]
struct Pending {
    req: Request,
    body: Vec<u8>,
    key: u128,
    model: String,
    /// The last link of the message chain, when skipping is on (docs/spec.md §15).
    link: Option<u128>,
    /// When the count call went out.
    sent_ms: Option<u64>,
}

#[derive(Debug)]
enum State {
    /// Not held (or decided): everything passes.
    Passing,
    /// Collecting the body.
    Buffering,
    /// Waiting for the window call, then the count call.
    Window { token: u32, pending: Box<Pending> },
    /// Waiting for the count call.
    Counting {
        token: u32,
        kind: CallKind,
        pending: Box<Pending>,
    },
    /// Waiting for the count of the conversation's new messages alone (docs/spec.md §15).
    Tail {
        token: u32,
        kind: CallKind,
        pending: Box<Pending>,
        proof: TailProof,
    },
    /// Sent upstream unchanged on a bound; counted once the upstream answers.
    Skipped { pending: Box<Pending>, bound: u64 },
    /// Waiting for the count of a skipped request.
    Checking {
        token: u32,
        kind: CallKind,
        pending: Box<Pending>,
        bound: u64,
    },
}

/// What a bound found for a request (docs/spec.md §15).
enum Proof {
    /// The bound proves the outcome: P_hi.
    Fits(u64),
    /// Counting the new messages alone may prove it.
    Tail(Call, TailProof),
}

/// What a tail's count must satisfy to prove the outcome: `base + count + need <= w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TailProof {
    base: u64,
    need: u64,
    w: u64,
}

/// One request through the filter.
#[derive(Debug)]
pub struct Exchange {
    state: State,
    endpoint: Endpoint,
    report: Option<Report>,
    /// The report went out with a local reply.
    replied: bool,
    /// What the request side knew, for the answer (set once the flow decided with a count).
    budget: Option<Budget>,
    response: Response,
    /// The route the request's model is named by (docs/spec.md §16).
    route: Option<usize>,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange::new()
    }
}

impl Exchange {
    pub fn new() -> Exchange {
        Exchange {
            state: State::Passing,
            endpoint: Endpoint::OpenAi,
            report: None,
            replied: false,
            budget: None,
            response: Response::default(),
            route: None,
        }
    }

    /// Runs `step` on the request's route (docs/spec.md §16): the route its model is named
    /// by, with metrics counted for it too, or `plugin` itself.
    fn routed<T>(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        step: impl FnOnce(&mut Self, &Plugin, &mut dyn Host) -> T,
    ) -> T {
        let route = self.route;
        on_route(plugin, route, host, |plugin, host| step(self, plugin, host))
    }

    fn unchanged(&mut self, host: &mut dyn Host, reason: Reason, count: Option<(u64, Source)>) {
        host.increment(Metric::Unchanged(reason));
        log::debug!("incontext: unchanged ({})", reason.as_str());
        self.state = State::Passing;
        self.report = Some(Report {
            action: "unchanged",
            reason: Some(reason),
            prompt: count.map(|c| c.0),
            source: count.map(|c| c.1),
            max_tokens: None,
        });
    }

    /// The request head arrived.
    pub fn on_headers(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        head: &RequestHead,
    ) -> HeadStep {
        host.increment(Metric::Requests);
        if head.method != Some("POST") {
            self.unchanged(host, Reason::Method, None);
            return HeadStep::Continue;
        }
        if head
            .content_encoding
            .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"))
        {
            self.unchanged(host, Reason::Encoding, None);
            return HeadStep::Continue;
        }
        if head
            .content_length
            .and_then(|l| l.trim().parse::<u64>().ok())
            .is_some_and(|l| l > plugin.config.max_body_bytes as u64)
        {
            self.unchanged(host, Reason::TooLarge, None);
            return HeadStep::Continue;
        }
        self.endpoint = match classify_path(head.path.unwrap_or_default()) {
            Ok(e) => e,
            Err(reason) => {
                self.unchanged(host, reason, None);
                return HeadStep::Continue;
            }
        };
        if head.end_of_stream {
            self.unchanged(host, Reason::NotJson, None);
            return HeadStep::Continue;
        }
        self.state = State::Buffering;
        HeadStep::Buffer
    }

    /// A body chunk arrived; `size` is all that is buffered so far.
    pub fn on_body_chunk(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> BodyStep {
        match self.state {
            State::Buffering => {}
            State::Passing | State::Skipped { .. } | State::Checking { .. } => {
                return BodyStep::Continue
            }
            State::Window { .. } | State::Counting { .. } | State::Tail { .. } => {
                return BodyStep::Wait
            }
        }
        if size > plugin.config.max_body_bytes {
            self.unchanged(host, Reason::TooLarge, None);
            return BodyStep::Continue;
        }
        if end_of_stream {
            BodyStep::Read
        } else {
            BodyStep::Buffer
        }
    }

    /// The body ended with trailers (no end-of-stream body chunk): it is not budgeted.
    pub fn on_trailers(&mut self, host: &mut dyn Host) {
        if matches!(self.state, State::Buffering) {
            self.unchanged(host, Reason::NotJson, None);
        }
    }

    /// A host call failed before the flow decided: unchanged.
    pub fn on_host_error(&mut self, host: &mut dyn Host) {
        self.unchanged(host, Reason::Internal, None);
    }

    /// The complete body.
    pub fn on_body(&mut self, plugin: &Plugin, host: &mut dyn Host, body: Vec<u8>) -> Step {
        // The analysis reads only what every route shares with the top level (the model
        // filter counts the models the routes name).
        let req = match analyze_at(&body, &plugin.config, self.endpoint) {
            Ok(r) => r,
            Err(reason) => {
                self.unchanged(host, reason, None);
                return Step::Done(Action::Continue);
            }
        };
        if !plugin.routes.is_empty() {
            self.route = plugin.config.route_of(Some(&req.model_name(&body)));
            if let Some(route) = self.route {
                host.increment_route(route, Metric::Requests);
            }
        }
        self.routed(plugin, host, |x, plugin, host| {
            x.on_analyzed(plugin, host, req, body)
        })
    }

    fn on_analyzed(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        req: Request,
        body: Vec<u8>,
    ) -> Step {
        match req.counting {
            Counting::Tokenize => self.count(plugin, host, req, body),
            _ if !self.validated(host, &req, &body) => Step::Done(Action::Continue),
            Counting::Exact(n) => {
                let count = Count {
                    tokens: n,
                    source: Source::Exact,
                    max_model_len: None,
                };
                self.finish(plugin, host, &req, body, count)
            }
            Counting::Estimate => self.estimate(plugin, host, &req, body),
        }
    }

    /// Validates what `analyze` only skimmed; when invalid, the request passes unchanged.
    fn validated(&mut self, host: &mut dyn Host, req: &Request, body: &[u8]) -> bool {
        match req.validate(body) {
            Ok(()) => true,
            Err(reason) => {
                self.unchanged(host, reason, None);
                false
            }
        }
    }

    fn count(&mut self, plugin: &Plugin, host: &mut dyn Host, req: Request, body: Vec<u8>) -> Step {
        let config = &plugin.config;
        let key = cache_key(&req, &body, &plugin.scope, config.context_length);
        let stored = host
            .get_shared(&cache::slot_key(key, config.cache_entries))
            .and_then(|v| cache::decode(key, &v));
        if let Some(reply) = stored {
            // A count stored without the window it came with (0) has no window to check.
            let window = Some(reply.max_model_len).filter(|c| *c > 0);
            let valid = window
                .is_none_or(|c| crate::tokenize::check_context(c, config.context_length).is_ok());
            if valid {
                host.increment(Metric::CacheHits);
                // The server's window may have changed since the count was stored.
                let window = match (window, config.context_length) {
                    (Some(c), None) => plugin
                        .learned_fresh(host, &req.model_name(&body))
                        .or(Some(c)),
                    _ => window,
                };
                let count = Count {
                    tokens: reply.count,
                    source: Source::Cache,
                    max_model_len: window,
                };
                return self.finish(plugin, host, &req, body, count);
            }
        }
        if !self.validated(host, &req, &body) {
            return Step::Done(Action::Continue);
        }
        host.increment(Metric::CacheMisses);
        let model = req.model_name(&body);
        let chain = plugin
            .skipping(&req)
            .then(|| bound::chain(&req, &body, &plugin.scope, config.context_length))
            .flatten();
        let pending = Box::new(Pending {
            req,
            body,
            key,
            model,
            link: chain.as_ref().and_then(|c| c.links.last().copied()),
            sent_ms: None,
        });
        if let Some(chain) = &chain {
            match self.provable(plugin, host, &pending, chain) {
                Some(Proof::Fits(p_hi)) => return self.skip(plugin, host, pending, p_hi),
                Some(Proof::Tail(call, proof)) => {
                    return self.dispatch_tail(plugin, host, pending, &call, proof)
                }
                None => {}
            }
        }
        self.count_exactly(plugin, host, pending)
    }

    /// Counts the whole prompt: the window first when nothing reports it.
    fn count_exactly(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: Box<Pending>,
    ) -> Step {
        let config = &plugin.config;
        let needs_window = !backend::count_reports_window(config, pending.req.form)
            && config.context_length.is_none()
            && plugin.learned_fresh(host, &pending.model).is_none();
        if needs_window {
            let call = backend::window_call(config);
            if let Some(token) = self.dispatch(plugin, host, &call) {
                self.state = State::Window { token, pending };
                return Step::Wait;
            }
            // No window now: count anyway (a configured window_tokens may still do).
        }
        self.dispatch_count(plugin, host, pending)
    }

    fn dispatch(&mut self, plugin: &Plugin, host: &mut dyn Host, call: &Call) -> Option<u32> {
        let t = &plugin.config.tokenizer;
        let length = call.body.as_ref().map(|b| b.len().to_string());
        let headers = backend::call_headers(&plugin.config, call, length.as_deref());
        host.increment(Metric::TokenizerCalls);
        let token = host.dispatch(&t.cluster, &headers, call, t.timeout_ms);
        if token.is_none() {
            log::warn!("incontext: tokenizer call not dispatched");
        }
        token
    }

    /// P_hi when a bound from a counted prefix of this conversation proves the outcome: the
    /// caller's cap fits (W − P_hi ≥ B), or, without a cap, the server's own default of the
    /// rest of the window does (W = C, W − P_hi ≥ R). Only where writing the cap back would
    /// change nothing: one cap member, of the field the rewrite writes, with a thinking
    /// budget that needs no lowering. Where the bytes of the new messages do not prove it, a
    /// count of those messages alone may: the call that asks it.
    fn provable(
        &self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: &Pending,
        chain: &bound::Chain,
    ) -> Option<Proof> {
        let config = &plugin.config;
        let req = &pending.req;
        let learned = match config.context_length {
            None => Some(plugin.learned(host, &pending.model)?),
            Some(_) => None,
        };
        let (w, c) = crate::plan::window(config, learned).ok()?;
        let need = match req.cap {
            Some(cap) => {
                let same_field = req.target().1 == cap.field.name();
                let budget_ok = req.form != Form::Messages
                    || matches!(
                        crate::dialect::messages::thinking_budget(req, &pending.body, cap.value),
                        Ok(None)
                    );
                if req.cap_members.len() != 1 || !same_field || !budget_ok {
                    return None;
                }
                cap.value
            }
            None if req.form == Form::Chat && w == c => config.min_output_tokens,
            None => return None,
        };
        if host
            .get_shared(&bound::off_key(&plugin.scope, &pending.model))
            .is_some()
        {
            return None;
        }
        let n = chain.links.len();
        for k in (n.saturating_sub(bound::MAX_PROBES).max(1)..=n).rev() {
            let link = chain.links[k - 1];
            let Some(entry) = host
                .get_shared(&bound::slot_key(link, config.cache_entries))
                .and_then(|v| bound::decode(link, &v))
            else {
                continue;
            };
            let body = &pending.body;
            let bounds = bound::bounds(req.form, body, chain, k, entry.tokens)?;
            if bounds.p_hi.checked_add(need)? <= w {
                return Some(Proof::Fits(bounds.p_hi));
            }
            let tail = bounds.tail?;
            let off = bound::tail_off_key(&plugin.scope, &pending.model);
            if !tail.may_prove(need, w) || host.get_shared(&off).is_some() {
                return None;
            }
            let messages = bound::tail_array(body, tail.items)?;
            let call = backend::tail_call(config, req, body, &messages)?;
            let proof = TailProof {
                base: tail.base,
                need,
                w,
            };
            return Some(Proof::Tail(call, proof));
        }
        None
    }

    /// Sends the count of the conversation's new messages alone.
    fn dispatch_tail(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        mut pending: Box<Pending>,
        call: &Call,
        proof: TailProof,
    ) -> Step {
        host.increment(Metric::TailCounts);
        pending.sent_ms = host.now_ms();
        match self.dispatch(plugin, host, call) {
            Some(token) => {
                self.state = State::Tail {
                    token,
                    kind: call.kind,
                    pending,
                    proof,
                };
                Step::Wait
            }
            None => self.count_exactly(plugin, host, pending),
        }
    }

    /// The tail's count: the request skips its count when it proves the outcome, and is
    /// counted whole otherwise. A server that refuses to count a tail alone (its template
    /// wants a whole conversation) is not asked again for this route and model.
    fn tail_counted(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: Box<Pending>,
        proof: TailProof,
        counted: Result<Counted, Failure>,
    ) -> Step {
        match counted {
            Ok(c) => {
                let p_hi = proof.base.saturating_add(c.count);
                if p_hi.saturating_add(proof.need) <= proof.w {
                    return self.skip(plugin, host, pending, p_hi);
                }
            }
            Err(failure) => {
                host.increment(Metric::Failure(failure));
                let refused = matches!(
                    failure,
                    Failure::Status | Failure::BadJson | Failure::Contract
                );
                let off = bound::tail_off_key(&plugin.scope, &pending.model);
                if refused && host.get_shared(&off).is_none() {
                    host.set_shared(&off, &[1]);
                    log::warn!(
                        "incontext: the tokenizer did not count a conversation's new messages alone ({}); counting whole prompts for this route from now on",
                        failure.as_str()
                    );
                }
            }
        }
        self.count_exactly(plugin, host, pending)
    }

    /// Sends the request on unchanged with P_hi reported; the conversation is anchored at
    /// once by the bound, and by the exact count once the upstream answered.
    fn skip(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: Box<Pending>,
        p_hi: u64,
    ) -> Step {
        host.increment(Metric::CountSkipped);
        if let Some(link) = pending.link {
            let slot = bound::slot_key(link, plugin.config.cache_entries);
            if host
                .get_shared(&slot)
                .and_then(|v| bound::decode(link, &v))
                .is_none()
            {
                let entry = bound::Entry {
                    tokens: p_hi,
                    exact: false,
                };
                host.set_shared(&slot, &bound::encode(link, entry));
            }
        }
        self.unchanged(host, Reason::Fits, Some((p_hi, Source::Bound)));
        // P_hi is an upper bound: an answer's window error is read with the estimate.
        let config = &plugin.config;
        self.budget = Some(Budget {
            dialect: Dialect::of(pending.req.form),
            backend: config.tokenizer.backend,
            model: pending.model.clone(),
            prompt: pending.req.estimate(&pending.body),
            exact: false,
            too_long: false,
            context: config
                .context_length
                .or_else(|| plugin.learned(host, &pending.model)),
            cap: pending.req.cap.map(|c| c.value),
            window_cap: None,
        });
        self.state = State::Skipped {
            pending,
            bound: p_hi,
        };
        Step::Done(Action::Continue)
    }

    /// The stream ended (the response is complete, or the stream was reset): a skipped
    /// request is counted now, off its path and off its answer's, to check the bound and to
    /// anchor the conversation's next turn.
    pub fn on_stream_end(&mut self, plugin: &Plugin, host: &mut dyn Host) {
        self.routed(plugin, host, |x, plugin, host| {
            x.on_route_stream_end(plugin, host)
        })
    }

    fn on_route_stream_end(&mut self, plugin: &Plugin, host: &mut dyn Host) {
        // Any other state is left as it is: a call still out becomes an orphan on deletion.
        if !matches!(self.state, State::Skipped { .. }) {
            return;
        }
        let State::Skipped { pending, bound } = std::mem::replace(&mut self.state, State::Passing)
        else {
            return;
        };
        let Some(call) = backend::count_call(&plugin.config, &pending.req, &pending.body) else {
            return;
        };
        if let Some(token) = self.dispatch(plugin, host, &call) {
            host.increment(Metric::BoundChecks);
            self.state = State::Checking {
                token,
                kind: call.kind,
                pending,
                bound,
            };
        }
    }

    fn dispatch_count(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        mut pending: Box<Pending>,
    ) -> Step {
        let Some(call) = backend::count_call(&plugin.config, &pending.req, &pending.body) else {
            // A field the payload needs does not parse (the server would refuse it too).
            return self.estimate(plugin, host, &pending.req, pending.body);
        };
        host.increment(Metric::CountCalls);
        pending.sent_ms = host.now_ms();
        match self.dispatch(plugin, host, &call) {
            Some(token) => {
                self.state = State::Counting {
                    token,
                    kind: call.kind,
                    pending,
                };
                Step::Wait
            }
            None => self.failed(plugin, host, Failure::Dispatch, pending),
        }
    }

    /// Takes the answer to call `answer.token` if it is this exchange's: a window answer is
    /// learned (or its failure counted) here; a count answer is parsed.
    fn take_answer(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        answer: &Answer,
    ) -> Option<Answered> {
        let state = std::mem::replace(&mut self.state, State::Passing);
        match state {
            State::Window { token, pending } if token == answer.token => {
                learn_window(plugin, host, &pending.model, answer);
                Some(Answered::Window(pending))
            }
            State::Counting {
                token,
                kind,
                pending,
            } if token == answer.token => {
                let counted = on_path_count(plugin, host, &pending, kind, answer);
                if let Some(e) = refusal(plugin, answer, &counted) {
                    return Some(Answered::TooLong(pending, e));
                }
                Some(Answered::Count(pending, counted))
            }
            State::Checking {
                token,
                kind,
                pending,
                bound,
            } if token == answer.token => {
                let counted =
                    answer.read(|b| backend::parse_count(&plugin.config, kind, answer.status, b));
                Some(Answered::Check(pending, bound, counted))
            }
            State::Tail {
                token,
                kind,
                pending,
                proof,
            } if token == answer.token => {
                let counted = on_path_count(plugin, host, &pending, kind, answer);
                Some(Answered::Tail(pending, proof, counted))
            }
            other => {
                self.state = other;
                None
            }
        }
    }

    /// The answer to a call. `None`: not this exchange's call.
    pub fn on_reply(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        answer: &Answer,
    ) -> Option<Step> {
        self.routed(plugin, host, |x, plugin, host| {
            x.on_route_reply(plugin, host, answer)
        })
    }

    fn on_route_reply(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        answer: &Answer,
    ) -> Option<Step> {
        Some(match self.take_answer(plugin, host, answer)? {
            Answered::Check(pending, bound, counted) => {
                // The request went on already: nothing to apply.
                checked(
                    plugin,
                    host,
                    pending.key,
                    &pending.model,
                    pending.link,
                    bound,
                    counted,
                );
                return None;
            }
            Answered::Window(pending) => self.dispatch_count(plugin, host, pending),
            Answered::Tail(pending, proof, counted) => {
                self.tail_counted(plugin, host, pending, proof, counted)
            }
            Answered::Count(pending, Ok(counted)) => self.counted(plugin, host, pending, counted),
            Answered::Count(pending, Err(failure)) => self.failed(plugin, host, failure, pending),
            Answered::TooLong(pending, e) => self.too_long(plugin, host, pending, e),
        })
    }

    /// The stream ended: what its call still needs when one is out (the request itself is
    /// let go). The exchange then passes everything.
    pub fn abandon(&mut self) -> Option<Orphan> {
        let (token, call, pending) = match std::mem::replace(&mut self.state, State::Passing) {
            State::Window { token, pending } => (token, OrphanCall::Window, pending),
            State::Counting {
                token,
                kind,
                pending,
            } => (token, OrphanCall::Count(kind), pending),
            State::Checking {
                token,
                kind,
                pending,
                bound,
            } => (token, OrphanCall::Check(kind, bound), pending),
            // A tail's count tells nothing without its request.
            State::Passing | State::Buffering | State::Skipped { .. } | State::Tail { .. } => {
                return None
            }
        };
        let Pending {
            key, model, link, ..
        } = *pending;
        Some(Orphan {
            token,
            call,
            key,
            model,
            link,
            route: self.route,
        })
    }

    /// The token of the call that is out, if any.
    pub fn pending_token(&self) -> Option<u32> {
        match self.state {
            State::Window { token, .. }
            | State::Counting { token, .. }
            | State::Tail { token, .. }
            | State::Checking { token, .. } => Some(token),
            _ => None,
        }
    }

    fn counted(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: Box<Pending>,
        counted: Counted,
    ) -> Step {
        store(
            plugin,
            host,
            pending.key,
            &pending.model,
            pending.link,
            counted,
        );
        let Pending { req, body, .. } = *pending;
        let count = Count {
            tokens: counted.count,
            source: Source::Exact,
            max_model_len: counted.window,
        };
        self.finish(plugin, host, &req, body, count)
    }

    fn failed(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        failure: Failure,
        pending: Box<Pending>,
    ) -> Step {
        host.increment(Metric::Failure(failure));
        log::warn!(
            "incontext: tokenizer failure ({}); using the estimate",
            failure.as_str()
        );
        let Pending { req, body, .. } = *pending;
        self.estimate(plugin, host, &req, body)
    }

    fn estimate(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        req: &Request,
        body: Vec<u8>,
    ) -> Step {
        host.increment(Metric::Estimates);
        match req.estimate(&body) {
            Some(tokens) => {
                let count = Count {
                    tokens,
                    source: Source::Estimate,
                    max_model_len: None,
                };
                self.finish(plugin, host, req, body, count)
            }
            None => {
                self.unchanged(host, Reason::Internal, None);
                Step::Done(Action::Continue)
            }
        }
    }

    /// Decides with a count.
    fn finish(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        req: &Request,
        body: Vec<u8>,
        count: Count,
    ) -> Step {
        let config = &plugin.config;
        // A count without its own window (an estimate, token ids, a counter that reports
        // none) uses the one learned for this model and route, when none is configured.
        let learned = match (config.context_length, count.max_model_len) {
            (None, None) => plugin.learned(host, &req.model_name(&body)),
            _ => None,
        };
        let decision = decide(req, &body, config, count, learned);
        self.budget = Some(budget_of(config, req, &body, &decision, count, learned));
        let counted = Some((decision.prompt, decision.source));
        self.state = State::Passing;
        let outcome = match decision.outcome {
            Outcome::Rewrite { edit, value } => {
                host.increment(Metric::Rewritten);
                log::debug!(
                    "incontext: rewritten prompt={} source={} max_tokens={value}",
                    decision.prompt,
                    decision.source.as_str()
                );
                self.report = Some(Report {
                    action: "rewritten",
                    reason: None,
                    prompt: Some(decision.prompt),
                    source: Some(decision.source),
                    max_tokens: Some(value),
                });
                Action::Rewrite(Rewrite { body, edit })
            }
            Outcome::Unchanged(reason) => {
                if reason == Reason::WindowConfig && !plugin.warned_window.replace(true) {
                    log::error!(
                        "incontext: the learned context length leaves fallback_margin_tokens + min_output_tokens >= the window; requests for that model pass unchanged"
                    );
                }
                self.unchanged(host, reason, counted);
                Action::Continue
            }
            Outcome::Reject { body: error } => {
                host.increment(Metric::Rejected);
                log::debug!("incontext: rejected prompt={}", decision.prompt);
                self.report = Some(Report {
                    action: "rejected",
                    reason: None,
                    prompt: Some(decision.prompt),
                    source: Some(decision.source),
                    max_tokens: None,
                });
                let mut headers = vec![("content-type", "application/json".to_string())];
                if config.response_headers {
                    headers.extend(self.report_headers());
                }
                self.replied = true;
                Action::Reply(LocalReply {
                    status: 400,
                    headers,
                    body: error,
                })
            }
        };
        Step::Done(outcome)
    }

    /// The counter refused the prompt as longer than the window (docs/spec.md §13): reject
    /// mode answers the dialect's error itself; otherwise the request goes on unchanged and
    /// the server's answer is translated.
    fn too_long(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        pending: Box<Pending>,
        e: WindowError,
    ) -> Step {
        let config = &plugin.config;
        learn_refused(plugin, host, &pending.model, &e);
        let Pending { req, body, .. } = *pending;
        let prompt = match (e.prompt, req.estimate(&body)) {
            (Some(a), Some(b)) => a.max(b),
            (a, b) => a.or(b).unwrap_or(0),
        };
        let windows = crate::plan::window(config, e.context).ok();
        let caller = req.cap.map(|c| c.value);
        self.budget = Some(Budget {
            dialect: Dialect::of(req.form),
            backend: config.tokenizer.backend,
            model: req.model_name(&body),
            prompt: Some(prompt),
            exact: e.prompt_exact,
            too_long: true,
            context: windows.map(|(_, c)| c),
            cap: caller,
            window_cap: None,
        });
        self.state = State::Passing;
        match windows {
            Some((w, _)) if config.on_insufficient == OnInsufficient::Reject => {
                let required = caller.map_or(config.min_output_tokens, |b| {
                    b.min(config.min_output_tokens)
                });
                let value = i128::from(w) - i128::from(prompt);
                host.increment(Metric::Rejected);
                log::debug!("incontext: rejected prompt={prompt} (the counter: too long)");
                self.report = Some(Report {
                    action: "rejected",
                    reason: None,
                    prompt: Some(prompt),
                    source: Some(Source::Exact),
                    max_tokens: None,
                });
                let mut headers = vec![("content-type", "application/json".to_string())];
                if config.response_headers {
                    headers.extend(self.report_headers());
                }
                self.replied = true;
                Step::Done(Action::Reply(LocalReply {
                    status: 400,
                    headers,
                    body: req.form.reject_body(w, prompt, value, required),
                }))
            }
            _ => {
                self.unchanged(host, Reason::TooLong, Some((prompt, Source::Exact)));
                Step::Done(Action::Continue)
            }
        }
    }

    /// The upstream's answer head (docs/spec.md §13): what to do with its body.
    pub fn on_response_head(
        &mut self,
        plugin: &Plugin,
        head: &response::Head,
    ) -> response::HeadStep {
        if self.replied {
            return response::HeadStep::Pass;
        }
        self.response
            .on_headers(self.budget.as_ref(), plugin.config.translate_errors, head)
    }

    /// A host call on the answer failed: the rest of it passes as it comes.
    pub fn on_response_host_error(&mut self) {
        self.response = Response::default();
    }

    /// An answer body chunk arrived; `size` is what the host buffered.
    pub fn on_response_body(&mut self, size: usize, end_of_stream: bool) -> response::BodyStep {
        self.response.on_body(size, end_of_stream)
    }

    /// The bytes [`response::BodyStep::Read`] asked for: what to send instead, if anything.
    /// A translated window error teaches the window it names.
    pub fn on_response_data(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        data: &[u8],
        end_of_stream: bool,
    ) -> response::Edit {
        self.routed(plugin, host, |x, plugin, host| {
            x.on_route_response_data(plugin, host, data, end_of_stream)
        })
    }

    fn on_route_response_data(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        data: &[u8],
        end_of_stream: bool,
    ) -> response::Edit {
        let out = self
            .response
            .on_data(self.budget.as_ref(), data, end_of_stream);
        if let Some(e) = out.translated {
            host.increment(Metric::Translated);
            log::debug!("incontext: the server's window error translated");
            if let (Some(c), None, Some(b)) = (
                e.context,
                plugin.config.context_length,
                self.budget.as_ref(),
            ) {
                plugin.learn(host, &b.model, c);
            }
        }
        if out.window_stop {
            host.increment(Metric::WindowStop);
        }
        out.edit
    }

    /// Applying an outcome failed in the host (the body could not be replaced, the local
    /// reply not sent): the request goes on unchanged.
    pub fn on_apply_error(&mut self, host: &mut dyn Host) {
        let counted = self
            .report
            .as_ref()
            .and_then(|r| Some((r.prompt?, r.source?)));
        self.replied = false;
        match self.route {
            Some(route) => {
                self.unchanged(&mut RouteHost { host, route }, Reason::Internal, counted)
            }
            None => self.unchanged(host, Reason::Internal, counted),
        }
    }

    fn report_headers(&self) -> Vec<(&'static str, String)> {
        self.report
            .as_ref()
            .map(Report::headers)
            .unwrap_or_default()
    }

    /// The headers to add to the upstream's response.
    pub fn response_headers(&self, plugin: &Plugin) -> Vec<(&'static str, String)> {
        if !plugin.config.response_headers || self.replied {
            return Vec::new();
        }
        self.report_headers()
    }
}

/// The answer to a tokenizer call, as the host delivered it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub token: u32,
    /// The HTTP status; `None` when there was no response.
    pub status: Option<u16>,
    /// The body's full size; `body` is what was read of it.
    pub size: usize,
    pub body: &'a [u8],
}

impl Answer<'_> {
    /// Applies `parse` to a body that is not too large.
    fn read<T>(&self, parse: impl FnOnce(&[u8]) -> Result<T, Failure>) -> Result<T, Failure> {
        if self.size > MAX_REPLY_BYTES {
            return Err(Failure::Contract);
        }
        parse(self.body)
    }
}

/// Learns the window from a window call's answer (or counts its failure).
fn learn_window(plugin: &Plugin, host: &mut dyn Host, model: &str, answer: &Answer) {
    let kind = backend::window_call(&plugin.config).kind;
    match answer.read(|b| backend::parse_window(kind, Some(model), answer.status, b)) {
        Ok(c) => plugin.learn(host, model, c),
        Err(failure) => {
            host.increment(Metric::Failure(failure));
            log::warn!(
                "incontext: window call failed ({}); counting without it",
                failure.as_str()
            );
        }
    }
}

/// Stores an exact count under `key`, the window it reported for `model`, and the count of
/// the conversation up to `link` (docs/spec.md §15).
fn store(
    plugin: &Plugin,
    host: &mut dyn Host,
    key: u128,
    model: &str,
    link: Option<u128>,
    counted: Counted,
) {
    let config = &plugin.config;
    if let Some(c) = counted.window {
        if config.context_length.is_none() {
            plugin.learn(host, model, c);
        }
    }
    let reply = Reply {
        count: counted.count,
        max_model_len: counted.window.unwrap_or(0),
    };
    host.set_shared(
        &cache::slot_key(key, config.cache_entries),
        &cache::encode(key, reply),
    );
    if let Some(link) = link {
        let entry = bound::Entry {
            tokens: counted.count,
            exact: true,
        };
        host.set_shared(
            &bound::slot_key(link, config.cache_entries),
            &bound::encode(link, entry),
        );
    }
}

/// The count of a request sent on a bound: stored, and held against its bound.
fn checked(
    plugin: &Plugin,
    host: &mut dyn Host,
    key: u128,
    model: &str,
    link: Option<u128>,
    bound: u64,
    counted: Result<Counted, Failure>,
) {
    let counted = match counted {
        Ok(c) => c,
        Err(failure) => {
            host.increment(Metric::Failure(failure));
            return;
        }
    };
    store(plugin, host, key, model, link, counted);
    if counted.count <= bound {
        return;
    }
    host.increment(Metric::BoundViolations);
    let off = bound::off_key(&plugin.scope, model);
    if host.get_shared(&off).is_none() {
        host.set_shared(&off, &[1]);
        log::warn!(
            "incontext: a count exceeded its bound ({} > {bound}); counting every request of this route from now on",
            counted.count
        );
    }
}

/// A call whose request is gone (the client left, the stream was reset), kept until its
/// answer: what the answer tells is still stored (the count, a learned window, a checked
/// bound), so the next identical request need not ask again. It holds the cache key, the model
/// and the conversation's last link, not the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    token: u32,
    call: OrphanCall,
    key: u128,
    model: String,
    link: Option<u128>,
    /// The request's route (docs/spec.md §16).
    route: Option<usize>,
}

/// What an orphan's call asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OrphanCall {
    Window,
    Count(CallKind),
    /// The count of a request sent on a bound, and that bound.
    Check(CallKind, u64),
}

impl Orphan {
    /// The token of the call it waits for.
    pub fn token(&self) -> u32 {
        self.token
    }

    /// The memory it holds, in bytes.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of::<Orphan>() + self.model.capacity()
    }

    /// The answer to its call: stored, nothing decided. `false`: not its call.
    pub fn on_reply(&self, plugin: &Plugin, host: &mut dyn Host, answer: &Answer) -> bool {
        if answer.token != self.token {
            return false;
        }
        on_route(plugin, self.route, host, |plugin, host| {
            self.on_route_reply(plugin, host, answer)
        });
        true
    }

    fn on_route_reply(&self, plugin: &Plugin, host: &mut dyn Host, answer: &Answer) {
        let count =
            |kind| answer.read(|b| backend::parse_count(&plugin.config, kind, answer.status, b));
        match self.call {
            OrphanCall::Window => learn_window(plugin, host, &self.model, answer),
            OrphanCall::Count(kind) => match count(kind) {
                Ok(counted) => store(plugin, host, self.key, &self.model, self.link, counted),
                Err(failure) => match refusal(plugin, answer, &Err(failure)) {
                    Some(e) => learn_refused(plugin, host, &self.model, &e),
                    None => host.increment(Metric::Failure(failure)),
                },
            },
            OrphanCall::Check(kind, bound) => checked(
                plugin,
                host,
                self.key,
                &self.model,
                self.link,
                bound,
                count(kind),
            ),
        }
    }
}

/// The counter refused the prompt as longer than the window (vLLM's `count_tokens` and
/// render answer 400 with the context-length message): the prompt is known to exceed C.
fn refusal(
    plugin: &Plugin,
    answer: &Answer,
    counted: &Result<Counted, Failure>,
) -> Option<WindowError> {
    if !matches!((counted, answer.status), (Err(Failure::Status), Some(400))) {
        return None;
    }
    answer
        .read(|b| Ok(response::window::parse(plugin.config.tokenizer.backend, b)))
        .ok()
        .flatten()
        .filter(|e| e.prompt_exceeds)
}

/// The window a refusal names, learned.
fn learn_refused(plugin: &Plugin, host: &mut dyn Host, model: &str, e: &WindowError) {
    if let (Some(c), None) = (e.context, plugin.config.context_length) {
        plugin.learn(host, model, c);
    }
}

/// The answer to a count call on a request's path, read; its duration recorded.
fn on_path_count(
    plugin: &Plugin,
    host: &mut dyn Host,
    pending: &Pending,
    kind: CallKind,
    answer: &Answer,
) -> Result<Counted, Failure> {
    if let (Some(sent), Some(now)) = (pending.sent_ms, host.now_ms()) {
        host.record(Histogram::CountMs, now.saturating_sub(sent));
    }
    answer.read(|b| backend::parse_count(&plugin.config, kind, answer.status, b))
}

/// What an answer was for.
enum Answered {
    Window(Box<Pending>),
    Count(Box<Pending>, Result<Counted, Failure>),
    /// The count of a skipped request, and its bound.
    Check(Box<Pending>, u64, Result<Counted, Failure>),
    /// The count of a conversation's new messages alone.
    Tail(Box<Pending>, TailProof, Result<Counted, Failure>),
    /// The counter refused the prompt as too long.
    TooLong(Box<Pending>, WindowError),
}

/// What the answer side needs to know of a decided request (docs/spec.md §13).
fn budget_of(
    config: &Config,
    req: &Request,
    body: &[u8],
    decision: &Decision,
    count: Count,
    learned: Option<u64>,
) -> Budget {
    let exact = count.source != Source::Estimate;
    let windows = crate::plan::window(config, count.max_model_len.or(learned)).ok();
    let context = windows.map(|(_, c)| c);
    let caller = req.cap.map(|c| c.value);
    let written = match decision.outcome {
        Outcome::Rewrite { value, .. } => Some(value),
        _ => None,
    };
    // The window, not the caller, set the cap: it is all the window left.
    let window_cap = match (written, windows) {
        (Some(v), Some((w, _))) if req.form == Form::Messages => {
            let margin = if exact {
                0
            } else {
                config.fallback_margin_tokens
            };
            let left = w.saturating_sub(decision.prompt).saturating_sub(margin);
            (v == left && caller.is_none_or(|b| v < b)).then_some(v)
        }
        _ => None,
    };
    Budget {
        dialect: Dialect::of(req.form),
        backend: config.tokenizer.backend,
        model: req.model_name(body),
        prompt: Some(decision.prompt),
        exact,
        too_long: exact && context.is_some_and(|c| decision.prompt >= c),
        context,
        cap: written.or(caller),
        window_cap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{HEADER_ACTION, HEADER_PROMPT, HEADER_SOURCE};
    use std::collections::HashMap;

    /// A dispatched call: cluster, headers, call.
    type Dispatched = (String, Vec<(String, String)>, Call);

    /// A host that keeps shared data in a map, records every call and counter, and can refuse
    /// dispatches.
    #[derive(Default)]
    struct FakeHost {
        shared: HashMap<String, Vec<u8>>,
        calls: Vec<Dispatched>,
        metrics: Vec<Metric>,
        route_metrics: Vec<(usize, Metric)>,
        refuse: bool,
        /// The clock, in ms.
        now: u64,
    }

    impl Host for FakeHost {
        fn get_shared(&mut self, key: &str) -> Option<Vec<u8>> {
            self.shared.get(key).cloned()
        }
        fn set_shared(&mut self, key: &str, value: &[u8]) {
            self.shared.insert(key.to_string(), value.to_vec());
        }
        fn dispatch(
            &mut self,
            cluster: &str,
            headers: &[(&str, &str)],
            call: &Call,
            _timeout_ms: u64,
        ) -> Option<u32> {
            if self.refuse {
                return None;
            }
            let headers = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.calls
                .push((cluster.to_string(), headers, call.clone()));
            Some(100 + self.calls.len() as u32)
        }
        fn increment(&mut self, metric: Metric) {
            self.metrics.push(metric);
        }
        fn increment_route(&mut self, route: usize, metric: Metric) {
            self.route_metrics.push((route, metric));
        }
        fn now_ms(&mut self) -> Option<u64> {
            Some(self.now)
        }
    }

    impl FakeHost {
        fn last_token(&self) -> u32 {
            100 + self.calls.len() as u32
        }
        fn has(&self, c: Metric) -> bool {
            self.metrics.contains(&c)
        }
    }

    fn plugin(extra: &str) -> Plugin {
        plugin_at("v", extra)
    }

    fn plugin_at(cluster: &str, extra: &str) -> Plugin {
        let text = format!(
            r#"{{"tokenizer":{{"cluster":"{cluster}"{}}},"min_output_tokens":64,"fallback_margin_tokens":32{}}}"#,
            extra.split_once('|').map_or("", |(t, _)| t),
            extra.split_once('|').map_or(extra, |(_, c)| c)
        );
        Plugin::new(Config::parse(text.as_bytes()).unwrap())
    }

    const CHAT: &str =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":32768}"#;
    const MESSAGES: &str = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":32000}"#;

    fn head(path: &'static str) -> RequestHead<'static> {
        RequestHead {
            method: Some("POST"),
            path: Some(path),
            ..RequestHead::default()
        }
    }

    /// Headers, then the whole body in one chunk.
    fn send(p: &Plugin, host: &mut FakeHost, path: &'static str, body: &str) -> (Exchange, Step) {
        let mut x = Exchange::new();
        assert_eq!(x.on_headers(p, host, &head(path)), HeadStep::Buffer);
        assert_eq!(
            x.on_body_chunk(p, host, body.len() / 2, false),
            BodyStep::Buffer
        );
        assert_eq!(x.on_body_chunk(p, host, body.len(), true), BodyStep::Read);
        let step = x.on_body(p, host, body.as_bytes().to_vec());
        (x, step)
    }

    fn reply(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, status: u16, body: &str) -> Step {
        let token = host.last_token();
        x.on_reply(
            p,
            host,
            &Answer {
                token,
                status: Some(status),
                size: body.len(),
                body: body.as_bytes(),
            },
        )
        .expect("the exchange's own call")
    }

    /// The rewritten body as JSON.
    fn rewritten(step: Step) -> serde_json::Value {
        match step {
            Step::Done(Action::Rewrite(mut r)) => {
                let (end, head) = r.head();
                let (end, head) = (end, head.into_owned());
                let mut out = head;
                out.extend_from_slice(&r.body[end..]);
                serde_json::from_slice(&out).unwrap()
            }
            other => panic!("not rewritten: {other:?}"),
        }
    }

    fn header(x: &Exchange, p: &Plugin, name: &str) -> Option<String> {
        x.response_headers(p)
            .into_iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    /// A conversation of `turns` tool rounds after a system prompt and a user question.
    fn session(turns: usize, cap: &str) -> String {
        let mut messages = vec![
            r#"{"role":"system","content":"you are an agent"}"#.to_string(),
            r#"{"role":"user","content":"fix the bug"}"#.to_string(),
        ];
        for i in 0..turns {
            messages.push(format!(
                r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c{i}","type":"function","function":{{"name":"read","arguments":"{{\"path\":\"f{i}\"}}"}}}}]}}"#
            ));
            messages.push(format!(
                r#"{{"role":"tool","tool_call_id":"c{i}","content":"{}"}}"#,
                "x".repeat(100)
            ));
        }
        format!(
            r#"{{"model":"m","messages":[{}],"tools":[{{"type":"function","function":{{"name":"read"}}}}]{cap}}}"#,
            messages.join(",")
        )
    }

    /// An Anthropic conversation of `turns` tool rounds after a question, streamed, with the
    /// top-level members `members` (a cap among them) besides the system prompt.
    fn anthropic_session(turns: usize, members: &str) -> &'static str {
        let mut m = vec![r#"{"role":"user","content":"fix it"}"#.to_string()];
        for i in 0..turns {
            m.push(format!(r#"{{"role":"assistant","content":[{{"type":"text","text":"reading"}},{{"type":"tool_use","id":"t{i}","name":"read","input":{{"path":"f{i}"}}}}]}}"#));
            m.push(format!(r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","content":"{}"}}]}}"#, "y".repeat(50)));
        }
        leak(format!(
            r#"{{"model":"m","system":"be brief",{members},"messages":[{}],"stream":true}}"#,
            m.join(",")
        ))
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    fn action(x: &Exchange, p: &Plugin) -> String {
        header(x, p, HEADER_ACTION).unwrap_or_default()
    }

    /// Answers the count call that is out for `x` (the skipped request's check).
    fn answer_check(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, count: u64) {
        let token = x.pending_token().expect("a check is out");
        let body = format!(r#"{{"count":{count},"max_model_len":40960}}"#);
        let step = x.on_reply(
            p,
            host,
            &Answer {
                token,
                status: Some(200),
                size: body.len(),
                body: body.as_bytes(),
            },
        );
        assert!(step.is_none(), "a check has nothing to apply");
    }

    const SKIP: &str = r#","context_length":40960,"skip_count":true"#;

    /// The first turn of `session` (one tool round, cap 16000), counted as `tokens`.
    fn anchor(p: &Plugin, host: &mut FakeHost, tokens: u64) {
        let cap = r#","max_tokens":16000"#;
        let (mut x, _) = send(p, host, "/v1/chat/completions", leak(session(1, cap)));
        let answer = format!(r#"{{"count":{tokens},"max_model_len":40960}}"#);
        reply(p, host, &mut x, 200, &answer);
    }

    #[test]
    fn a_grown_conversation_whose_cap_fits_skips_the_count_and_is_checked_after() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let cap = r#","max_tokens":16000"#;
        anchor(&p, &mut host, 900);
        assert_eq!(host.calls.len(), 1);

        let body = leak(session(2, cap));
        let (mut y, step) = send(&p, &mut host, "/v1/chat/completions", body);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(host.calls.len(), 1, "no count on the request's path");
        assert_eq!(action(&y, &p), "unchanged:fits");
        assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
        let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
        assert!(p_hi > 900 && p_hi + 16000 <= 40960, "{p_hi}");
        assert!(host.has(Metric::CountSkipped) && host.has(Metric::Unchanged(Reason::Fits)));
        // The body goes on as it came; once the upstream answers, it is counted off its path.
        assert_eq!(
            y.on_body_chunk(&p, &mut host, body.len(), true),
            BodyStep::Continue
        );
        y.on_stream_end(&p, &mut host);
        assert_eq!(host.calls.len(), 2);
        assert_eq!(host.calls[1].2.path, "/tokenize");
        assert!(host.has(Metric::BoundChecks));
        answer_check(&p, &mut host, &mut y, 1000);
        assert!(!host.has(Metric::BoundViolations));
        // That exact count anchors the next turn, which skips again.
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(3, cap)));
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(host.calls.len(), 2);
        // The same body again is a plain cache hit of the checked count.
        let (z, step) = send(&p, &mut host, "/v1/chat/completions", body);
        rewritten(step);
        assert_eq!(header(&z, &p, HEADER_PROMPT).as_deref(), Some("1000"));
    }

    #[test]
    fn a_bound_that_does_not_prove_the_outcome_counts() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let cap = r#","max_tokens":16000"#;
        anchor(&p, &mut host, 24900);
        let (mut y, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
        assert!(
            matches!(step, Step::Wait),
            "24900 + the bound of a turn > 40960 − 16000"
        );
        // Not even a quarter of the new bytes a token would fit: the whole prompt is counted.
        assert_eq!(host.calls.len(), 2);
        assert!(!host.has(Metric::TailCounts));
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"count":25000,"max_model_len":40960}"#,
        ));
        assert_eq!(v["max_tokens"], 15960);
    }

    /// The payload of call `i` as JSON.
    fn call_json(host: &FakeHost, i: usize) -> serde_json::Value {
        serde_json::from_slice(host.calls[i].2.body.as_deref().unwrap()).unwrap()
    }

    /// A conversation anchored at `tokens` after one tool round, and its next turn sent.
    fn tail_turn(p: &Plugin, host: &mut FakeHost, tokens: u64) -> (Exchange, Step) {
        anchor(p, host, tokens);
        let cap = r#","max_tokens":16000"#;
        send(p, host, "/v1/chat/completions", leak(session(2, cap)))
    }

    #[test]
    fn a_count_of_the_new_messages_alone_proves_what_their_bytes_do_not() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        // 24800 + the byte bound of a tool round > 24960 = W − B; 24800 + a quarter of its
        // bytes is not.
        let (mut y, step) = tail_turn(&p, &mut host, 24800);
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), 2);
        assert!(host.has(Metric::TailCounts));
        let whole_counts = |host: &FakeHost| {
            host.metrics
                .iter()
                .filter(|m| **m == Metric::CountCalls)
                .count()
        };
        assert_eq!(whole_counts(&host), 1, "the first turn's only");
        // vLLM's /tokenize of the two new messages alone: no system prompt, no tools.
        assert_eq!(host.calls[1].2.path, "/tokenize");
        let tail = call_json(&host, 1);
        let messages = tail["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0]["role"], "assistant");
        assert_eq!(messages[1]["role"], "tool");
        assert!(tail.get("tools").is_none(), "{tail}");
        assert_eq!(tail["model"], "m");
        assert_eq!(tail["add_generation_prompt"], true);
        // 24800 + 120 + SEAM: the cap fits, the request goes on unchanged.
        let step = reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"count":120,"max_model_len":40960}"#,
        );
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(action(&y, &p), "unchanged:fits");
        assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
        let p_hi = 24800 + 120 + bound::SEAM;
        assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
        assert!(host.has(Metric::CountSkipped));
        assert_eq!(whole_counts(&host), 1);
        // Checked after the upstream answered, like any skipped request.
        y.on_stream_end(&p, &mut host);
        assert_eq!(host.calls.len(), 3);
        assert_eq!(call_json(&host, 2)["messages"].as_array().unwrap().len(), 6);
        answer_check(&p, &mut host, &mut y, p_hi);
        assert!(!host.has(Metric::BoundViolations));
    }

    #[test]
    fn a_tail_count_that_does_not_prove_it_is_followed_by_the_whole_count() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let (mut y, _) = tail_turn(&p, &mut host, 24800);
        // 24800 + 150 + SEAM > 24960: the whole prompt is counted, and decides.
        let step = reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"count":150,"max_model_len":40960}"#,
        );
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), 3);
        let whole = call_json(&host, 2);
        assert_eq!(whole["messages"].as_array().unwrap().len(), 6);
        assert!(whole.get("tools").is_some());
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"count":24970,"max_model_len":40960}"#,
        ));
        assert_eq!(v["max_tokens"], 40960 - 24970);
        assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("exact"));
    }

    #[test]
    fn a_server_that_refuses_a_tail_alone_is_asked_for_whole_counts() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let (mut y, _) = tail_turn(&p, &mut host, 24800);
        // The template wants a whole conversation (roles must alternate, ...).
        let step = reply(&p, &mut host, &mut y, 400, r#"{"error":"secret"}"#);
        assert!(matches!(step, Step::Wait));
        assert!(host.has(Metric::Failure(Failure::Status)));
        assert_eq!(call_json(&host, 2)["messages"].as_array().unwrap().len(), 6);
        rewritten(reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"count":24900,"max_model_len":40960}"#,
        ));
        // The next conversation in the same band goes straight to the whole count.
        let other = session(1, r#","max_tokens":16000"#).replace("fix the bug", "other bug");
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(other.clone()));
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":24800,"max_model_len":40960}"#,
        );
        let calls = host.calls.len();
        let next = session(2, r#","max_tokens":16000"#).replace("fix the bug", "other bug");
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(next));
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), calls + 1);
        assert_eq!(
            call_json(&host, calls)["messages"]
                .as_array()
                .unwrap()
                .len(),
            6
        );
        // A passing failure (a timeout) turns nothing off.
        let q = plugin_at("w", SKIP);
        let (mut z, _) = tail_turn(&q, &mut host, 24800);
        let token = z.pending_token().unwrap();
        z.on_reply(
            &q,
            &mut host,
            &Answer {
                token,
                status: Some(504),
                size: 0,
                body: b"",
            },
        );
        assert!(host
            .get_shared(&bound::tail_off_key(&q.scope, "m"))
            .is_none());
    }

    #[test]
    fn a_tail_with_reasoning_or_gone_with_its_stream_counts_nothing_alone() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let cap = r#","max_tokens":16000"#;
        anchor(&p, &mut host, 24800);
        // An assistant turn with reasoning may render only in the whole conversation.
        let thinking = session(2, cap).replacen(
            r#""content":null,"tool_calls":[{"id":"c1""#,
            r#""content":null,"reasoning_content":"hmm","tool_calls":[{"id":"c1""#,
            1,
        );
        assert_ne!(thinking, session(2, cap));
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(thinking));
        assert!(matches!(step, Step::Wait));
        assert!(!host.has(Metric::TailCounts));
        assert_eq!(call_json(&host, 1)["messages"].as_array().unwrap().len(), 6);
        // A stream gone while its tail is counted leaves no orphan; the late answer is no
        // one's.
        let mut host = FakeHost::default();
        let (mut y, _) = tail_turn(&p, &mut host, 24800);
        let token = y.pending_token().unwrap();
        assert!(y.abandon().is_none());
        let late = br#"{"count":1,"max_model_len":40960}"#;
        let answer = Answer {
            token,
            status: Some(200),
            size: late.len(),
            body: late,
        };
        assert!(y.on_reply(&p, &mut host, &answer).is_none());
    }

    #[test]
    fn anthropic_tails_are_counted_by_the_anthropic_counter() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let turn = |n: usize| {
            anthropic_session(
                n,
                r#""tools":[{"name":"read","input_schema":{}}],"tool_choice":{"type":"auto"},"max_tokens":16000"#,
            )
        };
        let (mut x, _) = send(&p, &mut host, "/v1/messages", turn(1));
        reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":24850}"#);
        let (mut y, step) = send(&p, &mut host, "/v1/messages", turn(2));
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls[1].2.path, "/v1/messages/count_tokens");
        let tail = call_json(&host, 1);
        assert_eq!(tail["messages"].as_array().unwrap().len(), 2);
        assert_eq!(tail["messages"][0]["role"], "assistant");
        for gone in ["system", "tools", "tool_choice"] {
            assert!(tail.get(gone).is_none(), "{gone}: {tail}");
        }
        assert_eq!(tail["model"], "m");
        assert_eq!(tail["max_tokens"], 16000);
        assert_eq!(tail["stream"], true);
        reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":60}"#);
        assert_eq!(action(&y, &p), "unchanged:fits");
        let p_hi = 24850 + 60 + bound::SEAM;
        assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
    }

    #[test]
    fn bad_input_falls_back_to_a_full_count() {
        let cap = r#","max_tokens":16000"#;
        let first = session(2, cap);
        let grown = session(3, cap);
        let cases: Vec<(&str, String, &str)> = vec![
            // A message of the history edited, removed, reordered.
            ("edited", grown.replace("fix the bug", "fix the bugs"), ""),
            ("removed", grown.replace(r#"{"role":"user","content":"fix the bug"},"#, ""), ""),
            (
                "reordered",
                grown.replace(
                    r#"{"role":"system","content":"you are an agent"},{"role":"user","content":"fix the bug"}"#,
                    r#"{"role":"user","content":"fix the bug"},{"role":"system","content":"you are an agent"}"#,
                ),
                "",
            ),
            // Other tools, another model, two caps, a cap field the rewrite renames, T.
            ("tools", grown.replace(r#"{"name":"read"}"#, r#"{"name":"write"}"#), ""),
            ("model", grown.replace(r#""model":"m""#, r#""model":"n""#), ""),
            ("two caps", grown.replace(cap, r#","max_tokens":16000,"max_completion_tokens":16000"#), ""),
            ("renamed", grown.replace("max_tokens", "max_output_tokens"), ""),
            ("truncate", grown.replace(cap, r#","max_tokens":16000,"truncate_prompt_tokens":100"#), ""),
            // Content the bound cannot see through.
            (
                "image",
                grown.replace(
                    r#""}],"tools""#,
                    r#""},{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],"tools""#,
                ),
                "",
            ),
            // Another route.
            ("route", grown.clone(), "other"),
        ];
        for (name, body, cluster) in cases {
            let p = plugin(SKIP);
            let mut host = FakeHost::default();
            let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(first.clone()));
            reply(
                &p,
                &mut host,
                &mut x,
                200,
                r#"{"count":900,"max_model_len":40960}"#,
            );
            let q = if cluster.is_empty() {
                plugin(SKIP)
            } else {
                plugin_at(cluster, SKIP)
            };
            let (_, step) = send(&q, &mut host, "/v1/chat/completions", leak(body));
            assert!(matches!(step, Step::Wait), "{name}: counted");
            assert!(!host.has(Metric::CountSkipped), "{name}");
        }
        // A body that shrank: its prefix was counted (a cache hit, or a bounded prefix).
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(grown.clone()));
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":900,"max_model_len":40960}"#,
        );
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(first.clone()));
        assert!(
            matches!(step, Step::Wait),
            "a shorter body has no counted prefix"
        );
        // Skipping off: counted.
        let p = plugin(r#","context_length":40960"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(first));
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":900,"max_model_len":40960}"#,
        );
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(grown));
        assert!(matches!(step, Step::Wait));
    }

    #[test]
    fn without_a_cap_only_where_the_server_takes_the_rest_of_the_window() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(session(1, "")));
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":900,"max_model_len":40960}"#,
        );
        let (y, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, "")));
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(action(&y, &p), "unchanged:fits");
        // W < C: the server's default would overrun W.
        let p = plugin(r#","context_length":40960,"window_tokens":32768,"skip_count":true"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", leak(session(1, "")));
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":900,"max_model_len":40960}"#,
        );
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, "")));
        assert!(matches!(step, Step::Wait));
    }

    #[test]
    fn anthropic_turns_skip_too() {
        let p = plugin(SKIP);
        let mut host = FakeHost::default();
        let turn = |n: usize| anthropic_session(n, r#""max_tokens":32000"#);
        let (mut x, _) = send(&p, &mut host, "/v1/messages", turn(1));
        reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":300}"#);
        let (mut y, step) = send(&p, &mut host, "/v1/messages", turn(2));
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(action(&y, &p), "unchanged:fits");
        y.on_stream_end(&p, &mut host);
        assert_eq!(
            host.calls.last().unwrap().2.path,
            "/v1/messages/count_tokens"
        );
        // The stream ended before the check's answer: still stored and held to the bound.
        let token = y.pending_token().unwrap();
        let orphan = y.abandon().unwrap();
        let late = br#"{"input_tokens":99999}"#;
        assert!(orphan.on_reply(
            &p,
            &mut host,
            &Answer {
                token,
                status: Some(200),
                size: late.len(),
                body: late,
            }
        ));
        assert!(host.has(Metric::BoundViolations));
    }

    #[test]
    fn a_count_above_its_bound_turns_skipping_off_for_the_route() {
        // A tokenizer whose counts break the byte bound: far more tokens than bytes.
        let p = plugin(SKIP);
        let other = plugin_at("w", SKIP);
        let mut host = FakeHost::default();
        let cap = r#","max_tokens":16000"#;
        anchor(&p, &mut host, 900);
        let (mut o, _) = send(
            &other,
            &mut host,
            "/v1/chat/completions",
            leak(session(1, cap)),
        );
        reply(
            &other,
            &mut host,
            &mut o,
            200,
            r#"{"count":900,"max_model_len":40960}"#,
        );
        let (mut y, _) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
        assert_eq!(action(&y, &p), "unchanged:fits");
        let bound: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
        y.on_stream_end(&p, &mut host);
        answer_check(&p, &mut host, &mut y, bound + 1);
        assert!(host.has(Metric::BoundViolations));
        // From now on this route counts every turn, even one its bound would prove.
        let calls = host.calls.len();
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(3, cap)));
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), calls + 1);
        // Another route keeps skipping.
        let (o2, step) = send(
            &other,
            &mut host,
            "/v1/chat/completions",
            leak(session(2, cap)),
        );
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(action(&o2, &other), "unchanged:fits");
    }

    #[test]
    fn miss_counts_then_hit_skips_the_call() {
        let p = plugin(r#","context_length":512"#);
        let mut host = FakeHost::default();
        let (mut x, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert!(matches!(step, Step::Wait));
        assert!(x.pending_token().is_some());
        let (cluster, headers, call) = &host.calls[0];
        assert_eq!((cluster.as_str(), call.path.as_str()), ("v", "/tokenize"));
        assert!(headers.contains(&("content-type".into(), "application/json".into())));
        // A body chunk while the call is out keeps the request held.
        assert_eq!(x.on_body_chunk(&p, &mut host, 1, true), BodyStep::Wait);
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":40,"max_model_len":512}"#,
        ));
        assert_eq!(v["max_tokens"], 472);
        assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("exact"));
        assert_eq!(header(&x, &p, HEADER_ACTION).as_deref(), Some("rewritten"));
        assert!(host.has(Metric::CacheMisses) && host.has(Metric::Rewritten));

        let (x2, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(rewritten(step)["max_tokens"], 472);
        assert_eq!(host.calls.len(), 1, "a hit makes no call");
        assert!(host.has(Metric::CacheHits));
        assert_eq!(header(&x2, &p, HEADER_SOURCE).as_deref(), Some("cache"));
    }

    #[test]
    fn an_abandoned_call_keeps_key_and_model_and_stores_its_answer() {
        let p = plugin(r#","context_length":512"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let token = host.last_token();
        let orphan = x.abandon().expect("a call is out");
        assert_eq!(x.pending_token(), None, "the exchange let the request go");
        assert_eq!(orphan.token(), token);
        assert_eq!(orphan.model, "m");
        let ok = r#"{"count":40,"max_model_len":512}"#;
        let answer = |token| Answer {
            token,
            status: Some(200),
            size: ok.len(),
            body: ok.as_bytes(),
        };
        assert!(!orphan.on_reply(&p, &mut host, &answer(token + 1)));
        assert!(orphan.on_reply(&p, &mut host, &answer(token)));
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(rewritten(step)["max_tokens"], 472);
        assert_eq!(host.calls.len(), 1, "the stored count is a hit");
        // Nothing is out while the body is still coming.
        let mut y = Exchange::new();
        y.on_headers(&p, &mut host, &head("/v1/chat/completions"));
        assert!(y.abandon().is_none());
    }

    #[test]
    fn an_abandoned_window_call_still_learns_the_window() {
        let p = plugin("");
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        let orphan = x.abandon().expect("the window call is out");
        let body = r#"{"data":[{"id":"m","max_model_len":512}]}"#;
        assert!(orphan.on_reply(
            &p,
            &mut host,
            &Answer {
                token: orphan.token(),
                status: Some(200),
                size: body.len(),
                body: body.as_bytes(),
            }
        ));
        let (_, step) = send(&p, &mut host, "/v1/messages", MESSAGES);
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), 2);
        assert_eq!(host.calls[1].2.path, "/v1/messages/count_tokens");
    }

    #[test]
    fn every_failure_kind_falls_back_to_the_estimate() {
        let cases: [(Option<u16>, &str, Failure); 6] = [
            (None, "", Failure::Transport),
            (Some(504), "", Failure::Timeout),
            (Some(500), "{}", Failure::Status),
            (Some(200), "nope", Failure::BadJson),
            (
                Some(200),
                r#"{"count":true,"max_model_len":512}"#,
                Failure::Contract,
            ),
            (
                Some(200),
                r#"{"count":4,"max_model_len":1024}"#,
                Failure::Mismatch,
            ),
        ];
        for (status, body, failure) in cases {
            let p = plugin(r#","context_length":512"#);
            let mut host = FakeHost::default();
            let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
            let token = host.last_token();
            let step = x
                .on_reply(
                    &p,
                    &mut host,
                    &Answer {
                        token,
                        status,
                        size: body.len(),
                        body: body.as_bytes(),
                    },
                )
                .unwrap();
            let v = rewritten(step);
            let estimate = crate::estimate::estimate(&[r#"[{"role":"user","content":"hi"}]"#]);
            assert_eq!(v["max_tokens"], 512 - estimate - 32, "{failure:?}");
            assert!(host.has(Metric::Failure(failure)), "{failure:?}");
            assert!(host.has(Metric::Estimates));
            assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
            // Failures are never cached: the same request calls again.
            send(&p, &mut host, "/v1/chat/completions", CHAT);
            assert_eq!(host.calls.len(), 2, "{failure:?}");
        }
        // A reply larger than the limit is not read.
        let p = plugin(r#","context_length":512"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let token = host.last_token();
        let ok = br#"{"count":4,"max_model_len":512}"#;
        x.on_reply(
            &p,
            &mut host,
            &Answer {
                token,
                status: Some(200),
                size: MAX_REPLY_BYTES + 1,
                body: ok,
            },
        )
        .unwrap();
        assert!(host.has(Metric::Failure(Failure::Contract)));
        // A refused dispatch.
        let mut host = FakeHost {
            refuse: true,
            ..FakeHost::default()
        };
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        rewritten(step);
        assert!(host.has(Metric::Failure(Failure::Dispatch)));
    }

    #[test]
    fn callbacks_out_of_order_change_nothing() {
        let p = plugin(r#","context_length":512"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let other = host.last_token() + 7;
        assert!(x
            .on_reply(
                &p,
                &mut host,
                &Answer {
                    token: other,
                    status: Some(200),
                    size: 0,
                    body: b""
                }
            )
            .is_none());
        assert!(
            x.pending_token().is_some(),
            "an unknown token leaves the call out"
        );
        // Trailers instead of an end-of-stream body: not budgeted.
        let mut y = Exchange::new();
        y.on_headers(&p, &mut host, &head("/v1/chat/completions"));
        y.on_trailers(&mut host);
        assert!(host.has(Metric::Unchanged(Reason::NotJson)));
        assert_eq!(y.on_body_chunk(&p, &mut host, 10, true), BodyStep::Continue);
    }

    #[test]
    fn heads_that_are_not_budgeted() {
        let p = plugin(r#","context_length":512,"max_body_bytes":100"#);
        let mut host = FakeHost::default();
        let cases = [
            (
                RequestHead {
                    method: Some("GET"),
                    ..head("/v1/chat/completions")
                },
                Reason::Method,
            ),
            (
                RequestHead {
                    content_encoding: Some("gzip"),
                    ..head("/v1/chat/completions")
                },
                Reason::Encoding,
            ),
            (
                RequestHead {
                    content_length: Some("101"),
                    ..head("/x")
                },
                Reason::TooLarge,
            ),
            (head("/v1/messages/count_tokens"), Reason::CountOnly),
            (
                head("/v1/responses/resp_1/cancel?x=1"),
                Reason::ResponsesApi,
            ),
            (head("/v1/responses/input_tokens"), Reason::CountOnly),
            (head("/v1/responses/render"), Reason::CountOnly),
            (
                RequestHead {
                    end_of_stream: true,
                    ..head("/x")
                },
                Reason::NotJson,
            ),
        ];
        for (h, reason) in cases {
            let mut x = Exchange::new();
            assert_eq!(x.on_headers(&p, &mut host, &h), HeadStep::Continue);
            assert_eq!(
                header(&x, &p, HEADER_ACTION),
                Some(format!("unchanged:{}", reason.as_str()))
            );
        }
        // Oversize while buffering.
        let mut x = Exchange::new();
        assert_eq!(x.on_headers(&p, &mut host, &head("/x")), HeadStep::Buffer);
        assert_eq!(
            x.on_body_chunk(&p, &mut host, 101, false),
            BodyStep::Continue
        );
        assert!(host.has(Metric::Unchanged(Reason::TooLarge)));
    }

    #[test]
    fn learned_windows_are_scoped_by_route() {
        let a = plugin_at("a", "");
        let b = plugin_at("b", "");
        let mut host = FakeHost::default();
        let (mut x, _) = send(&a, &mut host, "/v1/chat/completions", CHAT);
        rewritten(reply(
            &a,
            &mut host,
            &mut x,
            200,
            r#"{"count":40,"max_model_len":512}"#,
        ));
        // Token ids: counted without a call, windowed by what this route learned.
        let ids = r#"{"model":"m","prompt":[1,2,3,4],"max_tokens":99999}"#;
        let (_, step) = send(&a, &mut host, "/v1/completions", ids);
        assert_eq!(rewritten(step)["max_tokens"], 508);
        let mut other = FakeHost {
            shared: host.shared.clone(),
            ..FakeHost::default()
        };
        let (x, step) = send(&b, &mut other, "/v1/completions", ids);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(
            header(&x, &b, HEADER_ACTION).as_deref(),
            Some("unchanged:no_window")
        );
    }

    #[test]
    fn reject_answers_in_the_dialect() {
        let p = plugin(r#","context_length":512,"on_insufficient":"reject""#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        match reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":500,"max_model_len":512}"#,
        ) {
            Step::Done(Action::Reply(r)) => {
                assert_eq!(r.status, 400);
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["error"]["code"], "context_length_exceeded");
                assert!(r.headers.contains(&(HEADER_ACTION, "rejected".to_string())));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            x.response_headers(&p).is_empty(),
            "sent with the local reply"
        );
        let (mut y, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        assert_eq!(
            host.calls.last().unwrap().2.path,
            "/v1/messages/count_tokens"
        );
        match reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":500}"#) {
            Step::Done(Action::Reply(r)) => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["type"], "error");
                assert_eq!(
                    v["error"]["message"],
                    "prompt is too long: 500 tokens > 448 maximum"
                );
            }
            other => panic!("{other:?}"),
        }
        // An estimate never rejects.
        let mut host = FakeHost::default();
        let (mut z, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let token = host.last_token();
        let step = z
            .on_reply(
                &p,
                &mut host,
                &Answer {
                    token,
                    status: Some(500),
                    size: 0,
                    body: b"",
                },
            )
            .unwrap();
        assert!(!matches!(step, Step::Done(Action::Reply(_))));
    }

    const RESPONSES: &str =
        r#"{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true,"store":false}"#;

    #[test]
    fn responses_are_rendered_and_written_as_max_output_tokens() {
        let p = plugin("");
        let mut host = FakeHost::default();
        let (mut x, step) = send(&p, &mut host, "/v1/responses?x=1", RESPONSES);
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls[0].2.path, "/v1/models");
        let step = reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"data":[{"id":"m","max_model_len":512}]}"#,
        );
        assert!(matches!(step, Step::Wait));
        let call = &host.calls[1].2;
        assert_eq!(call.path, "/v1/responses/render");
        assert_eq!(
            call.body.as_deref(),
            Some(
                br#"{"model":"m","input":[{"role":"user","content":"hi"}],"store":false}"#
                    .as_slice()
            )
        );
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"request_id":"r","token_ids":[1,2,3,4,5,6,7,8,9,10]}"#,
        ));
        assert_eq!(v["max_output_tokens"], 502);
        assert!(v.get("max_tokens").is_none());
        assert_eq!(v["stream"], true);
        assert_eq!(header(&x, &p, HEADER_PROMPT).as_deref(), Some("10"));
        // The same request again: a cache hit, whatever its cap or stream flag.
        let again = r#"{"model":"m","input":[{"role":"user","content":"hi"}],"stream":false,"store":false,"max_output_tokens":32000}"#;
        let (_, step) = send(&p, &mut host, "/v1/responses", again);
        assert_eq!(rewritten(step)["max_output_tokens"], 502);
        assert_eq!(host.calls.len(), 2);
        assert!(host.has(Metric::CacheHits));
    }

    #[test]
    fn responses_without_a_renderer_use_the_estimate_and_never_reject() {
        let p = plugin(r#","context_length":512,"on_insufficient":"reject""#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
        // vLLM without --enable-scale-out.
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            403,
            r#"{"detail":"Forbidden"}"#,
        ));
        let estimate = crate::estimate::estimate(&[r#"[{"role":"user","content":"hi"}]"#]);
        assert_eq!(v["max_output_tokens"], 512 - estimate - 32);
        assert!(host.has(Metric::Failure(Failure::Status)));
        assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
        // SGLang renders no Responses request: the estimate, with no count call.
        let p = plugin(r#","backend":"sglang"|,"context_length":512"#);
        let mut host = FakeHost::default();
        let (x, step) = send(&p, &mut host, "/v1/responses", RESPONSES);
        assert_eq!(rewritten(step)["max_output_tokens"], 512 - estimate - 32);
        assert!(host.calls.is_empty());
        assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
    }

    #[test]
    fn responses_reject_stateful_and_llamacpp() {
        let p = plugin(r#","context_length":512,"on_insufficient":"reject""#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
        match reply(&p, &mut host, &mut x, 200, r#"{"token_ids":[1,2,3]}"#) {
            Step::Done(Action::Rewrite(_)) => {}
            other => panic!("{other:?}"),
        }
        let ids = format!(r#"{{"token_ids":[{}]}}"#, vec!["7"; 460].join(","));
        let body = RESPONSES.replace("hi", "hello");
        let body: &'static str = Box::leak(body.into_boxed_str());
        let (mut y, _) = send(&p, &mut host, "/v1/responses", body);
        match reply(&p, &mut host, &mut y, 200, &ids) {
            Step::Done(Action::Reply(r)) => {
                assert_eq!(r.status, 400);
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["error"]["code"], "context_length_exceeded");
                assert_eq!(v["error"]["param"], "input");
            }
            other => panic!("{other:?}"),
        }
        let stateful = r#"{"model":"m","input":"more","previous_response_id":"resp_1"}"#;
        let (x, step) = send(&p, &mut host, "/v1/responses", stateful);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(
            header(&x, &p, HEADER_ACTION).as_deref(),
            Some("unchanged:stateful")
        );
        let p = plugin(r#","backend":"llamacpp"|,"context_length":512"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
        assert_eq!(host.calls[0].2.path, "/v1/responses/input_tokens");
        let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":12}"#));
        assert_eq!(v["max_output_tokens"], 500);
    }

    #[test]
    fn anthropic_learns_the_window_first_then_counts() {
        let p = plugin("");
        let mut host = FakeHost::default();
        let (mut x, step) = send(&p, &mut host, "/v1/messages", MESSAGES);
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls[0].2.path, "/v1/models");
        assert_eq!(host.calls[0].2.method, "GET");
        let step = reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"data":[{"id":"m","max_model_len":512}]}"#,
        );
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls[1].2.path, "/v1/messages/count_tokens");
        let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":30}"#));
        assert_eq!(v["max_tokens"], 482);
        assert_eq!(v["system"], "be brief");
        // The window is learned once per route: the next request counts straight away.
        let body = MESSAGES.replace("hi", "hello");
        let (_, step) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(body.into_boxed_str()),
        );
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), 3);
        assert_eq!(host.calls[2].2.path, "/v1/messages/count_tokens");
    }

    #[test]
    fn anthropic_thinking_budget() {
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let with = |budget: u64| {
            MESSAGES.replace(
                r#""max_tokens":32000"#,
                &format!(
                    r#""max_tokens":32000,"thinking":{{"type":"enabled","budget_tokens":{budget}}}"#
                ),
            )
        };
        let body: &'static str = Box::leak(with(2000).into_boxed_str());
        let (mut x, _) = send(&p, &mut host, "/v1/messages", body);
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"input_tokens":2500}"#,
        ));
        assert_eq!(v["max_tokens"], 1596);
        assert_eq!(v["thinking"]["budget_tokens"], 1595);
        assert_eq!(v["thinking"]["type"], "enabled");
        // No valid budget below the new cap: unchanged, with a reason.
        let mut host = FakeHost::default();
        let (mut y, _) = send(&p, &mut host, "/v1/messages", body);
        let step = reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":3100}"#);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(
            header(&y, &p, HEADER_ACTION).as_deref(),
            Some("unchanged:thinking_budget")
        );
        // A budget already below the new cap is left alone.
        let small: &'static str = Box::leak(with(1024).into_boxed_str());
        let mut host = FakeHost::default();
        let (mut z, _) = send(&p, &mut host, "/v1/messages", small);
        let v = rewritten(reply(&p, &mut host, &mut z, 200, r#"{"input_tokens":100}"#));
        assert_eq!(v["thinking"]["budget_tokens"], 1024);
    }

    #[test]
    fn llamacpp_window_from_props_and_sglang_ignores_tokenize_limit() {
        let p = plugin(r#","backend":"llamacpp"|"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(host.calls[0].2.path, "/props");
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"default_generation_settings":{"n_ctx":512}}"#,
        );
        assert_eq!(host.calls[1].2.path, "/v1/chat/completions/input_tokens");
        let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":12}"#));
        assert_eq!(v["max_tokens"], 500);

        let p = plugin(r#","backend":"sglang"|"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"object":"list","data":[{"id":"m","max_model_len":512}]}"#,
        );
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":12,"max_model_len":40960}"#,
        ));
        assert_eq!(
            v["max_tokens"], 500,
            "the window is /v1/models', not /tokenize's"
        );
    }

    /// Drives an answer through the exchange as the glue does (Envoy buffers while the flow
    /// says so); what the client receives.
    fn answer(
        x: &mut Exchange,
        p: &Plugin,
        host: &mut FakeHost,
        status: u16,
        content_type: &'static str,
        chunks: &[&[u8]],
    ) -> (response::HeadStep, Vec<u8>) {
        let head = response::Head {
            status: Some(status),
            content_type: Some(content_type),
            ..response::Head::default()
        };
        let step = x.on_response_head(p, &head);
        let mut out = Vec::new();
        let mut buffered: Vec<u8> = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let end = i + 1 == chunks.len();
            buffered.extend_from_slice(chunk);
            match x.on_response_body(buffered.len(), end) {
                response::BodyStep::Continue => out.append(&mut buffered),
                response::BodyStep::Buffer => {}
                response::BodyStep::Read => match x.on_response_data(p, host, &buffered, end) {
                    response::Edit::Keep => out.append(&mut buffered),
                    response::Edit::Replace(r) => {
                        out.extend_from_slice(&r);
                        buffered.clear();
                    }
                },
            }
        }
        (step, out)
    }

    fn error_message(body: &[u8]) -> String {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["error"]["message"].as_str().unwrap().to_string()
    }

    const V32_CAP_ERROR: &str = r#"{"error":{"message":"max_tokens=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=32000)","type":"BadRequestError","param":"max_tokens","code":400}}"#;
    const V32_PROMPT_ERROR: &str = r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)","type":"BadRequestError","param":"input_tokens","code":400}}"#;

    #[test]
    fn window_errors_reach_the_client_in_its_dialect() {
        // Anthropic, exact count below the window (the filter was told a larger window than
        // the server has): prompt + cap too long, and the server's window is learned.
        let p = plugin("");
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"data":[{"id":"m","max_model_len":40960}]}"#,
        );
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"input_tokens":3000}"#,
        ));
        assert_eq!(v["max_tokens"], 32000);
        let (step, out) = answer(
            &mut x,
            &p,
            &mut host,
            400,
            "application/json",
            &[
                &V32_CAP_ERROR.as_bytes()[..50],
                &V32_CAP_ERROR.as_bytes()[50..],
            ],
        );
        assert_eq!(step, response::HeadStep::Hold);
        assert_eq!(
            error_message(&out),
            "input length and `max_tokens` exceed context limit: 3000 + 32000 > 4096, decrease input length or `max_tokens` and try again"
        );
        assert!(host.has(Metric::Translated));
        // The next request is budgeted by the window the server named.
        let body = MESSAGES.replace("hi", "hello");
        let (mut y, step) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(body.into_boxed_str()),
        );
        assert!(matches!(step, Step::Wait));
        assert_eq!(
            host.calls.last().unwrap().2.path,
            "/v1/messages/count_tokens"
        );
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"input_tokens":3000}"#,
        ));
        assert_eq!(v["max_tokens"], 1096);

        // OpenAI chat, the prompt alone too long (exact count ≥ C): context_length_exceeded.
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let step = reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":5009,"max_model_len":4096}"#,
        );
        assert!(matches!(step, Step::Done(Action::Continue)));
        let (_, out) = answer(
            &mut x,
            &p,
            &mut host,
            400,
            "application/json",
            &[V32_PROMPT_ERROR.as_bytes()],
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["param"], "messages");
        assert_eq!(error_message(&out), "This model's maximum context length is 4096 tokens. However, your messages resulted in 5009 tokens. Please reduce the length of the messages.");
    }

    #[test]
    fn other_answers_pass_byte_for_byte() {
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":40,"max_model_len":4096}"#,
        );
        // Another 400, a look-alike, a huge error, a success: byte for byte.
        let other = br#"{"error":{"message":"temperature must be >= 0","type":"BadRequestError","code":400}}"#;
        for body in [&other[..], br#"{"error":{"message":"This model's maximum context length is 4096 tokens.","code":400}}"#, b"not json at all"] {
            let mut y = Exchange::new();
            y.budget = x.budget.clone();
            let (step, out) = answer(&mut y, &p, &mut host, 400, "application/json", &[&body[..3], &body[3..]]);
            assert_eq!(step, response::HeadStep::Hold);
            assert_eq!(out, body);
        }
        let huge = vec![b' '; response::MAX_ERROR_BYTES + 10];
        let mut y = Exchange::new();
        y.budget = x.budget.clone();
        let (_, out) = answer(
            &mut y,
            &p,
            &mut host,
            400,
            "application/json",
            &[&huge[..40000], &huge[40000..]],
        );
        assert_eq!(out, huge);
        let (step, out) = answer(
            &mut x,
            &p,
            &mut host,
            200,
            "application/json",
            &[b"{\"ok\":1}"],
        );
        assert_eq!(
            (step, out.as_slice()),
            (response::HeadStep::Pass, &b"{\"ok\":1}"[..])
        );
        assert!(!host.has(Metric::Translated));
        // A request the filter did not budget: its errors are not touched.
        let mut z = Exchange::new();
        z.on_headers(
            &p,
            &mut host,
            &RequestHead {
                method: Some("GET"),
                ..head("/v1/models")
            },
        );
        let (step, out) = answer(
            &mut z,
            &p,
            &mut host,
            400,
            "application/json",
            &[V32_PROMPT_ERROR.as_bytes()],
        );
        assert_eq!(
            (step, out.as_slice()),
            (response::HeadStep::Pass, V32_PROMPT_ERROR.as_bytes())
        );
        // translate_errors off.
        let q = plugin(r#","context_length":4096,"translate_errors":false"#);
        let (mut w, _) = send(&q, &mut host, "/v1/chat/completions", CHAT);
        assert!(w.budget.is_some());
        let (step, out) = answer(
            &mut w,
            &q,
            &mut host,
            400,
            "application/json",
            &[V32_PROMPT_ERROR.as_bytes()],
        );
        assert_eq!(
            (step, out.as_slice()),
            (response::HeadStep::Pass, V32_PROMPT_ERROR.as_bytes())
        );
    }

    const COUNT_REFUSED: &str = r#"{"type":"error","error":{"type":"BadRequestError","message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)"}}"#;

    #[test]
    fn a_prompt_the_counter_refuses_as_too_long() {
        // Passthrough: unchanged, then the server's cap error becomes "prompt is too long".
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        let step = reply(&p, &mut host, &mut x, 400, COUNT_REFUSED);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert_eq!(
            header(&x, &p, HEADER_ACTION).as_deref(),
            Some("unchanged:too_long")
        );
        assert!(!host.metrics.iter().any(|m| matches!(m, Metric::Failure(_))));
        let (_, out) = answer(
            &mut x,
            &p,
            &mut host,
            400,
            "application/json",
            &[V32_CAP_ERROR.as_bytes()],
        );
        assert_eq!(
            error_message(&out),
            "prompt is too long: 4097 tokens > 4096 maximum"
        );
        // Reject mode: answered locally, with no upstream request.
        let p = plugin(r#","context_length":4096,"on_insufficient":"reject""#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        match reply(&p, &mut host, &mut x, 400, COUNT_REFUSED) {
            Step::Done(Action::Reply(r)) => {
                assert_eq!(r.status, 400);
                assert_eq!(
                    error_message(&r.body),
                    "prompt is too long: 4097 tokens > 4032 maximum"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(host.has(Metric::Rejected));
        // Another 400 from the counter is a failure: the estimate.
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        let step = reply(
            &p,
            &mut host,
            &mut x,
            400,
            r#"{"type":"error","error":{"type":"BadRequestError","message":"bad role"}}"#,
        );
        rewritten(step);
        assert!(host.has(Metric::Failure(Failure::Status)));
    }

    #[test]
    fn stop_reason_when_the_window_ended_the_answer() {
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"input_tokens":3000}"#,
        ));
        assert_eq!(v["max_tokens"], 1096);
        let json = br#"{"id":"a","type":"message","content":[],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3000,"output_tokens":1096}}"#;
        let (step, out) = answer(
            &mut x,
            &p,
            &mut host,
            200,
            "application/json",
            &[&json[..60], &json[60..]],
        );
        assert_eq!(step, response::HeadStep::Watch);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stop_reason"], "model_context_window_exceeded");
        assert!(host.has(Metric::WindowStop));
        // Streamed: the message_delta event, split across chunks (the count from the cache).
        let (mut y, step) = send(&p, &mut host, "/v1/messages", MESSAGES);
        rewritten(step);
        let sse = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1096}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let (step, out) = answer(
            &mut y,
            &p,
            &mut host,
            200,
            "text/event-stream; charset=utf-8",
            &[&sse[..30], &sse[30..90], &sse[90..]],
        );
        assert_eq!(step, response::HeadStep::Watch);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            String::from_utf8_lossy(sse)
                .replace("\"max_tokens\"", "\"model_context_window_exceeded\"")
        );
        // The caller's own cap (smaller than what the window leaves): not watched.
        let small = MESSAGES.replace("32000", "500");
        let (mut z, step) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(small.into_boxed_str()),
        );
        assert_eq!(rewritten(step)["max_tokens"], 500, "counted from the cache");
        let (step, _) = answer(&mut z, &p, &mut host, 200, "application/json", &[&json[..]]);
        assert_eq!(step, response::HeadStep::Pass);
        // OpenAI chat clamped by the window: `length` stays, nothing watched.
        let (mut c, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        rewritten(reply(
            &p,
            &mut host,
            &mut c,
            200,
            r#"{"count":3000,"max_model_len":4096}"#,
        ));
        let (step, _) = answer(
            &mut c,
            &p,
            &mut host,
            200,
            "text/event-stream",
            &[b"data: {}\n\n"],
        );
        assert_eq!(step, response::HeadStep::Pass);
    }

    #[test]
    fn learned_windows_expire_and_follow_the_server() {
        let p = plugin(r#","window_ttl_ms":1000"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
        reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"data":[{"id":"m","max_model_len":4096}]}"#,
        );
        rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":30}"#));
        assert_eq!(host.calls.len(), 2);
        // Within the TTL: no window call.
        host.now = 1000;
        let b1 = MESSAGES.replace("hi", "one");
        let (_, _) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(b1.into_boxed_str()),
        );
        assert_eq!(
            host.calls.last().unwrap().2.path,
            "/v1/messages/count_tokens"
        );
        assert_eq!(host.calls.len(), 3);
        // After it: the window is learned again first, and the new one is used.
        host.now = 2001;
        let b2 = MESSAGES.replace("hi", "two");
        let (mut y, _) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(b2.into_boxed_str()),
        );
        assert_eq!(host.calls.last().unwrap().2.path, "/v1/models");
        reply(
            &p,
            &mut host,
            &mut y,
            200,
            r#"{"data":[{"id":"m","max_model_len":2048}]}"#,
        );
        let v = rewritten(reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":30}"#));
        assert_eq!(v["max_tokens"], 2018);
        // A stale window still decides an estimate (better than none).
        host.now = 10_000;
        let b3 = MESSAGES.replace("hi", "three");
        let (mut z, _) = send(
            &p,
            &mut host,
            "/v1/messages",
            Box::leak(b3.into_boxed_str()),
        );
        let token = host.last_token();
        let step = z
            .on_reply(
                &p,
                &mut host,
                &Answer {
                    token,
                    status: Some(500),
                    size: 0,
                    body: b"",
                },
            )
            .unwrap();
        assert!(
            matches!(step, Step::Wait),
            "the window call failed; the count goes on"
        );
        let token = host.last_token();
        let step = z
            .on_reply(
                &p,
                &mut host,
                &Answer {
                    token,
                    status: Some(500),
                    size: 0,
                    body: b"",
                },
            )
            .unwrap();
        rewritten(step);
        // A cached /tokenize count uses the window learned since.
        let p = plugin("");
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":40,"max_model_len":4096}"#,
        ));
        let (mut y, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        answer(
            &mut y,
            &p,
            &mut host,
            400,
            "application/json",
            &[V32_PROMPT_ERROR
                .replace("4096 tokens", "2048 tokens")
                .as_bytes()],
        );
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(rewritten(step)["max_tokens"], 2008);
    }

    #[test]
    fn responses_get_the_openai_signal_on_input() {
        // The renderer refuses the prompt as too long: reject mode answers itself.
        let p = plugin(r#","context_length":4096,"on_insufficient":"reject""#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
        assert_eq!(host.calls[0].2.path, "/v1/responses/render");
        match reply(&p, &mut host, &mut x, 400, V32_PROMPT_ERROR) {
            Step::Done(Action::Reply(r)) => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["error"]["code"], "context_length_exceeded");
                assert_eq!(v["error"]["param"], "input");
            }
            other => panic!("{other:?}"),
        }
        // Passthrough: the server's own error, translated.
        let p = plugin(r#","context_length":4096"#);
        let mut host = FakeHost::default();
        let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
        let step = reply(&p, &mut host, &mut x, 400, V32_PROMPT_ERROR);
        assert!(matches!(step, Step::Done(Action::Continue)));
        let cap = V32_CAP_ERROR.replace("max_tokens", "max_output_tokens");
        let (_, out) = answer(
            &mut x,
            &p,
            &mut host,
            400,
            "application/json",
            &[cap.as_bytes()],
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["param"], "input");
        assert_eq!(
            error_message(&out),
            "This model's maximum context length is 4096 tokens. However, your messages resulted in 4097 tokens. Please reduce the length of the messages."
        );
    }
    /// Two routes on two servers; the top level has no tokenizer.
    fn routed() -> Plugin {
        Plugin::new(
            Config::parse(
                br#"{"min_output_tokens":64,"fallback_margin_tokens":32,"routes":[
                {"model":"coder","tokenizer":{"cluster":"a"}},
                {"model":["small","tiny"],"tokenizer":{"cluster":"b"},"on_insufficient":"reject"}]}"#,
            )
            .unwrap(),
        )
    }

    #[test]
    fn each_model_is_counted_on_its_own_route() {
        let p = routed();
        assert_eq!(p.routes(), 2);
        let mut host = FakeHost::default();
        // The small model first: counted on b, whose /tokenize reports b's window.
        let small = CHAT.replace(r#""m""#, r#""small""#);
        let (mut x, step) = send(&p, &mut host, "/v1/chat/completions", &small);
        assert!(
            matches!(step, Step::Wait),
            "{step:?} {:?}",
            x.response_headers(&p)
        );
        assert_eq!(host.calls[0].0, "b");
        assert_eq!(host.calls[0].2.path, "/tokenize");
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":10,"max_model_len":2048,"tokens":[]}"#,
        ));
        assert_eq!(v["max_tokens"], 2038);
        // The coder model through the Anthropic dialect: its window comes from a's model
        // list, never from what b reported.
        let coder = MESSAGES.replace(r#""m""#, r#""coder""#);
        let (mut x, step) = send(&p, &mut host, "/v1/messages", &coder);
        assert!(matches!(step, Step::Wait));
        assert_eq!(
            (host.calls[1].0.as_str(), host.calls[1].2.path.as_str()),
            ("a", "/v1/models")
        );
        let step = reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"data":[{"id":"coder","max_model_len":8192}]}"#,
        );
        assert!(matches!(step, Step::Wait));
        assert_eq!(
            (host.calls[2].0.as_str(), host.calls[2].2.path.as_str()),
            ("a", "/v1/messages/count_tokens")
        );
        let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":30}"#));
        assert_eq!(v["max_tokens"], 8162);
        // Learned windows and cache entries live in each route's own scope.
        assert_eq!(p.routes[0].learned(&mut host, "coder"), Some(8192));
        assert_eq!(p.routes[1].learned(&mut host, "coder"), None);
        assert_eq!(p.routes[1].learned(&mut host, "small"), Some(2048));
        // The same chat for the small model is a hit in b's scope; for tiny (same route) too.
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", &small);
        assert!(matches!(step, Step::Done(Action::Rewrite(_))));
        assert_eq!(host.calls.len(), 3);
        // Each route's policy: b rejects what does not fit.
        let big = CHAT
            .replace(r#""m""#, r#""tiny""#)
            .replace("hi", "hi there");
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", &big);
        assert_eq!(host.calls[3].0, "b");
        let step = reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":2040,"max_model_len":2048,"tokens":[]}"#,
        );
        assert!(matches!(step, Step::Done(Action::Reply(_))), "{step:?}");
        // Metrics count for the route too.
        let route = |i: usize, m: Metric| host.route_metrics.contains(&(i, m));
        assert!(route(1, Metric::Requests) && route(0, Metric::Requests));
        assert!(route(1, Metric::Rewritten) && route(0, Metric::Rewritten));
        assert!(route(1, Metric::Rejected) && !route(0, Metric::Rejected));
        assert!(route(1, Metric::CacheHits) && !route(0, Metric::CacheHits));
        assert!(host.has(Metric::Rejected));
    }

    #[test]
    fn a_model_no_route_names_uses_the_top_level() {
        // Without a top-level tokenizer: unchanged, `model`, with no call.
        let p = routed();
        let mut host = FakeHost::default();
        let (x, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert!(matches!(step, Step::Done(Action::Continue)));
        assert!(host.calls.is_empty());
        assert_eq!(
            header(&x, &p, HEADER_ACTION).as_deref(),
            Some("unchanged:model")
        );
        assert!(host.route_metrics.is_empty());
        // With one: counted there, in the top level's scope.
        let p = Plugin::new(
            Config::parse(
                br#"{"tokenizer":{"cluster":"top"},"context_length":512,"min_output_tokens":64,
                "fallback_margin_tokens":32,"routes":[{"model":"coder","tokenizer":{"cluster":"a"}}]}"#,
            )
            .unwrap(),
        );
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(host.calls[0].0, "top");
        let v = rewritten(reply(
            &p,
            &mut host,
            &mut x,
            200,
            r#"{"count":12,"max_model_len":512,"tokens":[]}"#,
        ));
        assert_eq!(v["max_tokens"], 500);
        assert!(host.route_metrics.is_empty());
    }

    #[test]
    fn an_abandoned_call_stores_its_answer_in_its_route() {
        let p = routed();
        let mut host = FakeHost::default();
        let small = CHAT.replace(r#""m""#, r#""small""#);
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", &small);
        let token = host.last_token();
        let orphan = x.abandon().expect("a call is out");
        let ok = r#"{"count":40,"max_model_len":2048}"#;
        let answer = Answer {
            token,
            status: Some(200),
            size: ok.len(),
            body: ok.as_bytes(),
        };
        assert!(orphan.on_reply(&p, &mut host, &answer));
        assert_eq!(p.routes[1].learned(&mut host, "small"), Some(2048));
        assert_eq!(p.learned(&mut host, "small"), None);
        assert!(host.route_metrics.contains(&(1, Metric::CacheMisses)));
        let (_, step) = send(&p, &mut host, "/v1/chat/completions", &small);
        assert_eq!(rewritten(step)["max_tokens"], 2008);
        assert_eq!(
            host.calls.len(),
            1,
            "the stored count is a hit in its route"
        );
    }
}
