//! The proxy-wasm ABI (0.2.1) exports: the host calls these for each plugin (root) context
//! and each HTTP stream context. Each export finds its context and hands the callback on;
//! nothing here decides, and nothing panics (an unknown context id is ignored).
//!
//! Tokenizer calls are dispatched on behalf of the plugin's root context, so Envoy does not
//! cancel them when a stream ends first: an answer that arrives after its stream is gone is
//! still stored (`Exchange::on_late_reply`).

use super::host;
use super::http::Http;
use super::Root;
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;

/// proxy-wasm's "continue" and "pause" results.
pub const CONTINUE: u32 = 0;
pub const PAUSE: u32 = 1;

#[derive(Default)]
struct Registry {
    roots: HashMap<u32, Root>,
    streams: HashMap<u32, Http>,
    /// Call token → the stream that is waiting for it.
    calls: HashMap<u32, u32>,
    /// Streams that ended while their call was out, by call token.
    orphans: HashMap<u32, Http>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> Option<T> {
    REGISTRY.with(|r| r.try_borrow_mut().ok().map(|mut r| f(&mut r)))
}

/// Runs `f` on stream `id`, taken out of the registry meanwhile (a host call that re-enters
/// the module for the same stream finds nothing, instead of a borrowed registry).
fn on_stream<T: Default>(id: u32, f: impl FnOnce(&mut Http) -> T) -> T {
    let Some(mut stream) = with(|r| r.streams.remove(&id)).flatten() else {
        return T::default();
    };
    let out = f(&mut stream);
    if let Some(token) = stream.pending_token() {
        with(|r| r.calls.insert(token, id));
    }
    with(|r| r.streams.insert(id, stream));
    out
}

/// Dispatches a tokenizer call for stream `id` on behalf of its root context.
pub fn dispatch_for(
    stream: u32,
    root: u32,
    cluster: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout_ms: u64,
) -> Option<u32> {
    host::set_effective_context(root).ok()?;
    let token = host::dispatch(cluster, headers, body, timeout_ms);
    // Back to the stream for the rest of its callback; if that fails, the stream's own calls
    // fail too and leave the request unchanged.
    let _ = host::set_effective_context(stream);
    token.ok()
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host's allocator for buffers it hands to the module (`host::take` frees them).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut buffer: Vec<MaybeUninit<u8>> = Vec::with_capacity(size);
    // SAFETY: MaybeUninit needs no initialisation; the capacity is exactly `size`.
    unsafe { buffer.set_len(size) };
    Box::into_raw(buffer.into_boxed_slice()) as *mut u8
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_id: u32) {
    with(|r| {
        if parent_id == 0 {
            r.roots.insert(context_id, Root::default());
        } else {
            let shared = r.roots.get(&parent_id).and_then(Root::shared);
            r.streams
                .insert(context_id, Http::new(shared, context_id, parent_id));
        }
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_context_id: u32, _size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(context_id: u32, size: usize) -> bool {
    let Some(mut root) = with(|r| r.roots.remove(&context_id)).flatten() else {
        return false;
    };
    let ok = root.on_configure(size);
    with(|r| r.roots.insert(context_id, root));
    ok
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, _headers: usize, end: bool) -> u32 {
    on_stream(context_id, |s| s.on_request_headers(end))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, size: usize, end: bool) -> u32 {
    on_stream(context_id, |s| s.on_request_body(size, end))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _trailers: usize) -> u32 {
    on_stream(context_id, |s| s.on_request_trailers())
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, _headers: usize, _end: bool) -> u32 {
    on_stream(context_id, |s| s.on_response_headers())
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_context_id: u32, _size: usize, _end: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(_context_id: u32, _trailers: usize) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    _context_id: u32,
    token: u32,
    _headers: usize,
    body_size: usize,
    _trailers: usize,
) {
    // The answer belongs to the root the call was dispatched for: read it before switching
    // to the stream.
    let reply = Http::read_reply(body_size);
    let Some(stream) = with(|r| r.calls.remove(&token)).flatten() else {
        if let Some(mut orphan) = with(|r| r.orphans.remove(&token)).flatten() {
            orphan.on_late_reply(token, &reply);
        }
        return;
    };
    if host::set_effective_context(stream).is_err() {
        return;
    }
    on_stream(stream, |s| s.on_call_response(token, &reply));
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_context_id: u32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_context_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    with(|r| {
        r.roots.remove(&context_id);
        let Some(stream) = r.streams.remove(&context_id) else {
            return;
        };
        // A call still out: keep what it needs to store the answer.
        if let Some(token) = stream.pending_token() {
            r.calls.remove(&token);
            r.orphans.insert(token, stream);
        }
    });
}
