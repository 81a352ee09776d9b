//! The glue over a fake Envoy: what each hook returns, what it asks of Envoy, what it counts.

use crate::config;
use crate::envoy::{Body, Envoy, Headers};
use crate::metrics::Define;
use crate::stream::{CallAnswer, DataStatus, HeadStatus, Shared, Stream};
use std::collections::HashMap;
use std::sync::Arc;

const CONFIG: &str = r#"{"tokenizer":{"cluster":"vllm","authority":"vllm:8000"},
    "context_length":32768,"min_output_tokens":4096,"fallback_margin_tokens":1024}"#;

/// Metric names by id, as Envoy would define them.
#[derive(Default)]
struct Names(Vec<String>);

impl Define for Names {
    fn counter(&mut self, name: &str) -> Option<usize> {
        self.0.push(name.to_string());
        Some(self.0.len() - 1)
    }
    fn histogram(&mut self, name: &str) -> Option<usize> {
        self.counter(name)
    }
}

fn shared(config: &str) -> (Arc<Shared>, Vec<String>) {
    let mut names = Names::default();
    let s = config::load(&mut names, b"incontext", config.as_bytes(), |_| None).unwrap();
    (Arc::new(s), names.0)
}

/// A call the glue sent: cluster, headers, body.
type Callout = (String, Vec<(String, String)>, Vec<u8>);

/// One stream's Envoy: its headers and bodies, and everything the glue asked of it.
#[derive(Default)]
struct Fake {
    request_headers: Vec<(String, String)>,
    response_headers: Vec<(String, String)>,
    request_body: Vec<u8>,
    response_body: Vec<u8>,
    callouts: Vec<Callout>,
    sent: Vec<(u32, Vec<u8>)>,
    resumed: usize,
    counters: HashMap<usize, u64>,
    /// Reading a header panics (a fault inside the glue).
    panic_on_header: bool,
    refuse_callouts: bool,
    /// The bodies are handed out in slices of this many bytes (0: one slice).
    slice: usize,
    refuse_slices: bool,
    refuse_drain: bool,
    /// How many times the request body was read whole (copied out of Envoy).
    reads: usize,
    /// How many times a request header was set or removed.
    request_sets: usize,
    /// The filter state set, in order, with how many resumes came before each.
    state: Vec<(String, String, usize)>,
    /// Envoy calling hooks inside a call: named by the call ("callout", with its id,
    /// "send_response", "resume_request").
    reenter: Option<Box<dyn FnMut(&'static str, u64)>>,
    /// Moving this counter panics (a fault inside the glue).
    panic_on_counter: Option<usize>,
}

impl Fake {
    fn reenter(&mut self, call: &'static str, id: u64) {
        if let Some(f) = self.reenter.as_mut() {
            f(call, id);
        }
    }
}

impl Fake {
    fn map(&mut self, map: Headers) -> &mut Vec<(String, String)> {
        match map {
            Headers::Request => &mut self.request_headers,
            Headers::Response => &mut self.response_headers,
        }
    }
    fn body(&mut self, body: Body) -> &mut Vec<u8> {
        match body {
            Body::Request => &mut self.request_body,
            Body::Response => &mut self.response_body,
        }
    }
}

impl Envoy for Fake {
    fn header(&mut self, map: Headers, name: &str) -> Option<String> {
        assert!(!self.panic_on_header, "a fault in a header read");
        let map = self.map(map);
        map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }
    fn set_header(&mut self, map: Headers, name: &str, value: Option<&str>) -> bool {
        self.request_sets += usize::from(map == Headers::Request);
        let map = self.map(map);
        map.retain(|(k, _)| k != name);
        if let Some(v) = value {
            map.push((name.to_string(), v.to_string()));
        }
        true
    }
    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> bool {
        self.map(map).push((name.to_string(), value.to_string()));
        true
    }
    fn body_size(&mut self, body: Body) -> usize {
        self.body(body).len()
    }
    fn read_body(&mut self, body: Body) -> Option<Vec<u8>> {
        self.reads += usize::from(body == Body::Request);
        Some(self.body(body).clone())
    }
    fn replace_body(&mut self, body: Body, data: &[u8]) -> bool {
        *self.body(body) = data.to_vec();
        true
    }
    fn body_chunks(&mut self, body: Body, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool {
        if self.refuse_slices {
            return false;
        }
        let slice = match self.slice {
            0 => usize::MAX,
            n => n,
        };
        let mut chunks: Vec<&mut [u8]> = self.body(body).chunks_mut(slice).collect();
        f(&mut chunks);
        true
    }
    fn drain_body(&mut self, body: Body, n: usize) -> bool {
        if self.refuse_drain {
            return false;
        }
        self.body(body).drain(..n);
        true
    }
    fn send_response(&mut self, status: u32, _headers: &[(&str, &str)], body: &[u8]) {
        self.sent.push((status, body.to_vec()));
        self.reenter("send_response", 0);
    }
    fn callout(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        _timeout_ms: u64,
    ) -> Option<u64> {
        if self.refuse_callouts {
            return None;
        }
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.callouts
            .push((cluster.to_string(), headers, body.to_vec()));
        let id = self.callouts.len() as u64 + 6;
        self.reenter("callout", id);
        Some(id)
    }
    fn set_filter_state(&mut self, key: &str, value: &str) -> bool {
        (self.state).push((key.to_string(), value.to_string(), self.resumed));
        true
    }
    fn resume_request(&mut self) {
        self.resumed += 1;
        self.reenter("resume_request", 0);
    }
    fn increment(&mut self, counter: usize, by: u64) {
        assert_ne!(self.panic_on_counter, Some(counter), "a fault in a counter");
        *self.counters.entry(counter).or_default() += by;
    }
    fn record(&mut self, _histogram: usize, _value: u64) {}
}

/// The counters that moved, by name.
fn counted(names: &[String], fake: &Fake) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = fake
        .counters
        .iter()
        .map(|(id, n)| (names[*id].clone(), *n))
        .collect();
    out.sort();
    out
}

fn counts(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    out.sort();
    out
}

/// A POST of `body` to the chat endpoint, its head and body delivered in two chunks.
fn post(body: &[u8]) -> Fake {
    Fake {
        request_headers: vec![
            (":method".into(), "POST".into()),
            (":path".into(), "/v1/chat/completions".into()),
            ("content-length".into(), body.len().to_string()),
        ],
        ..Fake::default()
    }
}

/// Delivers the body in two chunks, as Envoy buffers them; the status of the last.
fn send_body(s: &mut Stream, f: &mut Fake, body: &[u8]) -> DataStatus {
    let (a, b) = body.split_at(body.len() / 2);
    f.request_body = a.to_vec();
    assert_eq!(s.request_body(f, false), DataStatus::Buffer);
    f.request_body.extend_from_slice(b);
    s.request_body(f, true)
}

fn chat(prompt: &str, max_tokens: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }))
    .unwrap()
}

fn tokenizer_answer(count: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "count": count,
        "max_model_len": 32768,
        "tokens": (0..count).collect::<Vec<_>>(),
    }))
    .unwrap()
}

fn answer(body: &[u8]) -> CallAnswer<'_> {
    CallAnswer {
        status: Some(200),
        size: body.len(),
        body,
    }
}

fn header<'a>(map: &'a [(String, String)], name: &str) -> Option<&'a str> {
    map.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A request counted by one call and rewritten: its new Content-Length, and its counters.
fn assert_counted_rewrite(names: &[String], f: &Fake) {
    assert_eq!(
        header(&f.request_headers, "content-length"),
        Some(f.request_body.len().to_string().as_str())
    );
    assert_eq!(
        counted(names, f),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_rewritten", 1),
            ("incontext_tokenizer_calls", 1),
            ("incontext_cache_misses", 1),
            ("incontext_count_calls", 1),
        ])
    );
}

#[test]
fn a_budgeted_request_is_held_until_its_count_then_rewritten_with_its_length() {
    let (shared, names) = shared(CONFIG);
    let body = chat("held until counted", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    // Nothing resumed before the decision: one call out, to the tokenizer cluster.
    assert_eq!(f.resumed, 0);
    assert_eq!(f.callouts.len(), 1);
    let (cluster, headers, _) = &f.callouts[0];
    assert_eq!(cluster, "vllm");
    assert_eq!(header(headers, ":path"), Some("/tokenize"));
    assert_eq!(header(headers, ":authority"), Some("vllm:8000"));
    assert_eq!(f.request_body, body);

    assert!(f.state.is_empty(), "nothing published before the decision");
    let reply = tokenizer_answer(1000);
    s.callout_done(&mut f, 7, &answer(&reply));
    assert_eq!(f.resumed, 1);
    let sent: serde_json::Value = serde_json::from_slice(&f.request_body).unwrap();
    assert_eq!(sent["max_tokens"], 32768 - 1000);
    assert_counted_rewrite(&names, &f);
    // The decision is Envoy's filter state before the request resumes (0 resumes before).
    let state = |pairs: &[(&str, u64)]| -> Vec<(String, String, usize)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string(), 0))
            .collect()
    };
    let mut expected = vec![
        ("incontext.outcome".to_string(), "rewritten".to_string(), 0),
        ("incontext.source".to_string(), "exact".to_string(), 0),
    ];
    expected.extend(state(&[
        ("incontext.prompt_tokens", 1000),
        ("incontext.window", 32768),
        ("incontext.max_tokens", 32768 - 1000),
        ("incontext.charge", 32768),
    ]));
    assert_eq!(f.state, expected);

    // The report goes out with the answer.
    f.response_headers = vec![(":status".into(), "200".into())];
    assert_eq!(s.response_headers(&mut f, false), HeadStatus::Continue);
    assert_eq!(
        header(&f.response_headers, "x-incontext-action"),
        Some("rewritten")
    );
    assert_eq!(
        header(&f.response_headers, "x-incontext-prompt-tokens"),
        Some("1000")
    );

    // The same prompt again, from any stream of the process: counted from the table, decided
    // in the body callback, with no call.
    let mut g = post(&body);
    let mut t = Stream::new(shared);
    assert_eq!(t.request_headers(&mut g, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut t, &mut g, &body), DataStatus::Continue);
    assert!(g.callouts.is_empty());
    assert_eq!(g.request_body, f.request_body);
    assert_eq!(
        counted(&names, &g),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_rewritten", 1),
            ("incontext_cache_hits", 1),
        ])
    );
}

#[test]
fn a_request_that_is_not_budgeted_passes_at_once() {
    let (shared, names) = shared(CONFIG);
    let mut f = Fake {
        request_headers: vec![
            (":method".into(), "GET".into()),
            (":path".into(), "/v1/models".into()),
        ],
        ..Fake::default()
    };
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, true), HeadStatus::Continue);
    assert!(f.callouts.is_empty());
    assert_eq!(
        counted(&names, &f),
        counts(&[("incontext_requests", 1), ("incontext_unchanged_method", 1)])
    );
    assert_eq!(
        f.state,
        [(
            "incontext.outcome".to_string(),
            "unchanged:method".to_string(),
            0
        )]
    );
}

#[test]
fn a_call_envoy_refuses_is_decided_on_the_estimate_at_once() {
    let (shared, names) = shared(CONFIG);
    let body = chat("no call goes out", 100_000);
    let mut f = post(&body);
    f.refuse_callouts = true;
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Continue);
    assert!(f.callouts.is_empty());
    assert_ne!(f.request_body, body);
    assert_eq!(
        header(&f.request_headers, "content-length"),
        Some(f.request_body.len().to_string().as_str())
    );
    f.response_headers = vec![(":status".into(), "200".into())];
    s.response_headers(&mut f, false);
    assert_eq!(
        header(&f.response_headers, "x-incontext-source"),
        Some("estimate")
    );
    let moved = counted(&names, &f);
    assert!(
        moved.contains(&("incontext_estimates".to_string(), 1)),
        "{moved:?}"
    );
    assert!(
        moved.contains(&("incontext_rewritten".to_string(), 1)),
        "{moved:?}"
    );
}

#[test]
fn a_prompt_with_no_room_is_answered_locally_when_configured_to_reject() {
    let config = config_with(r#""on_insufficient":"reject""#);
    let (shared, names) = shared(&config);
    let body = chat("too long a prompt", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    let reply = tokenizer_answer(32000);
    s.callout_done(&mut f, 7, &answer(&reply));
    assert_eq!(f.sent.len(), 1);
    assert_eq!(f.sent[0].0, 400);
    assert_eq!(f.resumed, 0);
    assert_eq!(f.request_body, body);
    let moved = counted(&names, &f);
    assert!(
        moved.contains(&("incontext_rejected".to_string(), 1)),
        "{moved:?}"
    );
}

#[test]
fn a_panic_lets_the_request_pass_counts_once_and_leaves_the_stream_alone() {
    let (shared, names) = shared(CONFIG);
    let body = chat("a fault", 100_000);
    let mut f = post(&body);
    f.panic_on_header = true;
    let mut s = Stream::new(shared);
    let out = s.guard(&mut f, HeadStatus::Continue, false, |s, e| {
        s.request_headers(e, false)
    });
    assert_eq!(out, HeadStatus::Continue);
    f.panic_on_header = false;
    // Every later callback of the stream passes, and nothing more is asked of Envoy.
    f.request_body = body.clone();
    let out = s.guard(&mut f, DataStatus::Continue, false, |s, e| {
        s.request_body(e, true)
    });
    assert_eq!(out, DataStatus::Continue);
    assert!(f.callouts.is_empty());
    assert_eq!(f.request_body, body);
    assert_eq!(f.resumed, 0);
    assert_eq!(counted(&names, &f), counts(&[("incontext_panics", 1)]));
}

#[test]
fn a_panic_while_the_request_is_held_resumes_it() {
    let (shared, names) = shared(CONFIG);
    let body = chat("a fault while held", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    let before = counted(&names, &f);
    s.guard(&mut f, (), true, |_, _| -> () {
        panic!("a fault in the answer's callback");
    });
    assert_eq!(f.resumed, 1);
    assert_eq!(f.request_body, body);
    let mut want = before.clone();
    want.push(("incontext_panics".into(), 1));
    want.sort();
    assert_eq!(counted(&names, &f), want);
    // The call's answer, when it comes, changes nothing.
    let reply = tokenizer_answer(1000);
    s.guard(&mut f, (), true, |s, e| {
        s.callout_done(e, 7, &answer(&reply))
    });
    assert_eq!(f.request_body, body);
    assert_eq!(f.resumed, 1);
}

#[test]
fn a_config_is_refused_with_its_field_named() {
    let mut names = Names::default();
    let bad = r#"{"tokenizer":{"cluster":"vllm"},"min_output_tokens":"many"}"#;
    let err = config::load(&mut names, b"incontext", bad.as_bytes(), |_| None)
        .err()
        .unwrap();
    assert!(err.contains("min_output_tokens"), "{err}");
    assert!(names.0.is_empty());
    let err = config::load(&mut names, b"other", CONFIG.as_bytes(), |_| None)
        .err()
        .unwrap();
    assert!(err.contains("filter_name"), "{err}");
}

#[test]
fn a_window_error_ending_in_trailers_is_translated_before_them() {
    let (shared, names) = shared(CONFIG);
    let body = chat("no room left", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    s.callout_done(&mut f, 7, &answer(&tokenizer_answer(32_000)));
    assert_eq!(f.resumed, 1);
    assert_eq!(f.request_body, body);

    f.response_headers = vec![
        (":status".into(), "400".into()),
        ("content-type".into(), "application/json".into()),
    ];
    assert_eq!(s.response_headers(&mut f, false), HeadStatus::Continue);
    let error = br#"{"error":{"message":"This model's maximum context length is 32768 tokens. However, your prompt contains at least 32769 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=32769)","type":"BadRequestError","param":"input_tokens","code":400}}"#;
    // The error is buffered whole; its body ends in trailers, with no more bytes.
    f.response_body = error.to_vec();
    assert_eq!(s.response_body(&mut f, false), DataStatus::Buffer);
    s.response_trailers(&mut f);
    let sent: serde_json::Value = serde_json::from_slice(&f.response_body).unwrap();
    assert_eq!(sent["error"]["code"], "context_length_exceeded", "{sent}");
    let moved = counted(&names, &f);
    assert!(
        moved.contains(&("incontext_translated".to_string(), 1)),
        "{moved:?}"
    );

    // Trailers of an answer that is not watched change nothing.
    let mut g = post(&body);
    let mut t = Stream::new(shared);
    g.response_headers = vec![(":status".into(), "200".into())];
    assert_eq!(t.response_headers(&mut g, false), HeadStatus::Continue);
    g.response_body = b"plain".to_vec();
    assert_eq!(t.response_body(&mut g, false), DataStatus::Continue);
    t.response_trailers(&mut g);
    assert_eq!(g.response_body, b"plain");
}

/// The test configuration with one more top-level member (`"key":value`).
fn config_with(member: &str) -> String {
    format!("{},{member}}}", CONFIG.trim_end().trim_end_matches('}'))
}

/// A POST of `body` with no content-length (chunked over HTTP/1, or HTTP/2).
fn post_unframed(body: &[u8]) -> Fake {
    let mut f = post(body);
    f.request_headers.retain(|(k, _)| k != "content-length");
    f
}

#[test]
fn a_held_request_without_a_length_goes_on_whole_with_one() {
    let config = config_with(r#""max_body_bytes":64"#);
    let (shared, names) = shared(&config);
    // Over max_body_bytes: not budgeted, but held to its end all the same.
    let body = chat("a body over the limit", 100_000);
    let mut f = post_unframed(&body);
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    f.request_body = body[..80].to_vec();
    assert_eq!(s.request_body(&mut f, false), DataStatus::Buffer);
    f.request_body = body.clone();
    assert_eq!(s.request_body(&mut f, true), DataStatus::Continue);
    assert!(f.callouts.is_empty());
    assert_eq!(f.request_body, body);
    let n = body.len().to_string();
    assert_eq!(
        header(&f.request_headers, "content-length"),
        Some(n.as_str())
    );
    assert_eq!(
        counted(&names, &f),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_unchanged_too_large", 1)
        ])
    );

    // Ended by trailers before its end of stream: unchanged, with its length.
    let small = br#"{"messages":[]}"#;
    let mut g = post_unframed(small);
    let mut t = Stream::new(shared);
    assert_eq!(t.request_headers(&mut g, false), HeadStatus::Stop);
    g.request_body = small.to_vec();
    assert_eq!(t.request_body(&mut g, false), DataStatus::Buffer);
    t.request_trailers(&mut g);
    let n = small.len().to_string();
    assert_eq!(
        header(&g.request_headers, "content-length"),
        Some(n.as_str())
    );
    assert_eq!(g.request_body, small);
}

#[test]
fn a_rewritten_request_without_a_length_gets_its_new_one() {
    let (shared, _) = shared(CONFIG);
    let body = chat("sent chunked", 100_000);
    let mut f = post_unframed(&body);
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    s.callout_done(&mut f, 7, &answer(&tokenizer_answer(1000)));
    assert_eq!(f.resumed, 1);
    assert_ne!(f.request_body, body);
    let n = f.request_body.len().to_string();
    assert_eq!(
        header(&f.request_headers, "content-length"),
        Some(n.as_str())
    );
}

mod in_place;
mod later;
mod part;
mod reentry;
