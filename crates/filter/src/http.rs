//! The per-request callbacks: each reads what the host has, hands it to the core's
//! `Exchange`, and applies the step it returns.

use super::{host, Shared};
use incontext_core::flow::{
    BodyStep, Call, Counter, Exchange, Head, HeadStep, Host, Outcome, Step, MAX_REPLY_BYTES,
};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::rc::Rc;

/// The core's view of the host.
struct Env<'a> {
    shared: &'a Shared,
}

impl Host for Env<'_> {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>> {
        host::get_shared(key).ok().flatten()
    }

    fn set_shared(&mut self, key: &str, value: &[u8]) {
        let _ = host::set_shared(key, value);
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32> {
        host::dispatch(cluster, headers, call.body.as_deref(), timeout_ms).ok()
    }

    fn count(&mut self, counter: Counter) {
        self.shared.metrics.bump(counter);
    }
}

pub struct Http {
    shared: Option<Rc<Shared>>,
    exchange: Exchange,
}

impl Http {
    pub fn new(shared: Option<Rc<Shared>>) -> Http {
        Http {
            shared,
            exchange: Exchange::new(),
        }
    }

    /// Applies a step; returns whether the request stays held.
    fn apply(&mut self, shared: &Shared, step: Step) -> bool {
        let mut env = Env { shared };
        match step {
            Step::Wait => true,
            Step::Done(Outcome::Continue) => false,
            Step::Done(Outcome::Rewrite(mut rewrite)) => {
                let (end, head) = rewrite.head();
                if let Err(e) = host::set_buffer(BufferType::HttpRequestBody, 0, end, &head) {
                    log::warn!("incontext: cannot replace the body (host status {})", e.0);
                    self.exchange.on_apply_error(&mut env);
                }
                false
            }
            Step::Done(Outcome::Reply(reply)) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                match host::send_response(reply.status, &headers, &reply.body) {
                    Ok(()) => true,
                    Err(e) => {
                        log::warn!("incontext: cannot send the rejection (host status {})", e.0);
                        self.exchange.on_apply_error(&mut env);
                        false
                    }
                }
            }
        }
    }
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
        let status = header(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u16>().ok());
        let body = if body_size > MAX_REPLY_BYTES {
            Vec::new()
        } else {
            host::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        let mut env = Env { shared: &shared };
        let Some(step) =
            self.exchange
                .on_reply(&shared.plugin, &mut env, token, status, body_size, &body)
        else {
            return;
        };
        if !self.apply(&shared, step) {
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
        let mut env = Env { shared: &shared };
        let read = |name| header(MapType::HttpRequestHeaders, name);
        let (Ok(method), Ok(path), Ok(encoding), Ok(length)) = (
            read(":method"),
            read(":path"),
            read("content-encoding"),
            read("content-length"),
        ) else {
            env.count(Counter::Requests);
            self.exchange.on_host_error(&mut env);
            return Action::Continue;
        };
        let head = Head {
            method: method.as_deref(),
            path: path.as_deref(),
            content_encoding: encoding.as_deref(),
            content_length: length.as_deref(),
            end_of_stream,
        };
        match self.exchange.on_headers(&shared.plugin, &mut env, &head) {
            HeadStep::Continue => Action::Continue,
            HeadStep::Buffer => {
                if let Err(e) = host::remove_header(MapType::HttpRequestHeaders, "content-length") {
                    log::warn!(
                        "incontext: cannot remove content-length (host status {})",
                        e.0
                    );
                    self.exchange.on_host_error(&mut env);
                }
                Action::Continue
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let mut env = Env { shared: &shared };
        match self
            .exchange
            .on_body_chunk(&shared.plugin, &mut env, body_size, end_of_stream)
        {
            BodyStep::Continue => return Action::Continue,
            BodyStep::Buffer | BodyStep::Wait => return Action::Pause,
            BodyStep::Read => {}
        }
        let body = match host::get_buffer(BufferType::HttpRequestBody, 0, body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                log::warn!("incontext: cannot read the body (host status {})", e.0);
                self.exchange.on_host_error(&mut env);
                return Action::Continue;
            }
        };
        let step = self.exchange.on_body(&shared.plugin, &mut env, body);
        if self.apply(&shared, step) {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(shared) = self.shared.clone() {
            self.exchange.on_trailers(&mut Env { shared: &shared });
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.as_ref() else {
            return Action::Continue;
        };
        for (name, value) in self.exchange.response_headers(&shared.plugin) {
            let _ = host::add_header(MapType::HttpResponseHeaders, name, &value);
        }
        Action::Continue
    }
}
