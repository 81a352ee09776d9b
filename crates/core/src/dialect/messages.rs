//! Anthropic Messages (a path ending in `/v1/messages`; docs/spec.md §10): the only cap is
//! `max_tokens`, and it is required; counted by the backend's own Anthropic counter with the
//! request as it is; the estimate reads `system`, `messages` and `tools`; extended thinking's
//! budget follows a lowered cap; a rejection is Anthropic's "prompt is too long" error, the
//! one Claude Code compacts on.

use crate::caps::CapField;
use crate::estimate::estimate as rough;
use crate::json::scan::{scan, Member};
use crate::reason::Reason;
use crate::request::Request;

/// A request without a valid `max_tokens` passes unchanged (`no_cap`): Anthropic requires it.
pub const REQUIRES_CAP: bool = true;

/// `cache_control` (Claude Code moves it to the newest message every turn) is never rendered;
/// a lone text block renders as its text, as a string content does (docs/spec.md §15b).
pub const CANON: super::canonical::Canon = super::canonical::Canon {
    ignored: &["cache_control"],
    text_block: Some("text"),
};

/// Anthropic's only cap is `max_tokens`; other names are not caps there.
pub fn is_cap(field: CapField) -> bool {
    field == CapField::MaxTokens
}

/// The estimate over the raw `messages`, `system` and `tools` (when an array).
pub fn estimate(req: &Request, body: &[u8]) -> Option<u64> {
    let f = &req.fields;
    let mut parts = vec![req.raw(body, f.messages)?];
    parts.extend(req.raw(body, f.system));
    parts.extend(req.raw(body, f.tools).filter(|t| t.starts_with('[')));
    Some(rough(&parts))
}

/// The members a tail's count leaves out: the system prompt and the tools render before the
/// first message, which the prefix's count holds already.
fn outside_tail(key: &str) -> bool {
    matches!(key, "messages" | "system" | "tools" | "tool_choice")
}

/// The counter's body for the messages after a conversation's counted prefix (its tail,
/// `messages`: a JSON array of them) as a conversation of their own (docs/spec.md §15): the
/// request's other members as they came, without the system prompt and the tools.
pub fn tail_body(req: &Request, body: &[u8], messages: &[u8]) -> Option<Vec<u8>> {
    tail_object(req, body, "messages", messages, outside_tail)
}

/// The request's members as they came but those `leave_out` names, then `key` (the member
/// that holds the conversation) with `messages`.
pub fn tail_object(
    req: &Request,
    body: &[u8],
    key: &str,
    messages: &[u8],
    leave_out: fn(&str) -> bool,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(messages.len() + 256);
    out.push(b'{');
    for m in req.members.iter().filter(|m| !leave_out(&m.key)) {
        out.extend_from_slice(body.get(m.key_start..m.value.end)?);
        out.push(b',');
    }
    super::write_key(key, &mut out);
    out.extend_from_slice(messages);
    out.push(b'}');
    Some(out)
}

/// Anthropic's smallest extended-thinking budget.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// Extended thinking (docs/spec.md §10): the server refuses `thinking.budget_tokens >=
/// max_tokens`. When the new cap would not exceed the caller's budget, the budget is lowered
/// to `value - 1` (the member index of `thinking` and its new value); where that is below
/// Anthropic's minimum, no valid request exists and the request passes unchanged.
pub fn thinking_budget(
    req: &Request,
    body: &[u8],
    value: u64,
) -> Result<Option<(usize, Vec<u8>)>, Reason> {
    let Some(idx) = req.fields.thinking else {
        return Ok(None);
    };
    let Some(raw) = req.raw_bytes(body, Some(idx)) else {
        return Ok(None);
    };
    let Ok(members) = scan(raw) else {
        return Ok(None); // not an object: the server judges it, as without the filter
    };
    let text = |m: &Member| raw.get(m.value.clone()).unwrap_or_default();
    let enabled = members
        .iter()
        .rev()
        .find(|m| m.key == "type")
        .is_some_and(|m| text(m) == b"\"enabled\"");
    let Some(budget) = members.iter().rev().find(|m| m.key == "budget_tokens") else {
        return Ok(None);
    };
    let Some(current) = std::str::from_utf8(text(budget))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        return Ok(None);
    };
    if !enabled || current < value {
        return Ok(None);
    }
    let lowered = value - 1;
    if lowered < MIN_THINKING_BUDGET {
        return Err(Reason::ThinkingBudget);
    }
    let (Some(before), Some(after)) = (raw.get(..budget.value.start), raw.get(budget.value.end..))
    else {
        return Ok(None);
    };
    let mut new = Vec::with_capacity(raw.len());
    new.extend_from_slice(before);
    new.extend_from_slice(lowered.to_string().as_bytes());
    new.extend_from_slice(after);
    Ok(Some((idx, new)))
}

/// Anthropic's "prompt is too long" error, on which Claude Code compacts its conversation.
/// M is the largest prompt that leaves the required output: W − required.
pub fn reject_body(window: u64, prompt: u64, required: u64) -> Vec<u8> {
    let maximum = window.saturating_sub(required);
    format!(
        r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"prompt is too long: {prompt} tokens > {maximum} maximum"}}}}"#
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::dialect::Endpoint;
    use crate::request::analyze_at;

    #[test]
    fn a_tail_body_keeps_all_but_what_renders_before_the_first_message() {
        let config = Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap();
        let body = br#"{"model":"m","system":[{"type":"text","text":"s"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"a"}],"max_tokens":10,"thinking":{"type":"disabled"}}"#;
        let req = analyze_at(body, &config, Endpoint::Messages).unwrap();
        let tail = br#"[{"role":"assistant","content":"b"}]"#;
        let out = tail_body(&req, body, tail).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","max_tokens":10,"thinking":{"type":"disabled"},"messages":[{"role":"assistant","content":"b"}]}"#
        );
    }
}
