//! The answer side over whole answers: translations, stop reasons, usage, trailers.

use super::*;
use serde_json::Value;

fn budget(dialect: Dialect) -> Budget {
    Budget {
        dialect,
        backend: Backend::Vllm,
        model: "m".to_string(),
        prompt: Some(3000),
        exact: true,
        too_long: false,
        context: Some(4096),
        cap: Some(1096),
        window_cap: None,
        usage: false,
    }
}

fn message(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    v["error"]["message"].as_str().unwrap().to_string()
}

const V32_PROMPT: &str = r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)","type":"BadRequestError","param":"input_tokens","code":400}}"#;
const V32_CAP: &str = r#"{"type":"error","error":{"type":"BadRequestError","message":"max_tokens=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=32000)"}}"#;

fn translated(b: &Budget, body: &str) -> Option<String> {
    let e = window::parse(b.backend, body.as_bytes())?;
    translate(b, &e).map(|t| message(&t))
}

#[test]
fn prompt_too_long_when_known() {
    // The server says the prompt alone is too long; P: the estimate beats its lower bound.
    let b = Budget {
        prompt: Some(5200),
        exact: false,
        ..budget(Dialect::Anthropic)
    };
    assert_eq!(
        translated(&b, V32_PROMPT).unwrap(),
        "prompt is too long: 5200 tokens > 4096 maximum"
    );
    // ... and the lower bound beats a smaller estimate.
    let b = Budget {
        prompt: Some(3900),
        ..b
    };
    assert_eq!(
        translated(&b, V32_PROMPT).unwrap(),
        "prompt is too long: 4097 tokens > 4096 maximum"
    );
    // The counter refused the prompt as too long: the cap error (checked first by vLLM)
    // still means "prompt too long".
    let b = Budget {
        too_long: true,
        prompt: Some(5009),
        exact: false,
        cap: Some(32000),
        ..budget(Dialect::Anthropic)
    };
    assert_eq!(
        translated(&b, V32_CAP).unwrap(),
        "prompt is too long: 5009 tokens > 4096 maximum"
    );
    // An exact P ≥ C.
    let b = Budget {
        prompt: Some(4500),
        cap: Some(32000),
        ..budget(Dialect::Anthropic)
    };
    assert_eq!(
        translated(&b, V32_CAP).unwrap(),
        "prompt is too long: 4500 tokens > 4096 maximum"
    );
    // OpenAI dialects.
    let o = Budget {
        prompt: Some(4500),
        ..budget(Dialect::OpenAi)
    };
    let t = translate(
        &o,
        &window::parse(Backend::Vllm, V32_PROMPT.as_bytes()).unwrap(),
    )
    .unwrap();
    let v: Value = serde_json::from_slice(&t).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    assert!(message(&t).contains("resulted in 4500 tokens."));
    let r = Budget {
        dialect: Dialect::Responses,
        ..o
    };
    let t = translate(
        &r,
        &window::parse(Backend::Vllm, V32_PROMPT.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&t).unwrap()["error"]["param"],
        "input"
    );
}

#[test]
fn prompt_and_cap_otherwise() {
    // An exact P below C with a cap too large for the window.
    let b = Budget {
        cap: Some(32000),
        ..budget(Dialect::Anthropic)
    };
    assert_eq!(
        translated(&b, V32_CAP).unwrap(),
        "input length and `max_tokens` exceed context limit: 3000 + 32000 > 4096, decrease input length or `max_tokens` and try again"
    );
    // vLLM 0.31: its lower bound, with an estimate below it; the cap and window it names.
    let b = Budget {
        prompt: Some(250),
        exact: false,
        context: None,
        cap: None,
        ..budget(Dialect::OpenAi)
    };
    let body = r#"{"error":{"message":"This model's maximum context length is 512 tokens. However, you requested 200 output tokens and your prompt contains at least 313 input tokens, for a total of at least 513 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=313)","type":"BadRequestError","param":"input_tokens","code":400}}"#;
    assert_eq!(
        translated(&b, body).unwrap(),
        "This model's maximum context length is 512 tokens. However, your messages resulted in 513 tokens (313 in the messages, 200 in the completion). Please reduce the length of the messages or completion."
    );
    // vLLM 0.11's completions: the limit named is C − B; C from the filter, else limit + B.
    let body = r#"{"error":{"message":"This model's maximum context length is 312 tokens. However, your request has 430 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}}"#;
    let b = Budget {
        prompt: Some(430),
        cap: Some(200),
        context: None,
        ..budget(Dialect::OpenAi)
    };
    assert!(translated(&b, body).unwrap().starts_with("This model's maximum context length is 512 tokens. However, your messages resulted in 630 tokens (430 in the messages, 200"));
    // vLLM 0.11's chat: the limit is C and the prompt (exact, the server's) reaches it.
    let body = r#"{"error":{"message":"This model's maximum context length is 512 tokens. However, your request has 600 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}}"#;
    let e = Budget {
        prompt: Some(550),
        exact: false,
        context: Some(512),
        ..budget(Dialect::Anthropic)
    };
    assert_eq!(
        translated(&e, body).unwrap(),
        "prompt is too long: 600 tokens > 512 maximum"
    );
    let body = r#"{"error":{"message":"This model's maximum context length is 312 tokens. However, your request has 430 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}}"#;
    // Nothing names C: unchanged.
    let b = Budget { cap: None, ..b };
    assert_eq!(translated(&b, body), None);
}

#[test]
fn other_backends() {
    let b = Budget {
        backend: Backend::Llamacpp,
        prompt: Some(5000),
        ..budget(Dialect::Anthropic)
    };
    let body = r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
    assert_eq!(
        translated(&b, body).unwrap(),
        "prompt is too long: 5000 tokens > 4096 maximum"
    );
    // Another backend's wording is not this backend's window error.
    assert_eq!(
        translated(
            &Budget {
                backend: Backend::Vllm,
                ..b.clone()
            },
            body
        ),
        None
    );
    let s = Budget {
        backend: Backend::Sglang,
        cap: Some(200),
        prompt: Some(430),
        ..budget(Dialect::OpenAi)
    };
    let body = r#"{"object":"error","message":"Requested token count exceeds the model's maximum context length of 512 tokens. You requested a total of 630 tokens: 430 tokens from the input messages and 200 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.","type":"BadRequestError","param":null,"code":400}"#;
    assert!(translated(&s, body)
        .unwrap()
        .contains("resulted in 630 tokens (430 in the messages, 200 in the completion)"));
}

fn head(status: u16, content_type: &'static str) -> Head<'static> {
    Head {
        status: Some(status),
        content_type: Some(content_type),
        ..Head::default()
    }
}

#[test]
fn which_answers_are_held_or_watched() {
    let b = budget(Dialect::Anthropic);
    let mut r = Response::default();
    assert_eq!(
        r.on_headers(Some(&b), true, &head(400, "application/json")),
        HeadStep::Hold
    );
    assert_eq!(
        r.on_headers(
            Some(&b),
            true,
            &head(404, "application/json; charset=utf-8")
        ),
        HeadStep::Hold
    );
    // Not budgeted, translation off, not an error, 5xx, encoded, too large, HTML, no body.
    assert_eq!(
        r.on_headers(None, true, &head(400, "application/json")),
        HeadStep::Pass
    );
    assert_eq!(
        r.on_headers(Some(&b), false, &head(400, "application/json")),
        HeadStep::Pass
    );
    assert_eq!(
        r.on_headers(Some(&b), true, &head(200, "application/json")),
        HeadStep::Pass
    );
    assert_eq!(
        r.on_headers(Some(&b), true, &head(500, "application/json")),
        HeadStep::Pass
    );
    let gz = Head {
        content_encoding: Some("gzip"),
        ..head(400, "application/json")
    };
    assert_eq!(r.on_headers(Some(&b), true, &gz), HeadStep::Pass);
    let big = Head {
        content_length: Some("65537"),
        ..head(400, "application/json")
    };
    assert_eq!(r.on_headers(Some(&b), true, &big), HeadStep::Pass);
    let fits = Head {
        content_length: Some("65536"),
        ..head(400, "application/json")
    };
    assert_eq!(r.on_headers(Some(&b), true, &fits), HeadStep::Hold);
    assert_eq!(
        r.on_headers(Some(&b), true, &head(400, "text/html")),
        HeadStep::Pass
    );
    let empty = Head {
        end_of_stream: true,
        ..head(400, "application/json")
    };
    assert_eq!(r.on_headers(Some(&b), true, &empty), HeadStep::Pass);
    // The window wrote the cap: Anthropic answers are watched, JSON and SSE alike.
    let w = Budget {
        window_cap: Some(1096),
        ..b.clone()
    };
    assert_eq!(
        r.on_headers(Some(&w), true, &head(200, "application/json")),
        HeadStep::Watch
    );
    assert_eq!(
        r.on_headers(
            Some(&w),
            true,
            &head(200, "text/event-stream; charset=utf-8")
        ),
        HeadStep::Watch
    );
    assert_eq!(
        r.on_headers(Some(&w), true, &head(200, "text/plain")),
        HeadStep::Pass
    );
    let o = Budget {
        dialect: Dialect::OpenAi,
        ..w
    };
    assert_eq!(
        r.on_headers(Some(&o), true, &head(200, "text/event-stream")),
        HeadStep::Pass
    );
}

#[test]
fn error_bodies_buffered_up_to_the_bound() {
    let b = Budget {
        cap: Some(32000),
        ..budget(Dialect::Anthropic)
    };
    let mut r = Response::default();
    r.on_headers(Some(&b), true, &head(400, "application/json"));
    assert_eq!(r.on_body(10, false), BodyStep::Buffer);
    assert_eq!(r.on_body(V32_CAP.len(), true), BodyStep::Read);
    let d = r.on_data(Some(&b), V32_CAP.as_bytes(), true);
    assert!(matches!(d.edit, Edit::Replace(_)));
    assert_eq!(d.translated.unwrap().context, Some(4096));
    // Larger than the bound: everything buffered passes.
    let mut r = Response::default();
    r.on_headers(Some(&b), true, &head(400, "application/json"));
    assert_eq!(r.on_body(MAX_ERROR_BYTES + 1, false), BodyStep::Continue);
    assert_eq!(r.on_body(MAX_ERROR_BYTES + 9, true), BodyStep::Continue);
    // Not a window error, a look-alike, not JSON: unchanged.
    for body in [
        r#"{"error":{"message":"temperature must be positive","type":"BadRequestError","code":400}}"#,
        r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","code":400}}"#,
        "<html>bad request</html>",
        "",
    ] {
        let mut r = Response::default();
        r.on_headers(Some(&b), true, &head(400, "application/json"));
        assert_eq!(r.on_body(body.len(), true), BodyStep::Read);
        assert_eq!(
            r.on_data(Some(&b), body.as_bytes(), true),
            Data::keep(),
            "{body}"
        );
    }
}
/// The host as Envoy's proxy-wasm is to the filter: it buffers what the filter asks it to keep
/// (a paused chunk stays, and the next one joins it) and hands over the whole buffer; bytes
/// added at the trailers join only what it buffers. The answer ends with its last chunk, or
/// with trailers after it. What the client gets, the edits counted, and what the client had
/// after each chunk.
fn through_each(
    r: &mut Response,
    b: &Budget,
    head: &Head,
    chunks: &[&[u8]],
    trailers: bool,
) -> (Vec<u8>, usize, Vec<usize>) {
    r.on_headers(Some(b), true, head);
    // The host's buffer; its first `kept` bytes passed the filter already.
    let (mut out, mut buffer, mut kept, mut edits) = (Vec::new(), Vec::new(), 0, 0);
    let mut arrived = Vec::new();
    let mut apply = |r: &mut Response, buffer: &mut Vec<u8>, kept: &mut usize, end: bool| {
        let d = r.on_data(Some(b), &buffer[*kept..], end);
        edits += usize::from(d.window_stop || d.translated.is_some());
        if let Edit::Replace(new) = d.edit {
            buffer.truncate(*kept);
            buffer.extend_from_slice(&new);
        }
        *kept = if r.host_keeps() { buffer.len() } else { 0 };
    };
    for (i, chunk) in chunks.iter().enumerate() {
        buffer.extend_from_slice(chunk);
        let end = !trailers && i + 1 == chunks.len();
        match r.on_body(buffer.len(), end) {
            BodyStep::Continue => {}
            BodyStep::Buffer => {
                arrived.push(out.len());
                continue;
            }
            BodyStep::Read => apply(r, &mut buffer, &mut kept, end),
        }
        if !r.host_keeps() {
            out.append(&mut buffer);
        }
        arrived.push(out.len());
    }
    if trailers && r.host_keeps() {
        apply(r, &mut buffer, &mut kept, true);
    }
    out.append(&mut buffer);
    (out, edits, arrived)
}

fn through(
    r: &mut Response,
    b: &Budget,
    head: &Head,
    chunks: &[&[u8]],
    trailers: bool,
) -> (Vec<u8>, usize) {
    let (out, edits, _) = through_each(r, b, head, chunks, trailers);
    assert!(!r.holds());
    (out, edits)
}

#[test]
fn held_bytes_wait_in_the_host_and_go_at_the_trailers() {
    let b = Budget {
        window_cap: Some(1096),
        ..budget(Dialect::Anthropic)
    };
    let json = r#"{"id":"m","content":[{"type":"text","text":"x"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"output_tokens":1096}}"#;
    let want = json.replace(r#""max_tokens""#, r#""model_context_window_exceeded""#);
    let head = head(200, "application/json");
    for trailers in [false, true] {
        for a in 0..=json.len() {
            for c in [a, (a + 7).min(json.len()), json.len()] {
                let (x, y, z) = (&json[..a], &json[a..c], &json[c..]);
                let chunks = [x.as_bytes(), y.as_bytes(), z.as_bytes()];
                let got = through(&mut Response::default(), &b, &head, &chunks, trailers);
                assert_eq!(got, (want.clone().into_bytes(), 1), "{a} {c} {trailers}");
            }
        }
    }
    // A chunk before what is held waits in the host with it, and only then.
    let mut r = Response::default();
    r.on_headers(Some(&b), true, &head);
    let at = json.find("\"stop_reason\"").unwrap();
    assert_eq!(
        r.on_data(Some(&b), &json.as_bytes()[..9], false),
        Data::keep()
    );
    assert!(!r.holds(), "a value passes at once");
    let d = r.on_data(Some(&b), &json.as_bytes()[9..at + 4], false);
    assert_eq!(d.edit, Edit::Replace(json.as_bytes()[9..at].to_vec()));
    assert!(r.holds());
    let d = r.on_data(Some(&b), &json.as_bytes()[at + 4..at + 8], false);
    assert_eq!((d.edit, r.holds()), (Edit::Replace(Vec::new()), true));
    // Nothing more comes: at the trailers, the tail goes.
    let d = r.on_data(Some(&b), b"", true);
    assert_eq!(d.edit, Edit::Replace(json.as_bytes()[at..at + 8].to_vec()));
    assert!(!r.holds());

    // A CR-framed stream ending in the trailers its head announced, its last event without a
    // blank line.
    let sse = "event: message_start\rdata: {}\r\revent: message_delta\rdata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":1096}}";
    let want = sse.replace(r#""max_tokens""#, r#""model_context_window_exceeded""#);
    let head_sse = Head {
        content_type: Some("text/event-stream"),
        trailers: true,
        ..head
    };
    for a in 0..=sse.len() {
        let chunks = [&sse.as_bytes()[..a], &sse.as_bytes()[a..]];
        let got = through(&mut Response::default(), &b, &head_sse, &chunks, true);
        assert_eq!(got, (want.clone().into_bytes(), 1), "cut {a}");
    }
    // Trailers the head did not announce: the events before the partial one passed at once,
    // and the partial event, which the host did not keep anything to join, cannot go.
    let unannounced = Head {
        trailers: false,
        ..head_sse
    };
    let first = "event: message_start\rdata: {}\r\r".len();
    for a in first..sse.len() {
        let chunks = [&sse.as_bytes()[..a], &sse.as_bytes()[a..]];
        let mut r = Response::default();
        let (out, edits, arrived) = through_each(&mut r, &b, &unannounced, &chunks, true);
        assert_eq!((&out[..], edits), (&sse.as_bytes()[..first], 0), "cut {a}");
        assert_eq!(arrived, [first, first], "cut {a}");
        assert!(r.holds() && !r.host_keeps());
    }

    // A window error ending in trailers: translated.
    let e = Budget {
        cap: Some(32000),
        ..budget(Dialect::Anthropic)
    };
    let error = head_error();
    let chunks = [&V32_CAP.as_bytes()[..40], &V32_CAP.as_bytes()[40..]];
    let (out, translated) = through(&mut Response::default(), &e, &error, &chunks, true);
    assert_eq!(translated, 1);
    assert!(message(&out).starts_with("input length and `max_tokens` exceed context limit"));
}

fn head_error() -> Head<'static> {
    head(400, "application/json")
}

#[test]
fn a_stream_waits_in_the_host_only_up_to_the_bound() {
    let b = Budget {
        window_cap: Some(8),
        ..budget(Dialect::Anthropic)
    };
    let event = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
    // Every chunk ends inside an event: the host keeps the events before it (the head
    // announced trailers).
    let mut r = Response::default();
    let announced = Head {
        trailers: true,
        ..head(200, "text/event-stream")
    };
    r.on_headers(Some(&b), true, &announced);
    let chunk = [&event.as_bytes()[5..], &event.as_bytes()[..5]].concat();
    let mut kept = 0;
    let mut chunks = 0;
    let last = loop {
        chunks += 1;
        let d = r.on_data(Some(&b), &chunk, false);
        if !r.holds() {
            break d.edit;
        }
        match d.edit {
            Edit::Replace(sent) => kept += sent.len(),
            Edit::Keep => panic!("a partial event is held"),
        }
    };
    assert_eq!(chunks, stop::MAX_HELD / event.len() + 1);
    // Released as it came: the host's bytes, the chunk's and what the editor held.
    match last {
        Edit::Replace(sent) => {
            assert_eq!(kept + sent.len(), chunks * chunk.len());
            assert!(kept + sent.len() > stop::MAX_HELD);
        }
        Edit::Keep => panic!("released"),
    }
    // The editor stepped aside.
    assert_eq!(r.on_data(Some(&b), b"x\n\n", false), Data::keep());
    assert!(!r.holds());
}

#[test]
fn complete_events_pass_at_once_and_only_a_partial_event_waits() {
    let b = Budget {
        window_cap: Some(1096),
        ..budget(Dialect::Anthropic)
    };
    let events = "event: message_start\ndata: {}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\nevent: content_block_stop\ndata: {}\n\n";
    let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":1096}}\n\n";
    let stop = "event: message_stop\ndata: {}\n\n";
    let sse = [events, delta, stop].concat();
    let want = sse.replace(r#""max_tokens""#, r#""model_context_window_exceeded""#);
    let delta_at = events.len();
    let plain = head(200, "text/event-stream");
    let announced = Head {
        trailers: true,
        ..plain
    };
    for cut in delta_at + 1..delta_at + delta.len() {
        let chunks = [&sse.as_bytes()[..cut], &sse.as_bytes()[cut..]];
        // Unannounced: the three events reach the client with the first chunk.
        let (out, edits, arrived) =
            through_each(&mut Response::default(), &b, &plain, &chunks, false);
        assert_eq!((out, edits), (want.clone().into_bytes(), 1), "cut {cut}");
        assert_eq!(arrived, [delta_at, want.len()], "cut {cut}");
        // Announced trailers: the host keeps them with the partial event.
        let (out, edits, arrived) =
            through_each(&mut Response::default(), &b, &announced, &chunks, true);
        assert_eq!((out, edits), (want.clone().into_bytes(), 1), "cut {cut}");
        assert_eq!(arrived, [0, want.len()], "cut {cut}");
    }
    // A partial event alone waits only up to the bound, then passes as it came.
    let mut r = Response::default();
    r.on_headers(Some(&b), true, &plain);
    let big = format!("event: ping\ndata: {}", "x".repeat(stop::MAX_HELD));
    let d = r.on_data(Some(&b), &big.as_bytes()[..stop::MAX_HELD], false);
    assert_eq!((d.edit, r.holds()), (Edit::Replace(Vec::new()), true));
    let d = r.on_data(Some(&b), &big.as_bytes()[stop::MAX_HELD..], false);
    assert_eq!(d.edit, Edit::Replace(big.into_bytes()));
    assert!(!r.holds());
}

const LLAMA_FULL: &str =
    r#"{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}"#;

#[test]
fn llamacpp_full_context_before_any_output_is_the_window_error() {
    let b = |dialect| Budget {
        backend: Backend::Llamacpp,
        ..budget(dialect)
    };
    let wants = [
        (
            Dialect::OpenAi,
            r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, your messages resulted in 4096 tokens (3000 in the messages, 1096 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        ),
        (
            Dialect::Anthropic,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 3000 + 1096 > 4096, decrease input length or `max_tokens` and try again"}}"#,
        ),
    ];
    for (dialect, want) in wants {
        let mut r = Response::default();
        let step = r.on_headers(Some(&b(dialect)), true, &head(500, "application/json"));
        assert_eq!(step, HeadStep::Hold);
        assert_eq!(r.on_body(LLAMA_FULL.len(), true), BodyStep::Read);
        let d = r.on_data(Some(&b(dialect)), LLAMA_FULL.as_bytes(), true);
        assert_eq!(d.edit, Edit::Replace(want.as_bytes().to_vec()));
        // No window is learned from it: it names none.
        assert_eq!(d.translated.map(|e| e.context), Some(None));
    }
    // Another server's 500, and llama.cpp's other 500s: not held, or byte for byte.
    let mut r = Response::default();
    let vllm = budget(Dialect::OpenAi);
    assert_eq!(
        r.on_headers(Some(&vllm), true, &head(500, "application/json")),
        HeadStep::Pass
    );
    let other = LLAMA_FULL.replace("Context size has been exceeded.", "Compute error.");
    let mut r = Response::default();
    r.on_headers(
        Some(&b(Dialect::OpenAi)),
        true,
        &head(500, "application/json"),
    );
    let d = r.on_data(Some(&b(Dialect::OpenAi)), other.as_bytes(), true);
    assert_eq!((d.edit, d.translated), (Edit::Keep, None));
    // Translation off: passes.
    let mut r = Response::default();
    let step = r.on_headers(
        Some(&b(Dialect::OpenAi)),
        false,
        &head(500, "application/json"),
    );
    assert_eq!(step, HeadStep::Pass);
}

#[test]
fn llamacpp_streams_are_watched_for_the_full_context() {
    let b = Budget {
        backend: Backend::Llamacpp,
        ..budget(Dialect::OpenAi)
    };
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
    let full = format!("data: {LLAMA_FULL}\n\n");
    let stream = [chunk, &full].concat();
    let want = [chunk, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"].concat();
    let sse = head(200, "text/event-stream");
    for a in 0..=stream.len() {
        let chunks = [&stream.as_bytes()[..a], &stream.as_bytes()[a..]];
        let mut r = Response::default();
        let (out, edits, arrived) = through_each(&mut r, &b, &sse, &chunks, false);
        assert_eq!(
            (String::from_utf8(out).unwrap(), edits),
            (want.clone(), 1),
            "cut {a}"
        );
        // The chunk event passes once its first line has ended or is past what names it; the
        // error waits.
        let first = match a {
            a if a == stream.len() => want.len(),
            a if a >= chunk.len() => chunk.len(),
            // Its line ends 2 bytes before its end.
            a if a > overflow::MAX_FIRST_LINE || a > chunk.len() - 2 => a,
            _ => 0,
        };
        assert_eq!(arrived[0], first, "cut {a}");
    }
    let mut r = Response::default();
    assert_eq!(r.on_headers(Some(&b), true, &sse), HeadStep::Watch);
    // Not for another backend, nor with translation off.
    let mut r = Response::default();
    assert_eq!(
        r.on_headers(Some(&budget(Dialect::OpenAi)), true, &sse),
        HeadStep::Pass
    );
    assert_eq!(r.on_headers(Some(&b), false, &sse), HeadStep::Pass);
}
