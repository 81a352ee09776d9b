//! The module's boundary: the proxy-wasm ABI (0.2.1) imports, wrapped as [`Proxy`] for
//! [`Wasm`], and the exports the host calls for each plugin (root) context and each HTTP
//! stream. Each export hands its callback to the one [`Filter`] of this VM; nothing here
//! decides. This is the only module with `unsafe` code and the only one built for wasm only.

use crate::filter::Filter;
use crate::logger;
use crate::proxy::{serialize_map, BufferType, HostError, LogLevel, MapType, MetricType, Proxy};
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ptr::null_mut;

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
    fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
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
/// `proxy_on_memory_allocate` (a boxed slice of exactly `size` bytes).
unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        Vec::from_raw_parts(data, size, size)
    }
}

/// An answer that hands over a host allocation: `Ok(None)` on NotFound.
///
/// # Safety
/// As for [`take`], when `code` is Ok.
unsafe fn taken(code: u32, data: *mut u8, size: usize) -> Result<Option<Vec<u8>>, HostError> {
    match code {
        OK => Ok(Some(take(data, size))),
        NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

/// The host, through the ABI's imports.
pub struct Wasm;

impl Proxy for Wasm {
    fn log(&mut self, level: LogLevel, message: &str) {
        // SAFETY: pointer and length of a live str.
        unsafe {
            proxy_log(level as u32, message.as_ptr(), message.len());
        }
    }

    fn log_level(&mut self) -> Option<u32> {
        let mut level = 0;
        // SAFETY: out-pointer to a local.
        (unsafe { proxy_get_log_level(&mut level) } == OK).then_some(level)
    }

    fn get_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        max: usize,
    ) -> Result<Option<Vec<u8>>, HostError> {
        let mut data = null_mut();
        let mut size = 0;
        // SAFETY: out-pointers to locals; on Ok the host hands over an allocation.
        unsafe {
            let code = proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size);
            taken(code, data, size)
        }
    }

    fn set_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        size: usize,
        value: &[u8],
    ) -> Result<(), HostError> {
        // SAFETY: pointer and length of a live slice.
        status(unsafe {
            proxy_set_buffer_bytes(kind as u32, start, size, value.as_ptr(), value.len())
        })
    }

    fn get_header(&mut self, map: MapType, key: &str) -> Result<Option<Vec<u8>>, HostError> {
        let mut data = null_mut();
        let mut size = 0;
        // SAFETY: as in `get_buffer`.
        unsafe {
            let code = proxy_get_header_map_value(
                map as u32,
                key.as_ptr(),
                key.len(),
                &mut data,
                &mut size,
            );
            taken(code, data, size)
        }
    }

    fn set_property(&mut self, path: &str, value: &[u8]) -> Result<(), HostError> {
        // SAFETY: pointers and lengths of a live str and slice.
        status(unsafe {
            proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len())
        })
    }

    fn remove_header(&mut self, map: MapType, key: &str) -> Result<(), HostError> {
        // SAFETY: pointer and length of a live str.
        status(unsafe { proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()) })
    }

    fn add_header(&mut self, map: MapType, key: &str, value: &str) -> Result<(), HostError> {
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

    fn send_response(
        &mut self,
        code: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
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

    fn get_shared(&mut self, key: &str) -> Result<Option<Vec<u8>>, HostError> {
        let mut data = null_mut();
        let mut size = 0;
        let mut cas = 0;
        // SAFETY: as in `get_buffer`.
        unsafe {
            let code =
                proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas);
            taken(code, data, size)
        }
    }

    fn set_shared(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        // SAFETY: pointers and lengths of live buffers.
        status(unsafe {
            proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), 0)
        })
    }

    fn define_metric(&mut self, kind: MetricType, name: &str) -> Result<u32, HostError> {
        let mut id = 0;
        // SAFETY: pointer and length of a live str; out-pointer to a local.
        status(unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })?;
        Ok(id)
    }

    fn increment_metric(&mut self, id: u32, offset: i64) -> Result<(), HostError> {
        // SAFETY: plain values.
        status(unsafe { proxy_increment_metric(id, offset) })
    }

    fn record_metric(&mut self, id: u32, value: u64) -> Result<(), HostError> {
        // SAFETY: plain values.
        status(unsafe { proxy_record_metric(id, value) })
    }

    fn now_ns(&mut self) -> Result<u64, HostError> {
        let mut t = 0;
        // SAFETY: out-pointer to a local.
        status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
        Ok(t)
    }

    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        let map = serialize_map(headers);
        let trailers = serialize_map(&[]);
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
                timeout_ms,
                &mut token,
            )
        })?;
        Ok(token)
    }

    fn set_effective_context(&mut self, context: u32) -> Result<(), HostError> {
        // SAFETY: plain value.
        status(unsafe { proxy_set_effective_context(context) })
    }

    fn resume_request(&mut self) -> Result<(), HostError> {
        // SAFETY: plain value (StreamType::HttpRequest = 0).
        status(unsafe { proxy_continue_stream(0) })
    }

    fn memory_bytes(&mut self) -> u64 {
        (core::arch::wasm32::memory_size(0) as u64) << 16
    }
}

/// A `log` backend over the host's log call.
struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        Wasm.log(
            logger::host_level(record.level()),
            &record.args().to_string(),
        );
    }

    fn flush(&self) {}
}

thread_local! {
    static FILTER: RefCell<Filter> = RefCell::new(Filter::default());
}

/// Runs `f` on this VM's filter. A callback that arrives while another is running (a host call
/// that re-enters the module) finds it busy and gets `T::default()`: continue, nothing done.
fn with<T: Default>(f: impl FnOnce(&mut Filter, &mut Wasm) -> T) -> T {
    FILTER.with(|filter| match filter.try_borrow_mut() {
        Ok(mut filter) => f(&mut filter, &mut Wasm),
        Err(_) => T::default(),
    })
}

/// WASI reactor start-up: static constructors, the logger and the panic hook. Host calls are
/// not allowed here.
#[no_mangle]
pub extern "C" fn _initialize() {
    extern "C" {
        fn __wasm_call_ctors();
    }
    // SAFETY: the reactor's constructor entry point, called once by the host before anything
    // else.
    unsafe { __wasm_call_ctors() };
    if log::set_logger(&HostLogger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    std::panic::set_hook(Box::new(|info| {
        Wasm.log(LogLevel::Error, &logger::panic_line(info.location()));
    }));
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host's allocator for buffers it hands to the module (`take` frees them).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut buffer: Vec<MaybeUninit<u8>> = Vec::with_capacity(size);
    // SAFETY: MaybeUninit needs no initialisation; the capacity is exactly `size`.
    unsafe { buffer.set_len(size) };
    Box::into_raw(buffer.into_boxed_slice()) as *mut u8
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_id: u32) {
    with(|f, _| f.on_context_create(context_id, parent_id))
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_context_id: u32, _size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(context_id: u32, size: usize) -> bool {
    with(|f, p| f.on_configure(p, context_id, size))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, _headers: usize, end: bool) -> u32 {
    with(|f, p| f.on_request_headers(p, context_id, end))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, size: usize, end: bool) -> u32 {
    with(|f, p| f.on_request_body(p, context_id, size, end))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _trailers: usize) -> u32 {
    with(|f, p| f.on_request_trailers(p, context_id))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, _headers: usize, end: bool) -> u32 {
    with(|f, p| f.on_response_headers(p, context_id, end))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(context_id: u32, size: usize, end: bool) -> u32 {
    with(|f, p| f.on_response_body(p, context_id, size, end))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _trailers: usize) -> u32 {
    with(|f, p| f.on_response_trailers(p, context_id))
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    _context_id: u32,
    token: u32,
    _headers: usize,
    body_size: usize,
    _trailers: usize,
) {
    with(|f, p| f.on_http_call_response(p, token, body_size))
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_context_id: u32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_log(context_id: u32) {
    with(|f, p| f.on_log(p, context_id))
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    with(|f, p| f.on_delete(p, context_id))
}
