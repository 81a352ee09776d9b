//! The host as the glue reaches it: every proxy-wasm host call the filter makes, as one trait
//! whose calls return a `Result` for every host status. The module implements it over the
//! ABI's imports (`wasm.rs`, the only place with `unsafe` host calls); the tests implement it
//! with a recording fake.

/// Buffers of the ABI (`proxy_get_buffer_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferType {
    HttpRequestBody = 0,
    HttpResponseBody = 1,
    HttpCallResponseBody = 4,
    PluginConfiguration = 7,
}

/// Header maps of the ABI.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapType {
    RequestHeaders = 0,
    ResponseHeaders = 2,
    CallResponseHeaders = 6,
}

/// Log levels of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// Metric kinds of the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// A host status other than Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

/// The proxy-wasm host calls of the filter. Reads answer `Ok(None)` when the host has nothing
/// (status NotFound).
pub trait Proxy {
    fn log(&mut self, level: LogLevel, message: &str);
    /// The host's log level (0 trace … 5 critical), if it tells.
    fn log_level(&mut self) -> Option<u32>;
    /// Up to `max` bytes of a buffer from `start`.
    fn get_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        max: usize,
    ) -> Result<Option<Vec<u8>>, HostError>;
    /// Replaces `size` bytes at `start` of a buffer with `value`.
    fn set_buffer(
        &mut self,
        kind: BufferType,
        start: usize,
        size: usize,
        value: &[u8],
    ) -> Result<(), HostError>;
    fn get_header(&mut self, map: MapType, key: &str) -> Result<Option<Vec<u8>>, HostError>;
    fn remove_header(&mut self, map: MapType, key: &str) -> Result<(), HostError>;
    fn add_header(&mut self, map: MapType, key: &str, value: &str) -> Result<(), HostError>;
    /// Answers the request locally.
    fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError>;
    /// Shared data (every worker's VM).
    fn get_shared(&mut self, key: &str) -> Result<Option<Vec<u8>>, HostError>;
    /// Sets shared data unconditionally.
    fn set_shared(&mut self, key: &str, value: &[u8]) -> Result<(), HostError>;
    fn define_metric(&mut self, kind: MetricType, name: &str) -> Result<u32, HostError>;
    fn increment_metric(&mut self, id: u32, offset: i64) -> Result<(), HostError>;
    /// Records a histogram value.
    fn record_metric(&mut self, id: u32, value: u64) -> Result<(), HostError>;
    /// The host's wall clock, in nanoseconds.
    fn now_ns(&mut self) -> Result<u64, HostError>;
    /// Sends an HTTP call to `cluster` on behalf of the effective context; the token its
    /// answer will carry.
    fn http_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, HostError>;
    /// Sets a property of the effective context's stream: Envoy stores it as the filter
    /// state `wasm.<path>` (a single-element path).
    fn set_property(&mut self, path: &str, value: &[u8]) -> Result<(), HostError>;
    /// Makes `context` the one later host calls act for.
    fn set_effective_context(&mut self, context: u32) -> Result<(), HostError>;
    /// Resumes the effective context's paused request.
    fn resume_request(&mut self) -> Result<(), HostError>;
    /// The module's linear memory, in bytes.
    fn memory_bytes(&mut self) -> u64;
}

/// A header value as text; `None` when absent or not UTF-8.
pub fn text(value: Option<Vec<u8>>) -> Option<String> {
    value.and_then(|v| String::from_utf8(v).ok())
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
