//! The per-request state machine.
//!
//! headers: drop `content-length` and continue (pausing here would stop body delivery) →
//! body: buffer until end of stream → count (cache, `/tokenize`, or estimate) → decide →
//! splice and resume, answer 400 (reject mode), or resume unchanged. Any error: unchanged.

use super::{cache, host, metrics::Metrics, Shared};
use crate::core::plan::{decide, Count, Outcome, Source};
use crate::core::reason::Reason;
use crate::core::request::{analyze, Counting, Request};
use crate::core::tokenize::{cache_key, parse_reply, payload, Failure, Reply};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::rc::Rc;
use std::time::Duration;

/// Tokenizer answers larger than this are not read (a contract failure).
const MAX_REPLY_BYTES: usize = 1 << 20;

enum State {
    /// Not ours to touch (or already decided): everything passes.
    Passing,
    /// Collecting the request body.
    Buffering,
    /// Waiting for `/tokenize`.
    Waiting { token: u32, pending: Box<Pending> },
}

struct Pending {
    req: Request,
    body: Vec<u8>,
    key: u128,
}

/// What the response headers report.
struct Report {
    action: &'static str,
    reason: Option<Reason>,
    prompt: Option<u64>,
    source: Option<Source>,
    max_tokens: Option<u64>,
    /// Already sent with a local reply.
    sent: bool,
}

pub struct Http {
    shared: Option<Rc<Shared>>,
    state: State,
    report: Option<Report>,
}

impl Http {
    pub fn new(shared: Option<Rc<Shared>>) -> Http {
        Http {
            shared,
            state: State::Passing,
            report: None,
        }
    }

    fn unchanged(&mut self, shared: &Shared, reason: Reason, count: Option<(u64, Source)>) {
        shared.metrics.unchanged(reason);
        log::debug!("incontext: unchanged ({})", reason.as_str());
        self.state = State::Passing;
        self.report = Some(Report {
            action: "unchanged",
            reason: Some(reason),
            prompt: count.map(|c| c.0),
            source: count.map(|c| c.1),
            max_tokens: None,
            sent: false,
        });
    }

    /// The body is complete: classify it and count. Returns whether to pause.
    fn start(&mut self, shared: &Rc<Shared>, mut body: Vec<u8>) -> bool {
        let req = match analyze(&body, &shared.config) {
            Ok(r) => r,
            Err(reason) => {
                self.unchanged(shared, reason, None);
                return false;
            }
        };
        // A cache hit skips validating messages/tools (see `Request::validate`); every other
        // path validates first.
        match req.counting {
            Counting::Tokenize => self.tokenize(shared, req, body),
            _ if !self.validated(shared, &req, &body) => false,
            Counting::Exact(n) => {
                let count = Count {
                    tokens: n,
                    source: Source::Exact,
                    max_model_len: None,
                };
                self.finish(shared, &req, &mut body, count)
            }
            Counting::Estimate => self.estimate(shared, &req, &mut body),
        }
    }

    /// Validates what `analyze` only skimmed; when invalid, leaves the request unchanged and
    /// returns false.
    fn validated(&mut self, shared: &Shared, req: &Request, body: &[u8]) -> bool {
        match req.validate(body) {
            Ok(()) => true,
            Err(reason) => {
                self.unchanged(shared, reason, None);
                false
            }
        }
    }

    fn tokenize(&mut self, shared: &Rc<Shared>, req: Request, mut body: Vec<u8>) -> bool {
        let config = &shared.config;
        let key = cache_key(&req, &body, &shared.route, config.context_length);
        if let Some(reply) = cache::lookup(key, config.cache_entries) {
            if crate::core::tokenize::check_context(reply.max_model_len, config.context_length)
                .is_ok()
            {
                Metrics::bump(shared.metrics.cache_hits);
                let count = Count {
                    tokens: reply.count,
                    source: Source::Cache,
                    max_model_len: Some(reply.max_model_len),
                };
                return self.finish(shared, &req, &mut body, count);
            }
        }
        if !self.validated(shared, &req, &body) {
            return false;
        }
        Metrics::bump(shared.metrics.cache_misses);
        let Some(payload) = payload(&req, &body) else {
            // A field the payload needs does not parse (vLLM would refuse it too).
            return self.estimate(shared, &req, &mut body);
        };
        let t = &config.tokenizer;
        let length = payload.len().to_string();
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &t.path),
            (":authority", &t.authority),
            ("content-type", "application/json"),
            ("content-length", &length),
            (
                "user-agent",
                concat!("incontext/", env!("CARGO_PKG_VERSION")),
            ),
        ];
        headers.extend(config.literal_headers());
        Metrics::bump(shared.metrics.tokenizer_calls);
        let timeout = Duration::from_millis(t.timeout_ms);
        match proxy_wasm::hostcalls::dispatch_http_call(
            &t.cluster,
            headers,
            Some(&payload),
            vec![],
            timeout,
        ) {
            Ok(token) => {
                self.state = State::Waiting {
                    token,
                    pending: Box::new(Pending { req, body, key }),
                };
                true
            }
            Err(status) => {
                log::warn!(
                    "incontext: tokenizer call not dispatched (host status {})",
                    status as u32
                );
                self.failed(shared, Failure::Dispatch, &req, &mut body)
            }
        }
    }

    fn failed(
        &mut self,
        shared: &Rc<Shared>,
        failure: Failure,
        req: &Request,
        body: &mut [u8],
    ) -> bool {
        shared.metrics.failure(failure);
        log::warn!(
            "incontext: tokenizer failure ({}); using the estimate",
            failure.as_str()
        );
        self.estimate(shared, req, body)
    }

    fn estimate(&mut self, shared: &Rc<Shared>, req: &Request, body: &mut [u8]) -> bool {
        Metrics::bump(shared.metrics.estimates);
        match req.estimate(body) {
            Some(tokens) => {
                let count = Count {
                    tokens,
                    source: Source::Estimate,
                    max_model_len: None,
                };
                self.finish(shared, req, body, count)
            }
            None => {
                self.unchanged(shared, Reason::Internal, None);
                false
            }
        }
    }

    /// Decides and applies the outcome. Returns whether the request stays paused (only
    /// when answered locally).
    fn finish(
        &mut self,
        shared: &Rc<Shared>,
        req: &Request,
        body: &mut [u8],
        count: Count,
    ) -> bool {
        let config = &shared.config;
        // A count without its own max_model_len (an estimate, token ids) uses the context
        // length learned earlier for this model, when none is configured.
        let learned = match (config.context_length, count.max_model_len) {
            (None, None) => cache::learned_context(&model_name(req, body)),
            _ => None,
        };
        let decision = decide(req, body, config, count, learned);
        let counted = Some((decision.prompt, decision.source));
        match decision.outcome {
            Outcome::Rewrite { edit, value } => {
                // Replaces only the head of the buffered body (Envoy drains and prepends),
                // written over our copy of the body when it fits there.
                let head = edit.write_head(body);
                if let Err(e) = host::set_buffer(BufferType::HttpRequestBody, 0, edit.end, &head) {
                    log::warn!("incontext: cannot replace the body (host status {})", e.0);
                    self.unchanged(shared, Reason::Internal, counted);
                    return false;
                }
                Metrics::bump(shared.metrics.rewritten);
                log::debug!(
                    "incontext: rewritten prompt={} source={} max_tokens={value}",
                    decision.prompt,
                    decision.source.as_str()
                );
                self.state = State::Passing;
                self.report = Some(Report {
                    action: "rewritten",
                    reason: None,
                    prompt: Some(decision.prompt),
                    source: Some(decision.source),
                    max_tokens: Some(value),
                    sent: false,
                });
                false
            }
            Outcome::Unchanged(reason) => {
                if reason == Reason::WindowConfig && !shared.warned_window.replace(true) {
                    log::error!(
                        "incontext: the learned context length leaves fallback_margin_tokens + min_output_tokens >= the window; requests for that model pass unchanged"
                    );
                }
                self.unchanged(shared, reason, counted);
                false
            }
            Outcome::Reject { body: error } => {
                let prompt = decision.prompt.to_string();
                let mut headers = vec![("content-type", "application/json")];
                if config.response_headers {
                    headers.extend([
                        ("x-incontext-action", "rejected"),
                        ("x-incontext-prompt-tokens", prompt.as_str()),
                        ("x-incontext-source", decision.source.as_str()),
                    ]);
                }
                match host::send_response(400, &headers, &error) {
                    Ok(()) => {
                        Metrics::bump(shared.metrics.rejected);
                        log::debug!("incontext: rejected prompt={}", decision.prompt);
                        self.state = State::Passing;
                        self.report = Some(Report {
                            action: "rejected",
                            reason: None,
                            prompt: Some(decision.prompt),
                            source: Some(decision.source),
                            max_tokens: None,
                            sent: true,
                        });
                        true
                    }
                    Err(e) => {
                        log::warn!("incontext: cannot send the rejection (host status {})", e.0);
                        self.unchanged(shared, Reason::Internal, counted);
                        false
                    }
                }
            }
        }
    }
}

fn model_name(req: &Request, body: &[u8]) -> String {
    req.raw(body, req.fields.model)
        .and_then(|m| serde_json::from_str::<String>(m).ok())
        .unwrap_or_default()
}

fn header(map: MapType, name: &str) -> Result<Option<String>, host::HostError> {
    host::get_header(map, name).map(host::text)
}

impl Context for Http {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let pending = match std::mem::replace(&mut self.state, State::Passing) {
            State::Waiting { token: t, pending } if t == token => pending,
            other => {
                self.state = other;
                return;
            }
        };
        let status = header(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u16>().ok());
        let reply = if body_size > MAX_REPLY_BYTES {
            Err(Failure::Contract)
        } else {
            let body = match host::get_buffer(BufferType::HttpCallResponseBody, 0, body_size) {
                Ok(b) => b.unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            parse_reply(status, &body, shared.config.context_length)
        };
        let Pending { req, mut body, key } = *pending;
        let paused = match reply {
            Ok(
                reply @ Reply {
                    count,
                    max_model_len,
                },
            ) => {
                cache::store(key, shared.config.cache_entries, reply);
                if shared.config.context_length.is_none() {
                    cache::learn_context(&model_name(&req, &body), max_model_len);
                }
                let count = Count {
                    tokens: count,
                    source: Source::Exact,
                    max_model_len: Some(max_model_len),
                };
                self.finish(&shared, &req, &mut body, count)
            }
            Err(failure) => self.failed(&shared, failure, &req, &mut body),
        };
        if !paused {
            if let Err(e) = host::resume_request() {
                log::warn!("incontext: cannot resume the request (host status {})", e.0);
            }
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        Metrics::bump(shared.metrics.requests);
        let method = header(MapType::HttpRequestHeaders, ":method");
        let encoding = header(MapType::HttpRequestHeaders, "content-encoding");
        let length = header(MapType::HttpRequestHeaders, "content-length");
        let (Ok(method), Ok(encoding), Ok(length)) = (method, encoding, length) else {
            self.unchanged(&shared, Reason::Internal, None);
            return Action::Continue;
        };
        if method.as_deref() != Some("POST") {
            self.unchanged(&shared, Reason::Method, None);
            return Action::Continue;
        }
        if encoding.is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity")) {
            self.unchanged(&shared, Reason::Encoding, None);
            return Action::Continue;
        }
        if length
            .and_then(|l| l.trim().parse::<u64>().ok())
            .is_some_and(|l| l > shared.config.max_body_bytes as u64)
        {
            self.unchanged(&shared, Reason::TooLarge, None);
            return Action::Continue;
        }
        if end_of_stream {
            self.unchanged(&shared, Reason::NotJson, None);
            return Action::Continue;
        }
        // The body may change length: Envoy recomputes framing without content-length.
        if let Err(e) = host::remove_header(MapType::HttpRequestHeaders, "content-length") {
            log::warn!(
                "incontext: cannot remove content-length (host status {})",
                e.0
            );
            self.unchanged(&shared, Reason::Internal, None);
            return Action::Continue;
        }
        self.state = State::Buffering;
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if !matches!(self.state, State::Buffering) {
            return if matches!(self.state, State::Waiting { .. }) {
                Action::Pause
            } else {
                Action::Continue
            };
        }
        if body_size > shared.config.max_body_bytes {
            self.unchanged(&shared, Reason::TooLarge, None);
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause; // buffer until the whole body is here
        }
        let body = match host::get_buffer(BufferType::HttpRequestBody, 0, body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                log::warn!("incontext: cannot read the body (host status {})", e.0);
                self.unchanged(&shared, Reason::Internal, None);
                return Action::Continue;
            }
        };
        if self.start(&shared, body) {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        // A body that ends with trailers never reported end_of_stream: decide now.
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        if matches!(self.state, State::Buffering) {
            self.unchanged(&shared, Reason::NotJson, None);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.as_ref() else {
            return Action::Continue;
        };
        if !shared.config.response_headers {
            return Action::Continue;
        }
        let Some(report) = self.report.as_ref().filter(|r| !r.sent) else {
            return Action::Continue;
        };
        let action = match report.reason {
            Some(reason) => format!("{}:{}", report.action, reason.as_str()),
            None => report.action.to_string(),
        };
        let map = MapType::HttpResponseHeaders;
        let _ = host::add_header(map, "x-incontext-action", &action);
        if let Some(p) = report.prompt {
            let _ = host::add_header(map, "x-incontext-prompt-tokens", &p.to_string());
        }
        if let Some(s) = report.source {
            let _ = host::add_header(map, "x-incontext-source", s.as_str());
        }
        if let Some(m) = report.max_tokens {
            let _ = host::add_header(map, "x-incontext-max-tokens", &m.to_string());
        }
        Action::Continue
    }
}
