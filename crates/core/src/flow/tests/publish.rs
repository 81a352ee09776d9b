//! What the exchange publishes (docs/spec.md §9a): the decision once the host applied it, the
//! answer's usage once read, each once.

use super::support::*;
use crate::flow::*;
use crate::publish::{CHARGE, MAX_TOKENS, OUTCOME, PROMPT, SOURCE, USAGE_PROMPT, WINDOW};

fn names(v: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    v.to_vec()
}

fn pairs(v: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    v.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The exchange's count answered: 100 tokens in a window of 40960, and a rewrite decided.
fn counted_100(x: &mut Exchange, p: &Plugin, host: &mut FakeHost) {
    let token = host.last_token();
    let step = x.on_reply(
        p,
        host,
        &reply_of(token, Some(200), tokenized(100, 40960).as_bytes()),
    );
    assert!(matches!(step, Some(Step::Done(Action::Rewrite(_)))));
}

#[test]
fn a_rewrite_is_published_once_applied_and_the_usage_once_read() {
    let (p, mut host) = setup(r#","context_length":40960"#);
    let mut x = Exchange::new();
    assert_eq!(
        x.on_headers(&p, &mut host, &head("/v1/chat/completions")),
        RequestHeadStep::Buffer
    );
    assert_eq!(x.published(), vec![], "nothing before the decision");
    let _ = x.on_body_chunk(&p, &mut host, CHAT.len(), true);
    let _ = x.on_body(&p, &mut host, CHAT.as_bytes().to_vec());
    counted_100(&mut x, &p, &mut host);
    assert_eq!(
        x.published(),
        vec![],
        "a rewrite is published once the host applied it"
    );
    x.applied(&p, &mut host, true);
    // The caller's 32768 is below what the window leaves (40860): it is the cap written.
    let cap: u64 = 32768;
    let (c, w) = (cap.to_string(), "40960".to_string());
    let charge = (100 + cap).to_string();
    assert_eq!(
        names(&x.published()),
        pairs(&[
            (OUTCOME, "rewritten"),
            (SOURCE, "exact"),
            (PROMPT, "100"),
            (WINDOW, w.as_str()),
            (MAX_TOKENS, c.as_str()),
            (CHARGE, charge.as_str()),
        ])
    );
    assert_eq!(x.published(), vec![], "each value once");
    let body = br#"{"id":"x","usage":{"prompt_tokens":101,"completion_tokens":3}}"#;
    json_answer(&mut x, &p, &mut host, 200, body);
    assert_eq!(names(&x.published()), pairs(&[(USAGE_PROMPT, "101")]));
    assert_eq!(x.published(), vec![]);
}

#[test]
fn a_rewrite_the_host_fails_to_apply_is_published_unchanged_without_a_cap() {
    let (p, mut host) = setup(r#","context_length":40960"#);
    let (mut x, _) = send(&p, &mut host, "/v1/chat/completions", CHAT);
    counted_100(&mut x, &p, &mut host);
    x.applied(&p, &mut host, false);
    assert_eq!(
        names(&x.published()),
        pairs(&[
            (OUTCOME, "unchanged:internal"),
            (SOURCE, "exact"),
            (PROMPT, "100"),
            (WINDOW, "40960"),
            (CHARGE, "40960"),
        ])
    );
}

#[test]
fn a_request_not_budgeted_publishes_its_outcome_alone() {
    let (p, mut host) = setup("");
    let mut x = Exchange::new();
    let get = RequestHead {
        method: Some("GET"),
        path: Some("/v1/models"),
        ..RequestHead::default()
    };
    assert_eq!(x.on_headers(&p, &mut host, &get), RequestHeadStep::Continue);
    assert_eq!(
        names(&x.published()),
        pairs(&[(OUTCOME, "unchanged:method")])
    );
}
