//! What the flow counts and measures: every `incontext_*` counter and histogram, named here
//! once. The glue defines and increments them by iterating [`Metric::all`].

use crate::reason::Reason;
use crate::tokenize::Failure;

/// A counter (`incontext_<name>`, and `incontext_route_<route>_<name>` for a request's route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Requests,
    Rewritten,
    Rejected,
    TokenizerCalls,
    CacheHits,
    CacheMisses,
    Estimates,
    Unchanged(Reason),
    Failure(Failure),
    /// A whole prompt counted on the request's path.
    CountCalls,
    /// A request whose count a bound made unnecessary (docs/spec.md §15).
    CountSkipped,
    /// A skipped request counted after it went upstream.
    BoundChecks,
    /// A check whose count exceeded the bound: skipping is off for that route and model.
    BoundViolations,
    /// A count of a conversation's new messages alone, on the request's path.
    TailCounts,
    /// A server's window error reached the client as its dialect's (docs/spec.md §13).
    Translated,
    /// An Anthropic answer ended by the window reports `model_context_window_exceeded`.
    WindowStop,
    /// A request sent on a bound checked by the usage its answer reported (no count).
    UsageChecks,
    /// An answer's usage differs from the exact count the filter decided with.
    UsageMismatch,
    /// A store into a full set of the count or anchor table replaced another key's entry
    /// (docs/spec.md §6).
    Evictions,
    /// A request counted whole because the anchor it would have been bounded from was
    /// evicted (docs/spec.md §15b).
    EvictedRecounts,
}

/// The counters that are not a reason or a failure, in the order of [`Metric::all`].
const PLAIN: [Metric; 18] = [
    Metric::Requests,
    Metric::Rewritten,
    Metric::Rejected,
    Metric::TokenizerCalls,
    Metric::CacheHits,
    Metric::CacheMisses,
    Metric::Estimates,
    Metric::CountCalls,
    Metric::CountSkipped,
    Metric::BoundChecks,
    Metric::BoundViolations,
    Metric::TailCounts,
    Metric::Translated,
    Metric::WindowStop,
    Metric::UsageChecks,
    Metric::UsageMismatch,
    Metric::Evictions,
    Metric::EvictedRecounts,
];

impl Metric {
    /// How many counters there are.
    pub const COUNT: usize = PLAIN.len() + Reason::ALL.len() + Failure::ALL.len();

    /// Every counter, each once, in the order of [`Metric::index`].
    pub fn all() -> impl Iterator<Item = Metric> {
        PLAIN
            .into_iter()
            .chain(Reason::ALL.into_iter().map(Metric::Unchanged))
            .chain(Failure::ALL.into_iter().map(Metric::Failure))
    }

    /// Its position in [`Metric::all`].
    pub fn index(self) -> usize {
        match self {
            Metric::Unchanged(r) => PLAIN.len() + r.index(),
            Metric::Failure(f) => PLAIN.len() + Reason::ALL.len() + f.index(),
            plain => PLAIN.iter().position(|m| *m == plain).unwrap_or(0),
        }
    }

    /// The name after `incontext_` (or `incontext_route_<route>_`).
    pub fn name(self) -> String {
        let plain = match self {
            Metric::Requests => "requests",
            Metric::Rewritten => "rewritten",
            Metric::Rejected => "rejected",
            Metric::TokenizerCalls => "tokenizer_calls",
            Metric::CacheHits => "cache_hits",
            Metric::CacheMisses => "cache_misses",
            Metric::Estimates => "estimates",
            Metric::CountCalls => "count_calls",
            Metric::CountSkipped => "count_skipped",
            Metric::BoundChecks => "bound_checks",
            Metric::BoundViolations => "bound_violations",
            Metric::TailCounts => "tail_counts",
            Metric::Translated => "translated",
            Metric::WindowStop => "window_stop",
            Metric::UsageChecks => "usage_checks",
            Metric::UsageMismatch => "usage_mismatch",
            Metric::Evictions => "evictions",
            Metric::EvictedRecounts => "evicted_recounts",
            Metric::Unchanged(r) => return format!("unchanged_{}", r.as_str()),
            Metric::Failure(f) => return format!("tokenizer_failures_{}", f.as_str()),
        };
        plain.to_string()
    }
}

/// What the flow measures (Envoy histograms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Histogram {
    /// Milliseconds from a count call's dispatch on the request's path to its answer.
    CountMs,
}

impl Histogram {
    pub const ALL: [Histogram; 1] = [Histogram::CountMs];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::CountMs => "count_ms",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_its_own_index_and_name() {
        let all: Vec<Metric> = Metric::all().collect();
        assert_eq!(all.len(), Metric::COUNT);
        for (i, m) in all.iter().enumerate() {
            assert_eq!(m.index(), i, "{m:?}");
        }
        let mut names: Vec<String> = all.iter().map(|m| m.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Metric::COUNT);
        assert_eq!(Metric::Unchanged(Reason::Fits).name(), "unchanged_fits");
        assert_eq!(
            Metric::Failure(Failure::Timeout).name(),
            "tokenizer_failures_timeout"
        );
    }
}
