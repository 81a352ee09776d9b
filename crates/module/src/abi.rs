//! The module's boundary: Envoy's dynamic-module ABI (version [`crate::ABI_VERSION`]) as far
//! as incontext uses it, written by hand from `abi.h`. `abi/bound.h` holds the declarations
//! bound here, as Envoy publishes them; `tests/abi.rs` checks every type, constant and
//! signature below against it. Each C typedef `envoy_dynamic_module_type_<x>` is the Rust type
//! `<X>` (camel case), each enumerator a constant of its C name.
//!
//! The event hooks hand each callback to the configuration ([`crate::config`]) or the stream
//! ([`crate::stream::Stream`]) behind the pointers Envoy keeps for the module, under
//! [`Stream::guard`]: a panic never crosses into Envoy. This is the only module with `unsafe`
//! code.

#![allow(non_upper_case_globals, clippy::missing_safety_doc)]
#![deny(clippy::undocumented_unsafe_blocks)]

use crate::config;
use crate::envoy::{Body, Envoy, Headers};
use crate::metrics::Define;
use crate::stream::{CallAnswer, DataStatus, HeadStatus, Shared, Stream};
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null, null_mut};
use std::sync::Arc;

pub type AbiVersionModulePtr = *const c_char;
pub type BufferModulePtr = *const c_char;
pub type BufferEnvoyPtr = *const c_char;
pub type HttpFilterConfigEnvoyPtr = *mut c_void;
pub type HttpFilterConfigModulePtr = *const c_void;
pub type HttpFilterPerRouteConfigModulePtr = *const c_void;
pub type HttpFilterEnvoyPtr = *mut c_void;
pub type HttpFilterModulePtr = *const c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: BufferEnvoyPtr,
    pub length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: BufferModulePtr,
    pub length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHttpHeader {
    pub key_ptr: BufferModulePtr,
    pub key_length: usize,
    pub value_ptr: BufferModulePtr,
    pub value_length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHttpHeader {
    pub key_ptr: BufferEnvoyPtr,
    pub key_length: usize,
    pub value_ptr: BufferEnvoyPtr,
    pub value_length: usize,
}

pub type HttpHeaderType = u32;
pub const envoy_dynamic_module_type_http_header_type_RequestHeader: HttpHeaderType = 0;
pub const envoy_dynamic_module_type_http_header_type_ResponseHeader: HttpHeaderType = 2;

pub type LogLevel = u32;
pub const envoy_dynamic_module_type_log_level_Trace: LogLevel = 0;
pub const envoy_dynamic_module_type_log_level_Debug: LogLevel = 1;
pub const envoy_dynamic_module_type_log_level_Info: LogLevel = 2;
pub const envoy_dynamic_module_type_log_level_Warn: LogLevel = 3;
pub const envoy_dynamic_module_type_log_level_Error: LogLevel = 4;

pub type HttpCalloutInitResult = u32;
pub const envoy_dynamic_module_type_http_callout_init_result_Success: HttpCalloutInitResult = 0;

pub type HttpCalloutResult = u32;
pub const envoy_dynamic_module_type_http_callout_result_Success: HttpCalloutResult = 0;

pub type HttpStreamResetReason = u32;

pub type MetricsResult = u32;
pub const envoy_dynamic_module_type_metrics_result_Success: MetricsResult = 0;

pub type HttpBodyType = u32;
pub const envoy_dynamic_module_type_http_body_type_ReceivedRequestBody: HttpBodyType = 0;
pub const envoy_dynamic_module_type_http_body_type_BufferedRequestBody: HttpBodyType = 1;
pub const envoy_dynamic_module_type_http_body_type_ReceivedResponseBody: HttpBodyType = 2;
pub const envoy_dynamic_module_type_http_body_type_BufferedResponseBody: HttpBodyType = 3;

pub type OnHttpFilterRequestHeadersStatus = u32;
pub const envoy_dynamic_module_type_on_http_filter_request_headers_status_Continue:
    OnHttpFilterRequestHeadersStatus = 0;
pub const envoy_dynamic_module_type_on_http_filter_request_headers_status_StopIteration:
    OnHttpFilterRequestHeadersStatus = 1;

pub type OnHttpFilterRequestBodyStatus = u32;
pub const envoy_dynamic_module_type_on_http_filter_request_body_status_Continue:
    OnHttpFilterRequestBodyStatus = 0;
pub const envoy_dynamic_module_type_on_http_filter_request_body_status_StopIterationAndBuffer:
    OnHttpFilterRequestBodyStatus = 1;
pub const envoy_dynamic_module_type_on_http_filter_request_body_status_StopIterationNoBuffer:
    OnHttpFilterRequestBodyStatus = 3;

pub type OnHttpFilterRequestTrailersStatus = u32;
pub const envoy_dynamic_module_type_on_http_filter_request_trailers_status_Continue:
    OnHttpFilterRequestTrailersStatus = 0;

pub type OnHttpFilterResponseHeadersStatus = u32;

pub type OnHttpFilterResponseBodyStatus = u32;

pub type OnHttpFilterResponseTrailersStatus = u32;
pub const envoy_dynamic_module_type_on_http_filter_response_trailers_status_Continue:
    OnHttpFilterResponseTrailersStatus = 0;

extern "C" {
    fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: LogLevel) -> bool;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id_ptr: *mut usize,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        histogram_id_ptr: *mut usize,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_get_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        result_buffer: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        status_code: u32,
        headers_vector: *mut ModuleHttpHeader,
        headers_vector_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_get_body_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
        result_buffer_vector: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_append_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_drain_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
        number_of_bytes: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_received_buffered_response_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> HttpCalloutInitResult;
    fn envoy_dynamic_module_callback_http_filter_continue_decoding(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    );
}

// Calls of a filter configuration, from Envoy's main thread (crate::calls).
pub type HttpFilterConfigSchedulerModulePtr = *mut c_void;

extern "C" {
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    ) -> HttpFilterConfigSchedulerModulePtr;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler_module_ptr: HttpFilterConfigSchedulerModulePtr,
        event_id: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler_module_ptr: HttpFilterConfigSchedulerModulePtr,
    );
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> HttpCalloutInitResult;
}

fn module_buffer(bytes: &[u8]) -> ModuleBuffer {
    ModuleBuffer {
        ptr: bytes.as_ptr().cast(),
        length: bytes.len(),
    }
}

/// The bytes of an Envoy buffer, valid for the current hook.
///
/// # Safety
/// `b` must come from Envoy within the current event hook.
unsafe fn envoy_bytes<'a>(b: EnvoyBuffer) -> &'a [u8] {
    if b.ptr.is_null() || b.length == 0 {
        &[]
    } else {
        // SAFETY: Envoy's buffer of this hook: `length` readable bytes at `ptr`, not null.
        unsafe { std::slice::from_raw_parts(b.ptr.cast(), b.length) }
    }
}

/// The bytes of an Envoy buffer, to write in place, valid for the current hook.
///
/// # Safety
/// `b` must come from Envoy within the current event hook, be memory Envoy lets the filter
/// write, and not be borrowed elsewhere.
unsafe fn envoy_bytes_mut<'a>(b: EnvoyBuffer) -> &'a mut [u8] {
    if b.ptr.is_null() || b.length == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract: `length` writable bytes at `ptr`, borrowed nowhere
        // else.
        unsafe { std::slice::from_raw_parts_mut(b.ptr.cast_mut().cast(), b.length) }
    }
}

/// A list Envoy hands over (headers, body chunks): empty when null.
///
/// # Safety
/// `ptr` must point to `len` valid items for the current hook, or be null.
unsafe fn envoy_list<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract: `len` items at `ptr`, not null.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

fn header_type(map: Headers) -> HttpHeaderType {
    match map {
        Headers::Request => envoy_dynamic_module_type_http_header_type_RequestHeader,
        Headers::Response => envoy_dynamic_module_type_http_header_type_ResponseHeader,
    }
}

/// `increment_counter` and `record_histogram_value`.
type MetricFn =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, usize, *mut ModuleBuffer, usize, u64) -> MetricsResult;

/// One stream's filter in Envoy, for the duration of one hook.
struct Filter {
    ptr: HttpFilterEnvoyPtr,
    /// Inside the body hook of that direction: the chunk that arrived is Envoy's "received"
    /// body, apart from the buffered one unless Envoy says they are the same.
    in_body: Option<Body>,
}

impl Filter {
    fn types(body: Body) -> (HttpBodyType, HttpBodyType) {
        match body {
            Body::Request => (
                envoy_dynamic_module_type_http_body_type_BufferedRequestBody,
                envoy_dynamic_module_type_http_body_type_ReceivedRequestBody,
            ),
            Body::Response => (
                envoy_dynamic_module_type_http_body_type_BufferedResponseBody,
                envoy_dynamic_module_type_http_body_type_ReceivedResponseBody,
            ),
        }
    }

    /// The received chunk is a body of its own (not the buffered one again).
    fn received_apart(&self, body: Body) -> bool {
        if self.in_body != Some(body) {
            return false;
        }
        // SAFETY: `ptr` is the filter of the current hook.
        let same = unsafe {
            match body {
                Body::Request => {
                    envoy_dynamic_module_callback_http_received_buffered_request_body(self.ptr)
                }
                Body::Response => {
                    envoy_dynamic_module_callback_http_received_buffered_response_body(self.ptr)
                }
            }
        };
        !same
    }

    fn size(&self, kind: HttpBodyType) -> usize {
        // SAFETY: `ptr` is the filter of the current hook.
        unsafe { envoy_dynamic_module_callback_http_get_body_size(self.ptr, kind) }
    }

    /// Appends the body's slices to `out`; `false` when Envoy refused.
    fn chunks(&self, kind: HttpBodyType, out: &mut Vec<EnvoyBuffer>) -> bool {
        // SAFETY: `ptr` is the filter of the current hook; the vector gets the room Envoy
        // asked for, and Envoy writes exactly that many items.
        unsafe {
            let n = envoy_dynamic_module_callback_http_get_body_chunks_size(self.ptr, kind);
            if n == 0 {
                return true;
            }
            let at = out.len();
            out.resize(
                at + n,
                EnvoyBuffer {
                    ptr: null(),
                    length: 0,
                },
            );
            envoy_dynamic_module_callback_http_get_body_chunks(
                self.ptr,
                kind,
                out.as_mut_ptr().add(at),
            )
        }
    }

    /// The slices of the body the filter holds: what Envoy buffered and, inside a body hook,
    /// the chunk that arrived.
    fn body_slices(&self, body: Body) -> Option<Vec<EnvoyBuffer>> {
        let (buffered, received) = Filter::types(body);
        let mut list = Vec::new();
        if !self.chunks(buffered, &mut list) {
            return None;
        }
        if self.received_apart(body) && !self.chunks(received, &mut list) {
            return None;
        }
        Some(list)
    }

    fn metric(&self, update: MetricFn, id: usize, value: u64) {
        // SAFETY: `ptr` is the filter of the current hook; no labels.
        unsafe { update(self.ptr, id, null_mut(), 0, value) };
    }

    fn drain(&self, kind: HttpBodyType) {
        let n = self.size(kind);
        if n > 0 {
            // SAFETY: `ptr` is the filter of the current hook.
            unsafe { envoy_dynamic_module_callback_http_drain_body(self.ptr, kind, n) };
        }
    }
}

impl Envoy for Filter {
    fn header(&mut self, map: Headers, name: &str) -> Option<String> {
        let mut value = EnvoyBuffer {
            ptr: null(),
            length: 0,
        };
        // SAFETY: `ptr` is the filter of the current hook; the value is copied before it
        // returns.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.ptr,
                header_type(map),
                module_buffer(name.as_bytes()),
                &mut value,
                0,
                null_mut(),
            )
        };
        if !found || value.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy gave the buffer in this hook.
        let bytes = unsafe { envoy_bytes(value) };
        std::str::from_utf8(bytes).ok().map(str::to_string)
    }

    fn set_header(&mut self, map: Headers, name: &str, value: Option<&str>) -> bool {
        let value = match value {
            Some(v) => module_buffer(v.as_bytes()),
            None => ModuleBuffer {
                ptr: null(),
                length: 0,
            },
        };
        // SAFETY: `ptr` is the filter of the current hook; the buffers outlive the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.ptr,
                header_type(map),
                module_buffer(name.as_bytes()),
                value,
            )
        }
    }

    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> bool {
        // SAFETY: as for `set_header`.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(
                self.ptr,
                header_type(map),
                module_buffer(name.as_bytes()),
                module_buffer(value.as_bytes()),
            )
        }
    }

    fn set_filter_state(&mut self, key: &str, value: &str) -> bool {
        // SAFETY: `self.ptr` is the live stream's; the buffers outlive the call (Envoy
        // copies them).
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.ptr,
                module_buffer(key.as_bytes()),
                module_buffer(value.as_bytes()),
            )
        }
    }

    fn body_size(&mut self, body: Body) -> usize {
        let (buffered, received) = Filter::types(body);
        let mut n = self.size(buffered);
        if self.received_apart(body) {
            n += self.size(received);
        }
        n
    }

    fn read_body(&mut self, body: Body) -> Option<Vec<u8>> {
        let slices = self.body_slices(body)?;
        let mut out = Vec::with_capacity(slices.iter().map(|c| c.length).sum());
        for c in slices {
            // SAFETY: Envoy gave the slices in this hook; they stay valid until it returns.
            out.extend_from_slice(unsafe { envoy_bytes(c) });
        }
        Some(out)
    }

    fn body_chunks(&mut self, body: Body, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool {
        let Some(slices) = self.body_slices(body) else {
            return false;
        };
        let mut chunks: Vec<&mut [u8]> = slices
            .into_iter()
            // SAFETY: Envoy gave the slices in this hook, each its own memory, valid until
            // the hook returns; the ABI hands a held body's slices to the filter to edit in
            // place (no filter after this one has seen the body).
            .map(|c| unsafe { envoy_bytes_mut(c) })
            .collect();
        f(&mut chunks);
        true
    }

    fn drain_body(&mut self, body: Body, n: usize) -> bool {
        let (buffered, received) = Filter::types(body);
        let from_buffered = n.min(self.size(buffered));
        let rest = n - from_buffered;
        // SAFETY: `ptr` is the filter of the current hook.
        unsafe {
            (from_buffered == 0
                || envoy_dynamic_module_callback_http_drain_body(self.ptr, buffered, from_buffered))
                && (rest == 0
                    || (self.received_apart(body)
                        && envoy_dynamic_module_callback_http_drain_body(self.ptr, received, rest)))
        }
    }

    fn replace_body(&mut self, body: Body, data: &[u8]) -> bool {
        let (buffered, received) = Filter::types(body);
        let apart = self.received_apart(body);
        self.drain(buffered);
        if apart {
            self.drain(received);
        }
        // Inside the body hook the chunk that arrived goes on after what is buffered.
        let into = if self.in_body == Some(body) {
            received
        } else {
            buffered
        };
        // SAFETY: `ptr` is the filter of the current hook; Envoy copies `data`.
        unsafe {
            envoy_dynamic_module_callback_http_append_body(self.ptr, into, module_buffer(data))
        }
    }

    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) {
        let mut list = module_headers(headers);
        // SAFETY: `ptr` is the filter of the current hook; every buffer outlives the call.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.ptr,
                status,
                list.as_mut_ptr(),
                list.len(),
                module_buffer(body),
                module_buffer(b"incontext"),
            )
        }
    }

    fn callout(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u64> {
        // SAFETY: `ptr` is the filter of the current hook.
        unsafe {
            callout(
                envoy_dynamic_module_callback_http_filter_http_callout,
                self.ptr,
                cluster,
                headers,
                body,
                timeout_ms,
            )
        }
    }

    fn resume_request(&mut self) {
        // SAFETY: `ptr` is the filter of the current hook.
        unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(self.ptr) }
    }

    fn increment(&mut self, counter: usize, by: u64) {
        self.metric(
            envoy_dynamic_module_callback_http_filter_increment_counter,
            counter,
            by,
        );
    }

    fn record(&mut self, histogram: usize, value: u64) {
        self.metric(
            envoy_dynamic_module_callback_http_filter_record_histogram_value,
            histogram,
            value,
        );
    }
}

/// A stream's or a configuration's `http_callout`.
type CalloutFn<P> = unsafe extern "C" fn(
    P,
    *mut u64,
    ModuleBuffer,
    *mut ModuleHttpHeader,
    usize,
    ModuleBuffer,
    u64,
) -> HttpCalloutInitResult;

/// Starts a call with `start` on behalf of `ptr`: its callout id, `None` when Envoy refused it.
///
/// # Safety
/// `ptr` must be what `start` takes, valid in the current hook.
unsafe fn callout<P>(
    start: CalloutFn<P>,
    ptr: P,
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u64,
) -> Option<u64> {
    let mut list = module_headers(headers);
    let mut id = 0u64;
    // SAFETY: `ptr` is what `start` takes (the caller's contract); every buffer and the
    // header list outlive the call, and Envoy copies them before it returns.
    let result = unsafe {
        start(
            ptr,
            &mut id,
            module_buffer(cluster.as_bytes()),
            list.as_mut_ptr(),
            list.len(),
            module_buffer(body),
            timeout_ms,
        )
    };
    (result == envoy_dynamic_module_type_http_callout_init_result_Success).then_some(id)
}

fn module_headers(headers: &[(&str, &str)]) -> Vec<ModuleHttpHeader> {
    headers
        .iter()
        .map(|(k, v)| ModuleHttpHeader {
            key_ptr: k.as_ptr().cast(),
            key_length: k.len(),
            value_ptr: v.as_ptr().cast(),
            value_length: v.len(),
        })
        .collect()
}

/// `define_counter` and `define_histogram`.
type DefineFn = unsafe extern "C" fn(
    HttpFilterConfigEnvoyPtr,
    ModuleBuffer,
    *mut ModuleBuffer,
    usize,
    *mut usize,
) -> MetricsResult;

/// Defines metrics on a filter configuration while Envoy loads it.
struct ConfigDefine(HttpFilterConfigEnvoyPtr);

impl ConfigDefine {
    fn define(&mut self, define: DefineFn, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: the configuration pointer of the current `config_new` hook; no labels.
        let r = unsafe {
            define(
                self.0,
                module_buffer(name.as_bytes()),
                null_mut(),
                0,
                &mut id,
            )
        };
        (r == envoy_dynamic_module_type_metrics_result_Success).then_some(id)
    }
}

impl Define for ConfigDefine {
    fn counter(&mut self, name: &str) -> Option<usize> {
        self.define(
            envoy_dynamic_module_callback_http_filter_config_define_counter,
            name,
        )
    }

    fn histogram(&mut self, name: &str) -> Option<usize> {
        self.define(
            envoy_dynamic_module_callback_http_filter_config_define_histogram,
            name,
        )
    }
}

/// The `log` crate's records into Envoy's log (its `dynamic_modules` component), at the
/// levels Envoy prints.
struct EnvoyLog;

fn level(l: log::Level) -> LogLevel {
    match l {
        log::Level::Error => envoy_dynamic_module_type_log_level_Error,
        log::Level::Warn => envoy_dynamic_module_type_log_level_Warn,
        log::Level::Info => envoy_dynamic_module_type_log_level_Info,
        log::Level::Debug => envoy_dynamic_module_type_log_level_Debug,
        log::Level::Trace => envoy_dynamic_module_type_log_level_Trace,
    }
}

impl log::Log for EnvoyLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        // SAFETY: a plain query of Envoy's log level.
        unsafe { envoy_dynamic_module_callback_log_enabled(level(metadata.level())) }
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = record.args().to_string();
        // SAFETY: Envoy copies the message.
        unsafe {
            envoy_dynamic_module_callback_log(level(record.level()), module_buffer(line.as_bytes()))
        }
    }

    fn flush(&self) {}
}

static LOG: EnvoyLog = EnvoyLog;

mod hooks;
