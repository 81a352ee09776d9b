//! The configuration as it is read: each field's type refuses what the field does not accept,
//! and the raw objects the validated [`Config`] is built from.

use super::{err, Backend, ConfigError, HeaderValue, OnInsufficient, TokenizerConfig};
use super::{DEFAULT_PATH, DEFAULT_TIMEOUT_MS};
use crate::json::path::Segment;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;

// ---- Value types: each refuses what its field does not accept. ----
//
// Every scalar field is read by the one `Scalar` reader and then checked by its type, so the
// deserializer is instantiated once for all of them (it keeps the wasm module small).

/// A JSON value as a configuration field first reads it.
pub(super) enum Scalar {
    Unsigned(u64),
    Negative,
    Float,
    Bool(bool),
    Str(String),
    /// null, an object or an array.
    Other,
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Unsigned(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(u64::try_from(v).map_or(Scalar::Negative, Scalar::Unsigned))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads a scalar and checks it with `check`, whose error message becomes the field's.
pub(super) fn scalar<'de, D: Deserializer<'de>, T>(
    d: D,
    check: impl FnOnce(Scalar) -> Result<T, String>,
) -> Result<T, D::Error> {
    check(Scalar::deserialize(d)?).map_err(de::Error::custom)
}

/// An integer in `MIN..=MAX` (not a bool, a float or a string).
#[derive(Debug, Clone, Copy)]
pub(super) struct Int<const MIN: u64, const MAX: u64>(pub(super) u64);

pub(super) const I64_MAX: u64 = i64::MAX as u64;
/// An integer > 0.
type Positive = Int<1, I64_MAX>;

pub(super) fn int_in(v: Scalar, min: u64, max: u64) -> Result<u64, String> {
    let below = || {
        if min == 1 {
            "must be > 0".to_string()
        } else {
            format!("must be >= {min}")
        }
    };
    match v {
        Scalar::Unsigned(n) if n < min => Err(below()),
        Scalar::Unsigned(n) if n > max => Err(format!("must be <= {max}")),
        Scalar::Unsigned(n) => Ok(n),
        Scalar::Negative => Err(below()),
        _ => Err("must be an integer".to_string()),
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Int<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| int_in(v, MIN, MAX)).map(Int)
    }
}

/// `true` or `false`.
pub(super) struct Flag(pub(super) bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| match v {
            Scalar::Bool(b) => Ok(Flag(b)),
            _ => Err("must be true or false".to_string()),
        })
    }
}

/// A string without control characters (a header value's bytes).
pub(super) fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

pub(super) fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// A non-empty string that passes `check` (its message otherwise).
pub(super) fn text(
    v: Scalar,
    check: fn(&str) -> Result<(), &'static str>,
) -> Result<String, String> {
    match v {
        Scalar::Str(s) if s.is_empty() => Err("must not be empty".to_string()),
        Scalar::Str(s) => check(&s).map(|()| s).map_err(str::to_string),
        _ => Err("must be a string".to_string()),
    }
}

/// A non-empty string.
#[derive(Debug, Clone)]
pub(super) struct Text(pub(super) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| text(v, |_| Ok(()))).map(Text)
    }
}

/// The tokenizer's `:authority`.
pub(super) struct Authority(pub(super) String);

impl<'de> Deserialize<'de> for Authority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| {
            text(v, |s| {
                if valid_header_value(s) {
                    Ok(())
                } else {
                    Err("contains control characters")
                }
            })
        })
        .map(Authority)
    }
}

/// The tokenizer's `:path`.
pub(super) struct UrlPath(pub(super) String);

impl<'de> Deserialize<'de> for UrlPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| {
            text(v, |s| {
                if s.starts_with('/') && valid_header_value(s) {
                    Ok(())
                } else {
                    Err("must be an absolute path starting with /")
                }
            })
        })
        .map(UrlPath)
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| {
            let name = text(v, |_| Ok(()))?;
            Backend::ALL
                .into_iter()
                .find(|b| b.as_str() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = Backend::ALL.iter().map(|b| b.as_str()).collect();
                    format!("unknown backend (known: {})", known.join(", "))
                })
        })
    }
}

impl<'de> Deserialize<'de> for OnInsufficient {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar(d, |v| match v {
            Scalar::Str(s) if s == "passthrough" => Ok(OnInsufficient::Passthrough),
            Scalar::Str(s) if s == "reject" => Ok(OnInsufficient::Reject),
            _ => Err("must be \"passthrough\" or \"reject\"".to_string()),
        })
    }
}

/// `model`: a name or a non-empty list of names.
pub(super) struct Models(pub(super) Vec<String>);

impl<'de> Deserialize<'de> for Models {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Models;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-empty string or a non-empty list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Models, E> {
                if v.is_empty() {
                    return Err(E::custom("must not be empty"));
                }
                Ok(Models(vec![v.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Models, A::Error> {
                let mut out = Vec::new();
                while let Some(Text(name)) = seq.next_element()? {
                    if out.contains(&name) {
                        return Err(de::Error::custom(format!("{name:?} is named twice")));
                    }
                    out.push(name);
                }
                if out.is_empty() {
                    return Err(de::Error::custom("must not be an empty list"));
                }
                Ok(Models(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `tokenizer.headers`: lowercase names, string or `{"env": NAME}` values, in order. The
/// messages never repeat a value.
pub(super) struct Headers(pub(super) Vec<(String, HeaderValue)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Headers;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if !valid_header_name(&name) {
                        return Err(de::Error::custom("header names must be lowercase tokens"));
                    }
                    if name == "content-type" || name == "content-length" || name == "host" {
                        return Err(de::Error::custom(
                            "content-type, content-length and host are set by the filter",
                        ));
                    }
                    let value: HeaderValue = map.next_value()?;
                    out.push((name, value));
                }
                Ok(Headers(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for HeaderValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read as a whole value: the messages never repeat it.
        let bad = || {
            de::Error::custom("header values must be strings without control characters, or {\"env\": \"VARIABLE\"}")
        };
        match Value::deserialize(d)? {
            Value::String(s) if valid_header_value(&s) => Ok(HeaderValue::Literal(s)),
            Value::Object(o) => match o.get("env") {
                Some(Value::String(var)) if o.len() == 1 && !var.is_empty() => {
                    Ok(HeaderValue::Env(var.clone()))
                }
                _ => Err(de::Error::custom(
                    "an object value must be {\"env\": \"VARIABLE\"}",
                )),
            },
            _ => Err(bad()),
        }
    }
}

// ---- The configuration's shapes, as they come from JSON. ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTokenizer {
    pub(super) backend: Option<Backend>,
    pub(super) cluster: Option<Text>,
    pub(super) authority: Option<Authority>,
    pub(super) path: Option<UrlPath>,
    pub(super) timeout_ms: Option<Int<1, { u32::MAX as u64 }>>,
    pub(super) headers: Option<Headers>,
}

/// What a route may set (docs/spec.md §16); the rest comes from the top level.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    pub(super) model: Option<Models>,
    pub(super) tokenizer: Option<RawTokenizer>,
    pub(super) context_length: Option<Positive>,
    pub(super) window_tokens: Option<Positive>,
    pub(super) min_output_tokens: Option<Positive>,
    pub(super) fallback_margin_tokens: Option<Int<0, I64_MAX>>,
    pub(super) on_insufficient: Option<OnInsufficient>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) tokenizer: Option<RawTokenizer>,
    pub(super) model: Option<Models>,
    pub(super) context_length: Option<Positive>,
    pub(super) window_tokens: Option<Positive>,
    pub(super) min_output_tokens: Option<Positive>,
    pub(super) fallback_margin_tokens: Option<Int<0, I64_MAX>>,
    pub(super) cache_entries: Option<Int<1, { 1 << 20 }>>,
    pub(super) max_body_bytes: Option<Int<1, { 1 << 30 }>>,
    pub(super) on_insufficient: Option<OnInsufficient>,
    pub(super) response_headers: Option<Flag>,
    pub(super) estimate_constrained: Option<Flag>,
    pub(super) exclude_tools_when_tool_choice_none: Option<Flag>,
    pub(super) skip_count: Option<Flag>,
    pub(super) translate_errors: Option<Flag>,
    pub(super) window_ttl_ms: Option<Positive>,
    pub(super) routes: Option<Vec<RawRoute>>,
}

/// The deserializer's path, as the dotted field name (`routes[1].tokenizer.cluster`).
pub(super) fn field_of(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if key.is_empty() {
                    out.push_str("\"\"");
                } else {
                    out.extend(key.escape_debug());
                }
            }
        }
    }
    if out.is_empty() {
        out.push_str("(root)");
    }
    out
}

pub(super) fn resolve_tokenizer(
    raw: RawTokenizer,
    prefix: &str,
) -> Result<TokenizerConfig, ConfigError> {
    let cluster = raw
        .cluster
        .ok_or_else(|| err(&format!("{prefix}tokenizer.cluster"), "required"))?
        .0;
    Ok(TokenizerConfig {
        backend: raw.backend.unwrap_or(Backend::Vllm),
        authority: raw.authority.map_or_else(|| cluster.clone(), |a| a.0),
        cluster,
        path: raw.path.map_or_else(|| DEFAULT_PATH.to_string(), |p| p.0),
        timeout_ms: raw.timeout_ms.map_or(DEFAULT_TIMEOUT_MS, |t| t.0),
        headers: raw.headers.map(|h| h.0).unwrap_or_default(),
    })
}
