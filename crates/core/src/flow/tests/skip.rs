use super::support::*;
use crate::flow::*;

#[test]
fn a_grown_conversation_whose_cap_fits_skips_the_count_and_is_checked_after() {
    let (p, mut host) = setup(SKIP);
    let cap = r#","max_tokens":16000"#;
    anchor(&p, &mut host, 900);
    assert_eq!(host.calls.len(), 1);

    let body = leak(session(2, cap));
    let (mut y, step) = send(&p, &mut host, "/v1/chat/completions", body);
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(host.calls.len(), 1, "no count on the request's path");
    assert_eq!(action(&y, &p), "unchanged:fits");
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    assert!(p_hi > 900 && p_hi + 16000 <= 40960, "{p_hi}");
    assert_eq!(host.count(Metric::CountSkipped), 1);
    assert_eq!(host.count(Metric::Unchanged(Reason::Fits)), 1);
    // The body goes on as it came; once the upstream answers, it is counted off its path.
    assert_eq!(
        y.on_body_chunk(&p, &mut host, body.len(), true),
        RequestBodyStep::Continue
    );
    y.on_stream_end(&p, &mut host);
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.calls[1].2.path, "/tokenize");
    assert_eq!(host.count(Metric::BoundChecks), 1);
    answer_check(&p, &mut host, &mut y, 1000);
    assert_eq!(host.count(Metric::BoundViolations), 0);
    // That exact count anchors the next turn, which skips again.
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(3, cap)));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(host.calls.len(), 2);
    // The same body again is a plain cache hit of the checked count.
    let (z, step) = send(&p, &mut host, "/v1/chat/completions", body);
    rewritten(step);
    assert_eq!(header(&z, &p, HEADER_PROMPT).as_deref(), Some("1000"));
}

#[test]
fn a_bound_that_does_not_prove_the_outcome_counts() {
    let (p, mut host) = setup(SKIP);
    let cap = r#","max_tokens":16000"#;
    anchor(&p, &mut host, 40880);
    let (mut y, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
    assert!(
        matches!(step, Step::Wait),
        "40880 + the bound of a turn leaves less than R = 64"
    );
    // Not even a quarter of the new bytes a token would leave R: the whole prompt is counted.
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.count(Metric::TailCounts), 0);
    let v = rewritten(reply(&p, &mut host, &mut y, 200, &tokenized(40890, 40960)));
    assert_eq!(v["max_tokens"], 70);
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("exact"));
}

/// The payload of call `i` as JSON.
fn call_json(host: &FakeHost, i: usize) -> serde_json::Value {
    serde_json::from_slice(host.calls[i].2.body.as_deref().unwrap()).unwrap()
}

/// A conversation anchored at `tokens` after one tool round, and its next turn sent.
fn tail_turn(p: &Plugin, host: &mut FakeHost, tokens: u64) -> (Exchange, Step) {
    anchor(p, host, tokens);
    let cap = r#","max_tokens":16000"#;
    send(p, host, "/v1/chat/completions", leak(session(2, cap)))
}

#[test]
fn a_count_of_the_new_messages_alone_proves_what_their_bytes_do_not() {
    let (p, mut host) = setup(SKIP);
    // 24800 + the byte bound of a tool round > 24960 = W − B; 24800 + a quarter of its
    // bytes is not.
    let (mut y, step) = tail_turn(&p, &mut host, 24800);
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.count(Metric::TailCounts), 1);
    let whole_counts = |host: &FakeHost| {
        host.metrics
            .iter()
            .filter(|m| **m == Metric::CountCalls)
            .count()
    };
    assert_eq!(whole_counts(&host), 1, "the first turn's only");
    // vLLM's /tokenize of the two new messages alone: no system prompt, no tools.
    assert_eq!(host.calls[1].2.path, "/tokenize");
    let tail = call_json(&host, 1);
    let messages = tail["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "assistant");
    assert_eq!(messages[1]["role"], "tool");
    assert!(tail.get("tools").is_none(), "{tail}");
    assert_eq!(tail["model"], "m");
    assert_eq!(tail["add_generation_prompt"], true);
    // 24800 + 120 + SEAM: the cap fits, the request goes on unchanged.
    let step = reply(&p, &mut host, &mut y, 200, &tokenized(120, 40960));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    let p_hi = 24800 + 120 + bound::SEAM;
    assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
    assert_eq!(host.count(Metric::CountSkipped), 1);
    assert_eq!(whole_counts(&host), 1);
    // Checked after the upstream answered, like any skipped request.
    y.on_stream_end(&p, &mut host);
    assert_eq!(host.calls.len(), 3);
    assert_eq!(call_json(&host, 2)["messages"].as_array().unwrap().len(), 6);
    answer_check(&p, &mut host, &mut y, p_hi);
    assert_eq!(host.count(Metric::BoundViolations), 0);
}

#[test]
fn near_the_edge_the_cap_is_written_from_a_bound_of_exact_counts() {
    let (p, mut host) = setup(SKIP);
    let (mut y, _) = tail_turn(&p, &mut host, 24800);
    // 24800 + 150 + SEAM = 24966 > 24960 = W − B, but leaves R: the cap is written from it.
    let p_hi = 24800 + 150 + bound::SEAM;
    let v = rewritten(reply(&p, &mut host, &mut y, 200, &tokenized(150, 40960)));
    assert_eq!(v["max_tokens"], 40960 - p_hi);
    assert_eq!(host.calls.len(), 2, "no whole count on the path");
    assert_eq!(host.count(Metric::CountCalls), 1, "the first turn's only");
    assert_eq!(host.count(Metric::CountSkipped), 1);
    assert_eq!(
        host.count(Metric::Rewritten),
        2,
        "the first turn's and this one"
    );
    assert_eq!(action(&y, &p), "rewritten");
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
    // Its answer is read for its usage, like any request sent on a bound's.
    let (head, _) = answer(
        &mut y,
        &p,
        &mut host,
        200,
        "text/event-stream",
        &[b"data: {}\n\n"],
    );
    assert_eq!(head, response::HeadStep::Observe);
    // Without usage in it: checked after the stream, within 64 of the count.
    y.on_stream_end(&p, &mut host);
    assert_eq!(call_json(&host, 2)["messages"].as_array().unwrap().len(), 6);
    answer_check(&p, &mut host, &mut y, p_hi - 19);
    assert_eq!(host.count(Metric::BoundViolations), 0);
    // A bound more than 64 above the count is a violation too: skipping goes off.
    let (mut z, _) = send(
        &p,
        &mut host,
        "/v1/chat/completions",
        leak(session(3, r#","max_tokens":16000"#)),
    );
    let step = reply(&p, &mut host, &mut z, 200, &tokenized(150, 40960));
    let written = rewritten(step)["max_tokens"].as_u64().unwrap();
    let z_hi = 40960 - written;
    z.on_stream_end(&p, &mut host);
    answer_check(&p, &mut host, &mut z, z_hi - 65);
    assert_eq!(host.count(Metric::BoundViolations), 1);
    let calls = host.calls.len();
    let (_, step) = send(
        &p,
        &mut host,
        "/v1/chat/completions",
        leak(session(4, r#","max_tokens":16000"#)),
    );
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), calls + 1);
    assert_eq!(host.count(Metric::TailCounts), 2, "a whole count, no tail");
}

#[test]
fn a_tail_count_that_leaves_less_than_r_is_followed_by_the_whole_count() {
    let (p, mut host) = setup(SKIP);
    let (mut y, _) = tail_turn(&p, &mut host, 40800);
    assert_eq!(host.count(Metric::TailCounts), 1);
    // 40800 + 120 + SEAM + R > 40960: the whole prompt is counted, and decides.
    let step = reply(&p, &mut host, &mut y, 200, &tokenized(120, 40960));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), 3);
    let whole = call_json(&host, 2);
    assert_eq!(whole["messages"].as_array().unwrap().len(), 6);
    assert!(whole.get("tools").is_some());
    let v = rewritten(reply(&p, &mut host, &mut y, 200, &tokenized(40880, 40960)));
    assert_eq!(v["max_tokens"], 80);
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("exact"));
}

#[test]
fn a_server_that_refuses_a_tail_alone_is_asked_for_whole_counts() {
    let (p, mut host) = setup(SKIP);
    let (mut y, _) = tail_turn(&p, &mut host, 24800);
    // The template wants a whole conversation (roles must alternate, ...).
    let step = reply(&p, &mut host, &mut y, 400, r#"{"error":"secret"}"#);
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::Failure(Failure::Status)), 1);
    assert_eq!(call_json(&host, 2)["messages"].as_array().unwrap().len(), 6);
    rewritten(reply(&p, &mut host, &mut y, 200, &tokenized(24900, 40960)));
    // The next conversation in the same band goes straight to the whole count.
    let other = session(1, r#","max_tokens":16000"#).replace("fix the bug", "other bug");
    counted(
        &p,
        &mut host,
        "/v1/chat/completions",
        leak(other.clone()),
        &tokenized(24800, 40960),
    );
    let calls = host.calls.len();
    let next = session(2, r#","max_tokens":16000"#).replace("fix the bug", "other bug");
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(next));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), calls + 1);
    assert_eq!(
        call_json(&host, calls)["messages"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    // A passing failure (a timeout) turns nothing off.
    let q = plugin_at("w", SKIP);
    let (mut z, _) = tail_turn(&q, &mut host, 24800);
    let token = z.pending_token().unwrap();
    z.on_reply(&q, &mut host, &reply_of(token, Some(504), b""));
    assert!(!flagged(&q, &mut host, Flag::TailOff, "m"));
}

#[test]
fn a_tail_with_reasoning_or_gone_with_its_stream_counts_nothing_alone() {
    let (p, mut host) = setup(SKIP);
    let cap = r#","max_tokens":16000"#;
    anchor(&p, &mut host, 24800);
    // An assistant turn with reasoning may render only in the whole conversation.
    let thinking = session(2, cap).replacen(
        r#""content":null,"tool_calls":[{"id":"c1""#,
        r#""content":null,"reasoning_content":"hmm","tool_calls":[{"id":"c1""#,
        1,
    );
    assert_ne!(thinking, session(2, cap));
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(thinking));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 0);
    assert_eq!(call_json(&host, 1)["messages"].as_array().unwrap().len(), 6);
    // A stream gone while its tail is counted leaves no orphan; the late answer is no
    // one's.
    let mut host = FakeHost::default();
    let (mut y, _) = tail_turn(&p, &mut host, 24800);
    let token = y.pending_token().unwrap();
    assert!(y.abandon().is_none());
    let late = tokenized(1, 40960);
    let late = late.as_bytes();
    let answer = Reply {
        token,
        status: Some(200),
        size: late.len(),
        body: late,
    };
    assert!(y.on_reply(&p, &mut host, &answer).is_none());
}

#[test]
fn anthropic_tails_are_counted_by_the_anthropic_counter() {
    let (p, mut host) = setup(SKIP);
    let turn = |n: usize| {
        anthropic_session(
            n,
            r#""tools":[{"name":"read","input_schema":{}}],"tool_choice":{"type":"auto"},"max_tokens":16000"#,
        )
    };
    counted(
        &p,
        &mut host,
        "/v1/messages",
        turn(1),
        r#"{"input_tokens":24850}"#,
    );
    let (mut y, step) = send(&p, &mut host, "/v1/messages", turn(2));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls[1].2.path, "/v1/messages/count_tokens");
    let tail = call_json(&host, 1);
    assert_eq!(tail["messages"].as_array().unwrap().len(), 2);
    assert_eq!(tail["messages"][0]["role"], "assistant");
    for gone in ["system", "tools", "tool_choice"] {
        assert!(tail.get(gone).is_none(), "{gone}: {tail}");
    }
    assert_eq!(tail["model"], "m");
    assert_eq!(tail["max_tokens"], 16000);
    assert_eq!(tail["stream"], true);
    reply(&p, &mut host, &mut y, 200, r#"{"input_tokens":60}"#);
    assert_eq!(action(&y, &p), "unchanged:fits");
    let p_hi = 24850 + 60 + bound::SEAM;
    assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
}

#[test]
fn bad_input_falls_back_to_a_full_count() {
    let cap = r#","max_tokens":16000"#;
    let first = session(2, cap);
    let grown = session(3, cap);
    let cases: Vec<(&str, String, &str)> = vec![
        // A message of the history edited, removed, reordered.
        ("edited", grown.replace("fix the bug", "fix the bugs"), ""),
        ("removed", grown.replace(r#"{"role":"user","content":"fix the bug"},"#, ""), ""),
        (
            "reordered",
            grown.replace(
                r#"{"role":"system","content":"you are an agent"},{"role":"user","content":"fix the bug"}"#,
                r#"{"role":"user","content":"fix the bug"},{"role":"system","content":"you are an agent"}"#,
            ),
            "",
        ),
        // Other tools, another model, two caps, a cap field the rewrite renames, T.
        ("tools", grown.replace(r#"{"name":"read"}"#, r#"{"name":"write"}"#), ""),
        ("model", grown.replace(r#""model":"m""#, r#""model":"n""#), ""),
        ("two caps", grown.replace(cap, r#","max_tokens":16000,"max_completion_tokens":16000"#), ""),
        ("renamed", grown.replace("max_tokens", "max_output_tokens"), ""),
        ("truncate", grown.replace(cap, r#","max_tokens":16000,"truncate_prompt_tokens":100"#), ""),
        // Invalid, duplicate caps: the exact count would remove them and write a valid one.
        ("negative cap", grown.replace(cap, r#","max_tokens":-5"#), ""),
        ("text cap", grown.replace(cap, r#","max_tokens":"abc""#), ""),
        ("fraction cap", grown.replace(cap, r#","max_tokens":1.5"#), ""),
        ("null cap", grown.replace(cap, r#","max_tokens":null"#), ""),
        ("twice", grown.replace(cap, r#","max_tokens":16000,"max_tokens":16000"#), ""),
        // Content the bound cannot see through.
        (
            "image",
            grown.replace(
                r#""}],"tools""#,
                r#""},{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],"tools""#,
            ),
            "",
        ),
        // Another route.
        ("route", grown.clone(), "other"),
    ];
    for (name, body, cluster) in cases {
        let (p, mut host) = setup(SKIP);
        counted(
            &p,
            &mut host,
            "/v1/chat/completions",
            leak(first.clone()),
            &tokenized(900, 40960),
        );
        let q = if cluster.is_empty() {
            plugin(SKIP)
        } else {
            plugin_at(cluster, SKIP)
        };
        let (_, step) = send(&q, &mut host, "/v1/chat/completions", leak(body));
        assert!(matches!(step, Step::Wait), "{name}: counted");
        assert_eq!(host.count(Metric::CountSkipped), 0, "{name}");
    }
    // A body that shrank: its prefix was counted (a cache hit, or a bounded prefix).
    let (p, mut host) = setup(SKIP);
    counted(
        &p,
        &mut host,
        "/v1/chat/completions",
        leak(grown.clone()),
        &tokenized(900, 40960),
    );
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(first.clone()));
    assert!(
        matches!(step, Step::Wait),
        "a shorter body has no counted prefix"
    );
    // Skipping off: counted.
    let (p, mut host) = setup(r#","context_length":40960,"skip_count":false"#);
    counted(
        &p,
        &mut host,
        "/v1/chat/completions",
        leak(first),
        &tokenized(900, 40960),
    );
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(grown));
    assert!(matches!(step, Step::Wait));
}

#[test]
fn without_a_cap_only_where_the_server_takes_the_rest_of_the_window() {
    let (p, mut host) = setup(SKIP);
    anchor_capped(&p, &mut host, "", 900);
    let (y, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, "")));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    // W < C: the server's default would overrun W.
    let (p, mut host) = setup(r#","context_length":40960,"window_tokens":32768,"skip_count":true"#);
    anchor_capped(&p, &mut host, "", 900);
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, "")));
    assert!(matches!(step, Step::Wait));
}

#[test]
fn anthropic_turns_skip_too() {
    let (p, mut host) = setup(SKIP);
    let turn = |n: usize| anthropic_session(n, r#""max_tokens":32000"#);
    counted(
        &p,
        &mut host,
        "/v1/messages",
        turn(1),
        r#"{"input_tokens":300}"#,
    );
    let (mut y, step) = send(&p, &mut host, "/v1/messages", turn(2));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    y.on_stream_end(&p, &mut host);
    assert_eq!(
        host.calls.last().unwrap().2.path,
        "/v1/messages/count_tokens"
    );
    // The stream ended before the check's answer: still stored and held to the bound.
    let token = y.pending_token().unwrap();
    let orphan = y.abandon().unwrap();
    let late = br#"{"input_tokens":99999}"#;
    assert!(orphan.on_reply(&p, &mut host, &reply_of(token, Some(200), late)));
    assert_eq!(host.count(Metric::BoundViolations), 1);
}

#[test]
fn a_count_above_its_bound_turns_skipping_off_for_the_route() {
    // A tokenizer whose counts break the byte bound: far more tokens than bytes.
    let p = plugin(SKIP);
    let other = plugin_at("w", SKIP);
    let mut host = FakeHost::default();
    let cap = r#","max_tokens":16000"#;
    anchor(&p, &mut host, 900);
    let (mut o, _) = send(
        &other,
        &mut host,
        "/v1/chat/completions",
        leak(session(1, cap)),
    );
    reply(&other, &mut host, &mut o, 200, &tokenized(900, 40960));
    let (mut y, _) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    let bound: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    y.on_stream_end(&p, &mut host);
    answer_check(&p, &mut host, &mut y, bound + 1);
    assert_eq!(host.count(Metric::BoundViolations), 1);
    // From now on this route counts every turn, even one its bound would prove.
    let calls = host.calls.len();
    let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(3, cap)));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), calls + 1);
    // Another route keeps skipping.
    let (o2, step) = send(
        &other,
        &mut host,
        "/v1/chat/completions",
        leak(session(2, cap)),
    );
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&o2, &other), "unchanged:fits");
}

#[test]
fn sglang_and_llamacpp_count_a_tail_with_their_own_counters() {
    // (backend, the whole count's answer, the tail's path, the tail's answer)
    let cases = [
        (
            "sglang",
            tokenized(24800, 40960),
            "/tokenize",
            tokenized(120, 40960),
        ),
        (
            "llamacpp",
            r#"{"input_tokens":24800}"#.to_string(),
            "/v1/chat/completions/input_tokens",
            r#"{"input_tokens":120}"#.to_string(),
        ),
    ];
    for (backend, whole, path, tail) in cases {
        let (p, mut host) = setup(&format!(
            r#","backend":"{backend}"|,"context_length":40960"#
        ));
        let cap = r#","max_tokens":16000"#;
        counted(
            &p,
            &mut host,
            "/v1/chat/completions",
            leak(session(1, cap)),
            &whole,
        );
        let (mut y, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
        assert!(matches!(step, Step::Wait), "{backend}");
        assert_eq!(host.count(Metric::TailCounts), 1, "{backend}");
        assert_eq!(host.calls[1].2.path, path, "{backend}");
        let sent = call_json(&host, 1);
        let messages = sent["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2, "{backend}: the new messages alone");
        assert_eq!(messages[0]["role"], "assistant", "{backend}");
        assert!(sent.get("tools").is_none(), "{backend}: {sent}");
        reply(&p, &mut host, &mut y, 200, &tail);
        assert_eq!(action(&y, &p), "unchanged:fits", "{backend}");
        assert_eq!(host.calls.len(), 2, "{backend}: no whole count on the path");
    }
}
