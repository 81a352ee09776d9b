//! The request dialect axis: OpenAI chat (`messages`), OpenAI completion (`prompt`),
//! Anthropic Messages and OpenAI Responses (docs/spec.md §4, §10, §14). One module per dialect holds what differs
//! between them: which fields are caps, how the prompt is counted and what the count payload
//! is, which raw slices the estimate reads, and how a rejection looks. This module names the
//! dialects and dispatches to them.

pub mod canonical;
pub mod chat;
pub mod completion;
pub mod messages;
pub mod responses;

use crate::caps::CapField;
use crate::config::Config;
use crate::json::scan::Member;
use crate::reason::Reason;
use crate::request::{Counting, Fields, Request};
use crate::response::errors;

/// The request dialect. It decides how caps are read and written, how the prompt is counted
/// and estimated, and how a rejection looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Chat,
    Completion,
    Messages,
    Responses,
}

/// What the request path says about the dialect, before the body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Endpoint {
    /// Any other path: the body's shape decides (chat or completion).
    #[default]
    OpenAi,
    /// `…/v1/messages`: Anthropic Messages.
    Messages,
    /// `…/v1/responses`: OpenAI Responses.
    Responses,
}

/// The endpoint of a request path (without the query), or why it is not budgeted.
pub fn classify_path(path: &str) -> Result<Endpoint, Reason> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let path = path.trim_end_matches('/');
    if path.ends_with("/v1/messages") {
        Ok(Endpoint::Messages)
    } else if path.ends_with("/v1/messages/count_tokens") {
        Err(Reason::CountOnly)
    } else if path.ends_with("/v1/responses") {
        Ok(Endpoint::Responses)
    } else if path.ends_with("/v1/responses/input_tokens") || path.ends_with("/v1/responses/render")
    {
        Err(Reason::CountOnly)
    } else if path.contains("/v1/responses/") {
        Err(Reason::ResponsesApi)
    } else {
        Ok(Endpoint::OpenAi)
    }
}

impl Endpoint {
    /// Whether a top-level member named by `field` is a caller cap at this endpoint.
    pub fn is_cap(self, field: CapField) -> bool {
        match self {
            Endpoint::OpenAi => true,
            Endpoint::Messages => messages::is_cap(field),
            Endpoint::Responses => responses::is_cap(field),
        }
    }

    /// The dialect of a body sent here, from the raw `messages` and which of `prompt` and
    /// `input` are present.
    pub fn form(self, messages: Option<&[u8]>, f: &Fields) -> Result<Form, Reason> {
        let array = messages.is_some_and(|m| m.starts_with(b"["));
        let has_prompt = f.prompt.is_some();
        match self {
            Endpoint::Responses if f.input.is_some() => Ok(Form::Responses),
            Endpoint::Responses => Err(Reason::Shape),
            Endpoint::Messages if array => Ok(Form::Messages),
            Endpoint::Messages => Err(Reason::Shape),
            Endpoint::OpenAi if array => Ok(Form::Chat),
            Endpoint::OpenAi if messages.is_none() && has_prompt => Ok(Form::Completion),
            Endpoint::OpenAi => Err(Reason::Shape),
        }
    }
}

impl Form {
    /// The member holding the conversation, message by message (Responses: input item by
    /// input item; docs/spec.md §15b); none for a completion's prompt.
    pub fn conversation(self, f: &Fields) -> Option<usize> {
        match self {
            Form::Chat | Form::Messages => f.messages,
            Form::Responses => f.input,
            Form::Completion => None,
        }
    }

    /// Whether a top-level member never reaches the prompt, whatever its value (a client may
    /// change it every turn: it stays out of what identifies a conversation).
    pub fn unrendered(self, key: &str) -> bool {
        match self {
            Form::Responses => responses::UNRENDERED.contains(&key),
            Form::Chat | Form::Completion | Form::Messages => false,
        }
    }

    /// What this dialect's messages may carry that the server renders alike (the canonical
    /// form the prefix chain hashes).
    pub fn canon(self) -> &'static canonical::Canon {
        match self {
            Form::Chat => &chat::CANON,
            Form::Messages => &messages::CANON,
            Form::Responses => &responses::CANON,
            Form::Completion => &completion::CANON,
        }
    }

    /// Whether a request without a valid cap is left unchanged (`no_cap`).
    pub fn requires_cap(self) -> bool {
        match self {
            Form::Chat => false,
            Form::Completion => completion::REQUIRES_CAP,
            Form::Messages => messages::REQUIRES_CAP,
            Form::Responses => responses::REQUIRES_CAP,
        }
    }

    /// Whether `truncate_prompt_tokens` (T) is read.
    pub fn reads_truncate(self) -> bool {
        matches!(self, Form::Chat | Form::Completion)
    }

    /// `Err` with the reason when a request of this dialect cannot be budgeted from its body
    /// alone (a Responses request that continues server-side state).
    pub fn admits(self, body: &[u8], members: &[Member], f: &Fields) -> Result<(), Reason> {
        match self {
            Form::Responses => responses::stateless(body, members, f),
            Form::Chat | Form::Completion | Form::Messages => Ok(()),
        }
    }

    /// How the prompt will be counted.
    pub fn counting(
        self,
        body: &[u8],
        members: &[Member],
        f: &Fields,
        config: &Config,
    ) -> Result<Counting, Reason> {
        match self {
            Form::Chat => Ok(chat::counting(body, members, f, config)),
            Form::Completion => completion::counting(body, members, f),
            Form::Messages | Form::Responses => Ok(Counting::Tokenize),
        }
    }

    /// The rough estimate's raw slices for `req` (docs/spec.md §7), at least 1.
    pub fn estimate(self, req: &Request, body: &[u8]) -> Option<u64> {
        let n = match self {
            Form::Chat => chat::estimate(req, body)?,
            Form::Completion => completion::estimate(req, body)?,
            Form::Messages => messages::estimate(req, body)?,
            Form::Responses => responses::estimate(req, body)?,
        };
        Some(n.max(1))
    }

    /// Whether every message's content is text (T may then lower the count; docs/spec.md §5).
    pub fn text_only(self, req: &Request, body: &[u8]) -> bool {
        match self {
            Form::Chat => chat::text_only(req, body),
            // The prompt is text or ids.
            Form::Completion => true,
            Form::Messages | Form::Responses => false,
        }
    }

    /// A member to change beside the cap so the rewritten request stays valid (Anthropic's
    /// thinking budget), or why no valid rewrite exists.
    pub fn companion_edit(
        self,
        req: &Request,
        body: &[u8],
        value: u64,
    ) -> Result<Option<(usize, Vec<u8>)>, Reason> {
        match self {
            Form::Messages => messages::thinking_budget(req, body, value),
            Form::Chat | Form::Completion | Form::Responses => Ok(None),
        }
    }

    /// The field to write and where: the caller's field, or `max_tokens` appended when there
    /// was no valid cap.
    pub fn target(self, req: &Request) -> (Option<usize>, &'static str) {
        match self {
            Form::Chat => chat::target(req),
            Form::Responses => responses::target(req),
            Form::Completion | Form::Messages => match req.cap {
                Some(c) => (Some(c.member), c.field.name()),
                None => (None, CapField::MaxTokens.name()),
            },
        }
    }

    /// The answer to a request rejected for want of room: W, P, the value the rule found (no
    /// dialect's answer names it) and the required minimum.
    pub fn reject_body(self, window: u64, prompt: u64, _value: i128, required: u64) -> Vec<u8> {
        match self {
            Form::Messages => messages::reject_body(window, prompt, required),
            Form::Chat | Form::Completion | Form::Responses => {
                errors::no_room(errors::Dialect::of(self), window, prompt, required)
            }
        }
    }
}

/// Builds vLLM's `/tokenize` payload for `req` (docs/spec.md §5). `None` when a field it needs
/// is not of the expected form (the caller then uses the estimate), or when the dialect is
/// counted by the backend's own counter with the request as it is (Anthropic, Responses).
pub fn payload(req: &Request, body: &[u8]) -> Option<Vec<u8>> {
    match req.form {
        Form::Chat => chat::payload(req, body),
        Form::Completion => completion::payload(req, body),
        Form::Messages | Form::Responses => None,
    }
}

/// `"name":` as a payload writes it.
pub(crate) fn write_key(key: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

/// Writes `,"name":<compacted raw>` (no comma right after the opening brace) when `raw` is
/// present.
pub(crate) fn write_field(out: &mut Vec<u8>, name: &str, raw: Option<&str>) -> Option<()> {
    if let Some(raw) = raw {
        if out.len() > 1 {
            out.push(b',');
        }
        write_key(name, out);
        crate::json::compact::compact(raw, out)?;
    }
    Some(())
}
