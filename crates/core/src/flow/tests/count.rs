use super::support::*;
use crate::flow::*;

#[test]
fn miss_counts_then_hit_skips_the_call() {
    let (p, mut host) = setup(r#","context_length":512"#);
    let (mut x, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert!(matches!(step, Step::Wait));
    assert!(x.pending_token().is_some());
    let (cluster, headers, call) = &host.calls[0];
    assert_eq!((cluster.as_str(), call.path.as_str()), ("v", "/tokenize"));
    assert!(headers.contains(&("content-type".into(), "application/json".into())));
    // A body chunk while the call is out keeps the request held.
    assert_eq!(
        x.on_body_chunk(&p, &mut host, 1, true),
        RequestBodyStep::Wait
    );
    let v = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(40, 512)));
    assert_eq!(v["max_tokens"], 472);
    assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("exact"));
    assert_eq!(header(&x, &p, HEADER_ACTION).as_deref(), Some("rewritten"));
    assert_eq!(host.count(Metric::CacheMisses), 1);
    assert_eq!(host.count(Metric::Rewritten), 1);

    let (x2, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert_eq!(rewritten(step)["max_tokens"], 472);
    assert_eq!(host.calls.len(), 1, "a hit makes no call");
    assert_eq!(host.count(Metric::CacheHits), 1);
    assert_eq!(header(&x2, &p, HEADER_SOURCE).as_deref(), Some("cache"));
}

#[test]
fn an_abandoned_call_keeps_key_and_model_and_stores_its_answer() {
    let (p, mut host) = setup(r#","context_length":512"#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    let token = host.last_token();
    let orphan = x.abandon().expect("a call is out");
    assert_eq!(x.pending_token(), None, "the exchange let the request go");
    assert_eq!(orphan.token(), token);
    assert_eq!(orphan.model, "m");
    let ok = &tokenized(40, 512);
    let answer = |token| Reply {
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
fn a_call_cancelled_with_its_request_is_made_again_uncounted_and_stored() {
    let (p, mut host) = setup(r#","context_length":512"#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    let calls = host.count(Metric::TokenizerCalls);
    let orphan = x.abandon_again(&p, &mut host).expect("a call is out");
    assert_eq!(x.pending_token(), None, "the exchange let the request go");
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.calls[1], host.calls[0], "the same call");
    assert_eq!(orphan.token(), host.last_token());
    assert_eq!(host.count(Metric::TokenizerCalls), calls, "counted once");
    let ok = &tokenized(40, 512);
    assert!(orphan.on_reply(
        &p,
        &mut host,
        &reply_of(orphan.token(), Some(200), ok.as_bytes())
    ));
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert_eq!(rewritten(step)["max_tokens"], 472);
    assert_eq!(host.calls.len(), 2, "the stored count is a hit");
    // Refused: nothing waits.
    let (mut y, _) = send(
        &p,
        &mut host,
        "/v1/chat/completions",
        "{\"model\":\"n\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
    );
    assert!(y.pending_token().is_some());
    host.refuse = true;
    assert!(y.abandon_again(&p, &mut host).is_none());
    assert_eq!(y.pending_token(), None);
}

#[test]
fn an_abandoned_window_call_still_learns_the_window() {
    let (p, mut host) = setup("");
    let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
    let orphan = x.abandon().expect("the window call is out");
    let body = &models(512);
    assert!(orphan.on_reply(
        &p,
        &mut host,
        &reply_of(orphan.token(), Some(200), body.as_bytes())
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
        (Some(200), &tokenized(4, 1024), Failure::Mismatch),
    ];
    for (status, body, failure) in cases {
        let (p, mut host) = setup(r#","context_length":512"#);
        let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
        let token = host.last_token();
        let step = x
            .on_reply(
                &p,
                &mut host,
                &Reply {
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
        assert_eq!(host.count(Metric::Failure(failure)), 1, "{failure:?}");
        assert_eq!(host.count(Metric::Estimates), 1);
        assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
        // Failures are never cached: the same request calls again.
        send(&p, &mut host, "/v1/chat/completions", CHAT);
        assert_eq!(host.calls.len(), 2, "{failure:?}");
    }
    // A reply larger than the limit is not read.
    let (p, mut host) = setup(r#","context_length":512"#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    let token = host.last_token();
    let ok = tokenized(4, 512);
    let ok = ok.as_bytes();
    x.on_reply(
        &p,
        &mut host,
        &Reply {
            token,
            status: Some(200),
            size: MAX_REPLY_BYTES + 1,
            body: ok,
        },
    )
    .unwrap();
    assert_eq!(host.count(Metric::Failure(Failure::Contract)), 1);
    // A refused dispatch.
    let mut host = FakeHost {
        refuse: true,
        ..FakeHost::default()
    };
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    rewritten(step);
    assert_eq!(host.count(Metric::Failure(Failure::Dispatch)), 1);
}

#[test]
fn callbacks_out_of_order_change_nothing() {
    let (p, mut host) = setup(r#","context_length":512"#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    let other = host.last_token() + 7;
    assert!(x
        .on_reply(&p, &mut host, &reply_of(other, Some(200), b""))
        .is_none());
    assert!(
        x.pending_token().is_some(),
        "an unknown token leaves the call out"
    );
    // Trailers instead of an end-of-stream body: not budgeted.
    let mut y = Exchange::new();
    y.on_headers(&p, &mut host, &head("/v1/chat/completions"));
    y.on_trailers(&p, &mut host);
    assert_eq!(host.count(Metric::Unchanged(Reason::NotJson)), 1);
    assert_eq!(
        y.on_body_chunk(&p, &mut host, 10, true),
        RequestBodyStep::Continue
    );
}

#[test]
fn heads_that_are_not_budgeted() {
    let (p, mut host) = setup(r#","context_length":512,"max_body_bytes":100"#);
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
        assert_eq!(x.on_headers(&p, &mut host, &h), RequestHeadStep::Continue);
        assert_eq!(
            header(&x, &p, HEADER_ACTION),
            Some(format!("unchanged:{}", reason.as_str()))
        );
    }
    // Oversize while buffering.
    let mut x = Exchange::new();
    assert_eq!(
        x.on_headers(&p, &mut host, &head("/x")),
        RequestHeadStep::Buffer
    );
    assert_eq!(
        x.on_body_chunk(&p, &mut host, 101, false),
        RequestBodyStep::Continue
    );
    // The head with a content-length over the limit, then this one.
    assert_eq!(host.count(Metric::Unchanged(Reason::TooLarge)), 2);
}

#[test]
fn learned_windows_are_scoped_by_route() {
    let a = plugin_at("a", "");
    let b = plugin_at("b", "");
    let mut host = FakeHost::default();
    let (mut x, _) = send(&a, &mut host, "/v1/chat/completions", CHAT);
    rewritten(reply(&a, &mut host, &mut x, 200, &tokenized(40, 512)));
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
    let (p, mut host) = setup(r#","context_length":512,"on_insufficient":"reject""#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    match reply(&p, &mut host, &mut x, 200, &tokenized(500, 512)) {
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
    let step = reply(&p, &mut host, &mut z, 500, "");
    assert!(!matches!(step, Step::Done(Action::Reply(_))));
}

#[test]
fn responses_are_rendered_and_written_as_max_output_tokens() {
    let (p, mut host) = setup("");
    let (mut x, step) = send(&p, &mut host, "/v1/responses?x=1", RESPONSES);
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls[0].2.path, "/v1/models");
    let step = reply(&p, &mut host, &mut x, 200, &models(512));
    assert!(matches!(step, Step::Wait));
    let call = &host.calls[1].2;
    assert_eq!(call.path, "/v1/responses/render");
    assert_eq!(
        call.body.as_deref(),
        Some(br#"{"model":"m","input":[{"role":"user","content":"hi"}],"store":false}"#.as_slice())
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
    assert_eq!(host.count(Metric::CacheHits), 1);
}

#[test]
fn responses_without_a_renderer_use_the_estimate_and_never_reject() {
    let (p, mut host) = setup(r#","context_length":512,"on_insufficient":"reject""#);
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
    assert_eq!(host.count(Metric::Failure(Failure::Status)), 1);
    assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
    // SGLang renders no Responses request: the estimate, with no count call.
    let (p, mut host) = setup(r#","backend":"sglang"|,"context_length":512"#);
    let (x, step) = send(&p, &mut host, "/v1/responses", RESPONSES);
    assert_eq!(rewritten(step)["max_output_tokens"], 512 - estimate - 32);
    assert!(host.calls.is_empty());
    assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
}

#[test]
fn responses_reject_stateful_and_llamacpp() {
    let (p, mut host) = setup(r#","context_length":512,"on_insufficient":"reject""#);
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
    let (p, mut host) = setup(r#","backend":"llamacpp"|,"context_length":512"#);
    let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
    assert_eq!(host.calls[0].2.path, "/v1/responses/input_tokens");
    let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":12}"#));
    assert_eq!(v["max_output_tokens"], 500);
}

#[test]
fn anthropic_learns_the_window_first_then_counts() {
    let (p, mut host) = setup("");
    let (mut x, step) = send(&p, &mut host, "/v1/messages", MESSAGES);
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls[0].2.path, "/v1/models");
    assert_eq!(host.calls[0].2.method, "GET");
    let step = reply(&p, &mut host, &mut x, 200, &models(512));
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
    let (p, mut host) = setup(r#","context_length":4096"#);
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
    let (y, step) = counted(
        &p,
        &mut host,
        "/v1/messages",
        body,
        r#"{"input_tokens":3100}"#,
    );
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
    let (p, mut host) = setup(r#","backend":"llamacpp"|"#);
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

    let (p, mut host) = setup(r#","backend":"sglang"|"#);
    let (mut x, _) = counted(
        &p,
        &mut host,
        "/v1/chat/completions",
        CHAT,
        r#"{"object":"list","data":[{"id":"m","max_model_len":512}]}"#,
    );
    let v = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(12, 40960)));
    assert_eq!(
        v["max_tokens"], 500,
        "the window is /v1/models', not /tokenize's"
    );
}
