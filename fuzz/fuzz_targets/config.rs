//! Plugin configuration (docs/spec.md §8): `Config::parse` on arbitrary bytes never panics, and every
//! accepted configuration satisfies the startup checks: R > 0, F ≥ 0, W ≤ C, F < W, R < W,
//! F + R < W when W is known, timeout > 0, cache_entries and max_body_bytes > 0, a path that
//! starts with `/`, a non-empty cluster, lowercase header names. Accepted input is valid JSON.
//! The run-time window check (`check_against`) agrees with F + R < W for learned windows.
//! Each route (docs/spec.md §16) satisfies the same checks, and names its own models only.
#![no_main]

mod common;

use common::{json_value, show};
use incontext_core::config::{Config, HeaderValue};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    let config = match Config::parse(data) {
        Ok(c) => c,
        Err(e) => {
            // The field is named (a key spelled "" as `""`).
            assert!(!e.field.is_empty(), "error without a field: {e:?}");
            let _ = e.to_string();
            return;
        }
    };
    let ctx = || format!("{config:?}\ninput: {}", show(data));
    match json_value(data) {
        Err(e) => panic!("accepted invalid JSON ({e}): {}", ctx()),
        Ok(Some(v)) => assert!(v.is_object(), "{}", ctx()),
        Ok(None) => {}
    }
    // Every route is a whole configuration; a model is named by one route at most; the top
    // level without a tokenizer budgets no model of its own.
    let mut named = std::collections::HashSet::new();
    for route in &config.routes {
        assert!(route.routes.is_empty(), "{}", ctx());
        for m in route.models.iter().flatten() {
            assert!(named.insert(m.clone()), "{m:?} named twice: {}", ctx());
            assert_eq!(
                config
                    .routes
                    .get(config.route_of(Some(m)).unwrap_or(usize::MAX)),
                Some(route),
                "{}",
                ctx()
            );
            assert!(config.accepts_model(Some(m)), "{}", ctx());
        }
        level(route, data);
    }
    level(&config, data);

    // Parsing is deterministic.
    assert_eq!(Config::parse(data).as_ref(), Ok(&config));
}

/// The checks every level (the top level, each route) satisfies.
fn level(config: &Config, data: &[u8]) {
    let ctx = || format!("{config:?}\ninput: {}", show(data));
    let (r, f) = (config.min_output_tokens, config.fallback_margin_tokens);
    assert!(r > 0, "R = 0: {}", ctx());
    if let (Some(w), Some(c)) = (config.window_tokens, config.context_length) {
        assert!(w <= c, "W > C: {}", ctx());
    }
    assert_eq!(
        config.window(),
        config.window_tokens.or(config.context_length)
    );
    if let Some(w) = config.window() {
        assert!(f < w && r < w, "F or R not below W: {}", ctx());
        assert!(
            u128::from(f) + u128::from(r) < u128::from(w),
            "F + R >= W: {}",
            ctx()
        );
    }
    assert!(config.tokenizer.timeout_ms > 0, "{}", ctx());
    assert!(config.cache_entries > 0, "{}", ctx());
    assert!(config.max_body_bytes > 0, "{}", ctx());
    assert!(config.tokenizer.path.starts_with('/'), "{}", ctx());
    assert!(!config.tokenizer.cluster.is_empty(), "{}", ctx());
    assert!(!config.tokenizer.authority.is_empty(), "{}", ctx());
    for (name, value) in &config.tokenizer.headers {
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)),
            "header name {name:?}: {}",
            ctx()
        );
        assert!(!["content-type", "content-length", "host"].contains(&name.as_str()));
        match value {
            HeaderValue::Literal(v) => assert!(
                !v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
                "{}",
                ctx()
            ),
            HeaderValue::Env(var) => assert!(!var.is_empty(), "{}", ctx()),
        }
    }

    // Resolving `{"env": NAME}` values: with every variable set to a clean value all become
    // literals; with none set, an error only when some value names a variable.
    let mut resolved = config.clone();
    resolved
        .resolve_env(|var| Some(format!("v-{}", var.len())))
        .expect("clean values resolve");
    assert!(resolved
        .tokenizer
        .headers
        .iter()
        .all(|(_, v)| matches!(v, HeaderValue::Literal(_))));
    assert_eq!(
        resolved.literal_headers().count(),
        config.tokenizer.headers.len()
    );
    let has_env = std::iter::once(config)
        .chain(&config.routes)
        .flat_map(|c| &c.tokenizer.headers)
        .any(|(_, v)| matches!(v, HeaderValue::Env(_)));
    assert_eq!(
        config.clone().resolve_env(|_| None).is_err(),
        has_env,
        "{}",
        ctx()
    );
    assert_eq!(
        config
            .clone()
            .resolve_env(|_| Some("a\r\nb".into()))
            .is_err(),
        has_env,
        "{}",
        ctx()
    );
    if let Some(models) = &config.models {
        assert!(
            (!models.is_empty() || !config.routes.is_empty())
                && models.iter().all(|m| !m.is_empty()),
            "{}",
            ctx()
        );
    }

    // Learned windows: check_against(w) accepts exactly when F + R < W (hence F, R < W).
    for w in [
        1,
        r,
        f,
        r.saturating_add(f),
        r.saturating_add(f).saturating_add(1),
        512,
        32768,
        u64::MAX,
    ] {
        let ok = config.check_against(w).is_ok();
        assert_eq!(
            ok,
            u128::from(f) + u128::from(r) < u128::from(w),
            "check_against({w}): {}",
            ctx()
        );
        let lw = config.window_with(w);
        assert!(
            lw <= w && config.window_tokens.is_none_or(|cw| lw <= cw),
            "{}",
            ctx()
        );
    }
}

fuzz_target!(|data: &[u8]| check(data));
