//! Each callback as Envoy makes it: contexts, call tokens, orphans, configuration, logs.

use super::*;

#[test]
fn a_call_is_made_for_the_root_and_answered_in_the_stream() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (stream, step) = vm.send(root, CHAT);
    assert_eq!(step, PAUSE, "held while the count runs");
    let calls = vm.host.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].0, calls[0].2.as_str()),
        (root, "/tokenize"),
        "dispatched on behalf of the root"
    );
    assert_eq!(
        vm.host.effective, stream,
        "back to the stream after the dispatch"
    );
    assert_eq!(vm.filter.held(), (1, 1, 0));

    vm.answer(root, calls[0].1, 200, &count(96));
    assert_eq!(vm.body_of(stream)["max_tokens"], 4096 - 96);
    assert_eq!(
        &vm.host.events[1..],
        [
            crate::tests::Event::SetBody { context: stream },
            crate::tests::Event::Resume { context: stream }
        ],
        "the body is replaced and the request resumed in the stream's context"
    );
    assert_eq!(vm.filter.held(), (1, 0, 0), "the token is forgotten");
    assert_eq!(
        vm.filter.on_response_headers(&mut vm.host, stream, false),
        CONTINUE
    );
    assert!(vm.host.response_headers[&stream]
        .contains(&("x-incontext-action".into(), "rewritten".into())));
    vm.delete(stream);
    assert_eq!(vm.filter.held(), (0, 0, 0));
    assert_eq!(vm.host.metric("incontext_rewritten"), 1);
}

#[test]
fn the_answer_of_a_gone_stream_is_stored_without_its_body() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (stream, _) = vm.send(root, CHAT);
    let token = vm.last_token();
    vm.delete(stream);
    assert_eq!(
        vm.filter.held(),
        (0, 0, 1),
        "an orphan waits for the answer"
    );
    assert_eq!(vm.host.metric("incontext_orphans"), 1);
    assert!(
        vm.filter.orphan_bytes() < 256,
        "the orphan keeps the key and the model, not the body"
    );

    vm.answer(root, token, 200, &count(96));
    assert_eq!(vm.filter.held(), (0, 0, 0));
    assert_eq!(vm.host.metric("incontext_orphans"), 0);
    assert_eq!(vm.host.resumes(), 0);

    // The same prompt again: a cache hit, no call.
    vm.cache_hit(root, 4096 - 96);
}

#[test]
fn a_gone_stream_with_a_big_body_leaves_a_small_orphan() {
    let mut vm = Vm::new();
    let root = vm.root();
    let text = "x".repeat(1 << 20);
    let body = CHAT.replace("\"hi\"", &format!("\"{text}\""));
    let (stream, step) = vm.send(root, &body);
    assert_eq!(step, PAUSE);
    vm.delete(stream);
    assert_eq!(vm.filter.held(), (0, 0, 1));
    assert!(
        vm.filter.orphan_bytes() < 256,
        "{}",
        vm.filter.orphan_bytes()
    );
}

#[test]
fn an_answer_for_a_stream_the_host_no_longer_knows_is_stored_as_an_orphans() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (stream, step) = vm.send(root, CHAT);
    assert_eq!(step, PAUSE);
    let token = vm.last_token();
    // The stream went in the host before its deletion reached the filter.
    vm.host.refuse_context.push(stream);
    vm.answer(root, token, 200, &count(96));
    assert_eq!(
        vm.filter.held(),
        (0, 0, 0),
        "the stream and its call are forgotten"
    );
    assert_eq!(vm.host.resumes(), 0);
    // Its deletion arrives later and changes nothing.
    vm.delete(stream);
    assert_eq!(vm.filter.held(), (0, 0, 0));
    // The answer was stored: the same prompt again is a cache hit, no call.
    vm.cache_hit(root, 4096 - 96);
}

#[test]
fn a_failed_late_answer_is_counted_not_stored() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (stream, _) = vm.send(root, CHAT);
    let token = vm.last_token();
    vm.delete(stream);
    vm.answer(root, token, 500, "{}");
    assert_eq!(vm.host.metric("incontext_tokenizer_failures_status"), 1);
    assert_eq!(vm.filter.held(), (0, 0, 0));
    let (_, step) = vm.send(root, CHAT);
    assert_eq!(
        step, PAUSE,
        "nothing was stored: the same prompt is counted again"
    );
}

#[test]
fn deleting_the_root_purges_its_orphans_only() {
    let mut vm = Vm::new();
    let a = vm.root();
    let b = vm.root();
    let (sa, _) = vm.send(a, CHAT);
    let (sb, _) = vm.send(b, &CHAT.replace("hi", "hello"));
    let tb = vm.last_token();
    vm.delete(sa);
    vm.delete(sb);
    assert_eq!(vm.filter.held(), (0, 0, 2));
    assert_eq!(vm.host.metric("incontext_orphans"), 2);
    // Envoy cancels a's calls when it deletes a: no answer comes for its orphan.
    vm.delete(a);
    assert_eq!(vm.filter.held(), (0, 0, 1));
    assert_eq!(vm.host.metric("incontext_orphans"), 1);
    // b's orphan is still answered and stored.
    vm.answer(b, tb, 200, &count(7));
    assert_eq!(vm.filter.held(), (0, 0, 0));
    assert_eq!(vm.host.metric("incontext_orphans"), 0);
    let (again, step) = vm.send(b, &CHAT.replace("hi", "hello"));
    assert_eq!(step, CONTINUE);
    assert_eq!(vm.body_of(again)["max_tokens"], 4096 - 7);
}

#[test]
fn unknown_tokens_and_contexts_change_nothing() {
    let mut vm = Vm::new();
    let root = vm.root();
    vm.answer(root, 77, 200, &count(1));
    vm.delete(99);
    assert_eq!(
        vm.filter.on_request_body(&mut vm.host, 99, 10, true),
        CONTINUE
    );
    let (stream, _) = vm.send(root, CHAT);
    vm.answer(root, vm.last_token() + 1, 200, &count(1));
    assert_eq!(
        vm.filter.held(),
        (1, 1, 0),
        "the stream still waits for its own call"
    );
    assert_eq!(vm.host.resumes(), 0);
    vm.answer(root, vm.last_token(), 200, &count(1));
    assert_eq!(vm.body_of(stream)["max_tokens"], 4095);
}

#[test]
fn a_stream_gone_before_its_call_leaves_nothing() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (id, _) = vm.open(
        root,
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
    );
    vm.host.request_body.insert(id, b"{\"mo".to_vec());
    assert_eq!(vm.filter.on_request_body(&mut vm.host, id, 4, false), PAUSE);
    vm.delete(id);
    assert_eq!(vm.filter.held(), (0, 0, 0));
    assert!(vm.host.calls().is_empty());
}

#[test]
fn the_window_call_then_the_count_call_each_get_their_token() {
    let mut vm = Vm::new();
    let (root, ok) = vm.root_with(
        r#"{"tokenizer":{"cluster":"vllm"},"min_output_tokens":64,"fallback_margin_tokens":32}"#,
    );
    assert!(ok);
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#;
    let (stream, _) = vm.post(root, "/v1/messages", body);
    let window = vm.last_token();
    assert_eq!(vm.host.calls()[0].2, "/v1/models");
    vm.answer(
        root,
        window,
        200,
        r#"{"data":[{"id":"m","max_model_len":1024}]}"#,
    );
    let calls = vm.host.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[1].0, calls[1].2.as_str()),
        (root, "/v1/messages/count_tokens")
    );
    assert_eq!(
        vm.filter.held(),
        (1, 1, 0),
        "only the count call's token is kept"
    );
    // The stream goes while its count call is out; the window was learned already.
    vm.delete(stream);
    vm.answer(root, calls[1].1, 200, r#"{"input_tokens":10}"#);
    assert_eq!(vm.filter.held(), (0, 0, 0));
}

#[test]
fn a_refused_context_switch_leaves_the_request_unchanged() {
    let mut vm = Vm::new();
    let root = vm.root();
    vm.host.refuse_context.push(root);
    let (stream, step) = vm.send(root, CHAT);
    assert_eq!(
        step, CONTINUE,
        "not dispatched: the estimate decides at once"
    );
    assert!(vm.host.calls().is_empty());
    assert_eq!(vm.host.metric("incontext_tokenizer_failures_dispatch"), 1);
    assert_eq!(vm.host.metric("incontext_estimates"), 1);
    assert_eq!(vm.filter.held(), (1, 0, 0));
    vm.delete(stream);
}

#[test]
fn an_invalid_configuration_is_refused_and_its_streams_pass() {
    let mut vm = Vm::new();
    let (root, ok) = vm.root_with(r#"{"tokenizer":{}}"#);
    assert!(!ok);
    let (stream, step) = vm.send(root, CHAT);
    assert_eq!(step, CONTINUE);
    assert!(vm.host.calls().is_empty());
    assert_eq!(vm.host.request_body[&stream], CHAT.as_bytes());
    vm.delete(stream);
    assert_eq!(vm.filter.held(), (0, 0, 0));
}

#[test]
fn the_log_level_is_read_on_every_request() {
    let mut vm = Vm::new();
    let root = vm.root();
    let before = vm.host.level_reads;
    for _ in 0..3 {
        let (s, _) = vm.send(root, r#"{"model":"m"}"#);
        vm.delete(s);
    }
    assert_eq!(vm.host.level_reads - before, 3);
    assert_eq!(logger::filter_for(Some(0)), log::LevelFilter::Trace);
    assert_eq!(logger::filter_for(Some(1)), log::LevelFilter::Debug);
    assert_eq!(logger::filter_for(None), log::LevelFilter::Info);
    assert_eq!(logger::filter_for(Some(3)), log::LevelFilter::Warn);
    assert_eq!(logger::filter_for(Some(5)), log::LevelFilter::Error);
}

#[test]
fn a_panic_is_logged_with_its_place_only() {
    let secret = "the prompt";
    let here = std::panic::Location::caller();
    let line = logger::panic_line(Some(here));
    assert!(line.contains(here.file()) && line.contains(&here.line().to_string()));
    assert!(!line.contains(secret));
    assert_eq!(logger::panic_line(None), "incontext: panicked");
}

#[test]
fn the_memory_gauge_adds_this_vms_change() {
    let mut vm = Vm::new();
    let root = vm.root();
    vm.host.memory = 1 << 20;
    let (s, _) = vm.send(root, r#"{"model":"m"}"#);
    vm.delete(s);
    assert_eq!(vm.host.metric("incontext_wasm_memory_bytes"), 1 << 20);
    vm.host.memory = 3 << 20;
    let (s, _) = vm.send(root, r#"{"model":"m"}"#);
    vm.delete(s);
    assert_eq!(vm.host.metric("incontext_wasm_memory_bytes"), 3 << 20);
    // A second root in the same VM defines no second gauge: the VM's memory counts once.
    vm.root();
    let (s, _) = vm.send(root, r#"{"model":"m"}"#);
    vm.delete(s);
    assert_eq!(vm.host.metric("incontext_wasm_memory_bytes"), 3 << 20);
}

#[test]
fn a_skipped_request_is_counted_when_its_stream_ends_and_checked_after_it_is_gone() {
    let mut vm = Vm::new();
    let (root, ok) = vm.root_with(SKIP);
    assert!(ok);
    let first = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}"#;
    let grown = r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}],"max_tokens":100}"#;
    let (s1, _) = vm.send(root, first);
    vm.answer(root, vm.last_token(), 200, &count(96));
    vm.delete(s1);
    let (s2, step) = vm.send(root, grown);
    assert_eq!(
        step, CONTINUE,
        "a bound proves the cap fits: no call, not held"
    );
    assert_eq!(vm.host.calls().len(), 1);
    vm.filter.on_response_headers(&mut vm.host, s2, false);
    assert!(vm.host.response_headers[&s2]
        .contains(&("x-incontext-action".into(), "unchanged:fits".into())));
    assert_eq!(vm.host.calls().len(), 1, "nothing while the answer streams");
    vm.host.effective = s2;
    vm.filter.on_log(&mut vm.host, s2);
    assert_eq!(
        vm.host.calls().len(),
        2,
        "the check goes out when the stream ends"
    );
    let token = vm.last_token();
    vm.delete(s2);
    // A count far above the bound: skipping turns off for the route.
    vm.answer(root, token, 200, &count(4000));
    assert_eq!(vm.host.metric("incontext_bound_checks"), 1);
    assert_eq!(vm.host.metric("incontext_bound_violations"), 1);
    assert_eq!(vm.filter.held(), (0, 0, 0));
}

#[test]
fn a_tail_count_resumes_the_request_unchanged_or_hands_over_to_the_whole_count() {
    let mut vm = Vm::new();
    let (root, ok) = vm.root_with(SKIP);
    assert!(ok);
    let first = |who: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{who}"}}],"max_tokens":3000}}"#
        )
    };
    let grown = |who: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{who}"}},{{"role":"assistant","content":"yo"}},{{"role":"user","content":"more"}}],"max_tokens":3000}}"#
        )
    };
    // Anchored 1040 tokens: the new messages' bytes do not prove 3000 fit 4096, their count may.
    for (who, tail, band) in [("a", 10, None), ("b", 50, Some(4096 - (1040 + 50 + 16)))] {
        let (s1, _) = vm.send(root, &first(who));
        vm.answer(root, vm.last_token(), 200, &count(1040));
        vm.delete(s1);
        let body = grown(who);
        let (s2, step) = vm.send(root, &body);
        assert_eq!(step, PAUSE, "held while the tail is counted");
        let calls = vm.host.calls();
        assert_eq!(calls.last().map(|c| c.2.as_str()), Some("/tokenize"));
        assert_eq!(vm.filter.held(), (1, 1, 0));
        let events = vm.host.events.len();
        vm.answer(root, vm.last_token(), 200, &count(tail));
        match band {
            None => {
                // 1040 + 10 + SEAM fits: resumed as it came, no further call.
                assert_eq!(
                    vm.host.events[events..],
                    [crate::tests::Event::Resume { context: s2 }]
                );
                assert_eq!(vm.host.request_body[&s2], body.as_bytes());
                assert_eq!(vm.filter.held(), (1, 0, 0));
                // Checked once its stream ended, like any skipped request.
                vm.delete(s2);
                assert_eq!(vm.filter.held(), (0, 0, 1));
                vm.answer(root, vm.last_token(), 200, &count(1060));
                assert_eq!(vm.filter.held(), (0, 0, 0));
                continue;
            }
            Some(value) => {
                // 1040 + 50 + SEAM leaves less than 3000 but more than R: the cap is written
                // from the bound, with no further call, and the request resumed.
                assert_eq!(vm.host.calls().len(), calls.len());
                assert_eq!(
                    vm.host.events[events..],
                    [
                        crate::tests::Event::SetBody { context: s2 },
                        crate::tests::Event::Resume { context: s2 }
                    ]
                );
                assert_eq!(vm.body_of(s2)["max_tokens"], value);
                assert_eq!(vm.filter.held(), (1, 0, 0));
            }
        }
        vm.delete(s2);
    }
    assert_eq!(vm.host.metric("incontext_tail_counts"), 2);
    assert_eq!(vm.host.metric("incontext_count_skipped"), 2);
    assert_eq!(vm.host.metric("incontext_bound_violations"), 0);
}

#[test]
fn the_decision_is_published_in_the_stream_before_the_request_resumes() {
    let mut vm = Vm::new();
    let root = vm.root();
    let (stream, _) = vm.send(root, CHAT);
    assert!(
        !vm.host.published.contains_key(&stream),
        "nothing before the count"
    );
    let calls = vm.host.calls();
    let at = vm.host.trace.len();
    vm.answer(root, calls[0].1, 200, &count(96));
    let pairs = |v: &[(&str, String)]| -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    };
    let cap = 4096 - 96;
    assert_eq!(
        vm.host.published[&stream],
        pairs(&[
            ("incontext.outcome", "rewritten".into()),
            ("incontext.source", "exact".into()),
            ("incontext.prompt_tokens", "96".into()),
            ("incontext.window", "4096".into()),
            ("incontext.max_tokens", cap.to_string()),
            ("incontext.charge", "4096".into()),
        ])
    );
    let after: Vec<&str> = vm.host.trace[at..]
        .iter()
        .copied()
        .filter(|c| matches!(*c, "set_property" | "resume_request" | "set_buffer"))
        .collect();
    let mut expected = vec!["set_buffer"];
    expected.extend(["set_property"; 6]);
    expected.push("resume_request");
    assert_eq!(after, expected);
    assert!(
        !vm.host.published.contains_key(&root),
        "the root publishes nothing"
    );
}
