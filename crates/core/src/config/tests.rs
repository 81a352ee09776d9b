//! The configuration's parsing and checks.

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
    assert_eq!(c.cache_entries, 65536);
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
        "fallback_margin_tokens":1024,"cache_entries":65536,"max_body_bytes":8388608,
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
    let mut bad = parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":{"env":"X"}}}}"#).unwrap();
    assert!(bad.resolve_env(|_| Some("a\nb".to_string())).is_err());
}

#[test]
fn error_display_names_field() {
    let e = parse(r#"{"tokenizer":{"cluster":"v"},"bogus":1}"#).unwrap_err();
    assert!(e.to_string().contains("`bogus`"), "{e}");
}

#[test]
fn fields_come_from_the_deserializer_path() {
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v","headers":{"a":5}}}"#),
        "tokenizer.headers.a"
    );
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v"},"model":["a",""]}"#),
        "model[1]"
    );
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v"},"cache_entries":2000000}"#),
        "cache_entries"
    );
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v","timeout_ms":4294967296}}"#),
        "tokenizer.timeout_ms"
    );
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v"},"min_output_tokens":18446744073709551615}"#),
        "min_output_tokens"
    );
    assert_eq!(field_of(r#"{"tokenizer":{"cluster":"v"},"":1}"#), "\"\"");
    // A header value is never repeated in the message.
    let e = parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":["secret"]}}}"#).unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
    let e = parse(r#"{"tokenizer":{"cluster":"v","headers":{"a":{"env":"X","k":"secret"}}}}"#)
        .unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
}

const TWO: &str = r#"{"routes":[
    {"model":"coder","tokenizer":{"cluster":"a"},"context_length":8192,"min_output_tokens":100},
    {"model":["small","fast"],"tokenizer":{"cluster":"b","backend":"sglang"},"window_tokens":2048,
     "min_output_tokens":64,"fallback_margin_tokens":32,"on_insufficient":"reject"}]}"#;

#[test]
fn routes_are_named() {
    let c = parse(TWO).unwrap();
    let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["coder", "small"]);
    let named = parse(
        r#"{"tokenizer":{"cluster":"v"},"routes":[{"name":"big_1","model":"Qwen/Qwen3-8B"},{"model":"Qwen/Qwen3-8B-FP8"}]}"#,
    )
    .unwrap();
    let names: Vec<&str> = named.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["big_1", "Qwen_Qwen3_8B_FP8"]);
    let field = |s: &str| parse(s).unwrap_err().field;
    assert_eq!(
        field(r#"{"tokenizer":{"cluster":"v"},"routes":[{"name":"a.b","model":"m"}]}"#),
        "routes[0].name"
    );
    assert_eq!(
        field(r#"{"tokenizer":{"cluster":"v"},"routes":[{"name":"","model":"m"}]}"#),
        "routes[0].name"
    );
    assert_eq!(
        field(r#"{"tokenizer":{"cluster":"v"},"routes":[{"model":"a-b"},{"model":"a.b"}]}"#),
        "routes[1].name"
    );
}

#[test]
fn routes_resolve_over_the_top_level() {
    let c = parse(TWO).unwrap();
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.models, Some(vec![]));
    assert_eq!(c.route_of(Some("coder")), Some(0));
    assert_eq!(c.route_of(Some("fast")), Some(1));
    assert_eq!(c.route_of(Some("other")), None);
    assert_eq!(c.route_of(None), None);
    assert!(c.accepts_model(Some("small")));
    assert!(!c.accepts_model(Some("other")));
    let (a, b) = (&c.routes[0], &c.routes[1]);
    assert_eq!(a.tokenizer.cluster, "a");
    assert_eq!((a.context_length, a.window()), (Some(8192), Some(8192)));
    assert_eq!(a.fallback_margin_tokens, DEFAULT_FALLBACK_MARGIN_TOKENS);
    assert_eq!(a.on_insufficient, OnInsufficient::Passthrough);
    assert_eq!(b.tokenizer.backend, Backend::Sglang);
    assert_eq!((b.context_length, b.window()), (None, Some(2048)));
    assert_eq!(b.on_insufficient, OnInsufficient::Reject);
    assert!(a.routes.is_empty());
    assert!(c
        .summary()
        .contains("routes[1] small (2 model(s)): backend sglang"));

    // With a top-level tokenizer: inherited by a route without one; other models use it.
    let c = parse(
        r#"{"tokenizer":{"cluster":"top"},"context_length":32768,
        "routes":[{"model":"m","window_tokens":16000},{"model":"n","tokenizer":{"cluster":"n"}}]}"#,
    )
    .unwrap();
    assert_eq!(c.models, None);
    assert!(c.accepts_model(Some("other")));
    assert_eq!(c.routes[0].tokenizer.cluster, "top");
    assert_eq!(c.routes[0].window(), Some(16000));
    assert_eq!(c.routes[1].context_length, Some(32768));
    assert_eq!(c.routes[1].tokenizer.cluster, "n");
}

#[test]
fn route_refusals_name_the_field() {
    let route = |r: &str| {
        field_of(&format!(
            r#"{{"tokenizer":{{"cluster":"v"}},"routes":[{{"model":"a"}},{r}]}}"#
        ))
    };
    assert_eq!(route(r#"{"model":"a"}"#), "routes[1].model");
    assert_eq!(route(r#"{"model":["b","a"]}"#), "routes[1].model");
    assert_eq!(route(r#"{}"#), "routes[1].model");
    assert_eq!(route(r#"{"model":[]}"#), "routes[1].model");
    // A model named twice in one route's list (or the top level's) is refused too.
    assert_eq!(route(r#"{"model":["b","b"]}"#), "routes[1].model");
    assert_eq!(
        field_of(r#"{"tokenizer":{"cluster":"v"},"model":["a","b","a"]}"#),
        "model"
    );
    assert_eq!(
        route(r#"{"model":"b","tokenizer":{}}"#),
        "routes[1].tokenizer.cluster"
    );
    assert_eq!(
        route(r#"{"model":"b","tokenizer":{"cluster":5}}"#),
        "routes[1].tokenizer.cluster"
    );
    assert_eq!(
        route(r#"{"model":"b","tokenizer":{"cluster":"c","backend":"tgi"}}"#),
        "routes[1].tokenizer.backend"
    );
    assert_eq!(
        route(r#"{"model":"b","cache_entries":5}"#),
        "routes[1].cache_entries"
    );
    assert_eq!(
        route(r#"{"model":"b","min_output_tokens":0}"#),
        "routes[1].min_output_tokens"
    );
    // Validated as a whole configuration: its own window against the inherited R and F.
    assert_eq!(
        route(r#"{"model":"b","context_length":3000}"#),
        "routes[1].min_output_tokens"
    );
    assert_eq!(
        route(r#"{"model":"b","context_length":30000,"window_tokens":40000}"#),
        "routes[1].window_tokens"
    );
    assert_eq!(
        field_of(r#"{"routes":[{"model":"a","tokenizer":{"cluster":"x"}},{"model":"b"}]}"#),
        "routes[1].tokenizer"
    );
    assert_eq!(
        field_of(
            r#"{"exclude_tools_when_tool_choice_none":true,"routes":[{"model":"a","tokenizer":{"cluster":"x","backend":"llamacpp"}}]}"#
        ),
        "routes[0].exclude_tools_when_tool_choice_none"
    );
    assert_eq!(field_of(r#"{"routes":[]}"#), "tokenizer");
    assert_eq!(field_of(r#"{"routes":{}}"#), "routes");
    // The top level without a tokenizer is not checked as one (nothing is counted there).
    assert_eq!(
        field_of(r#"{"window_tokens":100,"routes":[{"model":"a","tokenizer":{"cluster":"x"}}]}"#),
        "routes[0].fallback_margin_tokens"
    );
    assert!(parse(r#"{"context_length":100,"routes":[{"model":"a","tokenizer":{"cluster":"x"},"context_length":8000,"min_output_tokens":10,"fallback_margin_tokens":10}]}"#).is_ok());
}

#[test]
fn route_headers_resolve_with_their_field() {
    let mut c = parse(
        r#"{"routes":[{"model":"a","tokenizer":{"cluster":"x","headers":{"authorization":{"env":"A"}}}}]}"#,
    )
    .unwrap();
    assert!(c.tokenizer.headers.is_empty());
    let e = c.clone().resolve_env(|_| None).unwrap_err();
    assert_eq!(e.field, "routes[0].tokenizer.headers.authorization");
    c.resolve_env(|_| Some("Bearer k".to_string())).unwrap();
    assert_eq!(c.routes[0].literal_headers().count(), 1);
}
