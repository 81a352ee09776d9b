//! The answer's usage as the check and the next anchor (docs/spec.md §15a).

use super::support::*;
use crate::flow::*;

/// An Anthropic stream whose `message_start` reports `input` tokens (of which `cached` read
/// from the cache), cut into chunks at every `step` bytes.
fn anthropic_stream(input: u64, cached: u64) -> String {
    format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m\",\"usage\":{{\"input_tokens\":{input},\"cache_read_input_tokens\":{cached},\"output_tokens\":1}}}}}}\n\nevent: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"text\":\"hi\"}}}}\n\n"
    )
}

const CAP: &str = r#""max_tokens":16000"#;

/// The first Anthropic turn counted as `tokens`, its answer read; the exchange.
fn first_turn(p: &Plugin, host: &mut FakeHost, tokens: u64) -> Exchange {
    let (mut x, _) = send(p, host, "/v1/messages", anthropic_session(1, CAP));
    reply(
        p,
        host,
        &mut x,
        200,
        &format!(r#"{{"input_tokens":{tokens}}}"#),
    );
    x
}

fn stream_answer(p: &Plugin, host: &mut FakeHost, x: &mut Exchange, text: &str, step: usize) {
    let chunks: Vec<&[u8]> = text.as_bytes().chunks(step).collect();
    let (head, out) = answer(x, p, host, 200, "text/event-stream", &chunks);
    assert_eq!(head, response::HeadStep::Observe);
    assert_eq!(out, text.as_bytes(), "the answer passes as it came");
}

#[test]
fn a_skipped_turn_is_checked_and_anchored_by_its_answers_usage() {
    let (p, mut host) = setup(r#","context_length":40960"#);
    let mut x = first_turn(&p, &mut host, 900);
    stream_answer(&p, &mut host, &mut x, &anthropic_stream(900, 0), 7);
    assert_eq!(host.count(Metric::UsageMismatch), 0);
    let calls = host.calls.len();
    // The next turn fits by its bound: no call; its answer's usage checks it, byte by byte.
    let (mut y, step) = send(&p, &mut host, "/v1/messages", anthropic_session(2, CAP));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    stream_answer(&p, &mut host, &mut y, &anthropic_stream(1000, 200), 1);
    assert_eq!(host.count(Metric::UsageChecks), 1);
    assert!(1200 <= p_hi);
    assert_eq!(host.count(Metric::BoundViolations), 0);
    // No count once the stream ends: the usage was the check.
    y.on_stream_end(&p, &mut host);
    assert_eq!(y.pending_token(), None);
    assert_eq!(host.calls.len(), calls);
    assert_eq!(host.count(Metric::BoundChecks), 0);
    // The third turn is proved from the usage's anchor (1200 exact), not from P_hi.
    let (z, _) = send(&p, &mut host, "/v1/messages", anthropic_session(3, CAP));
    let z_hi: u64 = header(&z, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    let (w, _) = {
        let mut other = FakeHost::default();
        let q = plugin(r#","context_length":40960"#);
        let mut a = first_turn(&q, &mut other, 900);
        stream_answer(&q, &mut other, &mut a, &anthropic_stream(900, 0), 64);
        let (mut b, _) = send(&q, &mut other, "/v1/messages", anthropic_session(2, CAP));
        b.on_stream_end(&q, &mut other);
        let token = b.pending_token().unwrap();
        let count = r#"{"input_tokens":1200}"#;
        b.on_reply(
            &q,
            &mut other,
            &reply_of(token, Some(200), count.as_bytes()),
        );
        send(&q, &mut other, "/v1/messages", anthropic_session(3, CAP))
    };
    let w_hi: u64 = header(&w, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    assert_eq!(
        z_hi, w_hi,
        "the usage anchors as the count after the answer does"
    );
    assert_eq!(host.calls.len(), calls);
}

#[test]
fn a_usage_above_the_bound_turns_skipping_off() {
    let (p, mut host) = setup(r#","context_length":40960"#);
    let mut x = first_turn(&p, &mut host, 900);
    stream_answer(&p, &mut host, &mut x, &anthropic_stream(900, 0), 64);
    let (mut y, _) = send(&p, &mut host, "/v1/messages", anthropic_session(2, CAP));
    let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    stream_answer(&p, &mut host, &mut y, &anthropic_stream(p_hi + 1, 0), 64);
    assert_eq!(host.count(Metric::BoundViolations), 1);
    let calls = host.calls.len();
    let (_, step) = send(&p, &mut host, "/v1/messages", anthropic_session(3, CAP));
    assert!(matches!(step, Step::Wait), "counted from now on");
    assert_eq!(host.calls.len(), calls + 1);
}

#[test]
fn an_answer_without_usage_is_checked_by_a_count_after_it() {
    let (p, mut host) = setup(r#","context_length":40960"#);
    let mut x = first_turn(&p, &mut host, 900);
    stream_answer(&p, &mut host, &mut x, &anthropic_stream(900, 0), 64);
    let (mut y, _) = send(&p, &mut host, "/v1/messages", anthropic_session(2, CAP));
    // Cut off before its usage.
    let cut = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_to";
    stream_answer(&p, &mut host, &mut y, cut, 16);
    assert_eq!(host.count(Metric::UsageChecks), 0);
    y.on_stream_end(&p, &mut host);
    assert!(y.pending_token().is_some(), "the count after the answer");
    assert_eq!(host.count(Metric::BoundChecks), 1);
}

#[test]
fn a_usage_that_differs_from_the_count_is_counted_each_time() {
    let (p, mut host) = setup(r#","context_length":40960,"skip_count":false"#);
    let mut x = first_turn(&p, &mut host, 900);
    stream_answer(&p, &mut host, &mut x, &anthropic_stream(900, 0), 5);
    // The same request again, from the cache: its answers' usage checks the stored count.
    for (usage, cached) in [(850, 49), (901, 0), (700, 200)] {
        let (mut y, _) = send(&p, &mut host, "/v1/messages", anthropic_session(1, CAP));
        assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("cache"));
        stream_answer(&p, &mut host, &mut y, &anthropic_stream(usage, cached), 5);
    }
    // 899 and 901 differ from 900; 700 + 200 does not.
    assert_eq!(host.count(Metric::UsageMismatch), 2);
    assert_eq!(host.calls.len(), 1);
}
