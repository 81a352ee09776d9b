//! Micro-benchmark of the filter's per-request core work, natively (criterion):
//!
//!   cargo bench --bench core                 all of it (~2 min)
//!   bench/criterion-table.py                 the medians as a Markdown table
//!   cargo bench --bench core -- hit_path     one group / filter
//!
//! Bodies of 2 KB, 32 KB, 400 KB and 1.5 MB: realistic agent chat requests (system prompt,
//! tools, multi-turn messages with tool calls and tool results, `max_tokens`), built here
//! deterministically. Per size:
//!   scan        the top-level member scan (validates the whole body)
//!   analyze     scan (messages and tools only skimmed) + request shape, caps, counting mode
//!   cache_key   the 128-bit hash of the relevant raw slices (what a cache hit needs)
//!   payload     the `/tokenize` payload (only built on a miss)
//!   splice      the rewritten body
//!   decide      rule + splice, given a cached count
//!   hit_path    analyze + cache_key + decide: everything a cache hit does in the core (the
//!               prompt seen before: where `messages` and `tools` end is guessed, not skimmed)
//!   miss_path   analyze + validate + cache_key + payload + decide (no tokenizer reply)
//!   passthrough analyze of the same content without `messages` (returns Shape)
//!   response    the answer side per answer: a success's head (passes, its body never read);
//!               a streamed Anthropic answer of 400 events the window may have ended, watched
//!               event by event (`stream`, per answer); a window error translated
//! Throughput is reported in bytes of request body per second; `bench/criterion-table.py`
//! prints the medians as a Markdown table.

// A benchmark is test code: a broken fixture should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use incontext_core::config::Config;
use incontext_core::dialect::Endpoint;
use incontext_core::json::scan::scan;
use incontext_core::plan::{decide, Count, Source};
use incontext_core::request::{analyze, analyze_guessing};
use incontext_core::rewrite::splice;
use incontext_core::tokenize::{cache_key, payload};
use std::hint::black_box;
use std::time::Duration;

const SIZES: [(usize, &str); 4] = [
    (2 * 1024, "2KB"),
    (32 * 1024, "32KB"),
    (400 * 1024, "400KB"),
    (1536 * 1024, "1.5MB"),
];

const WORDS: &[&str] = &[
    "the",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "you",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "function",
    "return",
    "value",
    "error",
    "stack",
    "trace",
    "request",
    "response",
    "buffer",
    "config",
    "cluster",
    "listener",
    "filter",
    "tokenizer",
    "budget",
    "window",
    "context",
    "prompt",
    "count",
    "cache",
    "hash",
    "splice",
    "build",
    "failing",
    "test",
    "module",
    "crate",
];

const CODE: &[&str] = &[
    "def handler(request):\\n    body = json.loads(request.body)\\n    return {\\\"ok\\\": True}\\n",
    "fn main() {\\n    let v: Vec<u8> = Vec::with_capacity(1024);\\n    println!(\\\"{}\\\", v.len());\\n}\\n",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id LIMIT 50;\\n",
];

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "read_file", "description": "Read a file from the repository and return its contents.", "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Path relative to the repository root"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}}, "required": ["path"]}}}, {"type": "function", "function": {"name": "run_command", "description": "Run a shell command in the sandbox and return stdout and stderr.", "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600}}, "required": ["command"]}}}, {"type": "function", "function": {"name": "search_code", "description": "Search the code base for a regular expression.", "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"}}, "required": ["pattern"]}}}]"#;

const SYSTEM: &str = "You are a careful coding agent working in a large repository. Use the tools to read files and run commands before answering. Think step by step, keep answers short, cite file paths, and never invent APIs. Caf\u{e9} \u{fc}n\u{ef}code \u{2713} and \\\"quotes\\\" and a tab\\there.";

/// A small deterministic generator (xorshift), so every run benchmarks the same bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    fn prose(&mut self, words: usize) -> String {
        let mut s = String::new();
        for i in 0..words {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(WORDS[self.next(WORDS.len())]);
            if i % 19 == 18 {
                s.push('.');
            }
        }
        s
    }
}

fn turn(rng: &mut Rng, k: usize) -> String {
    let n = 20 + rng.next(40);
    let user = rng.prose(n);
    let code = CODE[rng.next(CODE.len())];
    let n = 40 + rng.next(80);
    let result = rng.prose(n);
    let n = 15 + rng.next(35);
    let answer = rng.prose(n);
    format!(
        r#", {{"role": "user", "content": "{user}"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_{k:05}", "type": "function", "function": {{"name": "read_file", "arguments": "{{\"path\": \"src/mod{k}.rs\", \"limit\": 200}}"}}}}]}}, {{"role": "tool", "tool_call_id": "call_{k:05}", "content": "{code}{result}"}}, {{"role": "assistant", "content": "{answer}"}}"#
    )
}

/// A chat body (`key` = "messages") or the same content under `key` = "input", of exactly
/// `size` bytes.
fn body(size: usize, key: &str) -> Vec<u8> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ size as u64);
    let assemble = |turns: &str, fill: &str| {
        format!(
            r#"{{"model": "qwen3-coder", "{key}": [{{"role": "system", "content": "{SYSTEM}"}}, {{"role": "user", "content": "Session 42: fix the failing build."}}{turns}, {{"role": "user", "content": "{fill}"}}], "tools": {TOOLS}, "temperature": 0.2, "stream": false, "max_tokens": 65536}}"#
        )
    };
    let mut turns = String::new();
    let mut k = 0;
    loop {
        let next = turns.clone() + &turn(&mut rng, k);
        if assemble(&next, "").len() > size {
            break;
        }
        turns = next;
        k += 1;
    }
    let base = assemble(&turns, "").len();
    assert!(base <= size, "size {size} too small");
    let mut fill = rng.prose((size - base) / 3 + 8);
    fill.truncate(size - base);
    let out = assemble(&turns, &fill).into_bytes();
    assert_eq!(out.len(), size);
    out
}

fn config() -> Config {
    Config::parse(
        br#"{"tokenizer":{"cluster":"vllm","authority":"vllm:8000"},"context_length":32768}"#,
    )
    .expect("config")
}

const ROUTE: &str = "vllm|vllm:8000|/tokenize";

fn cached() -> Count {
    Count {
        tokens: 1000,
        source: Source::Cache,
        max_model_len: Some(32768),
    }
}

fn bench(c: &mut Criterion) {
    let config = config();
    let bodies: Vec<_> = SIZES
        .iter()
        .map(|&(size, name)| (name, body(size, "messages"), body(size, "input")))
        .collect();
    for (_, chat, input) in &bodies {
        // The bodies are what the benchmark claims: valid, budgeted, rewritten, passthrough.
        serde_json::from_slice::<serde_json::Value>(chat).expect("valid JSON");
        let req = analyze(chat, &config).expect("a chat request");
        assert!(payload(&req, chat).is_some());
        assert!(analyze(input, &config).is_err());
    }

    /// A benchmark group with this file's timing settings.
    fn configured<'a>(
        c: &'a mut Criterion,
        name: &str,
        samples: usize,
    ) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
        let mut g = c.benchmark_group(name);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(2));
        g.sample_size(samples);
        g
    }

    // `work` over each size's chat body and its `input` twin.
    macro_rules! group {
        ($name:literal, |$body:ident, $input:ident| $work:expr) => {{
            let mut g = configured(c, $name, 30);
            for (name, chat, input) in &bodies {
                g.throughput(Throughput::Bytes(chat.len() as u64));
                g.bench_with_input(
                    BenchmarkId::from_parameter(name),
                    &(chat, input),
                    |b, (chat, input)| {
                        let $body: &[u8] = chat;
                        let $input: &[u8] = input;
                        b.iter(|| black_box($work))
                    },
                );
            }
            g.finish();
        }};
    }

    // `work` over each size's chat body and its analyzed request (analysis not timed).
    let reqs: Vec<_> = bodies
        .iter()
        .map(|(_, b, _)| analyze(b, &config).expect("chat"))
        .collect();
    macro_rules! per_request {
        ($name:literal, $samples:literal, |$req:ident, $chat:ident| $work:expr) => {{
            let mut g = configured(c, $name, $samples);
            for ((name, chat, _), req) in bodies.iter().zip(&reqs) {
                g.throughput(Throughput::Bytes(chat.len() as u64));
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    let $req = req;
                    let $chat: &[u8] = chat;
                    b.iter(|| black_box($work))
                });
            }
            g.finish();
        }};
    }

    group!("scan", |body, _i| scan(black_box(body)).map(|m| m.len()));
    group!("analyze", |body, _i| analyze(black_box(body), &config)
        .map(|r| r.members.len()));
    per_request!("cache_key", 30, |req, chat| cache_key(
        black_box(req),
        black_box(chat),
        ROUTE,
        Some(32768)
    ));
    per_request!("payload", 20, |req, chat| payload(
        black_box(req),
        black_box(chat)
    )
    .map(|p| p.len()));
    per_request!("splice", 30, |req, chat| {
        let (target, field) = req.target();
        splice(
            black_box(chat),
            &req.members,
            &req.cap_members,
            target,
            field,
            31768,
        )
        .len()
    });
    per_request!("decide", 30, |req, chat| decide(
        black_box(req),
        black_box(chat),
        &config,
        cached(),
        None
    )
    .prompt);
    group!("hit_path", |body, _i| {
        let (req, _) = analyze_guessing(body, &config, Endpoint::OpenAi).expect("chat");
        let key = cache_key(&req, body, ROUTE, Some(32768));
        (key, decide(&req, body, &config, cached(), None).prompt)
    });
    group!("miss_path", |body, _i| {
        let req = analyze(body, &config).expect("chat");
        req.validate(body).expect("valid");
        let key = cache_key(&req, body, ROUTE, Some(32768));
        let p = payload(&req, body).map(|p| p.len());
        (key, p, decide(&req, body, &config, cached(), None).prompt)
    });
    group!("passthrough", |_b, input| analyze(
        black_box(input),
        &config
    )
    .is_err());
}

/// The answer side (docs/spec.md §13): what a budgeted request's answer costs in the core.
fn response(c: &mut Criterion) {
    use incontext_core::config::Backend;
    use incontext_core::response::{self, Budget, Dialect, Head, Response};
    let budget = Budget {
        dialect: Dialect::Anthropic,
        backend: Backend::Vllm,
        model: "m".to_string(),
        prompt: Some(3000),
        exact: true,
        too_long: false,
        context: Some(32768),
        cap: Some(29768),
        window_cap: None,
        usage: false,
    };
    let watched = Budget {
        window_cap: Some(29768),
        ..budget.clone()
    };
    let ok = Head {
        status: Some(200),
        content_type: Some("application/json"),
        content_length: Some("2048"),
        ..Head::default()
    };
    let sse = Head {
        content_type: Some("text/event-stream"),
        content_length: None,
        ..ok
    };
    let mut events = String::new();
    for i in 0..400 {
        events.push_str(&format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"word{i} \"}}}}\n\n"
        ));
    }
    events.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":29768}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    // Chunks as a server writes them: one event each.
    let chunks: Vec<&[u8]> = events.split_inclusive("\n\n").map(str::as_bytes).collect();
    let error = br#"{"error":{"message":"This model's maximum context length is 32768 tokens. However, your prompt contains at least 32769 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=32769)","type":"BadRequestError","param":"input_tokens","code":400}}"#;
    let mut g = c.benchmark_group("response");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.bench_function("success_head", |b| {
        b.iter(|| {
            let mut r = Response::default();
            let step = r.on_headers(Some(black_box(&budget)), true, black_box(&ok));
            (step, r.on_body(2048, true))
        })
    });
    g.bench_function("stream_watched", |b| {
        b.iter(|| {
            let mut r = Response::default();
            r.on_headers(Some(&watched), true, &sse);
            let mut changed = 0;
            for (i, chunk) in chunks.iter().enumerate() {
                let end = i + 1 == chunks.len();
                r.on_body(chunk.len(), end);
                if r.on_data(Some(&watched), black_box(chunk), end).window_stop {
                    changed += 1;
                }
            }
            assert_eq!(changed, 1);
            changed
        })
    });
    g.bench_function("stream_unwatched", |b| {
        b.iter(|| {
            let mut r = Response::default();
            r.on_headers(Some(&budget), true, &sse);
            chunks
                .iter()
                .map(|c| r.on_body(black_box(c.len()), false))
                .filter(|s| *s != response::BodyStep::Continue)
                .count()
        })
    });
    g.bench_function("error_translated", |b| {
        b.iter(|| {
            let e = response::window::parse(Backend::Vllm, black_box(error)).expect("window error");
            response::translate(&budget, &e).map(|t| t.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench, response);
criterion_main!(benches);
