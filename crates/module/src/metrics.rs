//! The `incontext_*` metrics (docs/spec.md §9) as Envoy's dynamic-module counters and
//! histograms, and the counters again per route as `incontext_route_<name>_*` (§16); Envoy
//! lists them under the filter's metrics namespace. Every counter the core names
//! ([`Metric::all`]) is defined; nothing here lists them again. `incontext_panics` is the
//! module's own: a panic caught at the ABI boundary.

use crate::envoy::Envoy;
use incontext_core::flow::{Histogram, Metric};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What defines a metric when a configuration loads; `None` when Envoy refused it.
pub trait Define {
    fn counter(&mut self, name: &str) -> Option<usize>;
    fn histogram(&mut self, name: &str) -> Option<usize>;
}

/// The metric ids of one configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    all: Vec<Option<usize>>,
    routes: Vec<Vec<Option<usize>>>,
    histograms: Vec<Option<usize>>,
    pub panics: Option<usize>,
}

fn counters(define: &mut dyn Define, prefix: &str) -> Vec<Option<usize>> {
    Metric::all()
        .map(|m| define.counter(&format!("{prefix}{}", m.name())))
        .collect()
}

impl Metrics {
    /// The metrics of a configuration whose routes are named `routes`, in order.
    pub fn define<'a>(define: &mut dyn Define, routes: impl Iterator<Item = &'a str>) -> Metrics {
        Metrics {
            all: counters(define, "incontext_"),
            routes: routes
                .map(|name| counters(define, &format!("incontext_route_{name}_")))
                .collect(),
            histograms: Histogram::ALL
                .iter()
                .map(|h| define.histogram(&format!("incontext_{}", h.name())))
                .collect(),
            panics: define.counter("incontext_panics"),
        }
    }

    pub fn counter(&self, metric: Metric) -> Option<usize> {
        self.all.get(metric.index()).copied().flatten()
    }

    pub fn route_counter(&self, route: usize, metric: Metric) -> Option<usize> {
        self.routes
            .get(route)
            .and_then(|r| r.get(metric.index()))
            .copied()
            .flatten()
    }

    pub fn histogram(&self, histogram: Histogram) -> Option<usize> {
        let at = Histogram::ALL.iter().position(|h| *h == histogram)?;
        self.histograms.get(at).copied().flatten()
    }
}

/// At most this many histogram values wait in [`Deferred`]; later ones are dropped.
pub const MAX_DEFERRED_VALUES: usize = 256;

/// Metric updates made outside any stream (what the answer to a call made after its stream
/// counts). Envoy moves a metric only through a stream, so they wait here and the next stream
/// of the configuration applies them ([`Deferred::take`]). Bounded whatever traffic does: one
/// sum per counter id (the ids a configuration defined), at most [`MAX_DEFERRED_VALUES`]
/// histogram values.
#[derive(Default)]
pub struct Deferred {
    /// Something waits (read by every stream, without the lock).
    waiting: AtomicBool,
    state: Mutex<Updates>,
}

/// Counter ids with the sum to add, histogram ids with a value to record.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Updates {
    pub counters: Vec<(usize, u64)>,
    pub values: Vec<(usize, u64)>,
}

impl Deferred {
    pub fn increment(&self, counter: usize) {
        if let Ok(mut state) = self.state.lock() {
            match state.counters.iter_mut().find(|(id, _)| *id == counter) {
                Some((_, n)) => *n = n.saturating_add(1),
                None => state.counters.push((counter, 1)),
            }
            self.waiting.store(true, Ordering::Release);
        }
    }

    pub fn record(&self, histogram: usize, value: u64) {
        if let Ok(mut state) = self.state.lock() {
            if state.values.len() < MAX_DEFERRED_VALUES {
                state.values.push((histogram, value));
                self.waiting.store(true, Ordering::Release);
            }
        }
    }

    /// What waits, now taken; `None` when nothing does.
    pub fn take(&self) -> Option<Updates> {
        if !self.waiting.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.state.lock().ok()?;
        self.waiting.store(false, Ordering::Release);
        Some(std::mem::take(&mut *state))
    }

    /// Applies what waits through a stream's `envoy`.
    pub fn apply(&self, envoy: &mut dyn Envoy) {
        let Some(updates) = self.take() else {
            return;
        };
        for (id, by) in updates.counters {
            envoy.increment(id, by);
        }
        for (id, value) in updates.values {
            envoy.record(id, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids in order of definition; names refused when listed.
    #[derive(Default)]
    struct Names {
        counters: Vec<String>,
        histograms: Vec<String>,
        refuse: Vec<String>,
    }

    impl Define for Names {
        fn counter(&mut self, name: &str) -> Option<usize> {
            if self.refuse.iter().any(|r| r == name) {
                return None;
            }
            self.counters.push(name.to_string());
            Some(self.counters.len() - 1)
        }
        fn histogram(&mut self, name: &str) -> Option<usize> {
            self.histograms.push(name.to_string());
            Some(self.histograms.len() - 1)
        }
    }

    #[test]
    fn every_core_counter_is_defined_once_for_the_whole_and_for_each_route() {
        let mut names = Names::default();
        let m = Metrics::define(&mut names, ["a", "b"].into_iter());
        assert_eq!(names.counters.len(), 3 * Metric::COUNT + 1);
        let mut sorted = names.counters.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.counters.len());
        for metric in Metric::all() {
            let id = m.counter(metric).unwrap();
            assert_eq!(names.counters[id], format!("incontext_{}", metric.name()));
            let id = m.route_counter(1, metric).unwrap();
            assert_eq!(
                names.counters[id],
                format!("incontext_route_b_{}", metric.name())
            );
        }
        assert_eq!(m.route_counter(2, Metric::Requests), None);
        assert_eq!(names.counters[m.panics.unwrap()], "incontext_panics");
        assert_eq!(names.histograms, vec!["incontext_count_ms"]);
        assert_eq!(m.histogram(Histogram::CountMs), Some(0));
    }

    #[test]
    fn deferred_updates_wait_summed_per_counter_and_bounded() {
        let d = Deferred::default();
        assert_eq!(d.take(), None);
        for id in [3, 5, 3, 3] {
            d.increment(id);
        }
        for v in 0..(MAX_DEFERRED_VALUES as u64 + 10) {
            d.record(1, v);
        }
        let taken = d.take().unwrap();
        assert_eq!(taken.counters, vec![(3, 3), (5, 1)]);
        assert_eq!(taken.values.len(), MAX_DEFERRED_VALUES);
        assert_eq!(taken.values[0], (1, 0));
        assert_eq!(d.take(), None);
        d.record(0, 7);
        assert_eq!(
            d.take(),
            Some(Updates {
                counters: vec![],
                values: vec![(0, 7)]
            })
        );
    }

    #[test]
    fn a_refused_counter_is_skipped_and_the_others_count() {
        let mut names = Names {
            refuse: vec!["incontext_rewritten".into()],
            ..Names::default()
        };
        let m = Metrics::define(&mut names, std::iter::empty());
        assert_eq!(m.counter(Metric::Rewritten), None);
        let id = m.counter(Metric::Requests).unwrap();
        assert_eq!(names.counters[id], "incontext_requests");
    }
}
