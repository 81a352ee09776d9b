//! What the filter publishes about a request to the rest of Envoy (docs/spec.md §9a): the
//! decision as named values the host stores per request (the wasm build as filter state
//! through proxy-wasm properties, the module as filter state through its ABI), for access
//! logs and rate limits. Counts and names only: never a prompt, a body or a header value.
//!
//! The request side is written once, when the request is decided, before it goes on upstream;
//! the answer side ([`USAGE_PROMPT`]) once, when the answer's usage reports its prompt. Each
//! name is written at most once per request.

use crate::plan::Source;
use crate::report::Report;

/// The prefix of every published name.
pub const PREFIX: &str = "incontext.";
/// The outcome: `rewritten`, `rejected` or `unchanged:<reason>` (as `x-incontext-action`).
pub const OUTCOME: &str = "incontext.outcome";
/// P, when a count was made.
pub const PROMPT: &str = "incontext.prompt_tokens";
/// What P is: `exact`, `cache`, `estimate`, `bound`, `at_least`.
pub const SOURCE: &str = "incontext.source";
/// C, when known.
pub const WINDOW: &str = "incontext.window";
/// The cap that went upstream: the one the filter wrote, else the caller's.
pub const MAX_TOKENS: &str = "incontext.max_tokens";
/// What a token budget charges the request before it goes upstream: P plus the cap, or
/// the window when the request names no cap (the server's own cap is then what the window
/// leaves).
pub const CHARGE: &str = "incontext.charge";
/// The prompt the answer's usage reported.
pub const USAGE_PROMPT: &str = "incontext.usage_prompt_tokens";

/// Every name, in the order the request side writes them, then the answer's.
pub const NAMES: [&str; 7] = [
    OUTCOME,
    PROMPT,
    SOURCE,
    WINDOW,
    MAX_TOKENS,
    CHARGE,
    USAGE_PROMPT,
];

/// The decision of one request, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: String,
    pub prompt: Option<u64>,
    pub source: Option<Source>,
    pub window: Option<u64>,
    pub max_tokens: Option<u64>,
}

impl Decision {
    /// The decision a report and what the request side knew make.
    pub fn of(report: &Report, window: Option<u64>, cap: Option<u64>) -> Decision {
        let outcome = match report.reason {
            Some(reason) => format!("{}:{}", report.action, reason.as_str()),
            None => report.action.to_string(),
        };
        Decision {
            outcome,
            prompt: report.prompt,
            source: report.source,
            window,
            max_tokens: report.max_tokens.or(cap),
        }
    }

    /// The charge of a token budget: P + cap; P + (C − P) = C when there is no cap; none
    /// without P.
    pub fn charge(&self) -> Option<u64> {
        let prompt = self.prompt?;
        match (self.max_tokens, self.window) {
            (Some(cap), _) => Some(prompt.saturating_add(cap)),
            (None, Some(window)) => Some(window.max(prompt)),
            (None, None) => Some(prompt),
        }
    }

    /// The request side's values, each with its name.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![(OUTCOME, self.outcome.clone())];
        let numbers = [
            (PROMPT, self.prompt),
            (WINDOW, self.window),
            (MAX_TOKENS, self.max_tokens),
            (CHARGE, self.charge()),
        ];
        if let Some(s) = self.source {
            out.push((SOURCE, s.as_str().to_string()));
        }
        out.extend(
            numbers
                .into_iter()
                .filter_map(|(name, v)| v.map(|v| (name, v.to_string()))),
        );
        out
    }
}

/// What is still to publish for one request.
#[derive(Debug, Default)]
pub struct Publication {
    decision: Option<Decision>,
    decided: bool,
    usage: Option<u64>,
    used: bool,
}

impl Publication {
    /// The request is decided (once: a later decision changes nothing published).
    pub fn decide(&mut self, decision: Decision) {
        if self.decision.is_none() && !self.decided {
            self.decision = Some(decision);
        }
    }

    /// The answer's usage reported the prompt.
    pub fn usage(&mut self, prompt: u64) {
        if self.usage.is_none() && !self.used {
            self.usage = Some(prompt);
        }
    }

    /// The values not yet handed out, each once.
    pub fn take(&mut self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(d) = self.decision.take() {
            self.decided = true;
            out = d.entries();
        }
        if let Some(u) = self.usage.take() {
            self.used = true;
            out.push((USAGE_PROMPT, u.to_string()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::Reason;

    fn report(action: &'static str, reason: Option<Reason>, prompt: Option<u64>) -> Report {
        Report {
            action,
            reason,
            prompt,
            source: prompt.map(|_| Source::Exact),
            max_tokens: (action == "rewritten").then_some(900),
        }
    }

    #[test]
    fn a_rewrite_publishes_every_request_value_and_charges_prompt_plus_written_cap() {
        let d = Decision::of(
            &report("rewritten", None, Some(100)),
            Some(1000),
            Some(32000),
        );
        assert_eq!(
            d.entries(),
            vec![
                (OUTCOME, "rewritten".to_string()),
                (SOURCE, "exact".to_string()),
                (PROMPT, "100".to_string()),
                (WINDOW, "1000".to_string()),
                (MAX_TOKENS, "900".to_string()),
                (CHARGE, "1000".to_string()),
            ]
        );
    }

    #[test]
    fn an_unchanged_request_charges_the_callers_cap_or_the_window_without_one() {
        let fits = report("unchanged", Some(Reason::Fits), Some(40));
        let d = Decision::of(&fits, Some(1000), Some(200));
        assert_eq!(d.outcome, "unchanged:fits");
        assert_eq!(d.charge(), Some(240));
        assert_eq!(Decision::of(&fits, Some(1000), None).charge(), Some(1000));
        assert_eq!(Decision::of(&fits, None, None).charge(), Some(40));
    }

    #[test]
    fn a_request_never_counted_publishes_its_outcome_alone() {
        let d = Decision::of(&report("unchanged", Some(Reason::Method), None), None, None);
        assert_eq!(d.entries(), vec![(OUTCOME, "unchanged:method".to_string())]);
        assert_eq!(d.charge(), None);
    }

    #[test]
    fn each_value_is_handed_out_once() {
        let mut p = Publication::default();
        assert!(p.take().is_empty());
        let d = Decision::of(&report("rewritten", None, Some(10)), Some(100), None);
        p.decide(d.clone());
        assert_eq!(p.take().len(), 6);
        p.decide(d);
        p.usage(11);
        assert_eq!(p.take(), vec![(USAGE_PROMPT, "11".to_string())]);
        p.usage(12);
        assert_eq!(p.take(), Vec::<(&str, String)>::new());
    }

    #[test]
    fn every_name_is_listed_once_under_the_prefix() {
        let mut names = NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 7);
        assert_eq!(NAMES.iter().filter(|n| n.starts_with(PREFIX)).count(), 7);
    }
}
