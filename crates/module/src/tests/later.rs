//! Calls made on behalf of the configuration after their stream, and what their answers
//! count.

use super::*;

/// The bodies of a conversation's first turns, each with one more tool round (a model of its
/// own: the table is the process's, shared by every test).
pub(super) fn turns(tag: &str, n: usize, cap: u64) -> Vec<Vec<u8>> {
    let question = format!("fix the bug {tag}");
    let mut messages = vec![serde_json::json!({"role": "user", "content": question})];
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            serde_json::to_vec(&serde_json::json!({
                "model": format!("m {tag}"),
                "messages": messages,
                "max_tokens": cap,
                "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
            }))
            .unwrap(),
        );
        messages.push(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("c{i}"), "type": "function",
             "function": {"name": "read", "arguments": format!("{{\"path\":\"f{i}\"}}")}}]}),
        );
        messages.push(
            serde_json::json!({"role": "tool", "tool_call_id": format!("c{i}"),
                                         "content": "x".repeat(200)}),
        );
    }
    out
}

/// A stream through its request (answered by `count` when it calls) and its answer.
pub(super) fn through(shared: &Arc<Shared>, body: &[u8], count: usize) -> (Stream, Fake) {
    let mut f = post(body);
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    if send_body(&mut s, &mut f, body) == DataStatus::Buffer {
        s.callout_done(&mut f, 7, &answer(&tokenizer_answer(count)));
    }
    f.response_headers = vec![(":status".into(), "200".into())];
    s.response_headers(&mut f, false);
    (s, f)
}

#[test]
fn a_skipped_request_is_counted_after_its_stream_by_the_configuration() {
    let config = config_with(r#""skip_count":true"#);
    for answer_first in [false, true] {
        let (shared, names) = shared(&config);
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w = woken.clone();
        shared.calls.set_wake(Box::new(move || {
            w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        let t = turns(&format!("after its stream {answer_first}"), 3, 100);
        let (mut s, mut f) = through(&shared, &t[0], 1000);
        s.complete(&mut f);
        s.destroyed();
        assert!(shared.calls.take().is_empty());

        // The second turn goes on its bound, with no call; at its end the configuration
        // counts it (the counters of the hand-over move with the stream).
        let (mut s, mut f) = through(&shared, &t[1], 1000);
        assert!(f.callouts.is_empty());
        assert_eq!(
            header(&f.response_headers, "x-incontext-source"),
            Some("bound")
        );
        s.complete(&mut f);
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1);
        let moved = counted(&names, &f);
        assert!(
            moved.contains(&("incontext_bound_checks".into(), 1)),
            "{moved:?}"
        );
        let out = shared.calls.take();
        assert_eq!(out.len(), 1);
        let (token, call) = &out[0];
        assert_eq!(call.cluster, "vllm");
        assert!(call.headers.contains(&(":path".into(), "/tokenize".into())));
        assert!(!call.body.is_empty());
        shared.calls.sent(*token, Some(42), &shared);
        // A count far above the bound, before or after the stream is gone.
        let reply = tokenizer_answer(30_000);
        if answer_first {
            shared.calls.answered(42, &answer(&reply), &shared);
            s.destroyed();
        } else {
            s.destroyed();
            shared.calls.answered(42, &answer(&reply), &shared);
        }
        assert_eq!(shared.calls.waiting(), 0);

        // Skipping is off: the third turn is counted before it goes on. Its stream is the
        // configuration's next: what the answer counted moves with it, once.
        let mut g = post(&t[2]);
        let mut u = Stream::new(shared.clone());
        assert_eq!(u.request_headers(&mut g, false), HeadStatus::Stop);
        assert_eq!(
            counted(&names, &g),
            counts(&[("incontext_bound_violations", 1), ("incontext_requests", 1)])
        );
        let mut h = post(&t[2]);
        let mut v = Stream::new(shared.clone());
        v.request_headers(&mut h, false);
        assert_eq!(counted(&names, &h), counts(&[("incontext_requests", 1)]));
        assert_eq!(send_body(&mut u, &mut g, &t[2]), DataStatus::Buffer);
        assert_eq!(g.callouts.len(), 1, "answer first: {answer_first}");
    }
}

#[test]
fn without_a_scheduler_no_call_is_handed_over() {
    let (shared, _) = shared(CONFIG);
    let call = incontext_core::flow::Call {
        method: "POST",
        path: "/tokenize".into(),
        body: Some(b"{}".to_vec()),
        kind: incontext_core::backend::CallKind::Tokenize,
    };
    assert_eq!(shared.calls.send("vllm", &[], &call, 100), None);
    shared.calls.set_wake(Box::new(|| {}));
    assert_eq!(shared.calls.send("vllm", &[], &call, 100), Some(0));
    shared.calls.sent(0, None, &shared);
    assert_eq!(shared.calls.waiting(), 0);
    shared.calls.close();
    assert_eq!(shared.calls.send("vllm", &[], &call, 100), None);
}

#[test]
fn the_count_of_a_request_whose_client_left_is_made_again_and_stored() {
    let (shared, names) = shared(CONFIG);
    let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = woken.clone();
    shared.calls.set_wake(Box::new(move || {
        w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    let body = chat("a client that leaves while its prompt is counted", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    assert_eq!(f.callouts.len(), 1);
    // The client leaves: Envoy completes the stream, destroys it and cancels its call.
    s.complete(&mut f);
    assert!(shared.calls.take().is_empty());
    s.destroyed();
    assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1);
    let out = shared.calls.take();
    assert_eq!(out.len(), 1);
    let (token, call) = &out[0];
    let (cluster, headers, payload) = &f.callouts[0];
    assert_eq!(
        (&call.cluster, &call.headers, &call.body),
        (cluster, headers, payload)
    );
    // Counted once, by the stream.
    assert_eq!(
        counted(&names, &f),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_cache_misses", 1),
            ("incontext_tokenizer_calls", 1),
            ("incontext_count_calls", 1),
        ])
    );
    assert_eq!(shared.calls.waiting(), 1);
    shared.calls.sent(*token, Some(11), &shared);
    shared
        .calls
        .answered(11, &answer(&tokenizer_answer(1000)), &shared);
    assert_eq!(shared.calls.waiting(), 0);

    // The same prompt again: a hit, no call.
    let mut g = post(&body);
    let mut t = Stream::new(shared.clone());
    assert_eq!(t.request_headers(&mut g, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut t, &mut g, &body), DataStatus::Continue);
    assert!(g.callouts.is_empty());
    assert_eq!(
        counted(&names, &g),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_cache_hits", 1),
            ("incontext_rewritten", 1),
        ])
    );
}

#[test]
fn a_call_cancelled_with_its_stream_is_not_made_again_without_a_scheduler() {
    let (shared, _) = shared(CONFIG);
    let body = chat("a client that leaves, no scheduler", 100_000);
    let mut f = post(&body);
    let mut s = Stream::new(shared.clone());
    s.request_headers(&mut f, false);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Buffer);
    s.destroyed();
    assert!(shared.calls.take().is_empty());
    assert_eq!(shared.calls.waiting(), 0);
}
