use super::*;

/// llama-server's events, as its pinned release writes them.
const ANTHROPIC_HEAD: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" Norwich\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" conduc\"}}\n\n";
const ANTHROPIC_FULL: &str = "event: error\ndata: {\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}\n\n";
const CHAT_HEAD: &str = "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" schon\"}}],\"created\":1796590095,\"id\":\"chatcmpl-H\",\"model\":\"qwen3-tiny\",\"object\":\"chat.completion.chunk\"}\n\n";
const OPENAI_FULL: &str = "data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}}\n\n";

const ANTHROPIC_END: &str = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"model_context_window_exceeded\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
const CHAT_END: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
const RESPONSES_END: &str = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model. Please adjust your input and try again.\"}}}\n\n";

/// The stream through a new editor in these pieces: what the client gets, whether the end
/// was written, and what was held after each piece.
fn run(dialect: Dialect, pieces: &[&[u8]]) -> (Vec<u8>, bool, Vec<usize>) {
    let mut o = Overflow::new(Backend::Llamacpp, dialect);
    let (mut out, mut edited, mut held) = (Vec::new(), false, Vec::new());
    for (i, p) in pieces.iter().enumerate() {
        match o.chunk(p, i + 1 == pieces.len()) {
            Edit::Keep => out.extend_from_slice(p),
            Edit::Replace(r) => out.extend_from_slice(&r),
        }
        edited |= o.take_edited();
        held.push(o.held());
    }
    (out, edited, held)
}

/// Every cut of `stream` into two pieces gives `want`.
fn every_cut(dialect: Dialect, stream: &str, want: &str, edited: bool) {
    for a in 0..=stream.len() {
        let (x, y) = stream.as_bytes().split_at(a);
        let (out, e, _) = run(dialect, &[x, y]);
        assert_eq!(String::from_utf8(out).unwrap(), want, "cut {a}");
        assert_eq!(e, edited, "cut {a}");
    }
}

#[test]
fn anthropic_full_context_ends_as_the_window_did() {
    let stream = [ANTHROPIC_HEAD, ANTHROPIC_FULL].concat();
    let want = [ANTHROPIC_HEAD, ANTHROPIC_END].concat();
    every_cut(Dialect::Anthropic, &stream, &want, true);
    // Framed with CRLF or CR alone: the same end (written with LF).
    for eol in ["\r\n", "\r"] {
        let framed = stream.replace('\n', eol);
        let head = ANTHROPIC_HEAD.replace('\n', eol);
        every_cut(
            Dialect::Anthropic,
            &framed,
            &[&head, ANTHROPIC_END].concat(),
            true,
        );
    }
    // No block open: no content_block_stop.
    let closed =
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
    let stream = [ANTHROPIC_HEAD, closed, ANTHROPIC_FULL].concat();
    let end = &ANTHROPIC_END[closed.len()..];
    every_cut(
        Dialect::Anthropic,
        &stream,
        &[ANTHROPIC_HEAD, closed, end].concat(),
        true,
    );
}

#[test]
fn openai_full_context_ends_with_length() {
    let stream = [CHAT_HEAD, CHAT_HEAD, OPENAI_FULL].concat();
    every_cut(
        Dialect::OpenAi,
        &stream,
        &[CHAT_HEAD, CHAT_HEAD, CHAT_END].concat(),
        true,
    );
    every_cut(
        Dialect::Responses,
        &stream,
        &[CHAT_HEAD, CHAT_HEAD, RESPONSES_END].concat(),
        true,
    );
}

#[test]
fn other_events_and_errors_pass_byte_for_byte() {
    let others = [
        // Another server error, the other shape, a look-alike, an unfinished error.
        "data: {\"error\":{\"code\":500,\"message\":\"Compute error.\",\"type\":\"server_error\"}}\n\n",
        "event: error\ndata: {\"code\":500,\"message\":\"Invalid input batch.\",\"type\":\"server_error\"}\n\n",
        "data: {\"error\":{\"code\":400,\"message\":\"Context size has been exceeded.\",\"type\":\"invalid_request_error\"}}\n\n",
        "data: {\"error\":{\"message\":\"Context size has been exceeded.\"}}\n\n",
        "event: error\ndata: not json\n\n",
        "data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}}",
        ": ping\n\n",
    ];
    for other in others {
        let stream = [CHAT_HEAD, other].concat();
        every_cut(Dialect::OpenAi, &stream, &stream, false);
    }
    // What follows a replaced error passes as it comes.
    let after = [CHAT_HEAD, OPENAI_FULL, "data: x\n\n"].concat();
    every_cut(
        Dialect::OpenAi,
        &after,
        &[CHAT_HEAD, CHAT_END, "data: x\n\n"].concat(),
        true,
    );
}

#[test]
fn only_an_event_that_may_be_the_error_waits() {
    // A content event passes once its first line names it.
    let (x, y) = CHAT_HEAD.as_bytes().split_at(80);
    let (out, _, held) = run(Dialect::OpenAi, &[x, y]);
    assert_eq!(out, CHAT_HEAD.as_bytes());
    assert_eq!(held, [0, 0]);
    let second = ANTHROPIC_HEAD.find("\n\n").unwrap() + 2;
    let (x, y) = ANTHROPIC_HEAD.as_bytes().split_at(second + 9);
    let (_, _, held) = run(Dialect::Anthropic, &[x, y]);
    assert_eq!(
        held,
        [9, 0],
        "the first line of the second event, to its end"
    );
    // The error waits to its blank line.
    let cut = OPENAI_FULL.len() - 1;
    let (x, y) = OPENAI_FULL.as_bytes().split_at(cut);
    let (_, edited, held) = run(Dialect::OpenAi, &[x, y]);
    assert_eq!((edited, held), (true, vec![cut, 0]));
    // Up to MAX_EVENT: then it passes as it came.
    let long = format!("data: {{\"error\":\"{}\"}}\n\n", "x".repeat(MAX_EVENT));
    let (x, y) = long.as_bytes().split_at(MAX_EVENT + 5);
    let (out, edited, held) = run(Dialect::OpenAi, &[x, y]);
    assert_eq!(
        (out, edited, held),
        (long.clone().into_bytes(), false, vec![0, 0])
    );
}
