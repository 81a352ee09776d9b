//! Cache hits decided on a body read in part (`flow::partial`): the same step, counters and
//! report as the whole body, whatever the unread bytes are; every request a hit would read
//! inside a value of comes back to be read whole, with nothing counted.

use super::support::*;
use crate::digest::digest;
use crate::flow::partial::{self, hole, Known, Partial};
use crate::flow::*;

const CHAT_PATH: &str = "/v1/chat/completions";
const MESSAGES_PATH: &str = "/v1/messages";

/// Every count and context call answered: a count of 1000 in a window of 8192.
const ANSWER: &str = r#"{"count":1000,"max_model_len":8192,"input_tokens":1000,"data":[{"id":"m","max_model_len":8192}]}"#;

/// Runs `f` from empty tables of guesses and layouts (the tests also run in V8).
fn from_empty_tables<T>(f: impl FnOnce() -> T) -> T {
    crate::json::guess::forget();
    partial::forget();
    f()
}

/// `n` user messages of `len` bytes of `c`.
fn messages(n: usize, len: usize, c: &str) -> String {
    let one = format!(r#"{{"role":"user","content":"{}"}}"#, c.repeat(len));
    format!("[{}]", vec![one; n].join(","))
}

/// Two tools with long descriptions.
fn tools() -> String {
    let one = format!(
        r#"{{"type":"function","function":{{"name":"read","description":"{}","parameters":{{"type":"object"}}}}}}"#,
        "d".repeat(3000)
    );
    format!("[{one},{one}]")
}

/// The body as a host reads it in part on this thread's layout for its length: each hole
/// filled with `fill`, each value's digest made over the body's own bytes.
fn in_part(body: &[u8], fill: u8) -> Partial {
    let mut bytes = body.to_vec();
    let values = partial::layout(body.len())
        .into_iter()
        .map(|span| {
            bytes[hole(&span)].fill(fill);
            Known {
                digest: digest(&body[span.clone()]),
                span,
            }
        })
        .collect();
    Partial {
        body: bytes,
        values,
    }
}

/// An exchange that has buffered a whole body of `len` bytes and asks to read it.
fn buffered(p: &Plugin, host: &mut FakeHost, path: &'static str, len: usize) -> Exchange {
    let mut x = Exchange::new();
    assert_eq!(x.on_headers(p, host, &head(path)), RequestHeadStep::Buffer);
    assert_eq!(x.on_body_chunk(p, host, len, true), RequestBodyStep::Read);
    x
}

/// Sends `body` and answers its calls until it is decided: its count is stored.
fn stored(p: &Plugin, host: &mut FakeHost, path: &'static str, body: &str) {
    let (mut x, mut step) = send(p, host, path, body);
    for _ in 0..3 {
        if !matches!(step, Step::Wait) {
            return;
        }
        step = reply(p, host, &mut x, 200, ANSWER);
    }
    panic!("not decided");
}

/// What a step does to `body`: the bytes that go upstream, or the action's name.
fn outcome(step: &Step, body: &[u8]) -> Result<Vec<u8>, String> {
    match step {
        Step::Done(Action::Rewrite(r)) => Ok(r.edit().apply(body)),
        other => Err(format!("{other:?}")),
    }
}

/// Decides `body` once read in part (holes filled with `fill`) and once whole, each on a new
/// exchange: the step's outcome, the counters and the report must be the same.
fn same_decision(p: &Plugin, host: &mut FakeHost, path: &'static str, body: &str, fill: u8) {
    let b = body.as_bytes();
    let mut part = buffered(p, host, path, b.len());
    let before = (host.metrics.len(), host.route_metrics.len());
    let step = part
        .on_partial(p, host, in_part(b, fill))
        .expect("decided on the part read");
    settle(p, host, &mut part, &step);
    let by_part = (
        host.metrics[before.0..].to_vec(),
        host.route_metrics[before.1..].to_vec(),
    );

    let mut whole = buffered(p, host, path, b.len());
    let before = (host.metrics.len(), host.route_metrics.len());
    let whole_step = whole.on_body(p, host, b.to_vec());
    settle(p, host, &mut whole, &whole_step);
    let by_whole = (
        host.metrics[before.0..].to_vec(),
        host.route_metrics[before.1..].to_vec(),
    );

    assert_eq!(outcome(&step, b), outcome(&whole_step, b), "fill {fill}");
    assert!(outcome(&step, b).is_ok(), "a rewrite");
    assert_eq!(by_part, by_whole, "fill {fill}");
    assert_eq!(
        part.response_headers(p),
        whole.response_headers(p),
        "fill {fill}"
    );
}

/// The spans of `values` in `body`, found by their text.
fn spans(body: &str, values: &[&str]) -> Vec<std::ops::Range<usize>> {
    values
        .iter()
        .map(|v| {
            let at = body.find(v).unwrap();
            at..at + v.len()
        })
        .collect()
}

#[test]
fn a_hit_read_in_part_decides_as_the_whole_body() {
    let (m, t) = (messages(3, 2000, "a"), tools());
    let thinking = r#""thinking":{"type":"enabled","budget_tokens":30000}"#;
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            CHAT_PATH,
            format!(r#"{{"model":"m","messages":{m},"max_tokens":32768}}"#),
            vec![&m],
        ),
        (
            CHAT_PATH,
            format!(
                r#"{{"model":"m","messages":{m},"tools":{t},"stream":true,"max_completion_tokens":32768}}"#
            ),
            vec![&m, &t],
        ),
        // No cap: one is appended after the values.
        (
            CHAT_PATH,
            format!(r#"{{"messages":{m},"model":"m"}}"#),
            vec![&m],
        ),
        // The cap before the values.
        (
            CHAT_PATH,
            format!(r#"{{"max_tokens":32768,"tools":{t},"model":"m","messages":{m}}}"#),
            vec![&m, &t],
        ),
        (
            MESSAGES_PATH,
            format!(
                r#"{{"model":"m","max_tokens":32000,{thinking},"system":"be brief","messages":{m}}}"#
            ),
            vec![&m],
        ),
    ];
    for (path, body, values) in &cases {
        from_empty_tables(|| {
            let (p, mut host) = setup("");
            stored(&p, &mut host, path, body);
            assert_eq!(
                partial::layout(body.len()),
                vec![],
                "guesses not proved yet"
            );
            // The same prompt again: its guesses are proved by the stored count.
            let (_, step) = send(&p, &mut host, path, body);
            assert!(matches!(step, Step::Done(Action::Rewrite(_))), "{body:.60}");
            assert_eq!(partial::layout(body.len()), spans(body, values));
            for fill in [0, b'"', b']', b'a'] {
                same_decision(&p, &mut host, path, body, fill);
            }
            assert_eq!(host.count(Metric::CacheHits), 1 + 2 * 4);
            assert_eq!(host.count(Metric::CacheMisses), 1);
        });
    }
}

/// A host reads into the buffer of its last body read in part: the holes then hold that
/// body's bytes. Where a shorter prompt that begins the same way ended, they end as it did;
/// the guess for that value, which this thread's table still holds, is not made.
#[test]
fn holes_that_hold_another_bodys_bytes_are_not_guessed_into() {
    from_empty_tables(|| {
        let (p, mut host) = setup("");
        let short = format!(
            r#"{{"model":"m","messages":{},"max_tokens":32768}}"#,
            messages(3, 2000, "a")
        );
        let long = format!(
            r#"{{"model":"m","messages":{},"max_tokens":32768}}"#,
            messages(6, 2000, "a")
        );
        // The long one is first sent on a bound from the short one's count (its new
        // messages counted alone), then counted whole, then a hit.
        for body in [&short, &long] {
            stored(&p, &mut host, CHAT_PATH, body);
            stored(&p, &mut host, CHAT_PATH, body);
            send(&p, &mut host, CHAT_PATH, body);
            assert_eq!(partial::layout(body.len()).len(), 1);
        }
        assert_eq!(host.count(Metric::CacheHits), 3);
        // The long body read into the buffer the short one was read into.
        let mut read = in_part(long.as_bytes(), 0);
        let hole = hole(&read.values[0].span);
        let stale = &short.as_bytes()[hole.start..short.len()];
        read.body[hole.start..hole.start + stale.len()].copy_from_slice(stale);
        let mut x = buffered(&p, &mut host, CHAT_PATH, long.len());
        let Ok(step) = x.on_partial(&p, &mut host, read) else {
            panic!("not decided on the part read");
        };
        assert_eq!(
            outcome(&step, long.as_bytes()),
            Ok(long
                .replacen("32768", &(8192 - 1000).to_string(), 1)
                .into_bytes())
        );
    });
}

/// On `body`'s layout, `partial` must come back as read, with nothing counted or sent.
fn comes_back(p: &Plugin, host: &mut FakeHost, path: &'static str, partial: Partial) {
    let read = partial.body.clone();
    let mut x = buffered(p, host, path, read.len());
    let before = (host.metrics.len(), host.calls.len(), host.shared.clone());
    match x.on_partial(p, host, partial) {
        Err(back) => assert_eq!(back, read),
        Ok(_) => panic!("decided on the part read"),
    }
    assert_eq!(
        (host.metrics.len(), host.calls.len(), host.shared.clone()),
        before
    );
    assert!(x.report.is_none(), "nothing concluded");
}

#[test]
fn a_body_a_hit_would_read_inside_comes_back() {
    from_empty_tables(|| {
        let (p, mut host) = setup("");
        let m = messages(3, 2000, "a");
        let body = format!(r#"{{"model":"m","messages":{m},"max_tokens":32768}}"#);
        let b = body.as_bytes();
        stored(&p, &mut host, CHAT_PATH, &body);
        send(&p, &mut host, CHAT_PATH, &body);
        assert_eq!(partial::layout(b.len()).len(), 1);

        // Another prompt of that length, with the same edges: no count is stored for it.
        let other = body.replacen("aaaa", "bbbb", 1);
        assert_eq!(other.len(), body.len());
        comes_back(&p, &mut host, CHAT_PATH, in_part(other.as_bytes(), 0));

        // A digest that is not the value's.
        let mut wrong = in_part(b, 0);
        wrong.values[0].digest ^= 1;
        comes_back(&p, &mut host, CHAT_PATH, wrong);

        // A span the analysis did not jump.
        let mut shifted = in_part(b, 0);
        shifted.values[0].span.end -= 1;
        comes_back(&p, &mut host, CHAT_PATH, shifted);

        // A span that does not begin where the value does: the value is skimmed, not jumped.
        let mut later = in_part(b, b'a');
        later.values[0].span.start += 1;
        comes_back(&p, &mut host, CHAT_PATH, later);

        // Not a request on the guesses.
        let mut broken = in_part(b, 0);
        broken.body[2] = b'!';
        comes_back(&p, &mut host, CHAT_PATH, broken);

        // And the body itself still decides on the part read.
        same_decision(&p, &mut host, CHAT_PATH, &body, 0);
    });
}

/// A request whose hit reads its values whole learns no layout, and read in part on the
/// layout of a request like it, comes back.
#[test]
fn a_hit_that_reads_the_values_learns_no_layout_and_comes_back() {
    let m = messages(3, 2000, "a");
    let plain = format!(r#"{{"model":"m","messages":{m},"max_tokens":32768}}"#);
    for (extra, body) in [
        // T is checked against every message's content.
        (
            "",
            format!(r#"{{"model":"m","messages":{m},"truncate_prompt_tokens":99}}"#),
        ),
        // The check of `tools` reads into it.
        (r#","estimate_constrained":true"#, plain.clone()),
    ] {
        from_empty_tables(|| {
            let (p, mut host) = setup(extra);
            stored(&p, &mut host, CHAT_PATH, &body);
            let (_, step) = send(&p, &mut host, CHAT_PATH, &body);
            assert!(!matches!(step, Step::Wait), "a hit");
            assert_eq!(host.count(Metric::CacheHits), 1);
            assert_eq!(partial::layout(body.len()), vec![]);
            let at = body.find(&m).unwrap();
            let span = at..at + m.len();
            let mut read = body.as_bytes().to_vec();
            read[hole(&span)].fill(0);
            let part = Partial {
                body: read,
                values: vec![Known {
                    digest: digest(&body.as_bytes()[span.clone()]),
                    span,
                }],
            };
            comes_back(&p, &mut host, CHAT_PATH, part);
        });
    }
}

/// Caps on both sides of `messages`: the rewrite's new head would carry the value's bytes.
#[test]
fn a_rewrite_whose_head_spans_a_value_comes_back() {
    from_empty_tables(|| {
        let (p, mut host) = setup("");
        let m = messages(3, 2000, "a");
        let body = format!(
            r#"{{"max_tokens":32768,"model":"m","messages":{m},"max_completion_tokens":32000}}"#
        );
        stored(&p, &mut host, CHAT_PATH, &body);
        let (_, step) = send(&p, &mut host, CHAT_PATH, &body);
        let Step::Done(Action::Rewrite(r)) = &step else {
            panic!("not rewritten: {step:?}");
        };
        let at = body.find(&m).unwrap();
        let h = hole(&(at..at + m.len()));
        assert!(
            r.edit().keep < h.start && h.end < r.edit().end,
            "the head spans it"
        );
        assert_eq!(partial::layout(body.len()).len(), 1);
        comes_back(&p, &mut host, CHAT_PATH, in_part(body.as_bytes(), 0));
    });
}

#[test]
fn holes_leave_the_edges_a_guess_reads() {
    assert_eq!(hole(&(10..4106)), 74..4042);
    assert_eq!(hole(&(0..100)), 64..64);
    assert!(hole(&(5..20)).is_empty());
}
