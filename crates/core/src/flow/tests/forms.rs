//! The agents' own traffic (docs/spec.md §15b): a message written again in another form the
//! server renders alike keeps its prefix, and Responses turns skip like chat turns.

use super::support::*;
use crate::bound;
use crate::flow::*;

/// A Claude Code turn: the newest user message a list of text blocks carrying
/// `cache_control`, every earlier one as Claude Code writes it on later turns (a string).
fn claude_turn(rounds: usize) -> &'static str {
    let mut m = Vec::new();
    let user = |text: &str, newest: bool| {
        if newest {
            format!(
                r#"{{"role":"user","content":[{{"type":"text","text":"{text}","cache_control":{{"type":"ephemeral"}}}}]}}"#
            )
        } else {
            format!(r#"{{"role":"user","content":"{text}"}}"#)
        }
    };
    m.push(user("fix the bug", rounds == 0));
    for i in 0..rounds {
        m.push(format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"reading f{i}"}}]}}"#
        ));
        m.push(user(&format!("now look at f{i}"), i + 1 == rounds));
    }
    leak(format!(
        r#"{{"model":"m","system":[{{"type":"text","text":"you are Claude Code","cache_control":{{"type":"ephemeral"}}}}],"messages":[{}],"max_tokens":32000,"stream":true}}"#,
        m.join(",")
    ))
}

/// Claude Code's first turn, counted as 900 tokens.
fn claude_first(p: &Plugin, host: &mut FakeHost) {
    let count = r#"{"input_tokens":900}"#;
    counted(p, host, "/v1/messages", claude_turn(0), count);
}

#[test]
fn a_message_sent_again_as_a_string_keeps_the_prefix_its_blocks_were_counted_with() {
    let (p, mut host) = setup(SKIP);
    claude_first(&p, &mut host);
    assert_eq!(host.calls.len(), 1);
    for rounds in 1..4 {
        let (mut y, step) = send(&p, &mut host, "/v1/messages", claude_turn(rounds));
        assert!(matches!(step, Step::Done(Action::Continue)), "{rounds}");
        assert_eq!(action(&y, &p), "unchanged:fits");
        assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
        // Its check anchors the next turn.
        y.on_stream_end(&p, &mut host);
        assert_eq!(
            host.calls.len(),
            1 + rounds,
            "only the checks, off the path"
        );
        checked(
            &p,
            &mut host,
            &mut y,
            &format!(r#"{{"input_tokens":{}}}"#, 900 + 40 * rounds),
        );
    }
    assert_eq!(host.count(Metric::CountSkipped), 3);
    assert_eq!(host.count(Metric::BoundViolations), 0);
}

#[test]
fn a_message_sent_again_in_a_form_that_renders_otherwise_is_counted() {
    let (p, mut host) = setup(SKIP);
    claude_first(&p, &mut host);
    // The first message split in two blocks renders with a separator: not the prefix.
    let split = claude_turn(1).replacen(
        r#"{"role":"user","content":"fix the bug"}"#,
        r#"{"role":"user","content":[{"type":"text","text":"fix the"},{"type":"text","text":" bug"}]}"#,
        1,
    );
    let (_, step) = send(&p, &mut host, "/v1/messages", leak(split));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.count(Metric::CountSkipped), 0);
    assert_eq!(host.count(Metric::TailCounts), 0, "a whole count");
}

/// A Codex turn: instructions, the input items of `rounds` tool rounds after the question,
/// the tools after the input, no cap, streamed, and ids of its own in `client_metadata`
/// that change every turn.
fn codex_turn(rounds: usize, output: usize) -> &'static str {
    let mut items = vec![
        r#"{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions>"}]}"#.to_string(),
        r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the bug"}]}"#.to_string(),
    ];
    for i in 0..rounds {
        items.push(format!(
            r#"{{"type":"function_call","name":"shell","arguments":"{{\"command\":[\"cat\",\"f{i}\"]}}","call_id":"call_{i}"}}"#
        ));
        items.push(format!(
            r#"{{"type":"function_call_output","call_id":"call_{i}","output":"{}"}}"#,
            "z".repeat(output)
        ));
    }
    leak(format!(
        r#"{{"model":"m","instructions":"You are Codex.","input":[{}],"tools":[{{"type":"function","name":"shell","parameters":{{}}}}],"tool_choice":"auto","parallel_tool_calls":false,"store":false,"stream":true,"include":[],"prompt_cache_key":"s1","client_metadata":{{"turn_id":"t{rounds}"}}}}"#,
        items.join(",")
    ))
}

/// vLLM's render answer for a prompt of `n` tokens.
fn token_ids(n: usize) -> String {
    let ids: Vec<String> = (0..n).map(|i| (i % 1000).to_string()).collect();
    format!(r#"{{"token_ids":[{}]}}"#, ids.join(","))
}

const RESPONSES_PATH: &str = "/v1/responses";

/// The count out for `y` (its check) answered with `body`.
fn checked(p: &Plugin, host: &mut FakeHost, y: &mut Exchange, body: &str) {
    let token = y.pending_token().expect("a check is out");
    y.on_reply(p, host, &reply_of(token, Some(200), body.as_bytes()));
}

/// Codex's first turn, rendered as `tokens`: the step it took.
fn codex_first(p: &Plugin, host: &mut FakeHost, tokens: usize) -> Step {
    counted(
        p,
        host,
        RESPONSES_PATH,
        codex_turn(0, 10),
        &token_ids(tokens),
    )
    .1
}

#[test]
fn responses_turns_skip_their_count_like_chat_turns() {
    let (p, mut host) = setup(SKIP);
    let step = codex_first(&p, &mut host, 900);
    let first = rewritten(step);
    assert_eq!(first["max_output_tokens"], 40960 - 900);
    assert_eq!(host.calls[0].2.path, "/v1/responses/render");
    // The next turn repeats the input items and adds a tool round: no call on its path.
    let (mut y, step) = send(&p, &mut host, RESPONSES_PATH, codex_turn(1, 10));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(host.calls.len(), 1);
    assert_eq!(action(&y, &p), "unchanged:fits");
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    assert!(p_hi > 900 && p_hi < 1400, "{p_hi}");
    // Without usage in its answer it is checked by a render once the stream ended.
    y.on_stream_end(&p, &mut host);
    assert_eq!(host.calls.len(), 2);
    assert_eq!(host.calls[1].2.path, "/v1/responses/render");
    checked(&p, &mut host, &mut y, &token_ids(950));
    assert_eq!(host.count(Metric::BoundViolations), 0);
    assert_eq!(host.count(Metric::CountSkipped), 1);
}

#[test]
fn a_responses_tail_is_rendered_alone_without_instructions_and_tools() {
    let (p, mut host) = setup(SKIP);
    // 40960 − R (64) leaves room for the first turn; the second's bytes do not prove it.
    codex_first(&p, &mut host, 38000);
    let (mut y, step) = send(&p, &mut host, RESPONSES_PATH, codex_turn(1, 8000));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 1);
    let call = &host.calls[1].2;
    assert_eq!(call.path, "/v1/responses/render");
    let tail: serde_json::Value = serde_json::from_slice(call.body.as_deref().unwrap()).unwrap();
    let items = tail["input"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["type"], "function_call");
    assert_eq!(items[1]["type"], "function_call_output");
    for gone in ["instructions", "tools", "tool_choice", "stream"] {
        assert!(tail.get(gone).is_none(), "{gone}: {tail}");
    }
    assert_eq!(tail["model"], "m");
    assert_eq!(tail["store"], false);
    // 38000 + 2100 + SEAM leaves R: unchanged, no whole count.
    let step = reply(&p, &mut host, &mut y, 200, &token_ids(2100));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(action(&y, &p), "unchanged:fits");
    let p_hi = 38000 + 2100 + bound::SEAM;
    assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
}

#[test]
fn responses_items_the_bound_cannot_see_through_are_counted() {
    let (p, mut host) = setup(SKIP);
    codex_first(&p, &mut host, 900);
    let image = codex_turn(1, 10).replacen(
        r#"{"type":"function_call_output","call_id":"call_0","output":"zzzzzzzzzz"}"#,
        r#"{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:x"}]}"#,
        1,
    );
    let (_, step) = send(&p, &mut host, RESPONSES_PATH, leak(image));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::CountSkipped), 0);
    assert_eq!(host.count(Metric::TailCounts), 0);
    assert_eq!(host.calls.len(), 2);
}

/// A Qwen Code turn: the newest user message carries the date reminder as a block of its
/// own, which the next turn leaves out of it.
fn qwen_turn(prompts: &[&str]) -> &'static str {
    let mut m = vec![r#"{"role":"system","content":"You are Qwen Code."}"#.to_string()];
    for (i, prompt) in prompts.iter().enumerate() {
        let date = if i + 1 == prompts.len() {
            r#"{"type":"text","text":"<system-reminder>The date is today.</system-reminder>"},"#
        } else {
            ""
        };
        m.push(format!(
            r#"{{"role":"user","content":[{date}{{"type":"text","text":"{prompt}"}}]}}"#
        ));
        if i + 1 < prompts.len() {
            m.push(format!(
                r#"{{"role":"assistant","content":"Done with {prompt}."}}"#
            ));
        }
    }
    leak(format!(
        r#"{{"model":"m","messages":[{}],"max_tokens":32768,"stream":true,"stream_options":{{"include_usage":true}},"tools":[]}}"#,
        m.join(",")
    ))
}

/// Qwen Code's first turn, counted as `tokens`; the chat path.
fn qwen_first(p: &Plugin, host: &mut FakeHost, tokens: u64) -> &'static str {
    let chat = "/v1/chat/completions";
    counted(
        p,
        host,
        chat,
        qwen_turn(&["list"]),
        &tokenized(tokens, 40960),
    );
    chat
}

#[test]
fn a_message_sent_again_without_its_date_block_keeps_the_count_it_was_in() {
    let (p, mut host) = setup(SKIP);
    let chat = qwen_first(&p, &mut host, 900);
    let (mut y, step) = send(&p, &mut host, chat, qwen_turn(&["list", "read"]));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(host.calls.len(), 1, "no count on the path");
    assert_eq!(action(&y, &p), "unchanged:fits");
    let p_hi: u64 = header(&y, &p, HEADER_PROMPT).unwrap().parse().unwrap();
    assert!(p_hi > 900 + crate::reshape::RESHAPE + bound::TAIL, "{p_hi}");
    // Its check anchors it; the turn after leaves that turn's date out in turn.
    y.on_stream_end(&p, &mut host);
    answer_check(&p, &mut host, &mut y, 960);
    let (_, step) = send(&p, &mut host, chat, qwen_turn(&["list", "read", "add"]));
    assert!(matches!(step, Step::Done(Action::Continue)));
    assert_eq!(host.count(Metric::CountSkipped), 2);
    assert_eq!(host.count(Metric::BoundViolations), 0);
}

#[test]
fn a_date_block_moved_to_the_newest_message_lets_a_cap_be_written_from_a_bound() {
    let (p, mut host) = setup(SKIP);
    // 20000 + 32768 > 40960: every turn's cap must be written.
    let chat = qwen_first(&p, &mut host, 20000);
    let (mut y, step) = send(&p, &mut host, chat, qwen_turn(&["list", "read"]));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 1);
    // The new messages are counted without the date block the earlier one left out: its
    // tokens are in the anchor already.
    let call = &host.calls[1].2;
    let tail: serde_json::Value = serde_json::from_slice(call.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        tail["messages"],
        serde_json::json!([
            {"role": "assistant", "content": "Done with list."},
            {"role": "user", "content": [{"type": "text", "text": "read"}]}
        ])
    );
    let step = reply(&p, &mut host, &mut y, 200, &tokenized(40, 40960));
    let p_hi = 20000 + 2 * crate::reshape::RESHAPE + bound::SEAM + 40;
    assert_eq!(rewritten(step)["max_tokens"], 40960 - p_hi);
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    assert_eq!(host.count(Metric::CountSkipped), 1);
    // Its usage checks it and anchors the next turn, which moves that turn's date in turn.
    y.on_stream_end(&p, &mut host);
    answer_check(&p, &mut host, &mut y, 20030);
    assert_eq!(host.count(Metric::BoundViolations), 0);
    let (mut y, step) = send(&p, &mut host, chat, qwen_turn(&["list", "read", "add"]));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 2);
    let step = reply(&p, &mut host, &mut y, 200, &tokenized(30, 40960));
    let p_hi = 20030 + 2 * crate::reshape::RESHAPE + bound::SEAM + 30;
    assert_eq!(rewritten(step)["max_tokens"], 40960 - p_hi);
    assert_eq!(host.count(Metric::CountSkipped), 2);
}

#[test]
fn a_left_out_block_the_newest_message_does_not_carry_is_counted_whole_near_the_edge() {
    let (p, mut host) = setup(SKIP);
    let chat = qwen_first(&p, &mut host, 20000);
    let other_day =
        qwen_turn(&["list", "read"]).replacen("The date is today.", "The date is tomorrow.", 1);
    let (_, step) = send(&p, &mut host, chat, leak(other_day));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 0);
    let call = &host.calls[1].2;
    let whole: serde_json::Value = serde_json::from_slice(call.body.as_deref().unwrap()).unwrap();
    assert_eq!(whole["messages"].as_array().map(Vec::len), Some(4));
}

#[test]
fn a_message_sent_again_with_a_block_changed_is_counted() {
    let (p, mut host) = setup(SKIP);
    let chat = qwen_first(&p, &mut host, 900);
    for changed in [
        // Another text where the date was, or the blocks in another order.
        qwen_turn(&["list", "read"]).replacen(
            r#"[{"type":"text","text":"list"}]"#,
            r#"[{"type":"text","text":"<system-reminder>Another day.</system-reminder>"},{"type":"text","text":"list"}]"#,
            1,
        ),
        qwen_turn(&["list", "read"]).replacen(
            r#"[{"type":"text","text":"list"}]"#,
            r#"[{"type":"text","text":"list"},{"type":"text","text":"<system-reminder>The date is today.</system-reminder>"}]"#,
            1,
        ),
    ] {
        let calls = host.calls.len();
        let (_, step) = send(&p, &mut host, chat, leak(changed));
        assert!(matches!(step, Step::Wait));
        assert_eq!(host.calls.len(), calls + 1);
    }
    assert_eq!(host.count(Metric::CountSkipped), 0);
    assert_eq!(host.count(Metric::TailCounts), 0);
}

#[test]
fn a_responses_turn_without_a_cap_under_a_smaller_window_has_its_cap_written_from_a_bound() {
    let (p, mut host) = setup(r#","context_length":40960,"window_tokens":32768"#);
    let step = codex_first(&p, &mut host, 900);
    assert_eq!(rewritten(step)["max_output_tokens"], 32768 - 900);
    // W < C: vLLM would take C − P, so the rule writes W − P; a tail's count bounds it.
    let (mut y, step) = send(&p, &mut host, RESPONSES_PATH, codex_turn(1, 10));
    assert!(matches!(step, Step::Wait));
    assert_eq!(host.count(Metric::TailCounts), 1);
    assert_eq!(host.calls[1].2.path, "/v1/responses/render");
    let step = reply(&p, &mut host, &mut y, 200, &token_ids(120));
    let p_hi = 900 + 120 + bound::SEAM;
    assert_eq!(rewritten(step)["max_output_tokens"], 32768 - p_hi);
    assert_eq!(header(&y, &p, HEADER_SOURCE).as_deref(), Some("bound"));
    assert_eq!(header(&y, &p, HEADER_PROMPT), Some(p_hi.to_string()));
    assert_eq!(host.count(Metric::CountSkipped), 1);
    // Checked after its stream like any skipped request: within the slack, no violation.
    y.on_stream_end(&p, &mut host);
    checked(&p, &mut host, &mut y, &token_ids(1030));
    assert_eq!(host.count(Metric::BoundViolations), 0);
}
