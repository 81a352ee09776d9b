//! Tokenizer backends (docs/spec.md §11): for each model server and request dialect, the call
//! that counts a prompt exactly and how its answer reads; and where the window C comes from
//! when the count does not report it. Each backend is one module implementing [`Server`]
//! (its calls, its `/tokenize` reading, its window errors); what they share lives here: the
//! answers' shapes ([`CallKind`]) and their parsers, the status gate, the headers.

mod llamacpp;
mod render;
mod sglang;
mod vllm;

use crate::config::{Backend, Config, TokenizerConfig};
use crate::dialect::Form;
use crate::request::Request;
use crate::response::window::{Capture, WindowError};
use crate::tokenize::{check_status, parse_reply, Failure};
use serde_json::Value;

pub use llamacpp::{LLAMACPP_CHAT_COUNT_PATH, LLAMACPP_PROPS_PATH, LLAMACPP_RESPONSES_COUNT_PATH};
pub use render::{
    CHAT_RENDER_PATH, COMPLETIONS_RENDER_PATH, MESSAGES_RENDER_PATH, RESPONSES_RENDER_PATH,
};

/// Anthropic's counter, served by vLLM, SGLang and llama.cpp alike.
pub const MESSAGES_COUNT_PATH: &str = "/v1/messages/count_tokens";
/// The model list; vLLM and SGLang report each model's `max_model_len` there.
pub const MODELS_PATH: &str = "/v1/models";

/// An HTTP call to the tokenizer cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: &'static str,
    pub path: String,
    /// The JSON body of a POST.
    pub body: Option<Vec<u8>>,
    /// What the answer is.
    pub kind: CallKind,
}

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `{"count", "max_model_len"}` (`/tokenize` of vLLM and SGLang).
    Tokenize,
    /// `{"input_tokens"}` (Anthropic's counter; llama.cpp's chat counter).
    InputTokens,
    /// `{"tokens": [...]}` (llama.cpp's `/tokenize`).
    TokenList,
    /// `{"token_ids": [...]}`, or a list of one (vLLM's render API).
    TokenIds,
    /// The window: `/v1/models` (the named model's, else the first model's).
    Models,
    /// The window: the named model's in `/v1/models`, and only that (the render server).
    ModelWindow,
    /// The window: llama.cpp's `/props`.
    Props,
}

/// A count, and the window when the answer reports one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub count: u64,
    pub window: Option<u64>,
}

/// What a count call is made of: the tokenizer's configuration, the request read, its body.
pub(super) struct Ask<'a> {
    pub t: &'a TokenizerConfig,
    pub req: &'a Request,
    pub body: &'a [u8],
}

/// A tokenizer backend: the calls it answers and how it words what it says. The provided
/// methods are what most backends do.
trait Server {
    /// The call that counts `req` exactly, or `None` when a field the payload needs does not
    /// parse or the backend cannot count this dialect (the estimate is used then).
    fn count_call(&self, ask: &Ask) -> Option<Call>;

    /// Whether this backend counts a conversation's tail alone (docs/spec.md §15): a chat's
    /// by [`Server::chat_tail`], an Anthropic conversation's by Anthropic's counter.
    fn counts_tails(&self) -> bool {
        true
    }

    /// The call that counts a chat's tail, `messages` (a JSON array), alone.
    fn chat_tail(&self, _ask: &Ask, _messages: &[u8]) -> Option<Call> {
        None
    }

    /// The call that counts a Responses conversation's tail, `items` (a JSON array of input
    /// items), alone.
    fn responses_tail(&self, _ask: &Ask, _items: &[u8]) -> Option<Call> {
        None
    }

    /// Whether the server ends answers already under way when its context fills
    /// ([`context_full`]): a 5xx error before any output, an error event in a started stream.
    fn fills_mid_answer(&self) -> bool {
        false
    }

    /// Whether an error object (`{"code","message","type"}`) says the context filled while
    /// the answer was under way.
    fn context_full(&self, _error: &Value) -> bool {
        false
    }

    /// The call that reports the window C: `/v1/models`.
    fn window_call(&self) -> Call {
        get(MODELS_PATH, CallKind::Models)
    }

    /// Whether answers to the count calls for `form` report the window.
    fn count_reports_window(&self, _form: Form) -> bool {
        false
    }

    /// Reads a `/tokenize` answer (its status passed): the count; the `max_model_len` there
    /// is checked but is not the server's window.
    fn parse_tokenize(&self, _config: &Config, body: &[u8]) -> Result<Counted, Failure> {
        Ok(Counted {
            count: parse_reply(body)?.count,
            window: None,
        })
    }

    /// The window error in an error body (its JSON), by this backend's wording (docs/spec.md
    /// §13); `None` for any other error.
    fn window_error(&self, body: &Value) -> Option<WindowError>;
}

/// The configured backend.
fn server(backend: Backend) -> &'static dyn Server {
    match backend {
        Backend::Vllm => &vllm::Vllm,
        Backend::Sglang => &sglang::Sglang,
        Backend::Llamacpp => &llamacpp::Llamacpp,
        Backend::VllmRender => &render::Render,
    }
}

fn post(path: &str, body: Vec<u8>, kind: CallKind) -> Call {
    Call {
        method: "POST",
        path: path.to_string(),
        body: Some(body),
        kind,
    }
}

fn get(path: &str, kind: CallKind) -> Call {
    Call {
        method: "GET",
        path: path.to_string(),
        body: None,
        kind,
    }
}

/// Anthropic's counter for a Messages request: the backend's own converts the request as
/// `/v1/messages` does and ignores the members it does not read (max_tokens, stream, ...).
fn messages_count(body: &[u8]) -> Call {
    post(MESSAGES_COUNT_PATH, body.to_vec(), CallKind::InputTokens)
}

/// The window error in a server's error body (its JSON), by `backend`'s wording (docs/spec.md
/// §13); `None` for any other error.
pub fn window_error(backend: Backend, body: &Value) -> Option<WindowError> {
    server(backend).window_error(body)
}

/// Whether `backend` ends answers under way when its context fills (docs/spec.md §13).
pub fn fills_mid_answer(backend: Backend) -> bool {
    server(backend).fills_mid_answer()
}

/// Whether an error object of `backend` says its context filled while the answer was under
/// way.
pub fn context_full(backend: Backend, error: &Value) -> bool {
    server(backend).context_full(error)
}

/// The call that counts `req` exactly, or `None` when a field the payload needs does not
/// parse (the estimate is used then).
pub fn count_call(config: &Config, req: &Request, body: &[u8]) -> Option<Call> {
    let t = &config.tokenizer;
    server(t.backend).count_call(&Ask { t, req, body })
}

/// The call that counts a conversation's tail alone (docs/spec.md §15): the messages after
/// its counted prefix, `messages` (a JSON array of them), as a conversation of their own.
pub fn tail_call(config: &Config, req: &Request, body: &[u8], messages: &[u8]) -> Option<Call> {
    let t = &config.tokenizer;
    let server = server(t.backend);
    if !server.counts_tails() {
        return None;
    }
    match req.form {
        Form::Chat => server.chat_tail(&Ask { t, req, body }, messages),
        Form::Messages => {
            let tail = crate::dialect::messages::tail_body(req, body, messages)?;
            Some(post(MESSAGES_COUNT_PATH, tail, CallKind::InputTokens))
        }
        Form::Responses => server.responses_tail(&Ask { t, req, body }, messages),
        Form::Completion => None,
    }
}

/// The call that reports the window C, for a count that does not.
pub fn window_call(config: &Config) -> Call {
    server(config.tokenizer.backend).window_call()
}

/// Whether answers to this backend's count calls for `form` report the window.
pub fn count_reports_window(config: &Config, form: Form) -> bool {
    server(config.tokenizer.backend).count_reports_window(form)
}

/// The headers of `call` to the tokenizer cluster; `length` is its body's length as text.
pub fn call_headers<'a>(
    config: &'a Config,
    call: &'a Call,
    length: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", call.method),
        (":path", &call.path),
        (":authority", &config.tokenizer.authority),
        (
            "user-agent",
            concat!("incontext/", env!("CARGO_PKG_VERSION")),
        ),
    ];
    if let Some(length) = length {
        headers.push(("content-type", "application/json"));
        headers.push(("content-length", length));
    }
    headers.extend(config.literal_headers());
    headers
}

/// A JSON object.
type Map = serde_json::Map<String, Value>;

/// The answer as a JSON object.
fn object(body: &[u8]) -> Result<Map, Failure> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Failure::Contract),
        Err(_) => Err(Failure::BadJson),
    }
}

/// Reads the answer to a count call of `kind`.
pub fn parse_count(
    config: &Config,
    kind: CallKind,
    status: Option<u16>,
    body: &[u8],
) -> Result<Counted, Failure> {
    let read: fn(&Config, &[u8]) -> Result<Counted, Failure> = match kind {
        CallKind::Tokenize => {
            |config, body| server(config.tokenizer.backend).parse_tokenize(config, body)
        }
        CallKind::InputTokens => |_, body| input_tokens(body),
        CallKind::TokenList => |_, body| llamacpp::parse_token_list(body),
        CallKind::TokenIds => |_, body| render::parse_token_ids(body),
        // A window call's answer holds no count.
        CallKind::Models | CallKind::ModelWindow | CallKind::Props => {
            return Err(Failure::Contract)
        }
    };
    check_status(status)?;
    read(config, body)
}

/// `{"input_tokens"}`.
fn input_tokens(body: &[u8]) -> Result<Counted, Failure> {
    Ok(Counted {
        count: object(body)?
            .get("input_tokens")
            .and_then(Value::as_u64)
            .ok_or(Failure::Contract)?,
        window: None,
    })
}

/// Reads the answer to a window call: the `max_model_len` of `model` in `/v1/models` (of the
/// first model when none is named or it is not listed; for the render server, of `model`
/// only), or llama.cpp's per-slot `n_ctx`.
pub fn parse_window(
    kind: CallKind,
    model: Option<&str>,
    status: Option<u16>,
    body: &[u8],
) -> Result<u64, Failure> {
    let read: fn(&Map, Option<&str>) -> Result<u64, Failure> = match kind {
        CallKind::Models => models_window,
        CallKind::ModelWindow => render::parse_models,
        CallKind::Props => |map, _| llamacpp::parse_props(map),
        // A count call's answer holds no window to read here.
        CallKind::Tokenize | CallKind::InputTokens | CallKind::TokenList | CallKind::TokenIds => {
            |_, _| Err(Failure::Contract)
        }
    };
    check_status(status)?;
    read(&object(body)?, model)
}

/// `/v1/models`: the `max_model_len` of `model`, else of the first model.
fn models_window(map: &Map, model: Option<&str>) -> Result<u64, Failure> {
    let data = map
        .get("data")
        .and_then(Value::as_array)
        .ok_or(Failure::Contract)?;
    let named = data
        .iter()
        .find(|m| model.is_some() && m.get("id").and_then(Value::as_str) == model);
    let entry = named.or(data.first()).ok_or(Failure::Contract)?;
    positive(entry.get("max_model_len")).ok_or(Failure::Contract)
}

/// A positive integer member.
fn positive(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64).filter(|c| *c > 0)
}

/// The `i`-th number a wording captured.
fn num(captures: &[Capture], i: usize) -> Option<u64> {
    captures.get(i).map(|c| c.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Endpoint;
    use crate::request::analyze_at;

    fn cfg(backend: &str) -> Config {
        Config::parse(
            format!(r#"{{"tokenizer":{{"cluster":"v","backend":"{backend}"}}}}"#).as_bytes(),
        )
        .unwrap()
    }

    fn call(backend: &str, endpoint: Endpoint, body: &str) -> Call {
        let c = cfg(backend);
        let req = analyze_at(body.as_bytes(), &c, endpoint).unwrap();
        count_call(&c, &req, body.as_bytes()).unwrap()
    }

    const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"max_tokens":9}"#;
    const ANTHROPIC: &str = r#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],"max_tokens":32000}"#;

    #[test]
    fn calls_per_backend_and_dialect() {
        let v = call("vllm", Endpoint::OpenAi, CHAT);
        assert_eq!((v.path.as_str(), v.kind), ("/tokenize", CallKind::Tokenize));
        let s = call("sglang", Endpoint::OpenAi, CHAT);
        assert_eq!((s.path.as_str(), s.kind), ("/tokenize", CallKind::Tokenize));
        let body: Value = serde_json::from_slice(s.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["tools"][0]["function"]["name"], "f");
        assert!(body.get("max_tokens").is_none());
        let l = call("llamacpp", Endpoint::OpenAi, CHAT);
        assert_eq!(l.path, "/v1/chat/completions/input_tokens");
        assert_eq!(l.body.as_deref(), Some(CHAT.as_bytes()));
        let lc = call(
            "llamacpp",
            Endpoint::OpenAi,
            r#"{"prompt":["a \"b\""],"max_tokens":5}"#,
        );
        assert_eq!(lc.kind, CallKind::TokenList);
        assert_eq!(
            lc.body.as_deref(),
            Some(br#"{"content":"a \"b\""}"#.as_slice())
        );
        for b in ["vllm", "sglang", "llamacpp"] {
            let a = call(b, Endpoint::Messages, ANTHROPIC);
            assert_eq!(a.path, "/v1/messages/count_tokens");
            assert_eq!(a.body.as_deref(), Some(ANTHROPIC.as_bytes()));
        }
        assert_eq!(window_call(&cfg("sglang")).path, "/v1/models");
        assert_eq!(window_call(&cfg("llamacpp")).path, "/props");
        assert!(count_reports_window(&cfg("vllm"), Form::Chat));
        assert!(!count_reports_window(&cfg("vllm"), Form::Messages));
        assert!(!count_reports_window(&cfg("sglang"), Form::Chat));
    }

    #[test]
    fn replies() {
        let ok = Some(200);
        let sg = cfg("sglang");
        let v = cfg("vllm");
        let tok = br#"{"count":7,"max_model_len":40960,"tokens":[]}"#;
        assert_eq!(
            parse_count(&sg, CallKind::Tokenize, ok, tok),
            Ok(Counted {
                count: 7,
                window: None
            })
        );
        assert_eq!(
            parse_count(&v, CallKind::Tokenize, ok, tok),
            Ok(Counted {
                count: 7,
                window: Some(40960)
            })
        );
        let it = |b: &[u8]| parse_count(&v, CallKind::InputTokens, ok, b);
        assert_eq!(it(br#"{"input_tokens":12}"#).map(|c| c.count), Ok(12));
        assert_eq!(it(br#"{"input_tokens":-1}"#), Err(Failure::Contract));
        assert_eq!(it(br#"{"input_tokens":true}"#), Err(Failure::Contract));
        assert_eq!(it(br#"[1]"#), Err(Failure::Contract));
        assert_eq!(it(b"nope"), Err(Failure::BadJson));
        assert_eq!(
            parse_count(&v, CallKind::InputTokens, Some(500), b"{}"),
            Err(Failure::Status)
        );
        assert_eq!(
            parse_count(&v, CallKind::TokenList, ok, br#"{"tokens":[1,2,3]}"#).map(|c| c.count),
            Ok(3)
        );
        let models = br#"{"data":[{"id":"a","max_model_len":100},{"id":"b","max_model_len":512}]}"#;
        assert_eq!(
            parse_window(CallKind::Models, Some("b"), ok, models),
            Ok(512)
        );
        assert_eq!(
            parse_window(CallKind::Models, Some("z"), ok, models),
            Ok(100)
        );
        assert_eq!(
            parse_window(CallKind::Models, None, ok, br#"{"data":[]}"#),
            Err(Failure::Contract)
        );
        let props = br#"{"default_generation_settings":{"n_ctx":512}}"#;
        assert_eq!(parse_window(CallKind::Props, None, ok, props), Ok(512));
        assert_eq!(
            parse_window(CallKind::Props, None, ok, b"{}"),
            Err(Failure::Contract)
        );
        assert_eq!(
            parse_window(CallKind::Props, None, None, props),
            Err(Failure::Transport)
        );
    }

    #[test]
    fn render_calls_carry_the_request_without_caps() {
        let body =
            |c: &Call| -> Value { serde_json::from_slice(c.body.as_deref().unwrap()).unwrap() };
        let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"max_tokens":9,"max_completion_tokens":8,"stream":true,"stream_options":{"include_usage":true},"temperature":0.5}"#;
        let c = call("vllm-render", Endpoint::OpenAi, chat);
        assert_eq!(
            (c.method, c.path.as_str(), c.kind),
            ("POST", "/v1/chat/completions/render", CallKind::TokenIds)
        );
        let b = body(&c);
        assert_eq!(b["tools"][0]["function"]["name"], "f");
        assert_eq!(b["temperature"], 0.5);
        for gone in [
            "max_tokens",
            "max_completion_tokens",
            "stream",
            "stream_options",
        ] {
            assert!(b.get(gone).is_none(), "{gone}");
        }
        let c = call(
            "vllm-render",
            Endpoint::OpenAi,
            r#"{"model":"m","prompt":"a b","max_tokens":5,"stream":false}"#,
        );
        assert_eq!(c.path, "/v1/completions/render");
        assert_eq!(
            c.body.as_deref(),
            Some(br#"{"model":"m","prompt":"a b"}"#.as_slice())
        );
        let c = call(
            "vllm-render",
            Endpoint::Messages,
            r#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],"max_tokens":32000,"stream":true}"#,
        );
        assert_eq!(c.path, "/v1/messages/render");
        let b = body(&c);
        assert_eq!(
            (b["max_tokens"].as_u64(), b["system"].as_str()),
            (Some(1), Some("s"))
        );
        assert!(b.get("stream").is_none());
        let c = call(
            "vllm-render",
            Endpoint::Responses,
            r#"{"model":"m","input":"hi","max_output_tokens":7,"stream":true}"#,
        );
        assert_eq!(c.path, "/v1/responses/render");
        assert_eq!(
            c.body.as_deref(),
            Some(br#"{"model":"m","input":"hi"}"#.as_slice())
        );
        let r = cfg("vllm-render");
        assert_eq!(
            (window_call(&r).method, window_call(&r).path.as_str()),
            ("GET", "/v1/models")
        );
        assert!(!count_reports_window(&r, Form::Chat));
    }

    #[test]
    fn render_answers() {
        let r = cfg("vllm-render");
        let ok = Some(200);
        let count =
            |status, b: &[u8]| parse_count(&r, CallKind::TokenIds, status, b).map(|c| c.count);
        assert_eq!(
            count(ok, br#"{"request_id":"x","token_ids":[1,2,3],"model":"m"}"#),
            Ok(3)
        );
        assert_eq!(count(ok, br#"[{"token_ids":[1,2]}]"#), Ok(2));
        assert_eq!(
            count(ok, br#"[{"token_ids":[1]},{"token_ids":[1,2]}]"#),
            Err(Failure::Contract)
        );
        assert_eq!(count(ok, br#"{"tokens":[1]}"#), Err(Failure::Contract));
        // Scale-out disabled, an unknown endpoint or model.
        assert_eq!(count(Some(403), b"{}"), Err(Failure::Status));
        assert_eq!(count(Some(404), b"{}"), Err(Failure::Status));
        let models =
            br#"{"data":[{"id":"other","max_model_len":100},{"id":"m","max_model_len":512}]}"#;
        let kind = window_call(&r).kind;
        assert_eq!(parse_window(kind, Some("m"), ok, models), Ok(512));
        // Another model's window is never this model's.
        assert_eq!(
            parse_window(kind, Some("z"), ok, models),
            Err(Failure::Contract)
        );
        assert_eq!(parse_window(kind, None, ok, models), Err(Failure::Contract));
        assert_eq!(
            parse_window(kind, Some("m"), Some(403), models),
            Err(Failure::Status)
        );
    }
}
