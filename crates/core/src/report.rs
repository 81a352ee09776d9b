//! What the filter reports about a request in the `x-incontext-*` headers (docs/spec.md §9):
//! on the upstream's response, or on the local rejection.

use crate::plan::Source;
use crate::reason::Reason;

pub const HEADER_ACTION: &str = "x-incontext-action";
pub const HEADER_PROMPT: &str = "x-incontext-prompt-tokens";
pub const HEADER_SOURCE: &str = "x-incontext-source";
pub const HEADER_MAX_TOKENS: &str = "x-incontext-max-tokens";

/// What the report headers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `rewritten`, `unchanged` or `rejected`.
    pub action: &'static str,
    pub reason: Option<Reason>,
    pub prompt: Option<u64>,
    pub source: Option<Source>,
    pub max_tokens: Option<u64>,
}

impl Report {
    /// The report as header pairs.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let action = match self.reason {
            Some(reason) => format!("{}:{}", self.action, reason.as_str()),
            None => self.action.to_string(),
        };
        let mut out = vec![(HEADER_ACTION, action)];
        if let Some(p) = self.prompt {
            out.push((HEADER_PROMPT, p.to_string()));
        }
        if let Some(s) = self.source {
            out.push((HEADER_SOURCE, s.as_str().to_string()));
        }
        if let Some(m) = self.max_tokens {
            out.push((HEADER_MAX_TOKENS, m.to_string()));
        }
        out
    }
}
