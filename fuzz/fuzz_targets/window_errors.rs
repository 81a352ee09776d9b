//! Every backend's window-error parser and the translation (docs/spec.md §13;
//! crates/core/src/response/window.rs, errors.rs and the wordings in crates/core/src/backend/).
//!
//! Input: byte 0 = the budget (bits 0–1 the client's dialect: Anthropic, OpenAI, Responses;
//! bit 2 the filter's count is exact; bit 3 the counter refused the prompt as too long; bit 4
//! no count at all), bytes 1–4 P (u32), 5–6 C (u16; 0: unknown), 7–8 B (u16; 0: unknown),
//! then the error body. Properties checked:
//! * nothing panics: `window::parse` for every backend, `window::message`, `translate`, and the
//!   error through `Response` (held, then read whole);
//! * vLLM and vLLM's render server read the same wordings; a window error is JSON, and every
//!   number it names stands in the server's message (P may be one more than a number there:
//!   "more than N characters" bounds P from below), or, for llama.cpp, in `n_ctx` and
//!   `n_prompt_tokens` of an `exceed_context_size_error`;
//! * a wording matches from the message's start, whatever follows it: the message with text
//!   appended reads the same;
//! * a translation is the dialect's error object ("prompt is too long" / "input length and
//!   `max_tokens` exceed context limit" for Anthropic, `context_length_exceeded` with `param`
//!   `messages` or `input` for OpenAI), naming C; through `Response` the client gets exactly
//!   the translation, or the body byte for byte when there is none.
#![no_main]

mod common;

use common::show;
use incontext_core::config::Backend;
use incontext_core::response::window::{message, parse, WindowError};
use incontext_core::response::{
    translate, BodyStep, Budget, Dialect, Edit, Head, HeadStep, Response, MAX_ERROR_BYTES,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const BACKENDS: [Backend; 4] = [
    Backend::Vllm,
    Backend::VllmRender,
    Backend::Sglang,
    Backend::Llamacpp,
];

/// Whether `n` stands as a whole number in `text` (leading zeros allowed: "024" is 24).
fn names(text: &str, n: u64) -> bool {
    text.split(|c: char| !c.is_ascii_digit())
        .any(|run| !run.is_empty() && run.parse::<u64>().ok() == Some(n))
}

fn check_parse(backend: Backend, body: &[u8], value: Option<&Value>) -> Option<WindowError> {
    let e = parse(backend, body)?;
    let value = value.unwrap_or_else(|| {
        panic!(
            "{backend:?}: a window error that is not JSON: {}",
            show(body)
        )
    });
    if backend == Backend::Llamacpp {
        let error = &value["error"];
        if error["type"] == "server_error" {
            // The full shared cache: no numbers.
            assert_eq!(error["message"], "Context size has been exceeded.", "{}", show(body));
            assert_eq!(e, WindowError::default(), "{}", show(body));
            return Some(e);
        }
        assert_eq!(error["type"], "exceed_context_size_error", "{}", show(body));
        assert_eq!(e.context, error["n_ctx"].as_u64(), "{}", show(body));
        assert_eq!(
            e.prompt,
            error["n_prompt_tokens"].as_u64(),
            "{}",
            show(body)
        );
        assert!(e.prompt_exact && e.prompt_exceeds && e.cap.is_none() && e.limit.is_none());
        return Some(e);
    }
    let text = message(value).unwrap_or_else(|| panic!("{backend:?}: no message: {}", show(body)));
    for n in [e.context, e.limit, e.cap].into_iter().flatten() {
        assert!(
            names(text, n),
            "{backend:?}: {n} not in the message: {}",
            show(body)
        );
    }
    if let Some(p) = e.prompt {
        assert!(
            names(text, p) || names(text, p.saturating_sub(1)),
            "{backend:?}: P {p} not in the message: {}",
            show(body)
        );
    }
    // Whatever follows the wording is not read.
    let mut longer = value.clone();
    let slot = if value["error"]["message"].is_string() {
        &mut longer["error"]["message"]
    } else {
        &mut longer["message"]
    };
    *slot = Value::String(format!("{text} (parameter=x, value=1) and more"));
    let longer = serde_json::to_vec(&longer).expect("a value serialises");
    assert_eq!(
        parse(backend, &longer),
        Some(e),
        "{backend:?}: {}",
        show(body)
    );
    Some(e)
}

fn check_translation(budget: &Budget, e: &WindowError, body: &[u8]) -> Option<Vec<u8>> {
    let t = translate(budget, e)?;
    let v: Value = serde_json::from_slice(&t)
        .unwrap_or_else(|err| panic!("a translation that is not JSON ({err}): {}", show(&t)));
    let text = match budget.dialect {
        Dialect::Anthropic => {
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            let text = v["error"]["message"].as_str().expect("a message");
            assert!(
                text.starts_with("prompt is too long: ")
                    || text.starts_with("input length and `max_tokens` exceed context limit: "),
                "{text}"
            );
            text
        }
        Dialect::OpenAi | Dialect::Responses => {
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            let param = if budget.dialect == Dialect::Responses {
                "input"
            } else {
                "messages"
            };
            assert_eq!(v["error"]["param"], param);
            v["error"]["message"].as_str().expect("a message")
        }
    };
    // C: the server's, else the filter's, else the limit the server named plus the cap.
    let c = e
        .context
        .or(budget.context)
        .or_else(|| e.limit?.checked_add(e.cap.or(budget.cap)?))
        .expect("a translation names C");
    assert!(names(text, c), "C {c} not in {text:?}: {}", show(body));
    Some(t)
}

fn check(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let flags = data[0];
    let dialect =
        [Dialect::Anthropic, Dialect::OpenAi, Dialect::Responses][usize::from(flags & 3) % 3];
    let p = u64::from(u32::from_le_bytes([data[1], data[2], data[3], data[4]]));
    let number = |a: u8, b: u8| Some(u64::from(u16::from_le_bytes([a, b]))).filter(|n| *n > 0);
    let body = &data[9..];
    let value: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(v) = &value {
        let _ = message(v);
    }
    let vllm = check_parse(Backend::Vllm, body, value.as_ref());
    for backend in BACKENDS {
        let e = check_parse(backend, body, value.as_ref());
        if backend == Backend::VllmRender {
            assert_eq!(e, vllm, "the render server answers as vLLM: {}", show(body));
        }
        let budget = Budget {
            dialect,
            backend,
            model: "m".into(),
            prompt: (flags & 0x10 == 0).then_some(p),
            exact: flags & 4 == 4,
            too_long: flags & 8 == 8,
            context: number(data[5], data[6]),
            cap: number(data[7], data[8]),
            window_cap: None,
            usage: false,
        };
        let translated = e.and_then(|e| check_translation(&budget, &e, body));
        // Through the answer side: held (a small 4xx), read whole at its end.
        let mut r = Response::default();
        let head = Head {
            status: Some(400),
            content_type: Some("application/json"),
            ..Head::default()
        };
        assert_eq!(r.on_headers(Some(&budget), true, &head), HeadStep::Hold);
        if body.len() > MAX_ERROR_BYTES {
            continue;
        }
        assert_eq!(r.on_body(body.len(), true), BodyStep::Read);
        let d = r.on_data(Some(&budget), body, true);
        assert!(!r.holds());
        match (d.edit, translated) {
            (Edit::Keep, None) => assert_eq!(d.translated, None),
            (Edit::Replace(out), Some(t)) => {
                assert_eq!(out, t);
                assert_eq!(d.translated, e);
            }
            (edit, t) => panic!(
                "{backend:?}: {edit:?} for translation {t:?}: {}",
                show(body)
            ),
        }
    }
}

fuzz_target!(|data: &[u8]| check(data));
