//! The plugin, its routes (docs/spec.md §16), and [`Ctx`]: one request's route with the host,
//! through which every counter, call and table of that route is reached.

use super::{Call, Histogram, Host, Metric};
use crate::backend;
use crate::config::Config;
use crate::dialect::Form;
use crate::request::Request;
use std::sync::atomic::{AtomicBool, Ordering};

/// One plugin configuration: what every request it filters shares.
#[derive(Debug)]
pub struct Plugin {
    top: Route,
    routes: Vec<Route>,
}

/// Which route a request went to: the top level, or a route by its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteId {
    #[default]
    Top,
    Named(usize),
}

/// The top level or one route: its configuration resolved as a whole, and its scope.
#[derive(Debug)]
pub struct Route {
    pub config: Config,
    /// name|backend|cluster|authority|path: scopes every shared-data key of the route.
    pub scope: String,
    /// Its counters' index in the host's per-route metrics; `None` at the top level.
    index: Option<usize>,
    /// Whether "the learned context length is too small" was logged already (atomic: a
    /// native host shares the plugin between its worker threads).
    warned_window: AtomicBool,
}

impl Route {
    fn new(config: Config, index: Option<usize>) -> Route {
        let t = &config.tokenizer;
        let scope = format!(
            "{}|{}|{}|{}|{}",
            config.name,
            t.backend.as_str(),
            t.cluster,
            t.authority,
            t.path
        );
        Route {
            config,
            scope,
            index,
            warned_window: AtomicBool::new(false),
        }
    }

    /// Whether a bound may stand in for this request's count (docs/spec.md §15).
    pub fn skipping(&self, req: &Request) -> bool {
        self.config.skips()
            && matches!(req.form, Form::Chat | Form::Messages | Form::Responses)
            && req.truncate.is_none()
    }

    /// `true` the first time it is asked: the window-too-small error is logged once.
    pub fn first_window_warning(&self) -> bool {
        !self.warned_window.swap(true, Ordering::Relaxed)
    }
}

impl Plugin {
    pub fn new(config: Config) -> Plugin {
        let routes = (config.routes.iter().cloned().enumerate())
            .map(|(i, route)| Route::new(route, Some(i)))
            .collect();
        Plugin {
            top: Route::new(config, None),
            routes,
        }
    }

    pub fn config(&self) -> &Config {
        &self.top.config
    }

    /// The routes' names, in order (each has its own counters).
    pub fn route_names(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|r| r.config.name.as_str())
    }

    /// The route that names `model`, else the top level.
    pub fn resolve(&self, model: Option<&str>) -> RouteId {
        match self.top.config.route_of(model) {
            Some(i) if i < self.routes.len() => RouteId::Named(i),
            _ => RouteId::Top,
        }
    }

    pub fn route(&self, id: RouteId) -> &Route {
        match id {
            RouteId::Named(i) => self.routes.get(i).unwrap_or(&self.top),
            RouteId::Top => &self.top,
        }
    }

    /// The route `id` with the host.
    pub(super) fn ctx<'a>(&'a self, id: RouteId, host: &'a mut dyn Host) -> Ctx<'a> {
        Ctx {
            route: self.route(id),
            host,
            evicted_anchor: false,
        }
    }
}

/// One request's route with the host.
pub struct Ctx<'a> {
    pub route: &'a Route,
    pub host: &'a mut dyn Host,
    /// An anchor looked up was evicted lately (see [`Ctx::count_evicted_anchor`]).
    pub(super) evicted_anchor: bool,
}

impl Ctx<'_> {
    pub fn config(&self) -> &Config {
        &self.route.config
    }

    /// Counts `metric` for the whole configuration and for the route.
    pub fn count(&mut self, metric: Metric) {
        self.host.increment(metric);
        if let Some(i) = self.route.index {
            self.host.increment_route(i, metric);
        }
    }

    pub fn record(&mut self, histogram: Histogram, value: u64) {
        self.host.record(histogram, value);
    }

    pub fn now_ms(&mut self) -> Option<u64> {
        self.host.now_ms()
    }

    /// Sends a call to the route's tokenizer; the token of its reply.
    pub fn dispatch(&mut self, call: &Call) -> Option<u32> {
        self.count(Metric::TokenizerCalls);
        self.dispatch_again(call)
    }

    /// Sends a call counted already (`incontext_tokenizer_calls`) once more: the host
    /// cancelled the first with its request (an orphan made again).
    pub fn dispatch_again(&mut self, call: &Call) -> Option<u32> {
        let config = &self.route.config;
        let t = &config.tokenizer;
        let length = call.body.as_ref().map(|b| b.len().to_string());
        let headers = backend::call_headers(config, call, length.as_deref());
        let token = self.host.dispatch(&t.cluster, &headers, call, t.timeout_ms);
        if token.is_none() {
            log::warn!("incontext: tokenizer call not dispatched");
        }
        token
    }
}
