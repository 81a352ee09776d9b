//! The upstream's answer as Envoy delivers it: held error bodies, watched and observed
//! answers, trailers.

use super::*;

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

    /// As [`Vm::upstream`]; with `trailers`, the answer ends in trailers after its last chunk,
    /// which its head announces.
    fn upstream_with(
        &mut self,
        stream: u32,
        status: u16,
        content_type: &str,
        chunks: &[&[u8]],
        trailers: bool,
    ) -> (Vec<u8>, Vec<(String, String)>) {
        self.upstream_ending(stream, status, content_type, chunks, trailers, trailers)
    }

    /// As [`Vm::upstream_with`]; `announce`: the head has a `trailer` header.
    fn upstream_ending(
        &mut self,
        stream: u32,
        status: u16,
        content_type: &str,
        chunks: &[&[u8]],
        trailers: bool,
        announce: bool,
    ) -> (Vec<u8>, Vec<(String, String)>) {
        self.host.effective = stream;
        let length: usize = chunks.iter().map(|c| c.len()).sum();
        let mut head = vec![
            (":status".into(), status.to_string()),
            ("content-type".into(), content_type.into()),
            ("content-length".into(), length.to_string()),
        ];
        if announce {
            head.push(("trailer".into(), "x-t".into()));
        }
        self.host.answer_head.insert(stream, head);
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
    // Trailers the head did not announce: the complete event passed with its chunk, and the
    // partial one has nothing to join at the trailers.
    let id = windowed(&mut vm, root);
    let first = b"event: message_start\rdata: {\"type\":\"message_start\"}\r\r".len();
    let reads = vm.host.answer_reads();
    let (out, _) = vm.upstream_ending(
        id,
        200,
        "text/event-stream",
        &[&cr[..first + 9], &cr[first + 9..]],
        true,
        false,
    );
    assert_eq!(out, &cr[..first]);
    assert_eq!(vm.host.answer_reads(), reads + 2);
    assert_eq!(vm.host.metric("incontext_window_stop"), 2);
}

/// An Anthropic request whose cap the window wrote (1096 of 4096 after a count of 3000).
fn windowed(vm: &mut Vm, root: u32) -> u32 {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":32000}"#;
    let calls = vm.host.calls().len();
    let (id, _) = vm.post(root, "/v1/messages", body);
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
    // A failed write comes after the read found the answer's usage, which is published.
    for (next, after) in [
        (0, &["get_buffer"][..]),
        (2, &["set_buffer", "set_property"][..]),
    ] {
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
        // The window_stop count comes between the read and the write; nothing after but
        // the usage's publication.
        assert_eq!(vm.host.trace[at_trailers + next..], *after);
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
