use super::support::*;
use crate::flow::*;

/// Two routes on two servers; the top level has no tokenizer.
fn routed() -> Plugin {
    Plugin::new(
        Config::parse(
            br#"{"min_output_tokens":64,"fallback_margin_tokens":32,"routes":[
            {"model":"coder","tokenizer":{"cluster":"a"}},
            {"model":["small","tiny"],"tokenizer":{"cluster":"b"},"on_insufficient":"reject"}]}"#,
        )
        .unwrap(),
    )
}

#[test]
fn each_model_is_counted_on_its_own_route() {
    let p = routed();
    assert_eq!(p.route_names().count(), 2);
    let mut host = FakeHost::default();
    // The small model first: counted on b, whose /tokenize reports b's window.
    let small = CHAT.replace(r#""m""#, r#""small""#);
    let (mut x, step) = send(&p, &mut host, "/v1/chat/completions", &small);
    assert!(
        matches!(step, Step::Wait),
        "{step:?} {:?}",
        x.response_headers(&p)
    );
    assert_eq!(host.calls[0].0, "b");
    assert_eq!(host.calls[0].2.path, "/tokenize");
    let v = rewritten(reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"count":10,"max_model_len":2048,"tokens":[]}"#,
    ));
    assert_eq!(v["max_tokens"], 2038);
    // The coder model through the Anthropic dialect: its window comes from a's model
    // list, never from what b reported.
    let coder = MESSAGES.replace(r#""m""#, r#""coder""#);
    let (mut x, step) = send(&p, &mut host, "/v1/messages", &coder);
    assert!(matches!(step, Step::Wait));
    assert_eq!(
        (host.calls[1].0.as_str(), host.calls[1].2.path.as_str()),
        ("a", "/v1/models")
    );
    let step = reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"data":[{"id":"coder","max_model_len":8192}]}"#,
    );
    assert!(matches!(step, Step::Wait));
    assert_eq!(
        (host.calls[2].0.as_str(), host.calls[2].2.path.as_str()),
        ("a", "/v1/messages/count_tokens")
    );
    let v = rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":30}"#));
    assert_eq!(v["max_tokens"], 8162);
    // Learned windows and cache entries live in each route's own scope.
    assert_eq!(
        learned(&p, &mut host, RouteId::Named(0), "coder"),
        Some(8192)
    );
    assert_eq!(learned(&p, &mut host, RouteId::Named(1), "coder"), None);
    assert_eq!(
        learned(&p, &mut host, RouteId::Named(1), "small"),
        Some(2048)
    );
    // The same chat for the small model is a hit in b's scope; for tiny (same route) too.
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", &small);
    assert!(matches!(step, Step::Done(Action::Rewrite(_))));
    assert_eq!(host.calls.len(), 3);
    // Each route's policy: b rejects what does not fit.
    let big = CHAT
        .replace(r#""m""#, r#""tiny""#)
        .replace("hi", "hi there");
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", &big);
    assert_eq!(host.calls[3].0, "b");
    let step = reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"count":2040,"max_model_len":2048,"tokens":[]}"#,
    );
    assert!(matches!(step, Step::Done(Action::Reply(_))), "{step:?}");
    // Metrics count for the route too.
    let route = |i: usize, m: Metric| host.route_metrics.contains(&(i, m));
    assert!(route(1, Metric::Requests) && route(0, Metric::Requests));
    assert!(route(1, Metric::Rewritten) && route(0, Metric::Rewritten));
    assert!(route(1, Metric::Rejected) && !route(0, Metric::Rejected));
    assert!(route(1, Metric::CacheHits) && !route(0, Metric::CacheHits));
    assert_eq!(host.count(Metric::Rejected), 1);
}

#[test]
fn a_model_no_route_names_uses_the_top_level() {
    // Without a top-level tokenizer: unchanged, `model`, with no call.
    let p = routed();
    let mut host = FakeHost::default();
    let (x, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert!(host.calls.is_empty());
    assert_eq!(
        header(&x, &p, HEADER_ACTION).as_deref(),
        Some("unchanged:model")
    );
    assert!(host.route_metrics.is_empty());
    // With one: counted there, in the top level's scope.
    let p = Plugin::new(
        Config::parse(
            br#"{"tokenizer":{"cluster":"top"},"context_length":512,"min_output_tokens":64,
            "fallback_margin_tokens":32,"routes":[{"model":"coder","tokenizer":{"cluster":"a"}}]}"#,
        )
        .unwrap(),
    );
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert_eq!(host.calls[0].0, "top");
    let v = rewritten(reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"count":12,"max_model_len":512,"tokens":[]}"#,
    ));
    assert_eq!(v["max_tokens"], 500);
    assert!(host.route_metrics.is_empty());
}

#[test]
fn an_abandoned_call_stores_its_answer_in_its_route() {
    let p = routed();
    let mut host = FakeHost::default();
    let small = CHAT.replace(r#""m""#, r#""small""#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", &small);
    let token = host.last_token();
    let orphan = x.abandon().expect("a call is out");
    let ok = &tokenized(40, 2048);
    let answer = Reply {
        token,
        status: Some(200),
        size: ok.len(),
        body: ok.as_bytes(),
    };
    assert!(orphan.on_reply(&p, &mut host, &answer));
    assert_eq!(
        learned(&p, &mut host, RouteId::Named(1), "small"),
        Some(2048)
    );
    assert_eq!(learned(&p, &mut host, RouteId::Top, "small"), None);
    assert!(host.route_metrics.contains(&(1, Metric::CacheMisses)));
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", &small);
    assert_eq!(rewritten(step)["max_tokens"], 2008);
    assert_eq!(
        host.calls.len(),
        1,
        "the stored count is a hit in its route"
    );
}
