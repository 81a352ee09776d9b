//! The `incontext_*` metrics (docs/spec.md §9), and the counters again per route as
//! `incontext_route_<i>_*` (§16). Envoy lists them as `wasmcustom.<name>`.

use crate::proxy::{MetricType, Proxy};
use incontext_core::flow::{Histogram, Metric};
use incontext_core::reason::Reason;
use incontext_core::tokenize::Failure;

/// The metrics of the whole configuration, and the counters of each route.
pub struct Metrics {
    all: Counters,
    count_ms: Option<u32>,
    routes: Vec<Counters>,
}

impl Metrics {
    /// The metrics of a configuration with `routes` routes.
    pub fn define(proxy: &mut dyn Proxy, routes: usize) -> Metrics {
        Metrics {
            all: Counters::define(proxy, "incontext_"),
            count_ms: proxy
                .define_metric(MetricType::Histogram, "incontext_count_ms")
                .ok(),
            routes: (0..routes)
                .map(|i| Counters::define(proxy, &format!("incontext_route_{i}_")))
                .collect(),
        }
    }

    pub fn increment(&self, proxy: &mut dyn Proxy, metric: Metric) {
        self.all.increment(proxy, metric);
    }

    /// The counter of route `route` (the whole configuration's is `increment`'s).
    pub fn increment_route(&self, proxy: &mut dyn Proxy, route: usize, metric: Metric) {
        if let Some(counters) = self.routes.get(route) {
            counters.increment(proxy, metric);
        }
    }

    pub fn record(&self, proxy: &mut dyn Proxy, histogram: Histogram, value: u64) {
        let id = match histogram {
            Histogram::CountMs => self.count_ms,
        };
        if let Some(id) = id {
            let _ = proxy.record_metric(id, value);
        }
    }
}

/// Counter ids; a counter the host refused to define is skipped.
struct Counters {
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
    tail_counts: Option<u32>,
    translated: Option<u32>,
    window_stop: Option<u32>,
    unchanged: Vec<Option<u32>>,
    failures: Vec<Option<u32>>,
}

impl Counters {
    /// The counters named `<prefix>requests`, `<prefix>rewritten`, ...
    fn define(proxy: &mut dyn Proxy, prefix: &str) -> Counters {
        let mut counter = |name: &str| {
            proxy
                .define_metric(MetricType::Counter, &format!("{prefix}{name}"))
                .ok()
        };
        Counters {
            requests: counter("requests"),
            rewritten: counter("rewritten"),
            rejected: counter("rejected"),
            tokenizer_calls: counter("tokenizer_calls"),
            cache_hits: counter("cache_hits"),
            cache_misses: counter("cache_misses"),
            estimates: counter("estimates"),
            count_calls: counter("count_calls"),
            count_skipped: counter("count_skipped"),
            bound_checks: counter("bound_checks"),
            bound_violations: counter("bound_violations"),
            tail_counts: counter("tail_counts"),
            translated: counter("translated"),
            window_stop: counter("window_stop"),
            unchanged: Reason::ALL
                .iter()
                .map(|r| counter(&format!("unchanged_{}", r.as_str())))
                .collect(),
            failures: Failure::ALL
                .iter()
                .map(|f| counter(&format!("tokenizer_failures_{}", f.as_str())))
                .collect(),
        }
    }

    fn increment(&self, proxy: &mut dyn Proxy, metric: Metric) {
        let id = match metric {
            Metric::Requests => self.requests,
            Metric::Rewritten => self.rewritten,
            Metric::Rejected => self.rejected,
            Metric::TokenizerCalls => self.tokenizer_calls,
            Metric::CacheHits => self.cache_hits,
            Metric::CacheMisses => self.cache_misses,
            Metric::Estimates => self.estimates,
            Metric::Translated => self.translated,
            Metric::WindowStop => self.window_stop,
            Metric::Unchanged(r) => self.unchanged.get(r.index()).copied().flatten(),
            Metric::Failure(f) => self.failures.get(f.index()).copied().flatten(),
            Metric::CountCalls => self.count_calls,
            Metric::CountSkipped => self.count_skipped,
            Metric::BoundChecks => self.bound_checks,
            Metric::BoundViolations => self.bound_violations,
            Metric::TailCounts => self.tail_counts,
        };
        if let Some(id) = id {
            let _ = proxy.increment_metric(id, 1);
        }
    }
}

/// One VM's part of a gauge summed over every worker's VM: it adds the change of its own
/// value, so the gauge is the sum.
struct Gauge {
    id: Option<u32>,
    value: u64,
}

impl Gauge {
    fn define(proxy: &mut dyn Proxy, name: &str) -> Gauge {
        Gauge {
            id: proxy.define_metric(MetricType::Gauge, name).ok(),
            value: 0,
        }
    }

    fn set(&mut self, proxy: &mut dyn Proxy, value: u64) {
        let Some(id) = self.id else {
            return;
        };
        if value == self.value {
            return;
        }
        let delta = i64::try_from(i128::from(value) - i128::from(self.value)).unwrap_or(0);
        if proxy.increment_metric(id, delta).is_ok() {
            self.value = value;
        }
    }
}

/// What the VM holds (docs/spec.md §9): the calls of gone requests still out, and its linear
/// memory. Recorded when they change, summed over the workers' VMs.
pub struct Holdings {
    orphans: Gauge,
    memory: Gauge,
}

impl Holdings {
    pub fn define(proxy: &mut dyn Proxy) -> Holdings {
        Holdings {
            orphans: Gauge::define(proxy, "incontext_orphans"),
            memory: Gauge::define(proxy, "incontext_wasm_memory_bytes"),
        }
    }

    pub fn record(&mut self, proxy: &mut dyn Proxy, orphans: usize) {
        self.orphans.set(proxy, orphans as u64);
        let memory = proxy.memory_bytes();
        self.memory.set(proxy, memory);
    }
}
