//! Which requests are budgeted and how (docs/spec.md §4): request shape, caller caps, model filter,
//! and how the prompt is counted. Works on the scanned top-level members; values stay raw.

use super::caps::{parse_cap, CapField};
use super::config::Config;
use super::reason::Reason;
use crate::dialect::{Endpoint, Form};
use crate::json::guess::Guesses;
use crate::json::scan::{is_value_at, scan_guessing, Member, ScanError};

/// How the prompt will be counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counting {
    /// Ask the tokenizer (`/tokenize`).
    Tokenize,
    /// Known exactly without a call (a prompt of token ids).
    Exact(u64),
    /// The tokenizer cannot mirror this prompt: use the rough estimate.
    Estimate,
}

/// Indices (into `members`) of the last occurrence of each field the filter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pub model: Option<usize>,
    pub messages: Option<usize>,
    pub prompt: Option<usize>,
    pub tools: Option<usize>,
    pub tool_choice: Option<usize>,
    pub response_format: Option<usize>,
    pub truncate_prompt_tokens: Option<usize>,
    pub add_generation_prompt: Option<usize>,
    pub continue_final_message: Option<usize>,
    pub add_special_tokens: Option<usize>,
    pub chat_template: Option<usize>,
    pub chat_template_kwargs: Option<usize>,
    pub media_io_kwargs: Option<usize>,
    pub mm_processor_kwargs: Option<usize>,
    pub documents: Option<usize>,
    pub reasoning_effort: Option<usize>,
    pub system: Option<usize>,
    pub thinking: Option<usize>,
    pub output_config: Option<usize>,
    pub input: Option<usize>,
    pub instructions: Option<usize>,
    pub previous_response_id: Option<usize>,
    pub conversation: Option<usize>,
}

/// The caller cap B and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub field: CapField,
    pub value: u64,
    /// The member holding it (the last occurrence of that field).
    pub member: usize,
}

/// A request the filter budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub form: Form,
    pub members: Vec<Member>,
    pub fields: Fields,
    /// Every top-level cap member (valid or not, duplicates included): removed on rewrite.
    pub cap_members: Vec<usize>,
    pub cap: Option<Cap>,
    /// T, when ≥ 0.
    pub truncate: Option<u64>,
    pub counting: Counting,
    /// Members (`messages`, `tools`) whose value was only skimmed: see `validate`.
    pub unchecked: Vec<usize>,
    /// `tools` is left out of the count (`tool_choice: "none"` on a server that drops them).
    pub omit_tools: bool,
}

/// The members whose values are skimmed by `analyze`: the bulk of a prompt, which a cache hit
/// identifies by hash without validating it again.
fn skimmed(key: &str) -> bool {
    key == "messages" || key == "tools"
}

/// The raw bytes of a field (no UTF-8 check: for hashing and first-byte tests).
pub(crate) fn raw_bytes<'a>(
    body: &'a [u8],
    members: &[Member],
    idx: Option<usize>,
) -> Option<&'a [u8]> {
    body.get(members.get(idx?)?.value.clone())
}

/// The raw text of a field. Checks UTF-8 again (linear in its size): use `raw_bytes` where
/// bytes do.
pub(crate) fn raw<'a>(body: &'a [u8], members: &[Member], idx: Option<usize>) -> Option<&'a str> {
    let m = members.get(idx?)?;
    std::str::from_utf8(body.get(m.value.clone())?).ok()
}

/// Whether member `i`'s value is exactly one valid JSON value.
fn value_is_valid(body: &[u8], members: &[Member], i: usize) -> bool {
    members
        .get(i)
        .is_some_and(|m| is_value_at(body, m.value.clone()))
}

/// Scans and classifies a request body. `Err` is the reason to leave it unchanged.
///
/// The values of `messages` and `tools` are only skimmed: call `Request::validate` before
/// using the request for anything but a cache lookup.
pub fn analyze(body: &[u8], config: &Config) -> Result<Request, Reason> {
    analyze_at(body, config, Endpoint::OpenAi)
}

/// [`analyze`] for a request sent to `endpoint`.
pub fn analyze_at(body: &[u8], config: &Config, endpoint: Endpoint) -> Result<Request, Reason> {
    analyze_with(body, config, endpoint, None)
}

/// [`analyze_at`], guessing where long skimmed values end (`json::guess`). With the request,
/// the members whose end was guessed: when there are any, it is the request only once the
/// guesses are proved (`flow::count::prove`); otherwise analyze it again with [`analyze_at`].
/// A body the guesses cannot read is analyzed without them at once.
pub fn analyze_guessing(
    body: &[u8],
    config: &Config,
    endpoint: Endpoint,
) -> Result<(Request, Vec<usize>), Reason> {
    let mut guessed = Vec::new();
    let mut guesses = Guesses {
        found: &mut guessed,
        known: None,
    };
    match analyze_with(body, config, endpoint, Some(&mut guesses)) {
        Ok(req) => Ok((req, guessed)),
        Err(_) if !guessed.is_empty() => {
            analyze_at(body, config, endpoint).map(|req| (req, Vec::new()))
        }
        Err(reason) => Err(reason),
    }
}

/// [`analyze_guessing`] of a body some of whose bytes were not read (`flow::partial`), a value
/// that starts where one of `known` starts guessed to end where it ends, no other guessed:
/// the request as the guesses read it, and the members guessed; `None` when they do not read
/// as one (never analyzed again without guesses: that would read what was not read).
pub fn analyze_on_known(
    body: &[u8],
    config: &Config,
    endpoint: Endpoint,
    known: &[std::ops::Range<usize>],
) -> Option<(Request, Vec<usize>)> {
    let mut guessed = Vec::new();
    let mut guesses = Guesses {
        found: &mut guessed,
        known: Some(known),
    };
    let req = analyze_with(body, config, endpoint, Some(&mut guesses)).ok()?;
    Some((req, guessed))
}

fn analyze_with(
    body: &[u8],
    config: &Config,
    endpoint: Endpoint,
    guessed: Option<&mut Guesses>,
) -> Result<Request, Reason> {
    let (members, mut unchecked) = scan_guessing(body, skimmed, guessed).map_err(|e| match e {
        ScanError::NotJson => Reason::NotJson,
        ScanError::NotObject => Reason::NotObject,
    })?;
    let mut f = Fields::default();
    let mut cap_members = Vec::new();
    let mut last_cap: [Option<usize>; 3] = [None; 3];
    for (i, m) in members.iter().enumerate() {
        let slot = match m.key.as_str() {
            "model" => &mut f.model,
            "messages" => &mut f.messages,
            "prompt" => &mut f.prompt,
            "tools" => &mut f.tools,
            "tool_choice" => &mut f.tool_choice,
            "response_format" => &mut f.response_format,
            "truncate_prompt_tokens" => &mut f.truncate_prompt_tokens,
            "add_generation_prompt" => &mut f.add_generation_prompt,
            "continue_final_message" => &mut f.continue_final_message,
            "add_special_tokens" => &mut f.add_special_tokens,
            "chat_template" => &mut f.chat_template,
            "chat_template_kwargs" => &mut f.chat_template_kwargs,
            "media_io_kwargs" => &mut f.media_io_kwargs,
            "mm_processor_kwargs" => &mut f.mm_processor_kwargs,
            "documents" => &mut f.documents,
            "reasoning_effort" => &mut f.reasoning_effort,
            "system" => &mut f.system,
            "thinking" => &mut f.thinking,
            "output_config" => &mut f.output_config,
            "input" => &mut f.input,
            "instructions" => &mut f.instructions,
            "previous_response_id" => &mut f.previous_response_id,
            "conversation" => &mut f.conversation,
            key => {
                let field = CapField::from_key(key).filter(|c| endpoint.is_cap(*c));
                if let Some(field) = field {
                    cap_members.push(i);
                    if let Some(last) = last_cap.get_mut(field as usize) {
                        *last = Some(i);
                    }
                }
                continue;
            }
        };
        *slot = Some(i);
    }

    // Only the values the cache key hashes may stay unchecked (see `validate`): an earlier,
    // duplicate `messages` or `tools` is validated now.
    let hashed = |i: &usize| Some(*i) == f.messages || Some(*i) == f.tools;
    if !unchecked
        .iter()
        .filter(|i| !hashed(i))
        .all(|&i| value_is_valid(body, &members, i))
    {
        return Err(Reason::NotJson);
    }
    unchecked.retain(hashed);

    let messages = raw_bytes(body, &members, f.messages);
    let form = endpoint.form(messages, &f)?;
    form.admits(body, &members, &f)?;

    if config.models.is_some() {
        let model =
            raw(body, &members, f.model).and_then(|m| serde_json::from_str::<String>(m).ok());
        if !config.accepts_model(model.as_deref()) {
            return Err(Reason::Model);
        }
    }

    // B: the smallest valid value among the fields (each field's last occurrence, as a JSON
    // parser that keeps the last duplicate sees it); ties go to the earlier field name.
    let mut cap: Option<Cap> = None;
    for field in [
        CapField::MaxTokens,
        CapField::MaxCompletionTokens,
        CapField::MaxOutputTokens,
    ] {
        let Some(member) = last_cap.get(field as usize).copied().flatten() else {
            continue;
        };
        let Some(value) = raw(body, &members, Some(member)).and_then(parse_cap) else {
            continue;
        };
        if cap.is_none_or(|c| value < c.value) {
            cap = Some(Cap {
                field,
                value,
                member,
            });
        }
    }
    if form.requires_cap() && cap.is_none() {
        return Err(Reason::NoCap);
    }

    let truncate = if form.reads_truncate() {
        raw(body, &members, f.truncate_prompt_tokens).and_then(|t| t.trim().parse::<u64>().ok())
    } else {
        None
    };

    let omit_tools =
        form == Form::Chat && crate::dialect::chat::omit_tools(body, &members, &f, config);
    let counting = form.counting(body, &members, &f, config)?;

    let req = Request {
        form,
        members,
        fields: f,
        cap_members,
        cap,
        truncate,
        counting,
        unchecked,
        omit_tools,
    };
    Ok(req)
}

impl Request {
    /// Validates the skimmed values: the whole body is then exactly as valid as a full scan
    /// would have found it. Not needed for a cache hit: the key hashes these bytes, and an
    /// entry is only stored for a body that passed this check.
    pub fn validate(&self, body: &[u8]) -> Result<(), Reason> {
        if self
            .unchecked
            .iter()
            .all(|&i| value_is_valid(body, &self.members, i))
        {
            Ok(())
        } else {
            Err(Reason::NotJson)
        }
    }

    /// The raw text of a field of this request.
    pub fn raw<'a>(&self, body: &'a [u8], idx: Option<usize>) -> Option<&'a str> {
        raw(body, &self.members, idx)
    }

    /// The request's `model` as a string ("" when absent or not a string).
    pub fn model_name(&self, body: &[u8]) -> String {
        self.raw(body, self.fields.model)
            .and_then(|m| serde_json::from_str::<String>(m).ok())
            .unwrap_or_default()
    }

    /// The raw bytes of a field of this request.
    pub fn raw_bytes<'a>(&self, body: &'a [u8], idx: Option<usize>) -> Option<&'a [u8]> {
        raw_bytes(body, &self.members, idx)
    }

    /// The rough estimate for this request (docs/spec.md §7), at least 1.
    pub fn estimate(&self, body: &[u8]) -> Option<u64> {
        self.form.estimate(self, body)
    }

    /// Whether every message's content is text (T may then lower the count; docs/spec.md §5).
    pub fn text_only(&self, body: &[u8]) -> bool {
        self.form.text_only(self, body)
    }

    /// The field to write and where (see [`Form::target`]).
    pub fn target(&self) -> (Option<usize>, &'static str) {
        self.form.target(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap()
    }

    fn an(body: &str) -> Result<Request, Reason> {
        analyze(body.as_bytes(), &cfg())
    }

    #[test]
    fn shapes() {
        for (body, reason) in [
            ("nope", Reason::NotJson),
            ("[]", Reason::NotObject),
            (r#"{"model":"m"}"#, Reason::Shape),
            (r#"{"messages":"hi"}"#, Reason::Shape),
            (
                r#"{"messages":{},"prompt":"x","max_tokens":5}"#,
                Reason::Shape,
            ),
            (r#"{"prompt":"x"}"#, Reason::NoCap),
            (r#"{"prompt":5,"max_tokens":5}"#, Reason::Shape),
            (r#"{"prompt":[],"max_tokens":5}"#, Reason::Shape),
            (r#"{"prompt":[1,"a"],"max_tokens":5}"#, Reason::Shape),
        ] {
            assert_eq!(an(body).unwrap_err(), reason, "{body}");
        }
        let r = an(r#"{"messages":[],"prompt":"x"}"#).unwrap();
        assert_eq!(r.form, Form::Chat);
        assert_eq!(r.counting, Counting::Tokenize);
        assert_eq!(r.cap, None);
    }

    #[test]
    fn completion_counting() {
        assert_eq!(
            an(r#"{"prompt":"hello","max_tokens":5}"#).unwrap().counting,
            Counting::Tokenize
        );
        assert_eq!(
            an(r#"{"prompt":["hello"],"max_tokens":5}"#)
                .unwrap()
                .counting,
            Counting::Tokenize
        );
        assert_eq!(
            an(r#"{"prompt":["a","b"],"max_tokens":5}"#)
                .unwrap()
                .counting,
            Counting::Estimate
        );
        assert_eq!(
            an(r#"{"prompt":[1,2,3],"max_tokens":5}"#).unwrap().counting,
            Counting::Exact(3)
        );
        assert_eq!(
            an(r#"{"prompt":[[1,2],[1,2,3,4]],"max_tokens":5}"#)
                .unwrap()
                .counting,
            Counting::Exact(4)
        );
    }

    #[test]
    fn caps_smallest_wins_with_ties_and_duplicates() {
        let r = an(r#"{"messages":[],"max_output_tokens":10,"max_completion_tokens":10,"max_tokens":"20"}"#).unwrap();
        assert_eq!(
            r.cap,
            Some(Cap {
                field: CapField::MaxCompletionTokens,
                value: 10,
                member: 2
            })
        );
        assert_eq!(r.cap_members, vec![1, 2, 3]);
        let r = an(r#"{"messages":[],"max_tokens":5,"max_tokens":100}"#).unwrap();
        assert_eq!(r.cap.unwrap().value, 100);
        assert_eq!(r.cap.unwrap().member, 2);
        let r = an(r#"{"messages":[],"max_tokens":-5,"max_output_tokens":null}"#).unwrap();
        assert_eq!(r.cap, None);
        assert_eq!(r.target(), (None, "max_tokens"));
        let r = an(r#"{"messages":[],"max_output_tokens":7}"#).unwrap();
        assert_eq!(r.target(), (Some(1), "max_tokens"));
        let r = an(r#"{"prompt":"x","max_output_tokens":7}"#).unwrap();
        assert_eq!(r.target(), (Some(1), "max_output_tokens"));
    }

    #[test]
    fn constrained_requests_are_counted_unless_configured() {
        let estimating =
            Config::parse(br#"{"tokenizer":{"cluster":"v"},"estimate_constrained":true}"#).unwrap();
        // (body, counting by default, counting with `estimate_constrained`)
        for (body, default, estimating_too) in [
            (
                r#"{"messages":[],"response_format":{"type":"json_object"}}"#,
                Counting::Tokenize,
                Counting::Estimate,
            ),
            (
                r#"{"messages":[],"response_format":null}"#,
                Counting::Tokenize,
                Counting::Tokenize,
            ),
            (
                r#"{"messages":[],"tools":[{}],"tool_choice":"required"}"#,
                Counting::Tokenize,
                Counting::Estimate,
            ),
            (
                r#"{"messages":[],"tools":[{}],"tool_choice":"auto"}"#,
                Counting::Tokenize,
                Counting::Tokenize,
            ),
            (
                r#"{"messages":[],"tools":[{}]}"#,
                Counting::Tokenize,
                Counting::Tokenize,
            ),
            (
                r#"{"messages":[],"tools":[ ],"tool_choice":"none"}"#,
                Counting::Tokenize,
                Counting::Tokenize,
            ),
        ] {
            assert_eq!(an(body).unwrap().counting, default, "{body}");
            let counting = analyze(body.as_bytes(), &estimating).unwrap().counting;
            assert_eq!(counting, estimating_too, "{body}");
        }
    }

    #[test]
    fn model_filter() {
        let c = Config::parse(br#"{"tokenizer":{"cluster":"v"},"model":["a","b"]}"#).unwrap();
        assert!(analyze(br#"{"model":"b","messages":[]}"#, &c).is_ok());
        assert_eq!(
            analyze(br#"{"model":"c","messages":[]}"#, &c).unwrap_err(),
            Reason::Model
        );
        assert_eq!(
            analyze(br#"{"messages":[]}"#, &c).unwrap_err(),
            Reason::Model
        );
    }

    #[test]
    fn estimate_and_text_only() {
        let body = r#"{"messages":[{"role":"user","content":"abcd"}],"tools":[1]}"#;
        let r = an(body).unwrap();
        let expected = crate::estimate::estimate(&[r#"[{"role":"user","content":"abcd"}]"#, "[1]"]);
        assert_eq!(r.estimate(body.as_bytes()), Some(expected));
        assert!(r.text_only(body.as_bytes()));
        let body = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}],"truncate_prompt_tokens":5}"#;
        let r = an(body).unwrap();
        assert_eq!(r.truncate, Some(5));
        assert!(!r.text_only(body.as_bytes()));
        assert_eq!(
            an(r#"{"messages":[]}"#)
                .unwrap()
                .estimate(b"{\"messages\":[]}"),
            Some(1)
        );
    }

    #[test]
    fn messages_and_tools_are_skimmed_then_validated() {
        let c = cfg();
        let bad_messages = br#"{"messages":[{"role":"user","content":"hi"},],"max_tokens":5}"#;
        let req = analyze(bad_messages, &c).unwrap();
        assert_eq!(req.unchecked, vec![0]);
        assert_eq!(req.validate(bad_messages), Err(Reason::NotJson));

        let bad_tools = br#"{"messages":[],"tools":[{"type":"function" "x":1}]}"#;
        let req = analyze(bad_tools, &c).unwrap();
        assert_eq!(req.unchecked, vec![0, 1]);
        assert_eq!(req.validate(bad_tools), Err(Reason::NotJson));

        let good = br#"{"messages":[{"role":"user","content":"] } \" ["}],"tools":[]}"#;
        let req = analyze(good, &c).unwrap();
        assert_eq!(req.validate(good), Ok(()));
        assert_eq!(
            &good[req.members[0].value.clone()],
            br#"[{"role":"user","content":"] } \" ["}]"#
        );
    }

    #[test]
    fn an_earlier_duplicate_is_validated_at_once() {
        // Only the last `messages` is hashed into the cache key, so an invalid earlier one
        // cannot wait for `validate` (a cache hit skips it).
        let c = cfg();
        let body = br#"{"messages":[1,],"messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(analyze(body, &c).unwrap_err(), Reason::NotJson);
        let body = br#"{"messages":[1],"messages":[{"role":"user","content":"x"}]}"#;
        let req = analyze(body, &c).unwrap();
        assert_eq!(req.unchecked, vec![1]);
        assert_eq!(req.validate(body), Ok(()));
    }

    #[test]
    fn a_body_that_never_closes_is_not_json_at_once() {
        let body = br#"{"messages":[{"role":"user","content":"x"}"#;
        assert_eq!(analyze(body, &cfg()).unwrap_err(), Reason::NotJson);
    }
}

#[cfg(test)]
mod messages {
    use super::*;

    fn an(body: &str) -> Result<Request, Reason> {
        let c = Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap();
        analyze_at(body.as_bytes(), &c, Endpoint::Messages)
    }

    #[test]
    fn only_max_tokens_is_a_cap() {
        let r = an(r#"{"messages":[],"max_completion_tokens":5,"max_tokens":"900"}"#).unwrap();
        assert_eq!(r.form, Form::Messages);
        assert_eq!(
            r.cap.map(|c| (c.field, c.value)),
            Some((CapField::MaxTokens, 900))
        );
        assert_eq!(r.cap_members, vec![2]);
        assert_eq!(r.target(), (Some(2), "max_tokens"));
        for (body, reason) in [
            (
                r#"{"messages":[],"max_completion_tokens":5}"#,
                Reason::NoCap,
            ),
            (r#"{"messages":[],"max_tokens":0}"#, Reason::NoCap),
            (r#"{"messages":"x","max_tokens":9}"#, Reason::Shape),
            (r#"{"prompt":"x","max_tokens":9}"#, Reason::Shape),
        ] {
            assert_eq!(an(body).unwrap_err(), reason, "{body}");
        }
        assert_eq!(
            an(r#"{"messages":[],"max_tokens":9}"#).unwrap().counting,
            Counting::Tokenize
        );
    }

    #[test]
    fn estimate_covers_system_messages_and_tools() {
        let body = r#"{"system":"aaaa","messages":[{"role":"user","content":"bb"}],"tools":[{"name":"t"}],"max_tokens":9}"#;
        let r = an(body).unwrap();
        let all = crate::estimate::estimate(&[
            r#"[{"role":"user","content":"bb"}]"#,
            r#""aaaa""#,
            r#"[{"name":"t"}]"#,
        ]);
        assert_eq!(r.estimate(body.as_bytes()), Some(all));
        assert!(!r.text_only(body.as_bytes()));
    }
}
