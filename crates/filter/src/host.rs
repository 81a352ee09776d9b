//! Every host call of the filter: the proxy-wasm ABI's imports, each wrapped so that every
//! status becomes a `Result` (Envoy answers BadArgument, for example, to a header change made
//! at the wrong time). Nothing here panics.

use std::ptr::null_mut;

/// Buffers of the ABI (`proxy_get_buffer_bytes`).
#[derive(Debug, Clone, Copy)]
pub enum BufferType {
    HttpRequestBody = 0,
    HttpCallResponseBody = 4,
    PluginConfiguration = 7,
}

/// Header maps of the ABI.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy)]
pub enum MapType {
    RequestHeaders = 0,
    ResponseHeaders = 2,
    CallResponseHeaders = 6,
}

/// Log levels of the ABI.
#[derive(Debug, Clone, Copy)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

const METRIC_COUNTER: u32 = 0;
const METRIC_HISTOGRAM: u32 = 2;

/// A host status other than Ok, or a malformed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        kind: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        kind: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_remove_header_map_value(kind: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_add_header_map_value(
        kind: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_http_call(
        upstream: *const u8,
        upstream_size: usize,
        headers: *const u8,
        headers_size: usize,
        body: *const u8,
        body_size: usize,
        trailers: *const u8,
        trailers_size: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
}

fn status(code: u32) -> Result<(), HostError> {
    if code == OK {
        Ok(())
    } else {
        Err(HostError(code))
    }
}

/// Takes ownership of a buffer the host allocated through the module's allocator.
///
/// # Safety
/// `data`/`size` must come from a successful host call that returns memory allocated with
/// `proxy_on_memory_allocate` (the SDK's allocator, a `Vec<u8>` of exactly that capacity).
unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        Vec::from_raw_parts(data, size, size)
    }
}

/// Logs a message; a failure to log is ignored.
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: pointer and length of a live str.
    unsafe {
        proxy_log(level as u32, message.as_ptr(), message.len());
    }
}

/// The host's log level (0 trace … 5 critical), if it tells.
pub fn log_level() -> Option<u32> {
    let mut level = 0;
    // SAFETY: out-pointer to a local.
    (unsafe { proxy_get_log_level(&mut level) } == OK).then_some(level)
}

/// Reads up to `max` bytes of a buffer; `Ok(None)` when the host has none.
pub fn get_buffer(
    kind: BufferType,
    start: usize,
    max: usize,
) -> Result<Option<Vec<u8>>, HostError> {
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: out-pointers to locals; on Ok the host hands over an allocation (see `take`).
    let code = unsafe { proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size) };
    match code {
        OK => Ok(Some(unsafe { take(data, size) })),
        NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

/// Replaces `size` bytes at `start` of a buffer with `value`.
pub fn set_buffer(
    kind: BufferType,
    start: usize,
    size: usize,
    value: &[u8],
) -> Result<(), HostError> {
    // SAFETY: pointer and length of a live slice.
    status(unsafe { proxy_set_buffer_bytes(kind as u32, start, size, value.as_ptr(), value.len()) })
}

/// One header value, `Ok(None)` when absent.
pub fn get_header(map: MapType, key: &str) -> Result<Option<Vec<u8>>, HostError> {
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: as in `get_buffer`.
    let code = unsafe {
        proxy_get_header_map_value(map as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    };
    match code {
        OK => Ok(Some(unsafe { take(data, size) })),
        NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

pub fn remove_header(map: MapType, key: &str) -> Result<(), HostError> {
    // SAFETY: pointer and length of a live str.
    status(unsafe { proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()) })
}

pub fn add_header(map: MapType, key: &str, value: &str) -> Result<(), HostError> {
    // SAFETY: pointers and lengths of live strs.
    status(unsafe {
        proxy_add_header_map_value(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Serializes header pairs in the proxy-wasm map format.
pub fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Answers the request locally.
pub fn send_response(code: u32, headers: &[(&str, &str)], body: &[u8]) -> Result<(), HostError> {
    let map = serialize_map(headers);
    let details = "incontext_context_length_exceeded";
    // SAFETY: pointers and lengths of live buffers.
    status(unsafe {
        proxy_send_local_response(
            code,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    })
}

/// Shared data (all worker VMs): `Ok(None)` when the key is absent.
pub fn get_shared(key: &str) -> Result<Option<Vec<u8>>, HostError> {
    let mut data = null_mut();
    let mut size = 0;
    let mut cas = 0;
    // SAFETY: as in `get_buffer`.
    let code =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match code {
        OK => Ok(Some(unsafe { take(data, size) })),
        NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

/// Sets shared data unconditionally (cas 0).
pub fn set_shared(key: &str, value: &[u8]) -> Result<(), HostError> {
    // SAFETY: pointers and lengths of live buffers.
    status(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), 0)
    })
}

pub fn define_counter(name: &str) -> Result<u32, HostError> {
    let mut id = 0;
    // SAFETY: pointer and length of a live str; out-pointer to a local.
    status(unsafe { proxy_define_metric(METRIC_COUNTER, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn define_histogram(name: &str) -> Result<u32, HostError> {
    let mut id = 0;
    // SAFETY: pointer and length of a live str; out-pointer to a local.
    status(unsafe { proxy_define_metric(METRIC_HISTOGRAM, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn record(id: u32, value: u64) -> Result<(), HostError> {
    // SAFETY: plain values.
    status(unsafe { proxy_record_metric(id, value) })
}

/// The host's wall clock, in nanoseconds.
pub fn now_ns() -> Result<u64, HostError> {
    let mut t = 0;
    // SAFETY: out-pointer to a local.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

pub fn increment(id: u32) -> Result<(), HostError> {
    // SAFETY: plain values.
    status(unsafe { proxy_increment_metric(id, 1) })
}

/// Sends an HTTP call to `cluster`; the token its answer will carry.
pub fn dispatch(
    cluster: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout_ms: u64,
) -> Result<u32, HostError> {
    let map = serialize_map(headers);
    let trailers = serialize_map(&[]);
    let body = body.unwrap_or_default();
    let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX);
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers; out-pointer to a local.
    status(unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            map.as_ptr(),
            map.len(),
            body.as_ptr(),
            body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout,
            &mut token,
        )
    })?;
    Ok(token)
}

/// Makes `context_id` the context later host calls act on (a stream, or the plugin's root).
pub fn set_effective_context(context_id: u32) -> Result<(), HostError> {
    // SAFETY: plain value.
    status(unsafe { proxy_set_effective_context(context_id) })
}

/// Resumes a request paused in the body callback.
pub fn resume_request() -> Result<(), HostError> {
    // SAFETY: plain value (StreamType::HttpRequest = 0).
    status(unsafe { proxy_continue_stream(0) })
}

/// A header value as text, if it is valid UTF-8.
pub fn text(bytes: Option<Vec<u8>>) -> Option<String> {
    bytes.and_then(|b| String::from_utf8(b).ok())
}
