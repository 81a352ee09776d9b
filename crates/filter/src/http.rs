//! The per-request callbacks: each reads what the host has, hands it to the core's
//! `Exchange`, and applies the step it returns.

use super::abi::{self, CONTINUE, PAUSE};
use super::host::{self, BufferType, MapType};
use super::Shared;
use incontext_core::flow::{
    Action, Answer, BodyStep, Call, Exchange, HeadStep, Histogram, Host, Metric, RequestHead, Step,
    MAX_REPLY_BYTES,
};
use std::rc::Rc;

/// The core's view of the host, for one stream.
struct HostView<'a> {
    shared: &'a Shared,
    stream: u32,
    root: u32,
}

impl Host for HostView<'_> {
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
        abi::dispatch_for(
            self.stream,
            self.root,
            cluster,
            headers,
            call.body.as_deref(),
            timeout_ms,
        )
    }

    fn increment(&mut self, metric: Metric) {
        self.shared.metrics.increment(metric);
    }

    fn now_ms(&mut self) -> Option<u64> {
        host::now_ns().ok().map(|ns| ns / 1_000_000)
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        self.shared.metrics.record(histogram, value);
    }
}

/// A tokenizer answer as read from the host.
pub struct CallReply {
    status: Option<u16>,
    size: usize,
    body: Vec<u8>,
}

impl CallReply {
    fn answer(&self, token: u32) -> Answer<'_> {
        Answer {
            token,
            status: self.status,
            size: self.size,
            body: &self.body,
        }
    }
}

pub struct Http {
    shared: Option<Rc<Shared>>,
    id: u32,
    root: u32,
    exchange: Exchange,
}

fn header(map: MapType, name: &str) -> Result<Option<String>, host::HostError> {
    host::get_header(map, name).map(host::text)
}

impl Http {
    pub fn new(shared: Option<Rc<Shared>>, id: u32, root: u32) -> Http {
        Http {
            shared,
            id,
            root,
            exchange: Exchange::new(),
        }
    }

    fn view<'a>(&self, shared: &'a Shared) -> HostView<'a> {
        HostView {
            shared,
            stream: self.id,
            root: self.root,
        }
    }

    pub fn pending_token(&self) -> Option<u32> {
        self.exchange.pending_token()
    }

    /// Reads the answer of the call being delivered (status, body up to the limit).
    pub fn read_reply(size: usize) -> CallReply {
        let status = header(MapType::CallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u16>().ok());
        let body = if size > MAX_REPLY_BYTES {
            Vec::new()
        } else {
            host::get_buffer(BufferType::HttpCallResponseBody, 0, size)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        CallReply { status, size, body }
    }

    /// Applies a step; returns whether the request stays held.
    fn apply(&mut self, view: &mut HostView, step: Step) -> bool {
        match step {
            Step::Wait => true,
            Step::Done(Action::Continue) => false,
            Step::Done(Action::Rewrite(mut rewrite)) => {
                let (end, head) = rewrite.head();
                if let Err(e) = host::set_buffer(BufferType::HttpRequestBody, 0, end, &head) {
                    log::warn!("incontext: cannot replace the body (host status {})", e.0);
                    self.exchange.on_apply_error(view);
                }
                false
            }
            Step::Done(Action::Reply(reply)) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                match host::send_response(reply.status, &headers, &reply.body) {
                    Ok(()) => true,
                    Err(e) => {
                        log::warn!("incontext: cannot send the rejection (host status {})", e.0);
                        self.exchange.on_apply_error(view);
                        false
                    }
                }
            }
        }
    }

    pub fn on_call_response(&mut self, token: u32, reply: &CallReply) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let mut view = self.view(&shared);
        let Some(step) = self
            .exchange
            .on_reply(&shared.plugin, &mut view, &reply.answer(token))
        else {
            return;
        };
        if !self.apply(&mut view, step) {
            if let Err(e) = host::resume_request() {
                log::warn!("incontext: cannot resume the request (host status {})", e.0);
            }
        }
    }

    /// The answer to this stream's call arrived after the stream ended.
    pub fn on_late_reply(&mut self, token: u32, reply: &CallReply) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let mut view = self.view(&shared);
        self.exchange
            .on_late_reply(&shared.plugin, &mut view, &reply.answer(token));
    }

    pub fn on_request_headers(&mut self, end_of_stream: bool) -> u32 {
        let Some(shared) = self.shared.clone() else {
            return CONTINUE;
        };
        let mut view = self.view(&shared);
        let read = |name| header(MapType::RequestHeaders, name);
        let (Ok(method), Ok(path), Ok(encoding), Ok(length)) = (
            read(":method"),
            read(":path"),
            read("content-encoding"),
            read("content-length"),
        ) else {
            view.increment(Metric::Requests);
            self.exchange.on_host_error(&mut view);
            return CONTINUE;
        };
        let head = RequestHead {
            method: method.as_deref(),
            path: path.as_deref(),
            content_encoding: encoding.as_deref(),
            content_length: length.as_deref(),
            end_of_stream,
        };
        match self.exchange.on_headers(&shared.plugin, &mut view, &head) {
            HeadStep::Continue => CONTINUE,
            HeadStep::Buffer => {
                if let Err(e) = host::remove_header(MapType::RequestHeaders, "content-length") {
                    log::warn!(
                        "incontext: cannot remove content-length (host status {})",
                        e.0
                    );
                    self.exchange.on_host_error(&mut view);
                }
                CONTINUE
            }
        }
    }

    pub fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> u32 {
        let Some(shared) = self.shared.clone() else {
            return CONTINUE;
        };
        let mut view = self.view(&shared);
        match self
            .exchange
            .on_body_chunk(&shared.plugin, &mut view, body_size, end_of_stream)
        {
            BodyStep::Continue => return CONTINUE,
            BodyStep::Buffer | BodyStep::Wait => return PAUSE,
            BodyStep::Read => {}
        }
        let body = match host::get_buffer(BufferType::HttpRequestBody, 0, body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                log::warn!("incontext: cannot read the body (host status {})", e.0);
                self.exchange.on_host_error(&mut view);
                return CONTINUE;
            }
        };
        let step = self.exchange.on_body(&shared.plugin, &mut view, body);
        if self.apply(&mut view, step) {
            PAUSE
        } else {
            CONTINUE
        }
    }

    pub fn on_request_trailers(&mut self) -> u32 {
        if let Some(shared) = self.shared.clone() {
            self.exchange.on_trailers(&mut self.view(&shared));
        }
        CONTINUE
    }

    pub fn on_response_headers(&mut self) -> u32 {
        let Some(shared) = self.shared.clone() else {
            return CONTINUE;
        };
        self.exchange
            .on_upstream_answer(&shared.plugin, &mut self.view(&shared));
        for (name, value) in self.exchange.response_headers(&shared.plugin) {
            let _ = host::add_header(MapType::ResponseHeaders, name, &value);
        }
        CONTINUE
    }
}
