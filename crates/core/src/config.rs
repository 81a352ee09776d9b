//! Plugin configuration (docs/spec.md §8): parsing and validation, with errors that name the field.

use serde::Deserialize;
use serde_json::Value;
use std::fmt;

/// What to do when the budget leaves less than the required minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInsufficient {
    Passthrough,
    Reject,
}

/// The model server that counts (docs/spec.md §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Vllm,
    Sglang,
    Llamacpp,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Vllm => "vllm",
            Backend::Sglang => "sglang",
            Backend::Llamacpp => "llamacpp",
        }
    }

    fn parse(name: &str) -> Option<Backend> {
        [Backend::Vllm, Backend::Sglang, Backend::Llamacpp]
            .into_iter()
            .find(|b| b.as_str() == name)
    }
}

/// The tokenizer endpoint: an Envoy cluster plus the request line sent to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerConfig {
    pub backend: Backend,
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
    /// Extra headers for the tokenizer call (for example an API key), in config order.
    pub headers: Vec<(String, HeaderValue)>,
}

/// A tokenizer header value: given in the config, or read from an environment variable of
/// the Envoy process (exposed to the VM with `vm_config.environment_variables`), so a
/// credential need not sit in the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Literal(String),
    Env(String),
}

/// The validated configuration the filter runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub tokenizer: TokenizerConfig,
    /// Only requests for these models are budgeted; `None` means every model.
    pub models: Option<Vec<String>>,
    /// C, when configured.
    pub context_length: Option<u64>,
    /// W, when configured (else C).
    pub window_tokens: Option<u64>,
    /// R.
    pub min_output_tokens: u64,
    /// F.
    pub fallback_margin_tokens: u64,
    pub cache_entries: u32,
    pub max_body_bytes: usize,
    pub on_insufficient: OnInsufficient,
    pub response_headers: bool,
    /// Count requests with `response_format` or a forced `tool_choice` by the estimate, for
    /// servers whose chat template renders those fields.
    pub estimate_constrained: bool,
    /// Mirrors vLLM's `--exclude-tools-when-tool-choice-none` (vLLM only).
    pub exclude_tools_when_tool_choice_none: bool,
    /// Skip the count where a bound proves the outcome (docs/spec.md §15; vLLM only).
    pub skip_count: bool,
    /// Translate the server's window errors into the client dialect's (docs/spec.md §13).
    pub translate_errors: bool,
    /// How long a learned window no count call refreshes is trusted.
    pub window_ttl_ms: u64,
}

/// A configuration error; `field` names the offending key (dotted path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

// Raw shapes, as they come from JSON. Integers are read as i64/Value so that negatives and
// wrong types get an error that names the field instead of a generic serde message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenizer {
    backend: Option<Value>,
    cluster: Option<Value>,
    authority: Option<Value>,
    path: Option<Value>,
    timeout_ms: Option<Value>,
    headers: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    tokenizer: Option<Value>,
    model: Option<Value>,
    context_length: Option<Value>,
    window_tokens: Option<Value>,
    min_output_tokens: Option<Value>,
    fallback_margin_tokens: Option<Value>,
    cache_entries: Option<Value>,
    max_body_bytes: Option<Value>,
    on_insufficient: Option<Value>,
    response_headers: Option<Value>,
    estimate_constrained: Option<Value>,
    exclude_tools_when_tool_choice_none: Option<Value>,
    skip_count: Option<Value>,
    translate_errors: Option<Value>,
    window_ttl_ms: Option<Value>,
}

pub const DEFAULT_MIN_OUTPUT_TOKENS: u64 = 4096;
pub const DEFAULT_FALLBACK_MARGIN_TOKENS: u64 = 1024;
pub const DEFAULT_CACHE_ENTRIES: u32 = 4096;
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_WINDOW_TTL_MS: u64 = 60_000;
pub const DEFAULT_PATH: &str = "/tokenize";

/// Serde reports an unknown key as "unknown field `x`, expected ..."; turn it into our error.
fn serde_error(prefix: &str, e: serde_json::Error) -> ConfigError {
    let text = e.to_string();
    if let Some(rest) = text.strip_prefix("unknown field `") {
        // "unknown field `NAME`, expected …": NAME may itself hold a backtick.
        let name = rest
            .split_once("`, expected")
            .map_or(rest.trim_end_matches('`'), |(n, _)| n);
        let name: String = name.escape_debug().collect();
        let field = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        return err(&field, "unknown key");
    }
    let field = if prefix.is_empty() { "(root)" } else { prefix };
    err(field, format!("not valid: {text}"))
}

/// An integer field: absent → None; present → must be an integer (not a bool, not a float).
fn int(field: &str, v: Option<Value>) -> Result<Option<i64>, ConfigError> {
    match v {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Some(i)),
            None if n.as_u64().is_some() => Err(err(field, "too large")),
            None => Err(err(field, "must be an integer")),
        },
        Some(_) => Err(err(field, "must be an integer")),
    }
}

fn positive(field: &str, v: Option<Value>) -> Result<Option<u64>, ConfigError> {
    match int(field, v)? {
        None => Ok(None),
        Some(i) if i > 0 => Ok(Some(i as u64)),
        Some(_) => Err(err(field, "must be > 0")),
    }
}

fn string(field: &str, v: Option<Value>) -> Result<Option<String>, ConfigError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::String(_)) => Err(err(field, "must not be empty")),
        Some(_) => Err(err(field, "must be a string")),
    }
}

fn boolean(field: &str, v: Option<Value>, default: bool) -> Result<bool, ConfigError> {
    match v {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(b),
        Some(_) => Err(err(field, "must be true or false")),
    }
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn parse_tokenizer(v: Option<Value>) -> Result<TokenizerConfig, ConfigError> {
    let v = v.ok_or_else(|| err("tokenizer", "required"))?;
    if !v.is_object() {
        return Err(err("tokenizer", "must be an object"));
    }
    let raw: RawTokenizer = serde_json::from_value(v).map_err(|e| serde_error("tokenizer", e))?;
    let backend = match string("tokenizer.backend", raw.backend)? {
        None => Backend::Vllm,
        Some(b) => Backend::parse(&b).ok_or_else(|| {
            err(
                "tokenizer.backend",
                "unknown backend (known: vllm, sglang, llamacpp)",
            )
        })?,
    };
    let cluster = string("tokenizer.cluster", raw.cluster)?
        .ok_or_else(|| err("tokenizer.cluster", "required"))?;
    let authority =
        string("tokenizer.authority", raw.authority)?.unwrap_or_else(|| cluster.clone());
    let path = string("tokenizer.path", raw.path)?.unwrap_or_else(|| DEFAULT_PATH.to_string());
    if !path.starts_with('/') || !valid_header_value(&path) {
        return Err(err(
            "tokenizer.path",
            "must be an absolute path starting with /",
        ));
    }
    if !valid_header_value(&authority) {
        return Err(err("tokenizer.authority", "contains control characters"));
    }
    let timeout_ms =
        positive("tokenizer.timeout_ms", raw.timeout_ms)?.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms > u64::from(u32::MAX) {
        return Err(err("tokenizer.timeout_ms", "too large"));
    }
    let mut headers = Vec::new();
    match raw.headers {
        None => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                let field = "tokenizer.headers";
                if !valid_header_name(&name) || name.starts_with(':') {
                    return Err(err(field, "header names must be lowercase tokens"));
                }
                if name == "content-type" || name == "content-length" || name == "host" {
                    return Err(err(
                        field,
                        "content-type, content-length and host are set by the filter",
                    ));
                }
                let value = match value {
                    Value::String(s) if valid_header_value(&s) => HeaderValue::Literal(s),
                    Value::Object(o) if o.len() == 1 => match o.get("env") {
                        Some(Value::String(var)) if !var.is_empty() => HeaderValue::Env(var.clone()),
                        _ => return Err(err(field, "an object value must be {\"env\": \"VARIABLE\"}")),
                    },
                    _ => {
                        return Err(err(
                            field,
                            "header values must be strings without control characters, or {\"env\": \"VARIABLE\"}",
                        ))
                    }
                };
                headers.push((name, value));
            }
        }
        Some(_) => return Err(err("tokenizer.headers", "must be an object of strings")),
    }
    Ok(TokenizerConfig {
        backend,
        cluster,
        authority,
        path,
        timeout_ms,
        headers,
    })
}

fn parse_models(v: Option<Value>) -> Result<Option<Vec<String>>, ConfigError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(vec![s])),
        Some(Value::Array(items)) if !items.is_empty() => items
            .into_iter()
            .map(|i| match i {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(err("model", "list entries must be non-empty strings")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(err(
            "model",
            "must be a non-empty string or a non-empty list of strings",
        )),
    }
}

impl Config {
    /// Parses and validates the plugin configuration (a JSON object).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| err("(root)", format!("bad JSON: {e}")))?;
        if !value.is_object() {
            return Err(err("(root)", "must be a JSON object"));
        }
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| serde_error("", e))?;
        let tokenizer = parse_tokenizer(raw.tokenizer)?;
        let models = parse_models(raw.model)?;
        let context_length = positive("context_length", raw.context_length)?;
        let window_tokens = positive("window_tokens", raw.window_tokens)?;
        let min_output_tokens = positive("min_output_tokens", raw.min_output_tokens)?
            .unwrap_or(DEFAULT_MIN_OUTPUT_TOKENS);
        let fallback_margin_tokens =
            match int("fallback_margin_tokens", raw.fallback_margin_tokens)? {
                None => DEFAULT_FALLBACK_MARGIN_TOKENS,
                Some(f) if f >= 0 => f as u64,
                Some(_) => return Err(err("fallback_margin_tokens", "must be >= 0")),
            };
        let cache_entries = match positive("cache_entries", raw.cache_entries)? {
            None => DEFAULT_CACHE_ENTRIES,
            Some(n) if n <= 1 << 20 => n as u32,
            Some(_) => return Err(err("cache_entries", "must be <= 1048576")),
        };
        let max_body_bytes = match positive("max_body_bytes", raw.max_body_bytes)? {
            None => DEFAULT_MAX_BODY_BYTES,
            Some(n) if n <= 1 << 30 => n as usize,
            Some(_) => return Err(err("max_body_bytes", "must be <= 1073741824")),
        };
        let on_insufficient = match string("on_insufficient", raw.on_insufficient)?.as_deref() {
            None | Some("passthrough") => OnInsufficient::Passthrough,
            Some("reject") => OnInsufficient::Reject,
            Some(_) => {
                return Err(err(
                    "on_insufficient",
                    "must be \"passthrough\" or \"reject\"",
                ))
            }
        };
        let response_headers = boolean("response_headers", raw.response_headers, true)?;
        let estimate_constrained =
            boolean("estimate_constrained", raw.estimate_constrained, false)?;
        let exclude_tools_when_tool_choice_none = boolean(
            "exclude_tools_when_tool_choice_none",
            raw.exclude_tools_when_tool_choice_none,
            false,
        )?;
        let translate_errors = boolean("translate_errors", raw.translate_errors, true)?;
        let window_ttl_ms =
            positive("window_ttl_ms", raw.window_ttl_ms)?.unwrap_or(DEFAULT_WINDOW_TTL_MS);
        if exclude_tools_when_tool_choice_none && tokenizer.backend != Backend::Vllm {
            return Err(err(
                "exclude_tools_when_tool_choice_none",
                "is a vllm setting (tokenizer.backend is not vllm)",
            ));
        }
        let skip_count = boolean("skip_count", raw.skip_count, false)?;
        if skip_count && tokenizer.backend != Backend::Vllm {
            return Err(err(
                "skip_count",
                "is a vllm setting (tokenizer.backend is not vllm)",
            ));
        }
        let config = Config {
            tokenizer,
            models,
            context_length,
            window_tokens,
            min_output_tokens,
            fallback_margin_tokens,
            cache_entries,
            max_body_bytes,
            on_insufficient,
            response_headers,
            estimate_constrained,
            exclude_tools_when_tool_choice_none,
            skip_count,
            translate_errors,
            window_ttl_ms,
        };
        config.check_window()?;
        Ok(config)
    }

    /// Replaces every `{"env": NAME}` header value by the variable's value. A missing or
    /// unusable variable is an error naming the header (never its value).
    pub fn resolve_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for (name, value) in &mut self.tokenizer.headers {
            if let HeaderValue::Env(var) = value {
                let field = format!("tokenizer.headers.{name}");
                let resolved = lookup(var)
                    .ok_or_else(|| err(&field, format!("environment variable {var} is not set")))?;
                if resolved.is_empty() || !valid_header_value(&resolved) {
                    return Err(err(
                        &field,
                        format!("environment variable {var} is empty or has control characters"),
                    ));
                }
                *value = HeaderValue::Literal(resolved);
            }
        }
        Ok(())
    }

    /// The tokenizer headers with literal values (after `resolve_env`).
    pub fn literal_headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tokenizer.headers.iter().filter_map(|(k, v)| match v {
            HeaderValue::Literal(v) => Some((k.as_str(), v.as_str())),
            HeaderValue::Env(_) => None,
        })
    }

    /// The startup checks on W, C, R and F that can be made before anything is learned.
    fn check_window(&self) -> Result<(), ConfigError> {
        if let (Some(w), Some(c)) = (self.window_tokens, self.context_length) {
            if w > c {
                return Err(err(
                    "window_tokens",
                    format!("{w} exceeds context_length {c}"),
                ));
            }
        }
        if let Some(w) = self.window() {
            self.check_against(w)?;
        }
        Ok(())
    }

    /// Checks R and F against a window W (at startup, or when W is learned).
    pub fn check_against(&self, w: u64) -> Result<(), ConfigError> {
        let field = if self.window_tokens.is_some() {
            "window_tokens"
        } else {
            "context_length"
        };
        let (r, f) = (self.min_output_tokens, self.fallback_margin_tokens);
        if f >= w {
            return Err(err(
                "fallback_margin_tokens",
                format!("{f} must be below the window {w} ({field})"),
            ));
        }
        if r >= w {
            return Err(err(
                "min_output_tokens",
                format!("{r} must be below the window {w} ({field})"),
            ));
        }
        if f.saturating_add(r) >= w {
            return Err(err(
                "min_output_tokens",
                format!("fallback_margin_tokens + min_output_tokens ({f} + {r}) must be below the window {w} ({field})"),
            ));
        }
        Ok(())
    }

    /// W as configured: `window_tokens`, else `context_length`, else unknown.
    pub fn window(&self) -> Option<u64> {
        self.window_tokens.or(self.context_length)
    }

    /// W given a learned context length (used when `context_length` is not configured).
    pub fn window_with(&self, learned_c: u64) -> u64 {
        self.window_tokens.map_or(learned_c, |w| w.min(learned_c))
    }

    /// One log line's worth: counts and names only, never header values.
    pub fn summary(&self) -> String {
        let t = &self.tokenizer;
        format!(
            "configured; backend {}, tokenizer cluster {}, context_length {:?}, window {:?}, reserve {}, margin {}",
            t.backend.as_str(),
            t.cluster,
            self.context_length,
            self.window(),
            self.min_output_tokens,
            self.fallback_margin_tokens
        )
    }

    /// Whether a request's `model` is budgeted.
    pub fn accepts_model(&self, model: Option<&str>) -> bool {
        match (&self.models, model) {
            (None, _) => true,
            (Some(list), Some(m)) => list.iter().any(|x| x == m),
            (Some(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s.as_bytes())
    }

    fn field_of(s: &str) -> String {
        parse(s).unwrap_err().field
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(r#"{"tokenizer":{"cluster":"vllm"}}"#).unwrap();
        assert_eq!(c.tokenizer.cluster, "vllm");
        assert_eq!(c.tokenizer.authority, "vllm");
        assert_eq!(c.tokenizer.path, "/tokenize");
        assert_eq!(c.tokenizer.timeout_ms, 30_000);
        assert_eq!(c.min_output_tokens, 4096);
        assert_eq!(c.fallback_margin_tokens, 1024);
        assert_eq!(c.cache_entries, 4096);
        assert_eq!(c.max_body_bytes, 8 * 1024 * 1024);
        assert_eq!(c.on_insufficient, OnInsufficient::Passthrough);
        assert!(c.response_headers);
        assert!(c.translate_errors);
        assert_eq!(c.window_ttl_ms, 60_000);
        assert_eq!(c.window(), None);
        assert!(c.accepts_model(Some("anything")));
    }

    #[test]
    fn full_config_from_spec_parses() {
        let c = parse(
            r#"{"tokenizer":{"backend":"vllm","cluster":"vllm","authority":"vllm:8000","path":"/tokenize",
            "timeout_ms":30000,"headers":{"authorization":"Bearer x"}},"model":"Qwen/Qwen3-8B",
            "context_length":32768,"window_tokens":32768,"min_output_tokens":4096,
            "fallback_margin_tokens":1024,"cache_entries":4096,"max_body_bytes":8388608,
            "on_insufficient":"passthrough","response_headers":true}"#,
        )
        .unwrap();
        assert_eq!(
            c.tokenizer.headers,
            vec![(
                "authorization".to_string(),
                HeaderValue::Literal("Bearer x".to_string())
            )]
        );
        assert_eq!(c.models, Some(vec!["Qwen/Qwen3-8B".to_string()]));
        assert_eq!(c.window(), Some(32768));
        assert!(!c.accepts_model(Some("other")));
        assert!(!c.accepts_model(None));
    }

    #[test]
    fn refusals_name_the_field() {
        assert_eq!(field_of("{"), "(root)");
        assert_eq!(field_of("[]"), "(root)");
        assert_eq!(field_of(r#"{}"#), "tokenizer");
        assert_eq!(field_of(r#"{"tokenizer":{}}"#), "tokenizer.cluster");
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"colour":1}"#),
            "colour"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v","tiemout_ms":1}}"#),
            "tokenizer.tiemout_ms"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v","backend":"tgi"}}"#),
            "tokenizer.backend"
        );
        assert_eq!(
            field_of(
                r#"{"tokenizer":{"cluster":"v","backend":"sglang"},"exclude_tools_when_tool_choice_none":true}"#
            ),
            "exclude_tools_when_tool_choice_none"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"min_output_tokens":0}"#),
            "min_output_tokens"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"min_output_tokens":-5}"#),
            "min_output_tokens"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"fallback_margin_tokens":-1}"#),
            "fallback_margin_tokens"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v","timeout_ms":0}}"#),
            "tokenizer.timeout_ms"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"cache_entries":0}"#),
            "cache_entries"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"max_body_bytes":0}"#),
            "max_body_bytes"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"on_insufficient":"drop"}"#),
            "on_insufficient"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"response_headers":"yes"}"#),
            "response_headers"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"translate_errors":1}"#),
            "translate_errors"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"window_ttl_ms":0}"#),
            "window_ttl_ms"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"model":[]}"#),
            "model"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v"},"min_output_tokens":1.5}"#),
            "min_output_tokens"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v","headers":{"X-Key":"a"}}}"#),
            "tokenizer.headers"
        );
        assert_eq!(
            field_of(r#"{"tokenizer":{"cluster":"v","path":"tokenize"}}"#),
            "tokenizer.path"
        );
    }

    #[test]
    fn unknown_key_names_survive_odd_characters() {
        assert_eq!(field_of(r#"{"tokenizer":{"cluster":"v"},"a`b":1}"#), "a`b");
        assert_eq!(
            field_of("{\"tokenizer\":{\"cluster\":\"v\"},\"a\\nb\":1}"),
            "a\\nb"
        );
    }

    #[test]
    fn window_refusals() {
        let base = r#"{"tokenizer":{"cluster":"v"},"#;
        // W > C
        assert_eq!(
            field_of(&format!(
                r#"{base}"context_length":1000,"window_tokens":1001}}"#
            )),
            "window_tokens"
        );
        // F >= W
        assert_eq!(
            field_of(&format!(
                r#"{base}"context_length":1000,"fallback_margin_tokens":1000,"min_output_tokens":1}}"#
            )),
            "fallback_margin_tokens"
        );
        // R >= W
        assert_eq!(
            field_of(&format!(
                r#"{base}"context_length":1000,"fallback_margin_tokens":0,"min_output_tokens":1000}}"#
            )),
            "min_output_tokens"
        );
        // F + R >= W, and the boundary F + R = W - 1 is accepted
        assert_eq!(
            field_of(&format!(
                r#"{base}"context_length":1000,"fallback_margin_tokens":500,"min_output_tokens":500}}"#
            )),
            "min_output_tokens"
        );
        assert!(parse(&format!(
            r#"{base}"context_length":1000,"fallback_margin_tokens":500,"min_output_tokens":499}}"#
        ))
        .is_ok());
        // window_tokens alone is checked too
        assert!(parse(&format!(r#"{base}"window_tokens":4000}}"#)).is_err());
    }

    #[test]
    fn learned_window_is_capped_by_configured_window() {
        let c = parse(r#"{"tokenizer":{"cluster":"v"},"window_tokens":8000,"min_output_tokens":10,"fallback_margin_tokens":10}"#).unwrap();
        assert_eq!(c.window_with(32768), 8000);
        assert_eq!(c.window_with(4000), 4000);
        assert!(c.check_against(20).is_err());
        assert!(c.check_against(21).is_ok());
    }

    #[test]
    fn header_values_from_environment() {
        let mut c = parse(
            r#"{"tokenizer":{"cluster":"v","headers":{"authorization":{"env":"TOKEN"},"x-a":"b"}}}"#,
        )
        .unwrap();
        let mut missing = c.clone();
        let e = missing.resolve_env(|_| None).unwrap_err();
        assert_eq!(e.field, "tokenizer.headers.authorization");
        assert!(!e.to_string().contains("secret"));
        assert_eq!(c.literal_headers().count(), 1);
        c.resolve_env(|name| (name == "TOKEN").then(|| "Bearer secret".to_string()))
            .unwrap();
        let headers: Vec<_> = c.literal_headers().collect();
        assert_eq!(
            headers,
            vec![("authorization", "Bearer secret"), ("x-a", "b")]
        );
        assert!(parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":{"file":"x"}}}}"#).is_err());
        assert!(parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":{"env":""}}}}"#).is_err());
        let mut bad =
            parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":{"env":"X"}}}}"#).unwrap();
        assert!(bad.resolve_env(|_| Some("a\nb".to_string())).is_err());
    }

    #[test]
    fn error_display_names_field() {
        let e = parse(r#"{"tokenizer":{"cluster":"v"},"bogus":1}"#).unwrap_err();
        assert!(e.to_string().contains("`bogus`"), "{e}");
    }
}
