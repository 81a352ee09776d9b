//! One HTTP stream's callbacks: each reads what the host has, hands it to the core's
//! `Exchange`, and applies the step it returns.

use crate::filter::{CONTINUE, PAUSE};
use crate::proxy::{text, BufferType, MapType, Proxy};
use crate::Shared;
use incontext_core::flow::{
    Action, Call, Exchange, Histogram, Host, Metric, Orphan, Reply, RequestBodyStep, RequestHead,
    RequestHeadStep, Step, MAX_REPLY_BYTES,
};
use incontext_core::response;
use std::rc::Rc;

/// The core's view of the host, for one stream of one plugin.
pub struct HostView<'a> {
    pub proxy: &'a mut dyn Proxy,
    pub shared: &'a Shared,
    pub stream: u32,
    pub root: u32,
}

impl Host for HostView<'_> {
    fn get_shared(&mut self, key: &str) -> Option<Vec<u8>> {
        self.proxy.get_shared(key).ok().flatten()
    }

    fn set_shared(&mut self, key: &str, value: &[u8]) {
        let _ = self.proxy.set_shared(key, value);
    }

    /// Dispatched on behalf of the plugin's root context, so that Envoy does not cancel the
    /// call when the stream ends first: its answer is still stored (`Orphan`).
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        call: &Call,
        timeout_ms: u64,
    ) -> Option<u32> {
        self.proxy.set_effective_context(self.root).ok()?;
        let body = call.body.as_deref().unwrap_or_default();
        let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX);
        let token = self.proxy.http_call(cluster, headers, body, timeout);
        // Back to the stream for the rest of its callback; if that fails, the stream's own
        // calls fail too and leave the request unchanged.
        let _ = self.proxy.set_effective_context(self.stream);
        token.ok()
    }

    fn increment(&mut self, metric: Metric) {
        self.shared.metrics.increment(self.proxy, metric);
    }

    fn now_ms(&mut self) -> Option<u64> {
        self.proxy.now_ns().ok().map(|ns| ns / 1_000_000)
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        self.shared.metrics.record(self.proxy, histogram, value);
    }

    fn increment_route(&mut self, route: usize, metric: Metric) {
        self.shared
            .metrics
            .increment_route(self.proxy, route, metric);
    }
}

/// A tokenizer answer as read from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReply {
    status: Option<u16>,
    size: usize,
    body: Vec<u8>,
}

impl CallReply {
    /// Reads the answer of the call being delivered (status, body up to the limit).
    pub fn read(proxy: &mut dyn Proxy, size: usize) -> CallReply {
        let status = header(proxy, MapType::CallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u16>().ok());
        let body = if size > MAX_REPLY_BYTES {
            Vec::new()
        } else {
            proxy
                .get_buffer(BufferType::HttpCallResponseBody, 0, size)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        CallReply { status, size, body }
    }

    pub fn reply(&self, token: u32) -> Reply<'_> {
        Reply {
            token,
            status: self.status,
            size: self.size,
            body: &self.body,
        }
    }
}

fn header(
    proxy: &mut dyn Proxy,
    map: MapType,
    name: &str,
) -> Result<Option<String>, crate::proxy::HostError> {
    proxy.get_header(map, name).map(text)
}

/// One HTTP stream.
pub struct Http {
    shared: Option<Rc<Shared>>,
    id: u32,
    root: u32,
    exchange: Exchange,
    /// The first bytes of the answer the host buffers that passed the filter already: the
    /// host keeps them while the filter holds bytes after them.
    kept: usize,
}

impl Http {
    pub fn new(shared: Option<Rc<Shared>>, id: u32, root: u32) -> Http {
        Http {
            shared,
            id,
            root,
            exchange: Exchange::new(),
            kept: 0,
        }
    }

    pub fn root(&self) -> u32 {
        self.root
    }

    pub fn pending_token(&self) -> Option<u32> {
        self.exchange.pending_token()
    }

    /// The stream ended: what its call still needs, with the plugin it belongs to.
    pub fn abandon(mut self) -> Option<(Rc<Shared>, Orphan)> {
        let orphan = self.exchange.abandon()?;
        Some((self.shared?, orphan))
    }

    /// Applies a step, and tells the exchange whether the host applied it; returns whether
    /// the request stays held.
    fn apply(exchange: &mut Exchange, shared: &Shared, view: &mut HostView, step: Step) -> bool {
        let (held, applied) = match step {
            Step::Wait => return true,
            Step::Done(Action::Continue) => {
                publish(exchange, view);
                return false;
            }
            Step::Done(Action::Rewrite(mut rewrite)) => {
                let (end, head) = rewrite.head();
                let replaced = view
                    .proxy
                    .set_buffer(BufferType::HttpRequestBody, 0, end, &head);
                if let Err(e) = &replaced {
                    log::warn!("incontext: cannot replace the body (host status {})", e.0);
                }
                (false, replaced.is_ok())
            }
            Step::Done(Action::Reply(reply)) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                let sent = view
                    .proxy
                    .send_response(reply.status, &headers, &reply.body);
                if let Err(e) = &sent {
                    log::warn!("incontext: cannot send the rejection (host status {})", e.0);
                }
                // Sent: the request is answered and stays held; not sent: it goes on.
                (sent.is_ok(), sent.is_ok())
            }
        };
        exchange.applied(&shared.plugin, view, applied);
        publish(exchange, view);
        held
    }

    /// Runs `f` with the exchange and the host view, when the plugin is configured.
    fn with<T>(
        &mut self,
        proxy: &mut dyn Proxy,
        unconfigured: T,
        f: impl FnOnce(&mut Exchange, &Shared, &mut HostView) -> T,
    ) -> T {
        let Some(shared) = self.shared.clone() else {
            return unconfigured;
        };
        let mut view = HostView {
            proxy: &mut *proxy,
            shared: &shared,
            stream: self.id,
            root: self.root,
        };
        let out = f(&mut self.exchange, &shared, &mut view);
        publish(&mut self.exchange, &mut view);
        out
    }

    /// The answer to this stream's call (the stream is the effective context).
    pub fn on_call_response(&mut self, proxy: &mut dyn Proxy, token: u32, reply: &CallReply) {
        self.with(proxy, (), |exchange, shared, view| {
            let Some(step) = exchange.on_reply(&shared.plugin, view, &reply.reply(token)) else {
                return;
            };
            if !Http::apply(exchange, shared, view, step) {
                if let Err(e) = view.proxy.resume_request() {
                    log::warn!("incontext: cannot resume the request (host status {})", e.0);
                }
            }
        })
    }

    pub fn on_request_headers(&mut self, proxy: &mut dyn Proxy, end_of_stream: bool) -> u32 {
        self.with(proxy, CONTINUE, |exchange, shared, view| {
            let mut read = |name| header(view.proxy, MapType::RequestHeaders, name);
            let (Ok(method), Ok(path), Ok(encoding), Ok(length)) = (
                read(":method"),
                read(":path"),
                read("content-encoding"),
                read("content-length"),
            ) else {
                view.increment(Metric::Requests);
                exchange.on_host_error(&shared.plugin, view);
                return CONTINUE;
            };
            let head = RequestHead {
                method: method.as_deref(),
                path: path.as_deref(),
                content_encoding: encoding.as_deref(),
                content_length: length.as_deref(),
                end_of_stream,
            };
            match exchange.on_headers(&shared.plugin, view, &head) {
                RequestHeadStep::Continue => CONTINUE,
                RequestHeadStep::Buffer => {
                    let removed = view
                        .proxy
                        .remove_header(MapType::RequestHeaders, "content-length");
                    if let Err(e) = removed {
                        log::warn!(
                            "incontext: cannot remove content-length (host status {})",
                            e.0
                        );
                        exchange.on_host_error(&shared.plugin, view);
                    }
                    CONTINUE
                }
            }
        })
    }

    pub fn on_request_body(
        &mut self,
        proxy: &mut dyn Proxy,
        body_size: usize,
        end_of_stream: bool,
    ) -> u32 {
        self.with(proxy, CONTINUE, |exchange, shared, view| {
            match exchange.on_body_chunk(&shared.plugin, view, body_size, end_of_stream) {
                RequestBodyStep::Continue => return CONTINUE,
                RequestBodyStep::Buffer | RequestBodyStep::Wait => return PAUSE,
                RequestBodyStep::Read => {}
            }
            let body = match view
                .proxy
                .get_buffer(BufferType::HttpRequestBody, 0, body_size)
            {
                Ok(b) => b.unwrap_or_default(),
                Err(e) => {
                    log::warn!("incontext: cannot read the body (host status {})", e.0);
                    exchange.on_host_error(&shared.plugin, view);
                    return CONTINUE;
                }
            };
            let step = exchange.on_body(&shared.plugin, view, body);
            if Http::apply(exchange, shared, view, step) {
                PAUSE
            } else {
                CONTINUE
            }
        })
    }

    pub fn on_request_trailers(&mut self, proxy: &mut dyn Proxy) -> u32 {
        self.with(proxy, CONTINUE, |exchange, shared, view| {
            exchange.on_trailers(&shared.plugin, view);
            CONTINUE
        })
    }

    pub fn on_response_headers(&mut self, proxy: &mut dyn Proxy, end_of_stream: bool) -> u32 {
        self.with(proxy, CONTINUE, |exchange, shared, view| {
            for (name, value) in exchange.response_headers(&shared.plugin) {
                let _ = view
                    .proxy
                    .add_header(MapType::ResponseHeaders, name, &value);
            }
            let mut read = |name| header(view.proxy, MapType::ResponseHeaders, name);
            let (Ok(status), Ok(kind), Ok(encoding), Ok(length), Ok(trailer)) = (
                read(":status"),
                read("content-type"),
                read("content-encoding"),
                read("content-length"),
                read("trailer"),
            ) else {
                return CONTINUE;
            };
            let head = response::Head {
                status: status.and_then(|s| s.trim().parse().ok()),
                content_type: kind.as_deref(),
                content_encoding: encoding.as_deref(),
                content_length: length.as_deref(),
                end_of_stream,
                trailers: trailer.is_some(),
            };
            match exchange.on_response_head(&shared.plugin, &head) {
                response::HeadStep::Pass | response::HeadStep::Observe => {}
                response::HeadStep::Hold | response::HeadStep::Watch => {
                    // The body may change length.
                    let removed = view
                        .proxy
                        .remove_header(MapType::ResponseHeaders, "content-length");
                    if let Err(e) = removed {
                        log::warn!(
                            "incontext: cannot remove the answer's content-length (host status {})",
                            e.0
                        );
                        exchange.on_response_host_error();
                    }
                }
            }
            CONTINUE
        })
    }

    pub fn on_response_body(
        &mut self,
        proxy: &mut dyn Proxy,
        body_size: usize,
        end_of_stream: bool,
    ) -> u32 {
        let mut kept = std::mem::take(&mut self.kept);
        let step = self.with(proxy, CONTINUE, |exchange, shared, view| {
            match exchange.on_response_body(body_size, end_of_stream) {
                response::BodyStep::Continue => return CONTINUE,
                response::BodyStep::Buffer => return PAUSE,
                response::BodyStep::Read => {}
            }
            edit_answer(exchange, shared, view, body_size, end_of_stream, &mut kept);
            // While the filter holds bytes back, the host keeps this chunk with them.
            if kept > 0 {
                PAUSE
            } else {
                CONTINUE
            }
        });
        self.kept = kept;
        step
    }

    /// The answer ends in trailers, the end of its body with no more bytes: what the filter
    /// holds goes out before them, edited as at the end of a body, after what the host still
    /// buffers (and an answer read for its usage is read to its end). A stream's partial
    /// event held while the host kept nothing (the head announced no trailers) has nothing to
    /// join: it cannot go out, and the answer ends as it passed.
    pub fn on_response_trailers(&mut self, proxy: &mut dyn Proxy) -> u32 {
        let mut kept = std::mem::take(&mut self.kept);
        self.with(proxy, (), |exchange, shared, view| {
            if exchange.response_holds() && !exchange.response_host_keeps() {
                log::debug!("incontext: a partial event held at unannounced trailers is dropped");
                exchange.on_response_host_error();
                return;
            }
            if exchange.on_response_body(0, true) == response::BodyStep::Read {
                edit_answer(exchange, shared, view, usize::MAX, true, &mut kept);
            }
        });
        CONTINUE
    }

    /// The stream is done (answered, or reset): a skipped request's count goes out now.
    pub fn on_log(&mut self, proxy: &mut dyn Proxy) {
        self.with(proxy, (), |exchange, shared, view| {
            exchange.on_stream_end(&shared.plugin, view);
        })
    }
}

/// Writes what the exchange has to publish (docs/spec.md §9a) as properties, which Envoy
/// keeps as the stream's filter state `wasm.incontext.*`: before the request goes on, and
/// when the answer's usage comes. A property the host refuses is left out.
fn publish(exchange: &mut Exchange, view: &mut HostView) {
    for (name, value) in exchange.published() {
        if let Err(e) = view.proxy.set_property(name, value.as_bytes()) {
            log::debug!("incontext: cannot publish {name} (host status {})", e.0);
        }
    }
}

/// Reads up to `size` bytes of the answer the host buffers and hands the exchange what did
/// not pass it yet (after the first `kept` bytes); puts back what it returns. `kept` becomes
/// what the host keeps: the whole buffer while the exchange says it must (the filter holds
/// bytes back that trailers may have to follow), else nothing. A host failure leaves the rest
/// of the answer unwatched.
fn edit_answer(
    exchange: &mut Exchange,
    shared: &Shared,
    view: &mut HostView,
    size: usize,
    end_of_stream: bool,
    kept: &mut usize,
) {
    let before = std::mem::take(kept);
    let data = match view.proxy.get_buffer(BufferType::HttpResponseBody, 0, size) {
        Ok(b) => b.unwrap_or_default(),
        Err(e) => {
            log::warn!("incontext: cannot read the answer (host status {})", e.0);
            exchange.on_response_host_error();
            return;
        }
    };
    let (passed, fresh) = data.split_at(before.min(data.len()));
    let mut length = data.len();
    match exchange.on_response_data(&shared.plugin, view, fresh, end_of_stream) {
        response::Edit::Keep => {}
        response::Edit::Replace(out) => {
            let out = [passed, &out].concat();
            let replaced = view
                .proxy
                .set_buffer(BufferType::HttpResponseBody, 0, data.len(), &out);
            if let Err(e) = replaced {
                log::warn!("incontext: cannot replace the answer (host status {})", e.0);
                exchange.on_response_host_error();
                return;
            }
            length = out.len();
        }
    }
    if exchange.response_host_keeps() {
        *kept = length;
    }
}
