//! Every host call fails once, at every point of a request's life (each call site in turn):
//! the request still counts exactly one outcome (docs/spec.md §9: `requests = rewritten +
//! Σ unchanged_* + rejected + abandoned`), and it goes on intact: rewritten as decided, or
//! byte for byte as it came, or answered locally.

use super::*;

const REJECT: &str = r#"{"tokenizer":{"cluster":"vllm"},"context_length":4096,"min_output_tokens":64,"fallback_margin_tokens":32,"on_insufficient":"reject"}"#;

/// One request's life, from configuration to deletion.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    config: &'static str,
    method: &'static str,
    /// The count call's answer, when one is made.
    reply: (u16, &'static str),
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "rewritten",
        config: CONFIG,
        method: "POST",
        reply: (200, r#"{"count":96,"max_model_len":4096}"#),
    },
    Scenario {
        name: "rejected",
        config: REJECT,
        method: "POST",
        reply: (200, r#"{"count":4090,"max_model_len":4096}"#),
    },
    Scenario {
        name: "estimated",
        config: CONFIG,
        method: "POST",
        reply: (500, "{}"),
    },
    Scenario {
        name: "not budgeted",
        config: CONFIG,
        method: "GET",
        reply: (200, "{}"),
    },
];

/// What a run left.
struct Run {
    vm: Vm,
    stream: u32,
    /// The host calls made before the request (configuration).
    start: usize,
    /// The filter let the stream go before its end: the host no longer knew it.
    abandoned: bool,
}

fn run(s: Scenario, fail: Option<usize>) -> Run {
    let mut vm = Vm::new();
    let (root, ok) = vm.root_with(s.config);
    assert!(ok);
    let start = vm.host.trace.len();
    vm.host.fail_at = fail.map(|k| start + k);
    let length = CHAT.len().to_string();
    let (stream, _) = vm.open(
        root,
        &[
            (":method", s.method),
            (":path", "/v1/chat/completions"),
            ("content-length", &length),
        ],
    );
    vm.host
        .request_body
        .insert(stream, CHAT.as_bytes().to_vec());
    vm.filter
        .on_request_body(&mut vm.host, stream, CHAT.len(), true);
    if vm.filter.held().1 == 1 {
        let token = vm.last_token();
        vm.answer(root, token, s.reply.0, s.reply.1);
    }
    // The host no longer knew the stream when its answer came: the filter let it go.
    let abandoned = vm.filter.held().0 == 0;
    vm.host.effective = stream;
    vm.host.answer_head.insert(
        stream,
        vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
        ],
    );
    vm.filter.on_response_headers(&mut vm.host, stream, false);
    vm.host.answer_body.insert(stream, b"{}".to_vec());
    vm.filter.on_response_body(&mut vm.host, stream, 2, true);
    vm.delete(stream);
    Run {
        vm,
        stream,
        start,
        abandoned,
    }
}

/// The outcome counters' sum.
fn outcomes(host: &Fake) -> i64 {
    let unchanged: i64 = (host.metric_names.iter())
        .filter(|(_, n)| n.starts_with("incontext_unchanged_"))
        .map(|(_, n)| host.metric(n))
        .sum();
    host.metric("incontext_rewritten") + host.metric("incontext_rejected") + unchanged
}

#[test]
fn every_host_call_failing_leaves_one_outcome_and_the_request_intact() {
    let mut checked = 0;
    for s in SCENARIOS {
        let clean = run(s, None);
        assert!(!clean.abandoned, "{}", s.name);
        assert_eq!(outcomes(&clean.vm.host), 1, "{}", s.name);
        let calls = clean.vm.host.trace.len() - clean.start;
        assert!(calls >= 5, "{}: {calls} host calls", s.name);
        for k in 0..calls {
            let r = run(s, Some(k));
            let failed = r.vm.host.trace[r.start + k];
            let what = format!("{}: call {k} ({failed}) failed", s.name);
            let host = &r.vm.host;
            if failed != "increment_metric" {
                assert_eq!(host.metric("incontext_requests"), 1, "{what}");
                assert_eq!(
                    outcomes(host) + i64::from(r.abandoned),
                    1,
                    "{what}: {:?}",
                    host.metric_values
                );
            }
            // Rewritten as decided, or as it came.
            let body = &host.request_body[&r.stream];
            if host.metric("incontext_rewritten") == 1 {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap();
                assert!(v["max_tokens"].as_u64().unwrap() <= 4096, "{what}");
                assert_eq!(v["messages"][0]["content"], "hi", "{what}");
            } else if failed != "increment_metric" {
                assert_eq!(body.as_slice(), CHAT.as_bytes(), "{what}");
            }
            // A local reply only when it counts as rejected.
            let replied = (host.events.iter())
                .filter(|e| matches!(e, Event::Reply { .. }))
                .count() as i64;
            if failed != "increment_metric" {
                assert_eq!(replied, host.metric("incontext_rejected"), "{what}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} failures injected");
}
