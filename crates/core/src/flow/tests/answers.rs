use super::support::*;
use crate::flow::*;

fn error_message(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["error"]["message"].as_str().unwrap().to_string()
}

const V32_CAP_ERROR: &str = r#"{"error":{"message":"max_tokens=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=32000)","type":"BadRequestError","param":"max_tokens","code":400}}"#;
const V32_PROMPT_ERROR: &str = r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)","type":"BadRequestError","param":"input_tokens","code":400}}"#;

#[test]
fn window_errors_reach_the_client_in_its_dialect() {
    // Anthropic, exact count below the window (the filter was told a larger window than
    // the server has): prompt + cap too long, and the server's window is learned.
    let (p, mut host) = setup("");
    let (mut x, _) = counted(&p, &mut host, "/v1/messages", MESSAGES, &models(40960));
    let v = rewritten(reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"input_tokens":3000}"#,
    ));
    assert_eq!(v["max_tokens"], 32000);
    let (step, out) = answer(
        &mut x,
        &p,
        &mut host,
        400,
        "application/json",
        &[
            &V32_CAP_ERROR.as_bytes()[..50],
            &V32_CAP_ERROR.as_bytes()[50..],
        ],
    );
    assert_eq!(step, response::HeadStep::Hold);
    assert_eq!(
        error_message(&out),
        "input length and `max_tokens` exceed context limit: 3000 + 32000 > 4096, decrease input length or `max_tokens` and try again"
    );
    assert_eq!(host.count(Metric::Translated), 1);
    // The next request is budgeted by the window the server named.
    let body = MESSAGES.replace("hi", "hello");
    let (mut y, step) = send(
        &p,
        &mut host,
        "/v1/messages",
        Box::leak(body.into_boxed_str()),
    );
    assert!(matches!(step, Step::Wait));
    assert_eq!(
        host.calls.last().unwrap().2.path,
        "/v1/messages/count_tokens"
    );
    let v = rewritten(reply(
        &p,
        &mut host,
        &mut y,
        200,
        r#"{"input_tokens":3000}"#,
    ));
    assert_eq!(v["max_tokens"], 1096);

    // OpenAI chat, the prompt alone too long (exact count ≥ C): context_length_exceeded.
    let (p, mut host) = setup(r#","context_length":4096"#);
    let chat = "/v1/chat/completions";
    let (mut x, step) = counted(&p, &mut host, chat, CHAT, &tokenized(5009, 4096));
    assert!(matches!(step, Step::Done(Action::Continue)));
    let (_, out) = json_answer(&mut x, &p, &mut host, 400, V32_PROMPT_ERROR.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    assert_eq!(error_message(&out), "This model's maximum context length is 4096 tokens. However, your messages resulted in 5009 tokens. Please reduce the length of the messages.");
}

#[test]
fn other_answers_pass_byte_for_byte() {
    let (p, mut host) = setup(r#","context_length":4096"#);
    let chat = "/v1/chat/completions";
    let (mut x, _) = counted(&p, &mut host, chat, CHAT, &tokenized(40, 4096));
    // Another 400, a look-alike, a huge error, a success: byte for byte.
    let other =
        br#"{"error":{"message":"temperature must be >= 0","type":"BadRequestError","code":400}}"#;
    for body in [&other[..], br#"{"error":{"message":"This model's maximum context length is 4096 tokens.","code":400}}"#, b"not json at all"] {
        let mut y = Exchange::new();
        y.budget = x.budget.clone();
        let (step, out) = answer(&mut y, &p, &mut host, 400, "application/json", &[&body[..3], &body[3..]]);
        assert_eq!(step, response::HeadStep::Hold);
        assert_eq!(out, body);
    }
    let huge = vec![b' '; response::MAX_ERROR_BYTES + 10];
    let mut y = Exchange::new();
    y.budget = x.budget.clone();
    let (_, out) = answer(
        &mut y,
        &p,
        &mut host,
        400,
        "application/json",
        &[&huge[..40000], &huge[40000..]],
    );
    assert_eq!(out, huge);
    let (step, out) = json_answer(&mut x, &p, &mut host, 200, b"{\"ok\":1}");
    // Read for its usage only, and passed as it came.
    assert_eq!(
        (step, out.as_slice()),
        (response::HeadStep::Observe, &b"{\"ok\":1}"[..])
    );
    assert_eq!(host.count(Metric::Translated), 0);
    // A request the filter did not budget: its errors are not touched.
    let mut z = Exchange::new();
    z.on_headers(
        &p,
        &mut host,
        &RequestHead {
            method: Some("GET"),
            ..head("/v1/models")
        },
    );
    let (step, out) = json_answer(&mut z, &p, &mut host, 400, V32_PROMPT_ERROR.as_bytes());
    assert_eq!(
        (step, out.as_slice()),
        (response::HeadStep::Pass, V32_PROMPT_ERROR.as_bytes())
    );
    // translate_errors off.
    let q = plugin(r#","context_length":4096,"translate_errors":false"#);
    let (mut w, _) = send(&q, &mut host, "/v1/chat/completions", CHAT);
    assert!(w.budget.is_some());
    let (step, out) = json_answer(&mut w, &q, &mut host, 400, V32_PROMPT_ERROR.as_bytes());
    assert_eq!(
        (step, out.as_slice()),
        (response::HeadStep::Pass, V32_PROMPT_ERROR.as_bytes())
    );
}

const COUNT_REFUSED: &str = r#"{"type":"error","error":{"type":"BadRequestError","message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)"}}"#;

#[test]
fn a_prompt_the_counter_refuses_as_too_long() {
    // Passthrough: unchanged, then the server's cap error becomes "prompt is too long".
    let (p, mut host) = setup(r#","context_length":4096"#);
    let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
    let step = reply(&p, &mut host, &mut x, 400, COUNT_REFUSED);
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(
        header(&x, &p, HEADER_ACTION).as_deref(),
        Some("unchanged:too_long")
    );
    // 4097 is the server's lower bound ("at least"), not a count: the source says so.
    assert_eq!(header(&x, &p, HEADER_PROMPT).as_deref(), Some("4097"));
    assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("at_least"));
    assert!(!host.metrics.iter().any(|m| matches!(m, Metric::Failure(_))));
    let (_, out) = json_answer(&mut x, &p, &mut host, 400, V32_CAP_ERROR.as_bytes());
    assert_eq!(
        error_message(&out),
        "prompt is too long: 4097 tokens > 4096 maximum"
    );
    // Reject mode: answered locally, with no upstream request.
    let (p, mut host) = setup(r#","context_length":4096,"on_insufficient":"reject""#);
    let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
    match reply(&p, &mut host, &mut x, 400, COUNT_REFUSED) {
        Step::Done(Action::Reply(r)) => {
            assert_eq!(r.status, 400);
            assert_eq!(
                error_message(&r.body),
                "prompt is too long: 4097 tokens > 4032 maximum"
            );
            let source = r.headers.iter().find(|(k, _)| *k == HEADER_SOURCE);
            assert_eq!(source.map(|(_, v)| v.as_str()), Some("at_least"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(host.count(Metric::Rejected), 1);
    // Another 400 from the counter is a failure: the estimate.
    let mut host = FakeHost::default();
    let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
    let step = reply(
        &p,
        &mut host,
        &mut x,
        400,
        r#"{"type":"error","error":{"type":"BadRequestError","message":"bad role"}}"#,
    );
    rewritten(step);
    assert_eq!(host.count(Metric::Failure(Failure::Status)), 1);
    // A prompt whose estimate is above the server's lower bound: the estimate, said so.
    let (p, mut host) = setup(r#","context_length":4096"#);
    let long = MESSAGES.replace("be brief", &"word ".repeat(5000));
    let (mut x, _) = send(&p, &mut host, "/v1/messages", leak(long));
    reply(&p, &mut host, &mut x, 400, COUNT_REFUSED);
    let estimated: u64 = header(&x, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    assert!(estimated > 4097, "{estimated}");
    assert_eq!(header(&x, &p, HEADER_SOURCE).as_deref(), Some("estimate"));
}

#[test]
fn stop_reason_when_the_window_ended_the_answer() {
    let (p, mut host) = setup(r#","context_length":4096"#);
    let (mut x, _) = send(&p, &mut host, "/v1/messages", MESSAGES);
    let v = rewritten(reply(
        &p,
        &mut host,
        &mut x,
        200,
        r#"{"input_tokens":3000}"#,
    ));
    assert_eq!(v["max_tokens"], 1096);
    let json = br#"{"id":"a","type":"message","content":[],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3000,"output_tokens":1096}}"#;
    let (step, out) = answer(
        &mut x,
        &p,
        &mut host,
        200,
        "application/json",
        &[&json[..60], &json[60..]],
    );
    assert_eq!(step, response::HeadStep::Watch);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["stop_reason"], "model_context_window_exceeded");
    assert_eq!(host.count(Metric::WindowStop), 1);
    // Streamed: the message_delta event, split across chunks (the count from the cache).
    let (mut y, step) = send(&p, &mut host, "/v1/messages", MESSAGES);
    rewritten(step);
    let sse = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1096}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let (step, out) = answer(
        &mut y,
        &p,
        &mut host,
        200,
        "text/event-stream; charset=utf-8",
        &[&sse[..30], &sse[30..90], &sse[90..]],
    );
    assert_eq!(step, response::HeadStep::Watch);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        String::from_utf8_lossy(sse).replace("\"max_tokens\"", "\"model_context_window_exceeded\"")
    );
    // The caller's own cap (smaller than what the window leaves): not watched.
    let small = MESSAGES.replace("32000", "500");
    let (mut z, step) = send(
        &p,
        &mut host,
        "/v1/messages",
        Box::leak(small.into_boxed_str()),
    );
    assert_eq!(rewritten(step)["max_tokens"], 500, "counted from the cache");
    let (step, out) = answer(&mut z, &p, &mut host, 200, "application/json", &[&json[..]]);
    assert_eq!((step, out), (response::HeadStep::Observe, json.to_vec()));
    // OpenAI chat clamped by the window: `length` stays, the answer only read for its usage.
    let (mut c, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    rewritten(reply(&p, &mut host, &mut c, 200, &tokenized(3000, 4096)));
    let (step, _) = answer(
        &mut c,
        &p,
        &mut host,
        200,
        "text/event-stream",
        &[b"data: {}\n\n"],
    );
    assert_eq!(step, response::HeadStep::Observe);
}

#[test]
fn learned_windows_expire_and_follow_the_server() {
    let (p, mut host) = setup(r#","window_ttl_ms":1000"#);
    let (mut x, _) = counted(&p, &mut host, "/v1/messages", MESSAGES, &models(4096));
    rewritten(reply(&p, &mut host, &mut x, 200, r#"{"input_tokens":30}"#));
    assert_eq!(host.calls.len(), 2);
    // Within the TTL: no window call.
    host.now = 1000;
    let b1 = MESSAGES.replace("hi", "one");
    let (_, _) = send(
        &p,
        &mut host,
        "/v1/messages",
        Box::leak(b1.into_boxed_str()),
    );
    assert_eq!(
        host.calls.last().unwrap().2.path,
        "/v1/messages/count_tokens"
    );
    assert_eq!(host.calls.len(), 3);
    // After it: the window is learned again first, and the new one is used.
    host.now = 2001;
    let b2 = MESSAGES.replace("hi", "two");
    let (mut y, _) = send(
        &p,
        &mut host,
        "/v1/messages",
        Box::leak(b2.into_boxed_str()),
    );
    assert_eq!(host.calls.last().unwrap().2.path, "/v1/models");
    reply(&p, &mut host, &mut y, 200, &models(2048));
    let v = rewritten(reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":30}"#));
    assert_eq!(v["max_tokens"], 2018);
    // A stale window still decides an estimate (better than none).
    host.now = 10_000;
    let b3 = MESSAGES.replace("hi", "three");
    let (mut z, _) = send(
        &p,
        &mut host,
        "/v1/messages",
        Box::leak(b3.into_boxed_str()),
    );
    let step = reply(&p, &mut host, &mut z, 500, "");
    assert!(
        matches!(step, Step::Wait),
        "the window call failed; the count goes on"
    );
    let step = reply(&p, &mut host, &mut z, 500, "");
    rewritten(step);
    // A cached /tokenize count uses the window learned since.
    let (p, mut host) = setup("");
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(40, 4096)));
    let (mut y, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    answer(
        &mut y,
        &p,
        &mut host,
        400,
        "application/json",
        &[V32_PROMPT_ERROR
            .replace("4096 tokens", "2048 tokens")
            .as_bytes()],
    );
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    assert_eq!(rewritten(step)["max_tokens"], 2008);
}

#[test]
fn responses_get_the_openai_signal_on_input() {
    // The renderer refuses the prompt as too long: reject mode answers itself.
    let (p, mut host) = setup(r#","context_length":4096,"on_insufficient":"reject""#);
    let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
    assert_eq!(host.calls[0].2.path, "/v1/responses/render");
    match reply(&p, &mut host, &mut x, 400, V32_PROMPT_ERROR) {
        Step::Done(Action::Reply(r)) => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["param"], "input");
        }
        other => panic!("{other:?}"),
    }
    // Passthrough: the server's own error, translated.
    let (p, mut host) = setup(r#","context_length":4096"#);
    let (mut x, _) = send(&p, &mut host, "/v1/responses", RESPONSES);
    let step = reply(&p, &mut host, &mut x, 400, V32_PROMPT_ERROR);
    assert!(matches!(step, Step::Done(Action::Continue)));
    let cap = V32_CAP_ERROR.replace("max_tokens", "max_output_tokens");
    let (_, out) = json_answer(&mut x, &p, &mut host, 400, cap.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "input");
    assert_eq!(
        error_message(&out),
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 4097 tokens. Please reduce the length of the messages."
    );
}
