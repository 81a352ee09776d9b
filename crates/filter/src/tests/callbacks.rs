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
    assert!(vm
        .host
        .events
        .iter()
        .all(|e| !matches!(e, Event::Resume { .. })));

    // The same prompt again: a cache hit, no call.
    let (again, step) = vm.send(root, CHAT);
    assert_eq!(step, CONTINUE);
    assert_eq!(vm.host.calls().len(), 1);
    assert_eq!(vm.body_of(again)["max_tokens"], 4096 - 96);
    assert_eq!(vm.host.metric("incontext_cache_hits"), 1);
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
    assert!(vm
        .host
        .events
        .iter()
        .all(|e| !matches!(e, Event::Resume { .. })));
    // Its deletion arrives later and changes nothing.
    vm.delete(stream);
    assert_eq!(vm.filter.held(), (0, 0, 0));
    // The answer was stored: the same prompt again is a cache hit, no call.
    let (again, step) = vm.send(root, CHAT);
    assert_eq!(step, CONTINUE);
    assert_eq!(vm.host.calls().len(), 1);
    assert_eq!(vm.body_of(again)["max_tokens"], 4096 - 96);
    assert_eq!(vm.host.metric("incontext_cache_hits"), 1);
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
    assert!(vm
        .host
        .events
        .iter()
        .all(|e| !matches!(e, Event::Resume { .. })));
    vm.answer(root, vm.last_token(), 200, &count(1));
    assert_eq!(vm.body_of(stream)["max_tokens"], 4095);
}

#[test]
fn a_stream_gone_before_its_call_leaves_nothing() {
    let mut vm = Vm::new();
    let root = vm.root();
    let id = vm.context();
    vm.filter.on_context_create(id, root);
    vm.host.effective = id;
    vm.host.request_headers.insert(
        id,
        vec![
            (":method".into(), "POST".into()),
            (":path".into(), "/v1/chat/completions".into()),
        ],
    );
    vm.filter.on_request_headers(&mut vm.host, id, false);
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
    let (stream, _) = {
        let id = vm.context();
        vm.filter.on_context_create(id, root);
        vm.host.effective = id;
        vm.host.request_headers.insert(
            id,
            vec![
                (":method".into(), "POST".into()),
                (":path".into(), "/v1/messages".into()),
            ],
        );
        vm.filter.on_request_headers(&mut vm.host, id, false);
        vm.host.request_body.insert(id, body.as_bytes().to_vec());
        let step = vm
            .filter
            .on_request_body(&mut vm.host, id, body.len(), true);
        (id, step)
    };
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

impl Vm {
    /// The upstream answers `stream` with this head and body in these chunks, as Envoy
    /// delivers them (it keeps what the filter buffers and hands over the total); what the
    /// client receives and the answer's head after the filter.
    fn upstream(
        &mut self,
        stream: u32,
        status: u16,
        content_type: &str,
        chunks: &[&[u8]],
    ) -> (Vec<u8>, Vec<(String, String)>) {
        self.upstream_with(stream, status, content_type, chunks, false)
    }

    /// As [`Vm::upstream`]; with `trailers`, the answer ends in trailers after its last chunk.
    fn upstream_with(
        &mut self,
        stream: u32,
        status: u16,
        content_type: &str,
        chunks: &[&[u8]],
        trailers: bool,
    ) -> (Vec<u8>, Vec<(String, String)>) {
        self.host.effective = stream;
        let length: usize = chunks.iter().map(|c| c.len()).sum();
        self.host.answer_head.insert(
            stream,
            vec![
                (":status".into(), status.to_string()),
                ("content-type".into(), content_type.into()),
                ("content-length".into(), length.to_string()),
            ],
        );
        assert_eq!(
            self.filter
                .on_response_headers(&mut self.host, stream, false),
            CONTINUE
        );
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let held = self.host.answer_body.entry(stream).or_default();
            held.extend_from_slice(chunk);
            let size = held.len();
            let end = !trailers && i + 1 == chunks.len();
            match self
                .filter
                .on_response_body(&mut self.host, stream, size, end)
            {
                // Passed on: Envoy no longer has it.
                CONTINUE => out.append(&mut self.host.answer_body.remove(&stream).unwrap()),
                PAUSE => {}
                other => panic!("{other}"),
            }
        }
        if trailers {
            assert_eq!(
                self.filter.on_response_trailers(&mut self.host, stream),
                CONTINUE
            );
            out.append(&mut self.host.answer_body.remove(&stream).unwrap_or_default());
        }
        (out, self.host.answer_head[&stream].clone())
    }

    /// A request counted by `count` tokens, then answered by the upstream.
    fn counted(&mut self, root: u32, body: &str, tokens: u64) -> u32 {
        let (stream, _) = self.send(root, body);
        let token = self.last_token();
        self.answer(root, token, 200, &count(tokens));
        stream
    }
}

const PROMPT_TOO_LONG: &[u8] = br#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)","type":"BadRequestError","param":"input_tokens","code":400}}"#;

fn has_length(head: &[(String, String)]) -> bool {
    head.iter().any(|(k, _)| k == "content-length")
}

#[test]
fn a_window_error_is_buffered_and_answered_in_the_dialect() {
    let mut vm = Vm::new();
    let root = vm.root();
    // Ended by its last chunk, or by trailers after it.
    for (i, trailers) in [false, true].into_iter().enumerate() {
        let stream = vm.counted(root, &CHAT.replace("hi", &format!("h{i}")), 5000);
        let (out, head) = vm.upstream_with(
            stream,
            400,
            "application/json",
            &[&PROMPT_TOO_LONG[..100], &PROMPT_TOO_LONG[100..]],
            trailers,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert!(!has_length(&head), "the length changed with the body");
        assert_eq!(vm.host.metric("incontext_translated"), i as i64 + 1);
    }
    // Other errors arrive byte for byte.
    let other = br#"{"error":{"message":"bad temperature","code":400}}"#;
    let stream = vm.counted(root, &CHAT.replace("hi", "b"), 50);
    let (out, _) = vm.upstream(stream, 400, "application/json", &[&other[..9], &other[9..]]);
    assert_eq!(out, other);
    assert_eq!(vm.host.metric("incontext_translated"), 2);
    // Logs carry no server text.
    assert!(vm
        .host
        .logs
        .iter()
        .all(|(_, m)| !m.contains("maximum context") && !m.contains("temperature")));
}

#[test]
fn successful_answers_pass_as_they_come_read_only_until_their_usage() {
    let mut vm = Vm::new();
    let root = vm.root();
    let stream = vm.counted(root, CHAT, 50);
    let body = br#"{"choices":[{"finish_reason":"length"}]}"#;
    let (out, head) = vm.upstream(stream, 200, "application/json", &[&body[..5], &body[5..]]);
    assert_eq!(out, body);
    assert!(has_length(&head));
    let stream = vm.counted(root, &CHAT.replace("hi", "s"), 50);
    let sse = b"data: {}\n\ndata: [DONE]\n\n";
    let (out, _) = vm.upstream(stream, 200, "text/event-stream", &[&sse[..4], &sse[4..]]);
    assert_eq!(out, sse);
    // No usage in them: every chunk was read, none held or changed.
    assert_eq!(vm.host.answer_reads(), 4);
    // Once the usage is read, the rest of the answer is not.
    let stream = vm.counted(root, &CHAT.replace("hi", "u"), 50);
    let sse =
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50}}\n\ndata: {}\n\ndata: [DONE]\n\n";
    let chunks = [&sse[..52], &sse[52..60], &sse[60..]];
    let (out, head) = vm.upstream(stream, 200, "text/event-stream", &chunks);
    assert_eq!(out, sse);
    assert!(has_length(&head));
    assert_eq!(vm.host.answer_reads(), 5);
    assert_eq!(vm.host.metric("incontext_usage_mismatch"), 0);
    // A gzip error passes as it came, unread.
    let stream = vm.counted(root, &CHAT.replace("hi", "z"), 5000);
    vm.host.effective = stream;
    vm.host.answer_head.insert(
        stream,
        vec![
            (":status".into(), "400".into()),
            ("content-encoding".into(), "gzip".into()),
            ("content-length".into(), "10".into()),
        ],
    );
    vm.filter.on_response_headers(&mut vm.host, stream, false);
    vm.host.answer_body.insert(stream, vec![0x1f; 10]);
    assert_eq!(
        vm.filter.on_response_body(&mut vm.host, stream, 10, true),
        CONTINUE
    );
    assert_eq!(vm.host.answer_reads(), 5);
    assert!(has_length(&vm.host.answer_head[&stream]));
}

#[test]
fn an_anthropic_stream_ended_by_the_window_says_so_as_it_passes() {
    let mut vm = Vm::new();
    let root = vm.root();
    let id = windowed(&mut vm, root);
    let sse = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1096}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let (out, _) = vm.upstream(id, 200, "text/event-stream", &[&sse[..40], &sse[40..]]);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        String::from_utf8_lossy(sse).replace("\"max_tokens\"", "\"model_context_window_exceeded\"")
    );
    assert_eq!(vm.host.metric("incontext_window_stop"), 1);
    // Lines ended by CR alone; the message_delta, its last event, ends in trailers without
    // its blank line.
    let id = windowed(&mut vm, root);
    let cr = b"event: message_start\rdata: {\"type\":\"message_start\"}\r\revent: message_delta\rdata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1096}}";
    let (out, _) = vm.upstream_with(id, 200, "text/event-stream", &[&cr[..50], &cr[50..]], true);
    assert_eq!(out, window_stopped(cr));
    assert_eq!(vm.host.metric("incontext_window_stop"), 2);
}

/// An Anthropic request whose cap the window wrote (1096 of 4096 after a count of 3000).
fn windowed(vm: &mut Vm, root: u32) -> u32 {
    let id = vm.context();
    vm.filter.on_context_create(id, root);
    vm.host.effective = id;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":32000}"#;
    vm.host.request_headers.insert(
        id,
        vec![
            (":method".into(), "POST".into()),
            (":path".into(), "/v1/messages".into()),
        ],
    );
    vm.filter.on_request_headers(&mut vm.host, id, false);
    vm.host.request_body.insert(id, body.as_bytes().to_vec());
    let calls = vm.host.calls().len();
    vm.filter
        .on_request_body(&mut vm.host, id, body.len(), true);
    // Counted once; later requests find the count in the cache.
    if vm.host.calls().len() > calls {
        let token = vm.last_token();
        vm.answer(root, token, 200, r#"{"input_tokens":3000}"#);
    }
    assert_eq!(vm.body_of(id)["max_tokens"], 1096);
    // Envoy calls the stream's callbacks in its context.
    vm.host.effective = id;
    id
}

const MESSAGE: &[u8] = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"a"}],"model":"m","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3000,"output_tokens":1096}}"#;

/// Where the answer's held tail starts.
fn tail_at() -> usize {
    MESSAGE
        .windows(13)
        .position(|w| w == br#""stop_reason""#)
        .unwrap()
}

/// The upstream's head for `id`, a JSON answer: where its held tail starts.
fn json_head(vm: &mut Vm, id: u32) -> usize {
    vm.host.answer_head.insert(
        id,
        vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
        ],
    );
    assert_eq!(
        vm.filter.on_response_headers(&mut vm.host, id, false),
        CONTINUE
    );
    tail_at()
}

fn window_stopped(body: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(body)
        .replace(r#""max_tokens""#, r#""model_context_window_exceeded""#)
        .into_bytes()
}

#[test]
fn a_json_answer_ending_in_trailers_arrives_whole() {
    let mut vm = Vm::new();
    let root = vm.root();
    let at = tail_at();
    // Cut before, inside and after the held tail; one chunk.
    for cuts in [vec![at - 10], vec![at + 3], vec![at + 40, at + 60], vec![]] {
        let id = windowed(&mut vm, root);
        let mut chunks = Vec::new();
        let mut start = 0;
        for &c in cuts.iter().chain([MESSAGE.len()].iter()) {
            chunks.push(&MESSAGE[start..c]);
            start = c;
        }
        let (out, head) = vm.upstream_with(id, 200, "application/json", &chunks, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(window_stopped(MESSAGE)).unwrap(),
            "cuts {cuts:?}"
        );
        assert!(!has_length(&head));
        vm.delete(id);
    }
    assert_eq!(vm.host.metric("incontext_window_stop"), 4);
    // Fewer tokens than the written cap: the tail waits for the end all the same, and goes
    // unchanged.
    let id = windowed(&mut vm, root);
    let other = String::from_utf8_lossy(MESSAGE).replace("1096}", "7}");
    let before = vm.host.answer_reads();
    let (out, _) = vm.upstream_with(id, 200, "application/json", &[other.as_bytes()], true);
    assert_eq!(out, other.as_bytes());
    assert_eq!(
        vm.host.answer_reads() - before,
        2,
        "with its chunk, then at the trailers"
    );
    assert_eq!(vm.host.metric("incontext_window_stop"), 4);
    // An answer only read for its usage (which comes last in a JSON body): never held, read
    // to its end, the trailers; its prompt differs from the count of 50.
    let stream = vm.counted(root, CHAT, 50);
    let before = vm.host.answer_reads();
    let body = br#"{"choices":[{"finish_reason":"length"}],"usage":{"prompt_tokens":49}}"#;
    let (out, head) = vm.upstream_with(
        stream,
        200,
        "application/json",
        &[&body[..30], &body[30..]],
        true,
    );
    assert_eq!(
        (out.as_slice(), vm.host.answer_reads() - before),
        (&body[..], 3)
    );
    assert!(has_length(&head), "unchanged: its length stays");
    assert_eq!(vm.host.metric("incontext_usage_mismatch"), 1);
    // Not budgeted: the trailers read nothing.
    let (stream, _) = vm.send(root, r#"{"model":"m"}"#);
    let before = vm.host.answer_reads();
    let (out, _) = vm.upstream_with(stream, 200, "application/json", &[MESSAGE], true);
    assert_eq!(
        (out.as_slice(), vm.host.answer_reads() - before),
        (MESSAGE, 0)
    );
}

#[test]
fn a_held_chunk_waits_in_the_host_only_while_bytes_are_held() {
    let mut vm = Vm::new();
    let root = vm.root();
    let id = windowed(&mut vm, root);
    let at = json_head(&mut vm, id);
    // Before the tail: passes at once.
    vm.host.answer_body.insert(id, MESSAGE[..20].to_vec());
    assert_eq!(
        vm.filter.on_response_body(&mut vm.host, id, 20, false),
        CONTINUE
    );
    // The tail begins: the bytes before it stay in the host, the tail with the filter.
    vm.host.answer_body.insert(id, MESSAGE[20..at + 5].to_vec());
    assert_eq!(
        vm.filter.on_response_body(&mut vm.host, id, at - 15, false),
        PAUSE
    );
    assert_eq!(vm.host.answer_body[&id], &MESSAGE[20..at]);
    // Envoy hands the kept bytes over with the next chunk: only the new ones are read.
    vm.host
        .answer_body
        .get_mut(&id)
        .unwrap()
        .extend_from_slice(&MESSAGE[at + 5..]);
    let size = vm.host.answer_body[&id].len();
    assert_eq!(
        vm.filter.on_response_body(&mut vm.host, id, size, true),
        CONTINUE
    );
    let mut out = MESSAGE[..20].to_vec();
    out.extend_from_slice(&vm.host.answer_body[&id]);
    assert_eq!(out, window_stopped(MESSAGE));
}

#[test]
fn a_host_failure_at_the_trailers_lets_the_answer_go() {
    let mut vm = Vm::new();
    let root = vm.root();
    // The read fails, or the write after it (Envoy's logs then say which, with the host
    // status).
    for (next, failing) in [(0, "get_buffer"), (2, "set_buffer")] {
        let id = windowed(&mut vm, root);
        let at = json_head(&mut vm, id);
        vm.host.answer_body.insert(id, MESSAGE.to_vec());
        assert_eq!(
            vm.filter
                .on_response_body(&mut vm.host, id, MESSAGE.len(), false),
            PAUSE
        );
        assert_eq!(vm.host.answer_body[&id], &MESSAGE[..at]);
        let at_trailers = vm.host.trace.len();
        vm.host.fail_at = Some(at_trailers + next);
        assert_eq!(vm.filter.on_response_trailers(&mut vm.host, id), CONTINUE);
        // The window_stop count comes between the read and the write; nothing after.
        assert_eq!(vm.host.trace[at_trailers + next..], [failing]);
        // What the host keeps goes; the filter watches this answer no more.
        assert_eq!(vm.host.answer_body[&id], &MESSAGE[..at]);
        vm.host.fail_at = None;
        let events = vm.host.events.len();
        assert_eq!(vm.filter.on_response_trailers(&mut vm.host, id), CONTINUE);
        assert_eq!(vm.host.events.len(), events, "nothing read again");
        vm.delete(id);
    }
    // Counted when decided: the write that failed carried it.
    assert_eq!(vm.host.metric("incontext_window_stop"), 1);
}
