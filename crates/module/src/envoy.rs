//! The host as the glue reaches it: every call one HTTP stream makes into Envoy, as one trait.
//! `abi.rs` implements it over the ABI's callbacks; the tests implement it with a recording
//! fake.

/// A header map of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    Request,
    Response,
}

/// A body of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    Request,
    Response,
}

/// The calls one stream makes. Envoy's callbacks report failure as `false` (or nothing):
/// each is absorbed by the glue, which then leaves the request as it came.
pub trait Envoy {
    /// The first value of a header; `None` when absent or not UTF-8.
    fn header(&mut self, map: Headers, name: &str) -> Option<String>;
    /// Sets a header (every value replaced), or removes it (`None`).
    fn set_header(&mut self, map: Headers, name: &str, value: Option<&str>) -> bool;
    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> bool;
    /// The size of the body the filter holds: what Envoy buffered and, inside a body
    /// callback, the chunk that arrived.
    fn body_size(&mut self, body: Body) -> usize;
    /// That body's bytes.
    fn read_body(&mut self, body: Body) -> Option<Vec<u8>>;
    /// Replaces that body whole.
    fn replace_body(&mut self, body: Body, data: &[u8]) -> bool;
    /// Hands `f` that body as Envoy's slices, in order, to read and write in place; `false`
    /// when Envoy refused.
    fn body_chunks(&mut self, body: Body, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool;
    /// Drains the first `n` bytes of that body.
    fn drain_body(&mut self, body: Body, n: usize) -> bool;
    /// Answers the request locally.
    fn send_response(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]);
    /// Sends an HTTP call to `cluster`; the id its answer will carry.
    fn callout(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u64>;
    /// Sets the stream's filter state `key` (a string Envoy's access logs and rate limits
    /// read as `%FILTER_STATE(key:PLAIN)%`); `false` when Envoy refused.
    fn set_filter_state(&mut self, key: &str, value: &str) -> bool;
    /// Resumes a held request.
    fn resume_request(&mut self);
    /// Adds `by` to a counter.
    fn increment(&mut self, counter: usize, by: u64);
    fn record(&mut self, histogram: usize, value: u64);
}
