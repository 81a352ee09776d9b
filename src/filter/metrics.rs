//! The `incontext_*` counters (SPEC §9). Envoy lists them as `wasmcustom.<name>`.

use super::host;
use crate::core::reason::Reason;
use crate::core::tokenize::Failure;

/// Counter ids; a counter the host refused to define is skipped.
pub struct Metrics {
    pub requests: Option<u32>,
    pub rewritten: Option<u32>,
    pub rejected: Option<u32>,
    pub tokenizer_calls: Option<u32>,
    pub cache_hits: Option<u32>,
    pub cache_misses: Option<u32>,
    pub estimates: Option<u32>,
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

    pub fn bump(id: Option<u32>) {
        if let Some(id) = id {
            let _ = host::increment(id);
        }
    }

    pub fn unchanged(&self, reason: Reason) {
        Self::bump(self.unchanged.get(reason.index()).copied().flatten());
    }

    pub fn failure(&self, failure: Failure) {
        Self::bump(self.failures.get(failure.index()).copied().flatten());
    }
}
