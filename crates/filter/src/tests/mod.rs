//! The glue driven as Envoy drives it, over a fake host that records every call with the
//! context it was made in: contexts, call tokens, effective-context switching, orphans and
//! root deletion, configuration, logs and metrics.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::filter::{Filter, CONTINUE, PAUSE};

mod answers;
mod callbacks;
mod faults;
use crate::logger;
use crate::proxy::{BufferType, HostError, LogLevel, MapType, MetricType, Proxy};
use std::collections::HashMap;

/// A host call that matters to the order of things, with the effective context it was made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Event {
    Call {
        context: u32,
        token: u32,
        path: String,
    },
    Resume {
        context: u32,
    },
    SetBody {
        context: u32,
    },
    Reply {
        context: u32,
        status: u32,
    },
    /// The answer's body was read.
    ReadAnswer {
        context: u32,
    },
}

/// A host as Envoy is to the module, in memory.
#[derive(Default)]
pub(super) struct Fake {
    /// The context host calls act for (Envoy sets it to the callback's context).
    pub(super) effective: u32,
    pub(super) request_headers: HashMap<u32, Vec<(String, String)>>,
    pub(super) request_body: HashMap<u32, Vec<u8>>,
    pub(super) response_headers: HashMap<u32, Vec<(String, String)>>,
    /// The upstream answer's head as Envoy holds it (`response_headers` are those added).
    pub(super) answer_head: HashMap<u32, Vec<(String, String)>>,
    /// The answer body Envoy holds for the stream: the current chunk, or all it buffered.
    pub(super) answer_body: HashMap<u32, Vec<u8>>,
    /// The call answer being delivered: status and body.
    pub(super) call_answer: Option<(u16, Vec<u8>)>,
    pub(super) config: Vec<u8>,
    pub(super) shared: HashMap<String, Vec<u8>>,
    pub(super) metric_names: Vec<(MetricType, String)>,
    pub(super) metric_values: HashMap<u32, i64>,
    pub(super) next_token: u32,
    pub(super) events: Vec<Event>,
    /// The properties set, per context, in order.
    pub(super) published: HashMap<u32, Vec<(String, String)>>,
    /// Contexts `set_effective_context` refuses.
    pub(super) refuse_context: Vec<u32>,
    pub(super) level: Option<u32>,
    pub(super) level_reads: usize,
    pub(super) memory: u64,
    pub(super) now_ns: u64,
    pub(super) logs: Vec<(LogLevel, String)>,
    /// Every host call made, by name, in order.
    pub trace: Vec<&'static str>,
    /// The position in `trace` of the call that fails (`HostError(1)`).
    pub fail_at: Option<usize>,
}

impl Fake {
    /// Notes the host call `name`; `Err` when it is the one that fails.
    pub(super) fn host_call(&mut self, name: &'static str) -> Result<(), HostError> {
        self.trace.push(name);
        if self.fail_at == Some(self.trace.len() - 1) {
            return Err(HostError(1));
        }
        Ok(())
    }
}

impl Proxy for Fake {
    fn log(&mut self, level: LogLevel, message: &str) {
        self.logs.push((level, message.to_string()));
    }
    fn log_level(&mut self) -> Option<u32> {
        self.level_reads += 1;
        self.level
    }
    fn get_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        max: usize,
    ) -> Result<Option<Vec<u8>>, HostError> {
        self.host_call("get_buffer")?;
        let all = match kind {
            BufferType::HttpRequestBody => self.request_body.get(&self.effective).cloned(),
            BufferType::HttpResponseBody => {
                self.events.push(Event::ReadAnswer {
                    context: self.effective,
                });
                self.answer_body.get(&self.effective).cloned()
            }
            BufferType::HttpCallResponseBody => self.call_answer.as_ref().map(|a| a.1.clone()),
            BufferType::PluginConfiguration => Some(self.config.clone()),
        };
        Ok(all.map(|b| b[start.min(b.len())..start.saturating_add(max).min(b.len())].to_vec()))
    }
    fn set_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        size: usize,
        value: &[u8],
    ) -> Result<(), HostError> {
        self.host_call("set_buffer")?;
        let body = match kind {
            BufferType::HttpRequestBody => self.request_body.get_mut(&self.effective),
            BufferType::HttpResponseBody => self.answer_body.get_mut(&self.effective),
            _ => None,
        }
        // Envoy refuses a body it no longer buffers (Bad Argument).
        .ok_or(HostError(2))?;
        body.splice(start..start + size, value.iter().copied());
        self.events.push(Event::SetBody {
            context: self.effective,
        });
        Ok(())
    }
    fn get_header(&mut self, map: MapType, key: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host_call("get_header")?;
        let value = match map {
            MapType::RequestHeaders => self
                .request_headers
                .get(&self.effective)
                .and_then(|h| h.iter().find(|(k, _)| k == key))
                .map(|(_, v)| v.clone().into_bytes()),
            MapType::ResponseHeaders => self
                .answer_head
                .get(&self.effective)
                .and_then(|h| h.iter().find(|(k, _)| k == key))
                .map(|(_, v)| v.clone().into_bytes()),
            MapType::CallResponseHeaders if key == ":status" => self
                .call_answer
                .as_ref()
                .map(|a| a.0.to_string().into_bytes()),
            _ => None,
        };
        Ok(value)
    }
    fn remove_header(&mut self, map: MapType, key: &str) -> Result<(), HostError> {
        self.host_call("remove_header")?;
        let headers = match map {
            MapType::RequestHeaders => self.request_headers.get_mut(&self.effective),
            MapType::ResponseHeaders => self.answer_head.get_mut(&self.effective),
            MapType::CallResponseHeaders => None,
        };
        if let Some(h) = headers {
            h.retain(|(k, _)| k != key);
        }
        Ok(())
    }
    fn add_header(&mut self, map: MapType, key: &str, value: &str) -> Result<(), HostError> {
        self.host_call("add_header")?;
        assert_eq!(map, MapType::ResponseHeaders);
        self.response_headers
            .entry(self.effective)
            .or_default()
            .push((key.to_string(), value.to_string()));
        Ok(())
    }
    fn send_response(
        &mut self,
        status: u32,
        _headers: &[(&str, &str)],
        _body: &[u8],
    ) -> Result<(), HostError> {
        self.host_call("send_response")?;
        self.events.push(Event::Reply {
            context: self.effective,
            status,
        });
        Ok(())
    }
    fn get_shared(&mut self, key: &str) -> Result<Option<Vec<u8>>, HostError> {
        self.host_call("get_shared")?;
        Ok(self.shared.get(key).cloned())
    }
    fn set_shared(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        self.host_call("set_shared")?;
        self.shared.insert(key.to_string(), value.to_vec());
        Ok(())
    }
    fn define_metric(&mut self, kind: MetricType, name: &str) -> Result<u32, HostError> {
        self.host_call("define_metric")?;
        // Like Envoy: every definition gets its own id; the stat is the name's.
        self.metric_names.push((kind, name.to_string()));
        Ok(self.metric_names.len() as u32 - 1)
    }
    fn increment_metric(&mut self, id: u32, offset: i64) -> Result<(), HostError> {
        self.host_call("increment_metric")?;
        *self.metric_values.entry(id).or_default() += offset;
        Ok(())
    }
    fn http_call(
        &mut self,
        _cluster: &str,
        headers: &[(&str, &str)],
        _body: &[u8],
        _timeout_ms: u32,
    ) -> Result<u32, HostError> {
        self.host_call("http_call")?;
        self.next_token += 1;
        let path = headers
            .iter()
            .find(|(k, _)| *k == ":path")
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        self.events.push(Event::Call {
            context: self.effective,
            token: self.next_token,
            path,
        });
        Ok(self.next_token)
    }
    fn record_metric(&mut self, id: u32, value: u64) -> Result<(), HostError> {
        self.host_call("record_metric")?;
        self.metric_values.insert(id, value as i64);
        Ok(())
    }
    fn now_ns(&mut self) -> Result<u64, HostError> {
        self.host_call("now_ns")?;
        Ok(self.now_ns)
    }
    fn set_effective_context(&mut self, context: u32) -> Result<(), HostError> {
        self.host_call("set_effective_context")?;
        if self.refuse_context.contains(&context) {
            return Err(HostError(2));
        }
        self.effective = context;
        Ok(())
    }
    fn set_property(&mut self, path: &str, value: &[u8]) -> Result<(), HostError> {
        self.host_call("set_property")?;
        let value = String::from_utf8_lossy(value).into_owned();
        (self.published.entry(self.effective).or_default()).push((path.to_string(), value));
        Ok(())
    }
    fn resume_request(&mut self) -> Result<(), HostError> {
        self.host_call("resume_request")?;
        self.events.push(Event::Resume {
            context: self.effective,
        });
        Ok(())
    }
    fn memory_bytes(&mut self) -> u64 {
        self.memory
    }
}

impl Fake {
    /// How many times the filter read an answer's body.
    pub(super) fn answer_reads(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::ReadAnswer { .. }))
            .count()
    }

    /// A metric's value summed over every id defined with its name.
    pub(super) fn metric(&self, name: &str) -> i64 {
        self.metric_names
            .iter()
            .enumerate()
            .filter(|(_, (_, n))| n == name)
            .map(|(id, _)| self.metric_values.get(&(id as u32)).copied().unwrap_or(0))
            .sum()
    }

    /// How many times a stream was resumed.
    pub(super) fn resumes(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Resume { .. }))
            .count()
    }

    pub(super) fn calls(&self) -> Vec<(u32, u32, String)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Call {
                    context,
                    token,
                    path,
                } => Some((*context, *token, path.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Envoy and one VM's filter: every callback is made in its own context, as Envoy does.
pub(super) struct Vm {
    pub(super) filter: Filter,
    pub(super) host: Fake,
    pub(super) next_context: u32,
}

pub(super) const CONFIG: &str = r#"{"tokenizer":{"cluster":"vllm"},"context_length":4096,"min_output_tokens":64,"fallback_margin_tokens":32}"#;
pub(super) const SKIP: &str = r#"{"tokenizer":{"cluster":"vllm"},"context_length":4096,"min_output_tokens":64,"fallback_margin_tokens":32,"skip_count":true}"#;
pub(super) const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#;

impl Vm {
    pub(super) fn new() -> Vm {
        Vm {
            filter: Filter::default(),
            host: Fake::default(),
            next_context: 0,
        }
    }

    pub(super) fn context(&mut self) -> u32 {
        self.next_context += 1;
        self.next_context
    }

    /// A root context with this configuration; whether it was accepted.
    pub(super) fn root_with(&mut self, config: &str) -> (u32, bool) {
        let id = self.context();
        self.filter.on_context_create(id, 0);
        self.host.effective = id;
        self.host.config = config.as_bytes().to_vec();
        let ok = self.filter.on_configure(&mut self.host, id, config.len());
        (id, ok)
    }

    pub(super) fn root(&mut self) -> u32 {
        let (id, ok) = self.root_with(CONFIG);
        assert!(ok);
        id
    }

    /// A stream of `root` whose request head (`headers`) has reached the filter: the stream
    /// and what the head callback answered.
    pub(super) fn open(&mut self, root: u32, headers: &[(&str, &str)]) -> (u32, u32) {
        let id = self.context();
        self.filter.on_context_create(id, root);
        self.host.effective = id;
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.host.request_headers.insert(id, headers);
        let step = self.filter.on_request_headers(&mut self.host, id, false);
        (id, step)
    }

    /// A POST to `path` through headers and its whole body: the stream and what the body
    /// callback answered.
    pub(super) fn post(&mut self, root: u32, path: &str, body: &str) -> (u32, u32) {
        let (id, _) = self.open(root, &[(":method", "POST"), (":path", path)]);
        self.host.request_body.insert(id, body.as_bytes().to_vec());
        let step = self
            .filter
            .on_request_body(&mut self.host, id, body.len(), true);
        (id, step)
    }

    /// A chat request (with its content-length) through headers and its whole body: the
    /// stream and what the body callback answered.
    pub(super) fn send(&mut self, root: u32, body: &str) -> (u32, u32) {
        let length = body.len().to_string();
        let (id, step) = self.open(
            root,
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                ("content-length", &length),
            ],
        );
        assert_eq!(step, CONTINUE);
        self.host.request_body.insert(id, body.as_bytes().to_vec());
        let step = self
            .filter
            .on_request_body(&mut self.host, id, body.len(), true);
        (id, step)
    }

    /// The chat again, after one call was made and stored: a cache hit (the first) that
    /// writes `cap` without a call.
    pub(super) fn cache_hit(&mut self, root: u32, cap: u64) {
        let (again, step) = self.send(root, CHAT);
        assert_eq!(step, CONTINUE);
        assert_eq!(self.host.calls().len(), 1);
        assert_eq!(self.body_of(again)["max_tokens"], cap);
        assert_eq!(self.host.metric("incontext_cache_hits"), 1);
    }

    /// Envoy delivers the answer to call `token` in the context of the root that made it.
    pub(super) fn answer(&mut self, root: u32, token: u32, status: u16, body: &str) {
        self.host.effective = root;
        self.host.call_answer = Some((status, body.as_bytes().to_vec()));
        self.filter
            .on_http_call_response(&mut self.host, token, body.len());
        self.host.call_answer = None;
    }

    /// Envoy ends a context: the log callback, then the deletion.
    pub(super) fn delete(&mut self, id: u32) {
        self.host.effective = id;
        self.filter.on_log(&mut self.host, id);
        self.filter.on_delete(&mut self.host, id);
    }

    pub(super) fn body_of(&self, stream: u32) -> serde_json::Value {
        serde_json::from_slice(&self.host.request_body[&stream]).unwrap()
    }

    pub(super) fn last_token(&self) -> u32 {
        self.host.calls().last().expect("a call was made").1
    }
}

pub(super) fn count(n: u64) -> String {
    format!(r#"{{"count":{n},"max_model_len":4096}}"#)
}
