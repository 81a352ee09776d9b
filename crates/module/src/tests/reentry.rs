//! Envoy calling a stream's hooks inside its hooks, and destroying streams and configurations
//! while their calls are out (`slot.rs`, `calls.rs`).

use super::later::{through, turns};
use super::*;
use crate::slot::{After, Slot};
use std::cell::RefCell;
use std::rc::Rc;

fn request_headers(slot: &Slot, f: &mut Fake) -> HeadStatus {
    let go = Some(HeadStatus::Continue);
    let run = |s: &mut Stream, e: &mut dyn Envoy| {
        s.guard(e, HeadStatus::Continue, false, |s, e| {
            s.request_headers(e, false)
        })
    };
    slot.run(f, go, run).0.unwrap()
}

fn request_body(slot: &Slot, f: &mut Fake) -> DataStatus {
    let go = Some(DataStatus::Continue);
    let run = |s: &mut Stream, e: &mut dyn Envoy| {
        s.guard(e, DataStatus::Continue, false, |s, e| {
            s.request_body(e, true)
        })
    };
    slot.run(f, go, run).0.unwrap()
}

fn response_headers(slot: &Slot, f: &mut Fake) -> Option<HeadStatus> {
    let run = |s: &mut Stream, e: &mut dyn Envoy| {
        s.guard(e, HeadStatus::Continue, false, |s, e| {
            s.response_headers(e, true)
        })
    };
    slot.run(f, None, run).0
}

fn counter(names: &[String], name: &str) -> usize {
    names.iter().position(|n| n == name).unwrap()
}

#[test]
fn a_local_reply_inside_the_resume_gets_the_report_headers_and_the_completion() {
    let (shared, _) = shared(CONFIG);
    let slot = Rc::new(Slot::new(Stream::new(shared.clone())));
    let body = chat("a later filter answers at once", 100_000);
    let mut f = post(&body);
    assert_eq!(request_headers(&slot, &mut f), HeadStatus::Stop);
    f.request_body = body.clone();
    assert_eq!(request_body(&slot, &mut f), DataStatus::Buffer);
    assert_eq!(f.callouts.len(), 1);
    // Resuming the request ends in a later filter's local reply: Envoy runs the encode hooks
    // and completes the stream inside `continue_decoding`.
    let reply = Rc::new(RefCell::new(Fake::default()));
    let hooks = Rc::new(RefCell::new(Vec::new()));
    let (inner, g, seen) = (slot.clone(), reply.clone(), hooks.clone());
    f.reenter = Some(Box::new(move |call, _| {
        assert_eq!(call, "resume_request");
        let mut g = g.borrow_mut();
        g.response_headers = vec![(":status".into(), "503".into())];
        seen.borrow_mut().push(response_headers(&inner, &mut g));
        seen.borrow_mut().push(None);
        assert_eq!(inner.complete(&mut *g), After::Keep);
    }));
    assert_eq!(
        slot.answer(&mut f, 7, &answer(&tokenizer_answer(1000))),
        After::Keep
    );
    assert_eq!(f.resumed, 1);
    assert_eq!(*hooks.borrow(), [Some(HeadStatus::Continue), None]);
    let g = reply.borrow();
    assert_eq!(
        header(&g.response_headers, "x-incontext-action"),
        Some("rewritten")
    );
    assert_eq!(
        header(&g.response_headers, "x-incontext-prompt-tokens"),
        Some("1000")
    );
}

#[test]
fn a_call_that_fails_at_once_is_answered_when_its_hook_returns() {
    let (shared, names) = shared(CONFIG);
    let slot = Rc::new(Slot::new(Stream::new(shared.clone())));
    let body = chat("a call that fails inside its send", 100_000);
    let mut f = post(&body);
    assert_eq!(request_headers(&slot, &mut f), HeadStatus::Stop);
    f.request_body = body.clone();
    // Envoy answers the call inside `http_callout`, with no response.
    let (inner, other) = (slot.clone(), Rc::new(RefCell::new(Fake::default())));
    let answered = Rc::new(RefCell::new(Vec::new()));
    let seen = answered.clone();
    f.reenter = Some(Box::new(move |call, id| {
        assert_eq!(call, "callout");
        let failed = CallAnswer {
            status: None,
            size: 0,
            body: &[],
        };
        seen.borrow_mut()
            .push(inner.answer(&mut *other.borrow_mut(), id, &failed));
    }));
    // The answer is taken once the body hook has let go of the stream: the request goes on
    // by the hook's status, on the estimate, not resumed inside it.
    assert_eq!(request_body(&slot, &mut f), DataStatus::Continue);
    assert_eq!(*answered.borrow(), [After::Keep]);
    assert_eq!(f.resumed, 0);
    assert_eq!(f.callouts.len(), 1);
    assert_eq!(
        counted(&names, &f),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_cache_misses", 1),
            ("incontext_tokenizer_calls", 1),
            ("incontext_count_calls", 1),
            ("incontext_tokenizer_failures_transport", 1),
            ("incontext_estimates", 1),
            ("incontext_rewritten", 1),
        ])
    );
}

#[test]
fn a_completion_inside_a_busy_hook_is_run_when_it_returns() {
    let (shared, names) = shared(&config_with(r#""skip_count":true"#));
    shared.calls.set_wake(Box::new(|| {}));
    let t = turns("completed inside a hook", 2, 100);
    let (s, f) = through(&shared, &t[0], 1000);
    drop(f);
    s.destroyed();
    // The second turn goes on its bound; Envoy completes the stream inside its answer's
    // header hook (a reset while it runs).
    let (s, mut f) = through(&shared, &t[1], 1000);
    assert!(f.callouts.is_empty());
    let slot = Slot::new(s);
    let mut g = Fake::default();
    let run = |s: &mut Stream, e: &mut dyn Envoy| {
        assert_eq!(slot.complete(&mut g), After::Keep);
        s.response_trailers(e);
    };
    assert_eq!(slot.run(&mut f, None, run), (Some(()), After::Keep));
    assert_eq!(shared.calls.take().len(), 1, "the completion counted it");
    let id = counter(&names, "incontext_bound_checks");
    assert_eq!(f.counters.get(&id), Some(&1));
    assert!(g.counters.is_empty());
    slot.destroyed();
    assert_eq!(shared.calls.waiting(), 1);
}

#[test]
fn a_stream_destroyed_inside_its_hooks_is_freed_when_the_outermost_returns() {
    let (shared, _) = shared(CONFIG);
    let slot = Slot::new(Stream::new(shared.clone()));
    assert_eq!(slot.destroy(), After::Free);
    let mut f = post(b"{}");
    let mut g = Fake::default();
    let outer = |_: &mut Stream, _: &mut dyn Envoy| {
        // Nested: a hook Envoy runs inside this one finds the stream busy and is left out.
        let inner = |_: &mut Stream, _: &mut dyn Envoy| unreachable!("the stream is busy");
        assert_eq!(slot.run(&mut g, None, inner), (None, After::Keep));
        assert_eq!(slot.destroy(), After::Keep);
        assert_eq!(slot.complete(&mut g), After::Keep);
    };
    assert_eq!(slot.run(&mut f, None, outer), (Some(()), After::Free));
    assert_eq!(Arc::strong_count(&shared), 2);
    slot.destroyed();
    assert_eq!(Arc::strong_count(&shared), 1);
}

#[test]
fn a_panic_in_the_completion_leaves_nothing_waiting() {
    let (shared, names) = shared(&config_with(r#""skip_count":true"#));
    shared.calls.set_wake(Box::new(|| {}));
    let t = turns("a panic in the completion", 2, 100);
    let (s, _) = through(&shared, &t[0], 1000);
    s.destroyed();
    let (mut s, mut f) = through(&shared, &t[1], 1000);
    // The count is handed over, then counting it panics.
    f.panic_on_counter = Some(counter(&names, "incontext_bound_checks"));
    s.guard(&mut f, (), false, |s, e| s.complete(e));
    assert_eq!(shared.calls.waiting(), 1);
    assert_eq!(
        f.counters.get(&counter(&names, "incontext_panics")),
        Some(&1)
    );
    s.destroyed();
    assert_eq!(shared.calls.waiting(), 0);
}

#[test]
fn a_configuration_destroyed_while_its_count_is_out_leaves_nothing() {
    let (shared, _) = shared(&config_with(r#""skip_count":true"#));
    shared.calls.set_wake(Box::new(|| {}));
    let t = turns("destroyed while counting", 3, 100);
    let (s, _) = through(&shared, &t[0], 1000);
    s.destroyed();
    let (mut s, mut f) = through(&shared, &t[1], 1000);
    s.complete(&mut f);
    let out = shared.calls.take();
    assert_eq!(out.len(), 1);
    shared.calls.sent(out[0].0, Some(5), &shared);
    shared.calls.all_sent();
    s.destroyed();
    assert_eq!(shared.calls.waiting(), 1);
    // The listener is updated: Envoy destroys the configuration; a stream of it still
    // completing hands nothing over.
    shared.calls.close();
    let (mut u, mut g) = through(&shared, &t[2], 1000);
    u.complete(&mut g);
    assert!(shared.calls.take().is_empty());
    u.destroyed();
    // The answer Envoy may still deliver is stored; then nothing is left.
    shared
        .calls
        .answered(5, &answer(&tokenizer_answer(1000)), &shared);
    assert_eq!(shared.calls.waiting(), 0);
    assert_eq!(Arc::strong_count(&shared), 1);
}

#[test]
fn a_configuration_call_answered_inside_its_send_is_taken_when_sent() {
    let (shared, _) = shared(&config_with(r#""skip_count":true"#));
    shared.calls.set_wake(Box::new(|| {}));
    let t = turns("answered inside the send", 2, 100);
    let (s, _) = through(&shared, &t[0], 1000);
    s.destroyed();
    for refused in [false, true] {
        let (mut s, mut f) = through(&shared, &t[1], 1000);
        s.complete(&mut f);
        s.destroyed();
        let out = shared.calls.take();
        assert_eq!(out.len(), 1);
        assert_eq!(shared.calls.waiting(), 1);
        // Inside `http_callout`: the answer, before the send has returned the id.
        let failed = CallAnswer {
            status: None,
            size: 0,
            body: &[],
        };
        shared.calls.answered(9, &failed, &shared);
        let id = if refused { None } else { Some(9) };
        shared.calls.sent(out[0].0, id, &shared);
        shared.calls.all_sent();
        assert_eq!(shared.calls.waiting(), 0, "refused: {refused}");
    }
}

#[test]
fn the_payload_of_the_calls_out_is_bounded() {
    let (shared, _) = shared(CONFIG);
    let calls = crate::calls::Calls::with_max_payload(100);
    calls.set_wake(Box::new(|| {}));
    let call = |n: usize| incontext_core::flow::Call {
        method: "POST",
        path: "/tokenize".into(),
        body: Some(vec![b'x'; n]),
        kind: incontext_core::backend::CallKind::Tokenize,
    };
    assert_eq!(calls.send("vllm", &[], &call(60), 100), Some(0));
    assert_eq!(
        calls.send("vllm", &[], &call(41), 100),
        None,
        "over the bound"
    );
    assert_eq!(calls.send("vllm", &[], &call(40), 100), Some(1));
    assert_eq!(calls.payload_bytes(), 100);
    let out = calls.take();
    assert_eq!(out.len(), 2);
    // Refused by Envoy, or answered: its payload is no longer out.
    calls.sent(0, None, &shared);
    assert_eq!(calls.payload_bytes(), 40);
    calls.sent(1, Some(3), &shared);
    calls.all_sent();
    assert_eq!(calls.payload_bytes(), 40);
    calls.answered(3, &answer(&tokenizer_answer(5)), &shared);
    assert_eq!(calls.payload_bytes(), 0);
    assert_eq!(calls.send("vllm", &[], &call(100), 100), Some(2));
}
