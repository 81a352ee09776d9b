//! Long prompts analyzed on a guess of where `messages` ends (`json::guess`): a guess proved
//! by a stored count or by the request's validation decides as the skim would have, and an
//! unproved or wrong one is never used.

use super::support::*;
use crate::dialect::Endpoint;
use crate::flow::*;
use crate::request::{analyze_at, analyze_guessing};

const CHAT_PATH: &str = "/v1/chat/completions";

/// A chat whose `messages` is `value` (over `json::guess::MIN_LEN`, so worth a guess).
fn chat(value: &str) -> String {
    format!(r#"{{"model":"m","messages":{value},"max_tokens":32768}}"#)
}

/// Two user messages of `a` and `b` bytes of text.
fn two_messages(a: usize, b: usize) -> String {
    format!(
        r#"[{{"role":"user","content":"{}"}},{{"role":"user","content":"{}"}}]"#,
        "a".repeat(a),
        "b".repeat(b)
    )
}

/// Runs `f` from an empty table of guesses (the tests also run in V8, which has no threads).
fn from_an_empty_table<T>(f: impl FnOnce() -> T) -> T {
    crate::json::guess::forget();
    f()
}

/// The count call's payload of each call made so far.
fn payloads(host: &FakeHost) -> Vec<serde_json::Value> {
    host.calls
        .iter()
        .map(|(_, _, call)| serde_json::from_slice(call.body.as_deref().unwrap()).unwrap())
        .collect()
}

#[test]
fn a_long_prompt_seen_before_is_decided_on_a_proved_guess() {
    from_an_empty_table(|| {
        let body = chat(&two_messages(3000, 3000));
        let config = plugin("");
        let (p, mut host) = (config, FakeHost::default());
        assert_eq!(
            analyze_guessing(body.as_bytes(), p.config(), Endpoint::OpenAi)
                .unwrap()
                .1,
            Vec::<usize>::new(),
            "nothing learned yet"
        );
        let (mut x, _) = send(&p, &mut host, CHAT_PATH, &body);
        let first = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(1000, 8192)));
        assert_eq!(first["max_tokens"], 8192 - 1000);

        // The same prompt again: `messages` (member 1) is guessed, and the count stored for
        // its key proves the guess.
        let (req, guessed) =
            analyze_guessing(body.as_bytes(), p.config(), Endpoint::OpenAi).unwrap();
        assert_eq!(guessed, vec![1]);
        assert_eq!(
            req,
            analyze_at(body.as_bytes(), p.config(), Endpoint::OpenAi).unwrap()
        );
        let (x2, step) = send(&p, &mut host, CHAT_PATH, &body);
        assert_eq!(rewritten(step), first);
        assert_eq!(host.calls.len(), 1, "a hit makes no call");
        assert_eq!(host.count(Metric::CacheHits), 1);
        assert_eq!(host.count(Metric::CacheMisses), 1);
        assert_eq!(header(&x2, &p, HEADER_SOURCE).as_deref(), Some("cache"));
    });
}

#[test]
fn a_new_prompt_that_begins_and_ends_as_one_seen_is_proved_by_its_validation() {
    from_an_empty_table(|| {
        let (p, mut host) = setup("");
        let first = chat(&two_messages(3000, 3000));
        let (mut x, _) = send(&p, &mut host, CHAT_PATH, &first);
        reply(&p, &mut host, &mut x, 200, &tokenized(1000, 8192));

        // Another prompt of the same length that begins and ends as the first: the guess is
        // made, no count is stored for its key, and the request validates: it is counted.
        let mut value = two_messages(3000, 3000);
        value.replace_range(1500..1504, "zzzz");
        let other = chat(&value);
        assert_eq!(other.len(), first.len());
        assert_eq!(
            analyze_guessing(other.as_bytes(), p.config(), Endpoint::OpenAi)
                .unwrap()
                .1,
            vec![1]
        );
        let (mut x, step) = send(&p, &mut host, CHAT_PATH, &other);
        assert!(
            matches!(step, Step::Wait),
            "counted, not decided on the guess"
        );
        assert_eq!(host.count(Metric::CacheMisses), 2);
        let sent = payloads(&host);
        assert_eq!(sent.len(), 2);
        let content = sent[1]["messages"][0]["content"].as_str().unwrap();
        assert_eq!(content.find("zzzz"), Some(1500 - 27));
        let v = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(2000, 8192)));
        assert_eq!(v["max_tokens"], 8192 - 2000);
        assert_eq!(v["messages"][0]["content"].as_str().unwrap(), content);
    });
}

#[test]
fn a_wrong_guess_is_never_used() {
    from_an_empty_table(|| {
        let (p, mut host) = setup("");
        let first = chat(&two_messages(3000, 3000));
        let (mut x, _) = send(&p, &mut host, CHAT_PATH, &first);
        reply(&p, &mut host, &mut x, 200, &tokenized(1000, 8192));

        // `messages` begins as the first one's and, at its length, ends as it ended, but goes
        // on: the second message is wrapped in an array (one `a` less keeps the length), and
        // a third follows.
        let value = two_messages(2999, 3000).replacen(r#"},{"#, r#"},[{"#, 1);
        let value = format!(
            r#"{}],{{"role":"user","content":"c"}}]"#,
            &value[..value.len() - 1]
        );
        let wrong = chat(&value);
        let (req, guessed) =
            analyze_guessing(wrong.as_bytes(), p.config(), Endpoint::OpenAi).unwrap();
        assert_eq!(
            guessed,
            Vec::<usize>::new(),
            "the guessed scan fails: no guess is kept"
        );
        let skimmed = analyze_at(wrong.as_bytes(), p.config(), Endpoint::OpenAi).unwrap();
        assert_eq!(req, skimmed);
        assert_eq!(
            &wrong.as_bytes()[req.members[1].value.clone()],
            value.as_bytes()
        );

        let (mut x, step) = send(&p, &mut host, CHAT_PATH, &wrong);
        assert!(matches!(step, Step::Wait));
        assert_eq!(payloads(&host)[1]["messages"][2]["content"], "c");
        let v = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(1500, 8192)));
        assert_eq!(v["max_tokens"], 8192 - 1500);
    });
}

/// A request for model `m` whose `messages` holds an object with members named `model` (as
/// `evil`) and `tools`, with the request's own long `tools` after it, then `rest`. This thread
/// is taught two wrong spans of it, as if values that began and ended as they do had been
/// read before: `messages` up to the end of the inner `n`, and the inner `tools` up to the end
/// of the request's own. The body, and that wrong `messages` span.
fn lookalike(rest: &str) -> (String, std::ops::Range<usize>) {
    let text = |c: &str| c.repeat(3000);
    let messages = format!(
        r#"[{{"c":"{}"}},{{"n":[{{"c":"{}"}}],"model":"evil","tools":[{{"c":"{}"}}]}}]"#,
        text("x"),
        text("y"),
        text("z")
    );
    let tools = format!(r#""tools":[{{"c":"{}"}}]"#, text("w"));
    let body = format!(r#"{{"model":"m","messages":{messages},{tools}{rest}}}"#);
    let b = body.as_bytes();
    let start = body.find(r#"[{"c":"x"#).unwrap();
    let n_end = body.find(r#"],"model":"evil""#).unwrap() + 1;
    let inner = body.find(r#"[{"c":"z"#).unwrap();
    let tools_end = body.find(&tools).unwrap() + tools.len();
    crate::json::guess::learn(b, start, n_end);
    crate::json::guess::learn(b, inner, tools_end);
    (body, start..n_end)
}

#[test]
fn a_guessed_scan_that_reads_but_is_not_proved_is_analyzed_again() {
    from_an_empty_table(|| {
        let (p, mut host) = setup("");
        let (body, wrong) = lookalike(r#","max_tokens":32768"#);
        let b = body.as_bytes();

        // On those guesses the body reads as a request for model `evil` whose `messages` and
        // `tools` are not JSON values: no count is stored for its key and it does not
        // validate, so it is analyzed again.
        let (guessed_req, guessed) = analyze_guessing(b, p.config(), Endpoint::OpenAi).unwrap();
        assert_eq!(guessed, vec![1, 3]);
        assert_eq!(guessed_req.members[1].value, wrong);
        assert_eq!(guessed_req.model_name(b), "evil");
        let (mut x, step) = send(&p, &mut host, CHAT_PATH, &body);
        assert!(matches!(step, Step::Wait), "counted as the request it is");
        let sent = payloads(&host);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["model"], "m");
        assert_eq!(sent[0]["messages"].as_array().map(Vec::len), Some(2));
        assert_eq!(sent[0]["tools"][0]["c"], "w".repeat(3000));
        let v = rewritten(reply(&p, &mut host, &mut x, 200, &tokenized(3000, 8192)));
        assert_eq!(v["max_tokens"], 8192 - 3000);
    });
}

#[test]
fn a_guessed_value_the_key_does_not_hash_is_validated_at_once() {
    from_an_empty_table(|| {
        let (p, mut host) = setup("");
        // A request for model `evil` is counted and stored.
        let evil =
            r#"{"model":"evil","messages":[{"c":"q"}],"tools":[{"c":"r"}],"max_tokens":32768}"#;
        let (mut x, _) = send(&p, &mut host, CHAT_PATH, evil);
        reply(&p, &mut host, &mut x, 200, &tokenized(100, 8192));

        // A lookalike with a second `messages` and `tools` after its own, the ones its key
        // hashes: the same as the `evil` request's.
        let (body, _) =
            lookalike(r#","messages":[{"c":"q"}],"tools":[{"c":"r"}],"max_tokens":32768"#);
        let b = body.as_bytes();

        // On the guesses it would read as the `evil` request (the same key), with the guessed
        // members among those its key does not hash, which the count cannot vouch for: the
        // analysis validates them at once, they are not JSON values, and the body is analyzed
        // without guesses and counted as itself.
        let (req, guessed) = analyze_guessing(b, p.config(), Endpoint::OpenAi).unwrap();
        assert_eq!(guessed, Vec::<usize>::new());
        assert_eq!(req.model_name(b), "m");
        assert_eq!(req, analyze_at(b, p.config(), Endpoint::OpenAi).unwrap());
        let (_, step) = send(&p, &mut host, CHAT_PATH, &body);
        assert!(
            matches!(step, Step::Wait),
            "counted, not decided on the evil count"
        );
        assert_eq!(host.count(Metric::CacheHits), 0);
        assert_eq!(payloads(&host)[1]["model"], "m");
    });
}
