//! The fake host and the helpers every flow test shares.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub use crate::bound;
pub use crate::config::Config;
pub use crate::flow::route::RouteId;
pub use crate::flow::store::Flag;
use crate::flow::*;
pub use crate::reason::Reason;
pub use crate::report::{HEADER_ACTION, HEADER_PROMPT, HEADER_SOURCE};
pub use crate::response;
pub use crate::tokenize::Failure;
use std::collections::HashMap;

/// A dispatched call: cluster, headers, call.
pub type Dispatched = (String, Vec<(String, String)>, Call);

/// A host that keeps shared data in a map, records every call and counter, and can refuse
/// dispatches.
#[derive(Default)]
pub struct FakeHost {
    pub shared: HashMap<String, Vec<u8>>,
    pub calls: Vec<Dispatched>,
    pub metrics: Vec<Metric>,
    pub route_metrics: Vec<(usize, Metric)>,
    pub refuse: bool,
    /// The clock, in ms.
    pub now: u64,
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
    pub fn last_token(&self) -> u32 {
        100 + self.calls.len() as u32
    }
    /// How many times `metric` was counted.
    pub fn count(&self, metric: Metric) -> usize {
        self.metrics.iter().filter(|m| **m == metric).count()
    }
}

/// A plugin configured with `extra` (see [`plugin_at`]) and a fresh host.
pub fn setup(extra: &str) -> (Plugin, FakeHost) {
    (plugin(extra), FakeHost::default())
}

pub fn plugin(extra: &str) -> Plugin {
    plugin_at("v", extra)
}

pub fn plugin_at(cluster: &str, extra: &str) -> Plugin {
    let text = format!(
        r#"{{"tokenizer":{{"cluster":"{cluster}"{}}},"min_output_tokens":64,"fallback_margin_tokens":32{}}}"#,
        extra.split_once('|').map_or("", |(t, _)| t),
        extra.split_once('|').map_or(extra, |(_, c)| c)
    );
    Plugin::new(Config::parse(text.as_bytes()).unwrap())
}

pub const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":32768}"#;
pub const RESPONSES: &str =
    r#"{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true,"store":false}"#;
pub const MESSAGES: &str = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":32000}"#;

pub fn head(path: &'static str) -> RequestHead<'static> {
    RequestHead {
        method: Some("POST"),
        path: Some(path),
        ..RequestHead::default()
    }
}

/// Headers, then the whole body in one chunk.
pub fn send(p: &Plugin, host: &mut FakeHost, path: &'static str, body: &str) -> (Exchange, Step) {
    let mut x = Exchange::new();
    assert_eq!(x.on_headers(p, host, &head(path)), RequestHeadStep::Buffer);
    assert_eq!(
        x.on_body_chunk(p, host, body.len() / 2, false),
        RequestBodyStep::Buffer
    );
    assert_eq!(
        x.on_body_chunk(p, host, body.len(), true),
        RequestBodyStep::Read
    );
    let step = x.on_body(p, host, body.as_bytes().to_vec());
    settle(p, host, &mut x, &step);
    (x, step)
}

/// What the glue does after a step: a rewrite or a local reply applied by the host.
pub fn settle(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, step: &Step) {
    if matches!(step, Step::Done(Action::Rewrite(_) | Action::Reply(_))) {
        x.applied(p, host, true);
    }
}

/// vLLM's `/tokenize` answer: `count` tokens, window `window`.
pub fn tokenized(count: u64, window: u64) -> String {
    format!(r#"{{"count":{count},"max_model_len":{window}}}"#)
}

/// A `/v1/models` answer naming model `m` with window `window`.
pub fn models(window: u64) -> String {
    format!(r#"{{"data":[{{"id":"m","max_model_len":{window}}}]}}"#)
}

/// The tokenizer's reply to call `token`: `body` whole.
pub fn reply_of(token: u32, status: Option<u16>, body: &[u8]) -> Reply<'_> {
    Reply {
        token,
        status,
        size: body.len(),
        body,
    }
}

pub fn reply(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, status: u16, body: &str) -> Step {
    let token = host.last_token();
    let step = x
        .on_reply(p, host, &reply_of(token, Some(status), body.as_bytes()))
        .expect("the exchange's own call");
    settle(p, host, x, &step);
    step
}

/// Headers and body, then the tokenizer's reply `count` (status 200): the exchange and the
/// step the reply gave.
pub fn counted(
    p: &Plugin,
    host: &mut FakeHost,
    path: &'static str,
    body: &str,
    count: &str,
) -> (Exchange, Step) {
    let (mut x, _) = send(p, host, path, body);
    let step = reply(p, host, &mut x, 200, count);
    (x, step)
}

/// A JSON answer with `status`, driven through the exchange in one chunk (see [`answer`]).
pub fn json_answer(
    x: &mut Exchange,
    p: &Plugin,
    host: &mut FakeHost,
    status: u16,
    body: &[u8],
) -> (response::HeadStep, Vec<u8>) {
    answer(x, p, host, status, "application/json", &[body])
}

/// The rewritten body as JSON.
pub fn rewritten(step: Step) -> serde_json::Value {
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

pub fn header(x: &Exchange, p: &Plugin, name: &str) -> Option<String> {
    x.response_headers(p)
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A conversation of `turns` tool rounds after a system prompt and a user question.
pub fn session(turns: usize, cap: &str) -> String {
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
pub fn anthropic_session(turns: usize, members: &str) -> &'static str {
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

pub fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

pub fn action(x: &Exchange, p: &Plugin) -> String {
    header(x, p, HEADER_ACTION).unwrap_or_default()
}

/// Answers the count call that is out for `x` (the skipped request's check).
pub fn answer_check(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, count: u64) {
    let token = x.pending_token().expect("a check is out");
    let body = format!(r#"{{"count":{count},"max_model_len":40960}}"#);
    let step = x.on_reply(p, host, &reply_of(token, Some(200), body.as_bytes()));
    assert!(step.is_none(), "a check has nothing to apply");
}

pub const SKIP: &str = r#","context_length":40960,"skip_count":true"#;

/// The first turn of `session` (one tool round, cap 16000), counted as `tokens`.
pub fn anchor(p: &Plugin, host: &mut FakeHost, tokens: u64) {
    anchor_capped(p, host, r#","max_tokens":16000"#, tokens);
}

/// The first turn of `session` with `cap` (its members), counted as `tokens` of 40960.
pub fn anchor_capped(p: &Plugin, host: &mut FakeHost, cap: &str, tokens: u64) {
    let body = leak(session(1, cap));
    counted(
        p,
        host,
        "/v1/chat/completions",
        body,
        &tokenized(tokens, 40960),
    );
}

/// The context length learned for `model` on route `route`.
pub fn learned(p: &Plugin, host: &mut FakeHost, route: RouteId, model: &str) -> Option<u64> {
    p.ctx(route, host).context(model)
}

/// Whether `flag` is set for `model` on the top level.
pub fn flagged(p: &Plugin, host: &mut FakeHost, flag: Flag, model: &str) -> bool {
    p.ctx(RouteId::Top, host).flagged(flag, model)
}

/// Drives an answer through the exchange as the glue does (Envoy buffers while the flow
/// says so); what the client receives.
pub fn answer(
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
