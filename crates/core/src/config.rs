//! Plugin configuration (docs/spec.md §8, §16): typed parsing and validation, with errors that
//! name the field.
//!
//! The JSON is deserialized into typed shapes (`serde` derive, unknown keys refused); each value
//! type checks itself (an integer in its range, a non-empty string, a header), so the field
//! of every deserialization error is the path the deserializer was at. The checks that relate
//! fields (W ≤ C, F + R < W, a model named twice) name their fields themselves.

use crate::json::path;
use raw::*;
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
    /// vLLM's render API (docs/spec.md §16).
    VllmRender,
}

impl Backend {
    pub const ALL: [Backend; 4] = [
        Backend::Vllm,
        Backend::Sglang,
        Backend::Llamacpp,
        Backend::VllmRender,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Vllm => "vllm",
            Backend::Sglang => "sglang",
            Backend::Llamacpp => "llamacpp",
            Backend::VllmRender => "vllm-render",
        }
    }

    /// Whether its counts keep the bound's assumptions (docs/spec.md §15): a byte-level BPE
    /// tokenizer and a template whose conversation renders as its messages do, measured for
    /// vLLM's `/tokenize`, `count_tokens` and render API, SGLang's `/tokenize` and llama.cpp's
    /// counters (docs/backends.md).
    pub fn keeps_the_bound(self) -> bool {
        matches!(
            self,
            Backend::Vllm | Backend::VllmRender | Backend::Sglang | Backend::Llamacpp
        )
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

/// The validated configuration the filter runs with: the top level, or one route resolved
/// as a whole configuration (the top level's values with the route's overrides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// At a top level without a tokenizer of its own (every route has one), the first
    /// route's; `models` is then empty, so no request is counted there.
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
    /// Skip the count where a bound proves the outcome (docs/spec.md §15, §15a), as set;
    /// unset means on where the backend keeps the bound's assumptions ([`Config::skips`]).
    pub skip_count: Option<bool>,
    /// Translate the server's window errors into the client dialect's (docs/spec.md §13).
    pub translate_errors: bool,
    /// How long a learned window no count call refreshes is trusted.
    pub window_ttl_ms: u64,
    /// The routes (docs/spec.md §16), each resolved; empty in a route itself.
    pub routes: Vec<Config>,
    /// A route's name (its metrics' and shared data's scope); empty at the top level.
    pub name: String,
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

/// Whether `name` may name a route: it becomes part of metric names.
fn route_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A route's default name: its first model, every other character as `_`, at most 64.
fn default_route_name(model: &str) -> String {
    let name: String = model
        .chars()
        .take(64)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() {
        "_".to_string()
    } else {
        name
    }
}

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

pub const DEFAULT_MIN_OUTPUT_TOKENS: u64 = 4096;
pub const DEFAULT_FALLBACK_MARGIN_TOKENS: u64 = 1024;
pub const DEFAULT_CACHE_ENTRIES: u32 = 65536;
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_WINDOW_TTL_MS: u64 = 60_000;
pub const DEFAULT_PATH: &str = "/tokenize";

impl Config {
    /// Parses and validates the plugin configuration (a JSON object).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| err("(root)", format!("bad JSON: {e}")))?;
        if !value.is_object() {
            return Err(err("(root)", "must be a JSON object"));
        }
        let raw: RawConfig = path::deserialize(value).map_err(|e| {
            // One log line: control characters (a key may hold any) are escaped.
            let message: String = e
                .error
                .to_string()
                .chars()
                .flat_map(|c| {
                    let escaped = c.is_control().then(|| c.escape_debug());
                    escaped
                        .into_iter()
                        .flatten()
                        .chain((!c.is_control()).then_some(c))
                })
                .collect();
            err(&field_of(&e.path), message)
        })?;
        let routes = raw.routes.unwrap_or_default();
        let own_tokenizer = match raw.tokenizer {
            Some(t) => Some(resolve_tokenizer(t, "")?),
            None if routes.is_empty() => return Err(err("tokenizer", "required")),
            None => None,
        };
        let mut top = Config {
            tokenizer: TokenizerConfig {
                backend: Backend::Vllm,
                cluster: String::new(),
                authority: String::new(),
                path: DEFAULT_PATH.to_string(),
                timeout_ms: DEFAULT_TIMEOUT_MS,
                headers: Vec::new(),
            },
            models: raw.model.map(|m| m.0),
            context_length: raw.context_length.map(|v| v.0),
            window_tokens: raw.window_tokens.map(|v| v.0),
            min_output_tokens: raw
                .min_output_tokens
                .map_or(DEFAULT_MIN_OUTPUT_TOKENS, |v| v.0),
            fallback_margin_tokens: raw
                .fallback_margin_tokens
                .map_or(DEFAULT_FALLBACK_MARGIN_TOKENS, |v| v.0),
            // Both bounded to 32 bits by their types.
            cache_entries: raw
                .cache_entries
                .map_or(DEFAULT_CACHE_ENTRIES, |v| v.0 as u32),
            max_body_bytes: raw
                .max_body_bytes
                .map_or(DEFAULT_MAX_BODY_BYTES, |v| v.0 as usize),
            on_insufficient: raw.on_insufficient.unwrap_or(OnInsufficient::Passthrough),
            response_headers: raw.response_headers.map(|f| f.0).unwrap_or(true),
            estimate_constrained: raw.estimate_constrained.map(|f| f.0).unwrap_or(false),
            exclude_tools_when_tool_choice_none: raw
                .exclude_tools_when_tool_choice_none
                .is_some_and(|f| f.0),
            skip_count: raw.skip_count.map(|f| f.0),
            translate_errors: raw.translate_errors.map(|f| f.0).unwrap_or(true),
            window_ttl_ms: raw.window_ttl_ms.map_or(DEFAULT_WINDOW_TTL_MS, |v| v.0),
            routes: Vec::new(),
            name: String::new(),
        };
        let mut resolved: Vec<Config> = Vec::with_capacity(routes.len());
        for (i, route) in routes.into_iter().enumerate() {
            let prefix = format!("routes[{i}].");
            let config = top.route(route, own_tokenizer.as_ref(), &prefix)?;
            for model in config.models.iter().flatten() {
                if let Some(j) = resolved
                    .iter()
                    .position(|r| r.models.iter().flatten().any(|m| m == model))
                {
                    return Err(err(
                        &format!("{prefix}model"),
                        format!("{model:?} is already named by routes[{j}]"),
                    ));
                }
            }
            if let Some(j) = resolved.iter().position(|r| r.name == config.name) {
                return Err(err(
                    &format!("{prefix}name"),
                    format!("{:?} is already the name of routes[{j}]", config.name),
                ));
            }
            config.check(&prefix)?;
            resolved.push(config);
        }
        match own_tokenizer {
            Some(t) => {
                top.tokenizer = t;
                top.check("")?;
            }
            None => {
                // Models no route names pass unchanged (`model`).
                if let Some(first) = resolved.first() {
                    top.tokenizer = TokenizerConfig {
                        headers: Vec::new(),
                        ..first.tokenizer.clone()
                    };
                }
                top.models = Some(Vec::new());
            }
        }
        top.routes = resolved;
        Ok(top)
    }

    /// A route resolved over this top level, before its checks.
    fn route(
        &self,
        raw: RawRoute,
        tokenizer: Option<&TokenizerConfig>,
        prefix: &str,
    ) -> Result<Config, ConfigError> {
        let models = raw
            .model
            .ok_or_else(|| err(&format!("{prefix}model"), "required"))?
            .0;
        let name = match raw.name {
            Some(name) if route_name_ok(&name) => name,
            Some(_) => {
                return Err(err(
                    &format!("{prefix}name"),
                    "must be 1 to 64 of A-Z, a-z, 0-9 and _",
                ))
            }
            // The first model, in the characters a metric name may hold.
            None => models
                .first()
                .map(|m| default_route_name(m))
                .unwrap_or_default(),
        };
        let tokenizer = match raw.tokenizer {
            Some(t) => resolve_tokenizer(t, prefix)?,
            None => tokenizer.cloned().ok_or_else(|| {
                err(
                    &format!("{prefix}tokenizer"),
                    "required (the top level has no tokenizer)",
                )
            })?,
        };
        Ok(Config {
            tokenizer,
            models: Some(models),
            context_length: raw.context_length.map(|v| v.0).or(self.context_length),
            window_tokens: raw.window_tokens.map(|v| v.0).or(self.window_tokens),
            min_output_tokens: raw
                .min_output_tokens
                .map_or(self.min_output_tokens, |v| v.0),
            fallback_margin_tokens: raw
                .fallback_margin_tokens
                .map_or(self.fallback_margin_tokens, |v| v.0),
            on_insufficient: raw.on_insufficient.unwrap_or(self.on_insufficient),
            routes: Vec::new(),
            name,
            ..self.clone()
        })
    }

    /// The checks that relate fields, with `prefix` before every field named.
    fn check(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.exclude_tools_when_tool_choice_none && self.tokenizer.backend != Backend::Vllm {
            return Err(err(
                &format!("{prefix}exclude_tools_when_tool_choice_none"),
                "is a vllm setting (tokenizer.backend is not vllm)",
            ));
        }
        if self.skip_count == Some(true) && !self.tokenizer.backend.keeps_the_bound() {
            return Err(err(
                &format!("{prefix}skip_count"),
                "is a vllm and vllm-render setting (their counts keep the bound's assumptions)",
            ));
        }
        self.check_window().map_err(|e| ConfigError {
            field: format!("{prefix}{}", e.field),
            ..e
        })
    }

    /// Parses a configuration, then resolves its `{"env": NAME}` header values with `lookup`
    /// (what a glue does when its host loads the configuration).
    pub fn load(
        bytes: &[u8],
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::parse(bytes)?;
        config.resolve_env(lookup)?;
        Ok(config)
    }

    /// Replaces every `{"env": NAME}` header value by the variable's value. A missing or
    /// unusable variable is an error naming the header (never its value).
    pub fn resolve_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        self.resolve_env_at(&lookup, "")?;
        for (i, route) in self.routes.iter_mut().enumerate() {
            route.resolve_env_at(&lookup, &format!("routes[{i}]."))?;
        }
        Ok(())
    }

    fn resolve_env_at(
        &mut self,
        lookup: &impl Fn(&str) -> Option<String>,
        prefix: &str,
    ) -> Result<(), ConfigError> {
        for (name, value) in &mut self.tokenizer.headers {
            if let HeaderValue::Env(var) = value {
                let field = format!("{prefix}tokenizer.headers.{name}");
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
        let mut out = if self.models.as_ref().is_some_and(Vec::is_empty) {
            "configured; no tokenizer at the top level".to_string()
        } else {
            format!("configured; {}", self.route_summary())
        };
        for (i, route) in self.routes.iter().enumerate() {
            let models = route.models.as_ref().map_or(0, Vec::len);
            out.push_str(&format!(
                "; routes[{i}] {} ({models} model(s)): {}",
                route.name,
                route.route_summary()
            ));
        }
        out
    }

    fn route_summary(&self) -> String {
        let t = &self.tokenizer;
        format!(
            "backend {}, tokenizer cluster {}, context_length {:?}, window {:?}, reserve {}, margin {}",
            t.backend.as_str(),
            t.cluster,
            self.context_length,
            self.window(),
            self.min_output_tokens,
            self.fallback_margin_tokens
        )
    }

    /// Whether a request's `model` is budgeted: by the route that names it, or here.
    pub fn accepts_model(&self, model: Option<&str>) -> bool {
        if self.route_of(model).is_some() {
            return true;
        }
        match (&self.models, model) {
            (None, _) => true,
            (Some(list), Some(m)) => list.iter().any(|x| x == m),
            (Some(_), None) => false,
        }
    }

    /// Whether a bound may stand in for a count (docs/spec.md §15a): on by default where the
    /// backend keeps the bound's assumptions, off with `skip_count: false`.
    pub fn skips(&self) -> bool {
        self.skip_count.unwrap_or(true) && self.tokenizer.backend.keeps_the_bound()
    }

    /// The route that names `model`, if any (docs/spec.md §16).
    pub fn route_of(&self, model: Option<&str>) -> Option<usize> {
        let model = model?;
        self.routes
            .iter()
            .position(|r| r.models.iter().flatten().any(|m| m == model))
    }
}

mod raw;
#[cfg(test)]
mod tests;
