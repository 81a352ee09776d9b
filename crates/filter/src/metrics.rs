//! The `incontext_*` metrics (docs/spec.md §9), and the counters again per route as
//! `incontext_route_<name>_*` (§16). Envoy lists them as `wasmcustom.<name>`. Every counter
//! the core names ([`Metric::all`]) is defined; nothing here lists them again.

use crate::proxy::{MetricType, Proxy};
use incontext_core::flow::{Histogram, Metric};

/// The metrics of the whole configuration, and the counters of each route.
pub struct Metrics {
    all: Counters,
    histograms: Vec<Option<u32>>,
    routes: Vec<Counters>,
}

impl Metrics {
    /// The metrics of a configuration whose routes are named `routes`, in order.
    pub fn define<'a>(proxy: &mut dyn Proxy, routes: impl Iterator<Item = &'a str>) -> Metrics {
        Metrics {
            all: Counters::define(proxy, "incontext_"),
            histograms: Histogram::ALL
                .iter()
                .map(|h| {
                    let name = format!("incontext_{}", h.name());
                    proxy.define_metric(MetricType::Histogram, &name).ok()
                })
                .collect(),
            routes: routes
                .map(|name| Counters::define(proxy, &format!("incontext_route_{name}_")))
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
        let at = Histogram::ALL.iter().position(|h| *h == histogram);
        if let Some(id) = at.and_then(|i| self.histograms.get(i)).copied().flatten() {
            let _ = proxy.record_metric(id, value);
        }
    }
}

/// Counter ids by [`Metric::index`]; a counter the host refused to define is skipped.
struct Counters(Vec<Option<u32>>);

impl Counters {
    /// The counters named `<prefix><metric name>`.
    fn define(proxy: &mut dyn Proxy, prefix: &str) -> Counters {
        Counters(
            Metric::all()
                .map(|m| {
                    let name = format!("{prefix}{}", m.name());
                    proxy.define_metric(MetricType::Counter, &name).ok()
                })
                .collect(),
        )
    }

    fn increment(&self, proxy: &mut dyn Proxy, metric: Metric) {
        if let Some(id) = self.0.get(metric.index()).copied().flatten() {
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
