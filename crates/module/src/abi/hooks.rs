//! The event hooks Envoy calls: each runs whole under the panic guard ([`guarded`], and
//! [`Stream::guard`] around a stream's work) and hands its callback to the configuration or
//! the stream. A hook with nothing to do (the stream-callout and watermark hooks) has no body
//! to guard.

use super::*;
use crate::slot::{After, Slot};

const ABI_VERSION_C: &CStr = c"v0.1.0";

/// Runs `f`; `fallback` after a panic in it (the panic hook has logged where): no panic
/// crosses into Envoy.
fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> AbiVersionModulePtr {
    guarded(null(), || {
        if log::set_logger(&LOG).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
        // A panic's message could quote a request: only where it happened is logged.
        std::panic::set_hook(Box::new(|info| {
            log::error!("{}", incontext_core::panic_line(info.location()));
        }));
        ABI_VERSION_C.as_ptr()
    })
}

/// A configuration Envoy loads: its module pointer (an `Arc<Shared>` boxed), null when it is
/// refused (the line saying why is logged; Envoy then refuses the configuration).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> HttpFilterConfigModulePtr {
    guarded(null(), || {
        // SAFETY: Envoy's buffers of this hook.
        let (name, config) = unsafe { (envoy_bytes(name), envoy_bytes(config)) };
        let mut define = ConfigDefine(filter_config_envoy_ptr);
        let shared = match config::load(&mut define, name, config, |v| std::env::var(v).ok()) {
            Ok(shared) => shared,
            Err(line) => {
                log::error!("{line}");
                return null();
            }
        };
        // SAFETY: the configuration of this hook.
        let scheduler = unsafe {
            envoy_dynamic_module_callback_http_filter_config_scheduler_new(filter_config_envoy_ptr)
        };
        if !scheduler.is_null() {
            let scheduler = Scheduler(scheduler);
            shared.calls.set_wake(Box::new(move || scheduler.commit()));
        }
        Box::into_raw(Box::new(Arc::new(shared)))
            .cast_const()
            .cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    filter_config_ptr: HttpFilterConfigModulePtr,
) {
    guarded((), || {
        if filter_config_ptr.is_null() {
            return;
        }
        // SAFETY: a pointer `config_new` made (`Box<Arc<Shared>>`); Envoy destroys it once.
        let config = unsafe { Box::from_raw(filter_config_ptr.cast::<Arc<Shared>>().cast_mut()) };
        config.calls.close();
        drop(config)
    })
}

/// A configuration's scheduler: it wakes Envoy's main thread for the configuration's calls
/// (`on_http_filter_config_scheduled`). Deleted with the last reference to it.
struct Scheduler(HttpFilterConfigSchedulerModulePtr);

// SAFETY: Envoy's configuration scheduler may be committed from any thread, and deleted from
// any (abi.h).
unsafe impl Send for Scheduler {}
// SAFETY: as for `Send`: `commit` is the only call through a shared reference.
unsafe impl Sync for Scheduler {}

impl Scheduler {
    fn commit(&self) {
        // SAFETY: the scheduler lives until this value is dropped.
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, 0) }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: made by `config_scheduler_new`, deleted once.
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
    }
}

/// The configuration behind a module pointer; `None` for a null one.
///
/// # Safety
/// `ptr` must be a pointer `on_http_filter_config_new` returned and not yet destroyed.
unsafe fn config_of<'a>(ptr: HttpFilterConfigModulePtr) -> Option<&'a Arc<Shared>> {
    // SAFETY: the caller's contract: null or a live `Box<Arc<Shared>>`.
    unsafe { ptr.cast::<Arc<Shared>>().as_ref() }
}

/// Envoy's main thread, woken for the configuration's calls: each goes out.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    filter_config_ptr: HttpFilterConfigModulePtr,
    _event_id: u64,
) {
    guarded((), || {
        // SAFETY: Envoy hands the configuration's own pointer, alive during its hooks.
        let Some(shared) = (unsafe { config_of(filter_config_ptr) }) else {
            return;
        };
        for (token, call) in shared.calls.take() {
            let headers: Vec<(&str, &str)> = call
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            // SAFETY: the configuration of this hook.
            let id = unsafe {
                callout(
                    envoy_dynamic_module_callback_http_filter_config_http_callout,
                    filter_config_envoy_ptr,
                    &call.cluster,
                    &headers,
                    &call.body,
                    call.timeout_ms,
                )
            };
            shared.calls.sent(token, id, shared);
        }
        shared.calls.all_sent();
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    filter_config_ptr: HttpFilterConfigModulePtr,
    callout_id: u64,
    result: HttpCalloutResult,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    guarded((), || {
        // SAFETY: Envoy hands the configuration's own pointer, alive during its hooks.
        let Some(shared) = (unsafe { config_of(filter_config_ptr) }) else {
            return;
        };
        // SAFETY: Envoy's lists of this hook.
        let (status, size, body) =
            unsafe { call_answer(result, headers, headers_size, body_chunks, body_chunks_size) };
        let answer = CallAnswer {
            status,
            size,
            body: &body,
        };
        shared.calls.answered(callout_id, &answer, shared)
    })
}

/// A call's answer as Envoy hands it over: its status (`None` without a response), its body's
/// size, and the body when it is not over the read limit.
///
/// # Safety
/// The lists must be Envoy's, valid for the current hook (or null).
unsafe fn call_answer(
    result: HttpCalloutResult,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) -> (Option<u16>, usize, Vec<u8>) {
    // SAFETY: the caller's contract: Envoy's lists of this hook, or null.
    let (headers, chunks) = unsafe {
        (
            envoy_list(headers.cast_const(), headers_size),
            envoy_list(body_chunks.cast_const(), body_chunks_size),
        )
    };
    let status = (result == envoy_dynamic_module_type_http_callout_result_Success)
        .then(|| {
            headers.iter().find_map(|h| {
                // SAFETY: a header Envoy handed over in this hook.
                let (key, value) = unsafe {
                    (
                        envoy_bytes(EnvoyBuffer {
                            ptr: h.key_ptr,
                            length: h.key_length,
                        }),
                        envoy_bytes(EnvoyBuffer {
                            ptr: h.value_ptr,
                            length: h.value_length,
                        }),
                    )
                };
                (key == b":status")
                    .then(|| std::str::from_utf8(value).ok()?.trim().parse::<u16>().ok())
                    .flatten()
            })
        })
        .flatten();
    let size: usize = chunks.iter().map(|c| c.length).sum();
    let mut body = Vec::new();
    if size <= incontext_core::flow::MAX_REPLY_BYTES {
        body.reserve(size);
        for c in chunks {
            // SAFETY: a chunk Envoy handed over in this hook.
            body.extend_from_slice(unsafe { envoy_bytes(*c) });
        }
    }
    (status, size, body)
}

/// Per-route configurations are not supported: Envoy refuses one.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> HttpFilterPerRouteConfigModulePtr {
    guarded(null(), || {
        log::error!("incontext: per-route configurations are not supported");
        null()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _filter_config_ptr: HttpFilterPerRouteConfigModulePtr,
) {
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    filter_config_ptr: HttpFilterConfigModulePtr,
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
) -> HttpFilterModulePtr {
    guarded(null(), || {
        // SAFETY: Envoy hands the configuration's own pointer, alive while it makes streams.
        let Some(shared) = (unsafe { config_of(filter_config_ptr) }) else {
            return null();
        };
        let slot = Box::new(Slot::new(Stream::new(shared.clone())));
        Box::into_raw(slot).cast_const().cast()
    })
}

/// Runs `hook` on the slot behind a module pointer, with Envoy's filter for this hook, then
/// frees the slot when Envoy destroyed the stream meanwhile; `None` for a null pointer.
///
/// # Safety
/// `module` must be null or a pointer `on_http_filter_new` returned and not yet freed.
unsafe fn on_slot<T>(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    in_body: Option<Body>,
    hook: impl FnOnce(&Slot, &mut Filter) -> (T, After),
) -> Option<T> {
    guarded(None, || {
        // SAFETY: the caller's contract: null or a live slot. Envoy runs a stream's hooks on
        // one thread; the slot takes nested ones (`slot.rs`).
        let slot = unsafe { module.cast::<Slot>().as_ref() }?;
        let mut filter = Filter {
            ptr: envoy,
            in_body,
        };
        let (out, after) = hook(slot, &mut filter);
        if after == After::Free {
            // SAFETY: Envoy destroyed the stream during the hook, the outermost of it now
            // returning; nothing uses the slot after.
            unsafe { free(module) };
        }
        Some(out)
    })
}

/// # Safety
/// As for [`on_slot`], not null; the pointer is not used again.
unsafe fn free(module: HttpFilterModulePtr) {
    // SAFETY: the caller's contract: a live slot from `on_http_filter_new`, freed once.
    let slot = unsafe { Box::from_raw(module.cast::<Slot>().cast_mut()) };
    guarded((), move || slot.destroyed());
}

/// A hook of the stream: `pass` without a stream, a busy one, or after a panic; `go` as for
/// [`Slot::run`] (a request hook's Continue).
///
/// # Safety
/// As for [`on_slot`].
unsafe fn on_stream<T: Copy>(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    in_body: Option<Body>,
    (pass, go): (T, Option<T>),
    run: impl FnOnce(&mut Stream, &mut dyn Envoy) -> T,
) -> T {
    // SAFETY: the caller's contract.
    unsafe {
        on_slot(envoy, module, in_body, |slot, filter| {
            let (out, after) = slot.run(filter, go, |s, e| s.guard(e, pass, false, run));
            (out.unwrap_or(pass), after)
        })
    }
    .unwrap_or(pass)
}

/// Envoy's header statuses (the request's and the response's have the same values).
fn head_status(status: HeadStatus) -> u32 {
    match status {
        HeadStatus::Continue => {
            envoy_dynamic_module_type_on_http_filter_request_headers_status_Continue
        }
        HeadStatus::Stop => {
            envoy_dynamic_module_type_on_http_filter_request_headers_status_StopIteration
        }
    }
}

/// Envoy's body statuses (likewise).
fn data_status(status: DataStatus) -> u32 {
    match status {
        DataStatus::Continue => {
            envoy_dynamic_module_type_on_http_filter_request_body_status_Continue
        }
        DataStatus::Buffer => {
            envoy_dynamic_module_type_on_http_filter_request_body_status_StopIterationAndBuffer
        }
        DataStatus::Stop => {
            envoy_dynamic_module_type_on_http_filter_request_body_status_StopIterationNoBuffer
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> OnHttpFilterRequestHeadersStatus {
    // SAFETY: Envoy's pointers of this hook: the stream's own, alive until it is destroyed.
    head_status(unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            None,
            (HeadStatus::Continue, Some(HeadStatus::Continue)),
            |s, e| s.request_headers(e, end_of_stream),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> OnHttpFilterRequestBodyStatus {
    // SAFETY: as for the request's headers.
    data_status(unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            Some(Body::Request),
            (DataStatus::Continue, Some(DataStatus::Continue)),
            |s, e| s.request_body(e, end_of_stream),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
) -> OnHttpFilterRequestTrailersStatus {
    // SAFETY: as for the request's headers.
    unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            None,
            // The hook answers Continue: a resumption decided inside it is that answer.
            ((), Some(())),
            |s, e| s.request_trailers(e),
        )
    };
    envoy_dynamic_module_type_on_http_filter_request_trailers_status_Continue
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> OnHttpFilterResponseHeadersStatus {
    // SAFETY: as for the request's headers.
    head_status(unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            None,
            (HeadStatus::Continue, None),
            |s, e| s.response_headers(e, end_of_stream),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> OnHttpFilterResponseBodyStatus {
    // SAFETY: as for the request's headers.
    data_status(unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            Some(Body::Response),
            (DataStatus::Continue, None),
            |s, e| s.response_body(e, end_of_stream),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
) -> OnHttpFilterResponseTrailersStatus {
    // SAFETY: as for the request's headers.
    unsafe {
        on_stream(
            filter_envoy_ptr,
            filter_module_ptr,
            None,
            ((), None),
            |s, e| s.response_trailers(e),
        )
    };
    envoy_dynamic_module_type_on_http_filter_response_trailers_status_Continue
}

/// The stream is complete: a request sent on a bound is counted now (by the configuration).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
) {
    // SAFETY: as for the request's headers.
    unsafe {
        on_slot(filter_envoy_ptr, filter_module_ptr, None, |slot, filter| {
            ((), slot.complete(filter))
        })
    };
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(
    filter_module_ptr: HttpFilterModulePtr,
) {
    guarded((), || {
        // SAFETY: null or the stream's own slot, alive until it is freed.
        let Some(slot) = (unsafe { filter_module_ptr.cast::<Slot>().as_ref() }) else {
            return;
        };
        if slot.destroy() == After::Free {
            // SAFETY: the slot is in no hook, and Envoy destroys a stream once.
            unsafe { free(filter_module_ptr) };
        }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter_envoy_ptr: HttpFilterEnvoyPtr,
    filter_module_ptr: HttpFilterModulePtr,
    callout_id: u64,
    result: HttpCalloutResult,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    let hook = |slot: &Slot, filter: &mut Filter| {
        // SAFETY: Envoy's lists of this hook.
        let (status, size, body) =
            unsafe { call_answer(result, headers, headers_size, body_chunks, body_chunks_size) };
        let answer = CallAnswer {
            status,
            size,
            body: &body,
        };
        ((), slot.answer(filter, callout_id, &answer))
    };
    // SAFETY: as for the request's headers.
    unsafe { on_slot(filter_envoy_ptr, filter_module_ptr, None, hook) };
}

// Hooks Envoy requires of every HTTP filter module; incontext starts no streams, schedules
// nothing and does not follow the client's write buffer.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _reason: HttpStreamResetReason,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
    _filter_module_ptr: HttpFilterModulePtr,
) {
}
