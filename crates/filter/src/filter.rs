//! The filter of one VM: its plugin (root) contexts, its HTTP streams, which stream waits for
//! which call, and the calls of streams that are gone. The ABI's exports (`wasm.rs`) hand every
//! callback here; each runs over a [`Proxy`], so all of it is tested natively.
//!
//! Tokenizer calls are dispatched on behalf of the plugin's root context (`HostView`), so Envoy
//! does not cancel them when their stream ends first. A stream that ends while its call is out
//! leaves an [`Orphan`] (the cache key and the model, not the body) until the answer comes; it
//! is then stored. Envoy cancels a root's calls when it deletes the root: its orphans go with
//! it, as no answer will come for them.

use crate::http::{CallReply, HostView, Http};
use crate::metrics::{Holdings, Metrics};
use crate::proxy::{BufferType, Proxy};
use crate::{logger, Shared};
use incontext_core::config::Config;
use incontext_core::flow::{Orphan, Plugin};
use std::collections::HashMap;
use std::rc::Rc;

/// proxy-wasm's "continue" and "pause" results.
pub const CONTINUE: u32 = 0;
pub const PAUSE: u32 = 1;

/// A plugin (root) context: its configuration, once valid.
#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

/// A call whose stream is gone, with the plugin it was made for.
struct Orphaned {
    root: u32,
    shared: Rc<Shared>,
    orphan: Orphan,
}

#[derive(Default)]
pub struct Filter {
    roots: HashMap<u32, Root>,
    streams: HashMap<u32, Http>,
    /// Call token → the stream that waits for its answer.
    calls: HashMap<u32, u32>,
    /// Call token → what the answer of a gone stream's call is stored with.
    orphans: HashMap<u32, Orphaned>,
    /// The VM's gauges, defined with the first valid configuration.
    holdings: Option<Holdings>,
}

impl Filter {
    pub fn on_context_create(&mut self, context_id: u32, parent_id: u32) {
        if parent_id == 0 {
            self.roots.insert(context_id, Root::default());
        } else {
            let shared = self.roots.get(&parent_id).and_then(|r| r.shared.clone());
            self.streams
                .insert(context_id, Http::new(shared, context_id, parent_id));
        }
    }

    /// Reads and checks the plugin configuration; `false` (Envoy refuses the configuration)
    /// when it is invalid.
    pub fn on_configure(&mut self, proxy: &mut dyn Proxy, context_id: u32, size: usize) -> bool {
        logger::follow(proxy.log_level());
        let Some(root) = self.roots.get_mut(&context_id) else {
            return false;
        };
        let bytes = match proxy.get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                log::error!(
                    "incontext: cannot read the plugin configuration (host status {})",
                    e.0
                );
                return false;
            }
        };
        match Config::load(&bytes, |name| std::env::var(name).ok()) {
            Ok(config) => {
                log::info!(
                    "incontext {}: {}",
                    env!("CARGO_PKG_VERSION"),
                    config.summary()
                );
                let plugin = Plugin::new(config);
                let metrics = Metrics::define(proxy, plugin.route_names());
                root.shared = Some(Rc::new(Shared { plugin, metrics }));
                if self.holdings.is_none() {
                    self.holdings = Some(Holdings::define(proxy));
                }
                true
            }
            Err(e) => {
                log::error!("incontext: {e}");
                false
            }
        }
    }

    /// Runs `f` on stream `id`, then notes the call it waits for, if any.
    fn on_stream<T: Default>(&mut self, id: u32, f: impl FnOnce(&mut Http) -> T) -> T {
        let Some(stream) = self.streams.get_mut(&id) else {
            return T::default();
        };
        let out = f(stream);
        if let Some(token) = stream.pending_token() {
            self.calls.insert(token, id);
        }
        out
    }

    pub fn on_request_headers(&mut self, proxy: &mut dyn Proxy, id: u32, end: bool) -> u32 {
        // Envoy's log level may change at run time.
        logger::follow(proxy.log_level());
        self.on_stream(id, |s| s.on_request_headers(proxy, end))
    }

    pub fn on_request_body(
        &mut self,
        proxy: &mut dyn Proxy,
        id: u32,
        size: usize,
        end: bool,
    ) -> u32 {
        self.on_stream(id, |s| s.on_request_body(proxy, size, end))
    }

    pub fn on_request_trailers(&mut self, proxy: &mut dyn Proxy, id: u32) -> u32 {
        self.on_stream(id, |s| s.on_request_trailers(proxy))
    }

    pub fn on_response_headers(&mut self, proxy: &mut dyn Proxy, id: u32, end: bool) -> u32 {
        self.on_stream(id, |s| s.on_response_headers(proxy, end))
    }

    pub fn on_response_body(
        &mut self,
        proxy: &mut dyn Proxy,
        id: u32,
        size: usize,
        end: bool,
    ) -> u32 {
        self.on_stream(id, |s| s.on_response_body(proxy, size, end))
    }

    pub fn on_response_trailers(&mut self, proxy: &mut dyn Proxy, id: u32) -> u32 {
        self.on_stream(id, |s| s.on_response_trailers(proxy))
    }

    pub fn on_log(&mut self, proxy: &mut dyn Proxy, id: u32) {
        self.on_stream(id, |s| s.on_log(proxy))
    }

    /// The answer to call `token`, delivered in the context of the root it was dispatched for.
    pub fn on_http_call_response(&mut self, proxy: &mut dyn Proxy, token: u32, body_size: usize) {
        // Read while the root is the effective context, before switching to the stream.
        let reply = CallReply::read(proxy, body_size);
        if let Some(stream) = self.calls.remove(&token) {
            if proxy.set_effective_context(stream).is_ok() {
                self.on_stream(stream, |s| s.on_call_response(proxy, token, &reply));
                return;
            }
            // The host no longer knows the stream (it went before its deletion reached the
            // filter): it is gone, and the answer is its orphan's.
            self.drop_stream(proxy, stream);
        }
        if let Some(gone) = self.orphans.remove(&token) {
            let mut view = HostView {
                proxy: &mut *proxy,
                shared: &gone.shared,
                stream: gone.root,
                root: gone.root,
            };
            gone.orphan
                .on_reply(&gone.shared.plugin, &mut view, &reply.reply(token));
            self.record_holdings(proxy);
        }
    }

    pub fn on_delete(&mut self, proxy: &mut dyn Proxy, id: u32) {
        if self.roots.remove(&id).is_some() {
            // Envoy cancels the root's calls: no answer will come for its orphans.
            self.orphans.retain(|_, o| o.root != id);
            self.record_holdings(proxy);
            return;
        }
        self.drop_stream(proxy, id);
    }

    /// Forgets stream `id`; a call it still has out becomes an orphan.
    fn drop_stream(&mut self, proxy: &mut dyn Proxy, id: u32) {
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        if let Some(token) = stream.pending_token() {
            self.calls.remove(&token);
        }
        let root = stream.root();
        // A call still out: keep what storing its answer needs.
        if let Some((shared, orphan)) = stream.abandon() {
            let token = orphan.token();
            self.orphans.insert(
                token,
                Orphaned {
                    root,
                    shared,
                    orphan,
                },
            );
        }
        self.record_holdings(proxy);
    }

    fn record_holdings(&mut self, proxy: &mut dyn Proxy) {
        if let Some(h) = self.holdings.as_mut() {
            h.record(proxy, self.orphans.len());
        }
    }

    /// Streams, calls waited for, orphans.
    #[cfg(test)]
    pub fn held(&self) -> (usize, usize, usize) {
        (self.streams.len(), self.calls.len(), self.orphans.len())
    }

    /// The memory the orphans hold.
    #[cfg(test)]
    pub fn orphan_bytes(&self) -> usize {
        self.orphans
            .values()
            .map(|o| std::mem::size_of::<Orphaned>() + o.orphan.held_bytes())
            .sum()
    }
}
