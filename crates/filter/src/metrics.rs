//! The `incontext_*` counters (docs/spec.md §9). Envoy lists them as `wasmcustom.<name>`.

use super::host;
use incontext_core::flow::{Histogram, Metric};
use incontext_core::reason::Reason;
use incontext_core::tokenize::Failure;

/// Counter ids; a counter the host refused to define is skipped.
pub struct Metrics {
    requests: Option<u32>,
    rewritten: Option<u32>,
    rejected: Option<u32>,
    tokenizer_calls: Option<u32>,
    cache_hits: Option<u32>,
    cache_misses: Option<u32>,
    estimates: Option<u32>,
    count_calls: Option<u32>,
    count_skipped: Option<u32>,
    bound_checks: Option<u32>,
    bound_violations: Option<u32>,
    count_ms: Option<u32>,
    unchanged: Vec<Option<u32>>,
    failures: Vec<Option<u32>>,
}

fn counter(name: &str) -> Option<u32> {
    host::define_counter(name).ok()
}

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            requests: counter("incontext_requests"),
            rewritten: counter("incontext_rewritten"),
            rejected: counter("incontext_rejected"),
            tokenizer_calls: counter("incontext_tokenizer_calls"),
            cache_hits: counter("incontext_cache_hits"),
            cache_misses: counter("incontext_cache_misses"),
            estimates: counter("incontext_estimates"),
            count_calls: counter("incontext_count_calls"),
            count_skipped: counter("incontext_count_skipped"),
            bound_checks: counter("incontext_bound_checks"),
            bound_violations: counter("incontext_bound_violations"),
            count_ms: host::define_histogram("incontext_count_ms").ok(),
            unchanged: Reason::ALL
                .iter()
                .map(|r| counter(&format!("incontext_unchanged_{}", r.as_str())))
                .collect(),
            failures: Failure::ALL
                .iter()
                .map(|f| counter(&format!("incontext_tokenizer_failures_{}", f.as_str())))
                .collect(),
        }
    }

    pub fn increment(&self, c: Metric) {
        let id = match c {
            Metric::Requests => self.requests,
            Metric::Rewritten => self.rewritten,
            Metric::Rejected => self.rejected,
            Metric::TokenizerCalls => self.tokenizer_calls,
            Metric::CacheHits => self.cache_hits,
            Metric::CacheMisses => self.cache_misses,
            Metric::Estimates => self.estimates,
            Metric::Unchanged(r) => self.unchanged.get(r.index()).copied().flatten(),
            Metric::Failure(f) => self.failures.get(f.index()).copied().flatten(),
            Metric::CountCalls => self.count_calls,
            Metric::CountSkipped => self.count_skipped,
            Metric::BoundChecks => self.bound_checks,
            Metric::BoundViolations => self.bound_violations,
        };
        if let Some(id) = id {
            let _ = host::increment(id);
        }
    }

    pub fn record(&self, h: Histogram, value: u64) {
        let id = match h {
            Histogram::CountMs => self.count_ms,
        };
        if let Some(id) = id {
            let _ = host::record(id, value);
        }
    }
}
