//! Every hook Envoy calls runs whole under the panic guard: its body is one call of
//! `guarded` (or of `on_stream` / `on_slot`, which are), or it has nothing to do. Read from
//! the source, as the hooks are compiled into the module only.

#![allow(clippy::expect_used)]

const HOOKS: &str = include_str!("../src/abi/hooks.rs");

/// Each `extern "C"` function of the hooks: its name and its body (the statements between its
/// braces), from the source.
fn hooks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("extern \"C\" fn ") {
        let after = &rest[at + "extern \"C\" fn ".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body starts at the first brace: a signature has none.
        let open = after.find('{').expect("a body");
        let mut depth = 0;
        let mut close = open;
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, after[open + 1..close].to_string()));
        rest = &after[close..];
    }
    out
}

/// The body's code, comments left out.
fn code(body: &str) -> String {
    body.lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn guarded(body: &str) -> bool {
    let code = code(body);
    if code.is_empty() {
        return true;
    }
    let guards = ["guarded(", "on_stream(", "on_slot("];
    // The first call the body makes is a guard, and nothing comes before it but a closure
    // it is handed or the wrapping of its result.
    let first = guards.iter().filter_map(|g| code.find(g)).min();
    let Some(first) = first else {
        return false;
    };
    let before = &code[..first];
    before.is_empty()
        || before
            .trim_end()
            .trim_end_matches(|c: char| c == '(' || c == '{' || c.is_whitespace())
            .split_whitespace()
            .all(|w| ["unsafe", "head_status(unsafe", "data_status(unsafe"].contains(&w))
        || (before.starts_with("let hook = |") && code.contains("on_slot("))
}

#[test]
fn every_hook_runs_under_the_panic_guard() {
    let all = hooks(HOOKS);
    assert_eq!(
        all.len(),
        25,
        "{:?}",
        all.iter().map(|h| &h.0).collect::<Vec<_>>()
    );
    let bare: Vec<&String> = all
        .iter()
        .filter(|(_, body)| !guarded(body))
        .map(|(name, _)| name)
        .collect();
    assert!(bare.is_empty(), "hooks outside the guard: {bare:?}");
}

#[test]
fn a_hook_outside_the_guard_is_named() {
    let text = HOOKS.replacen(
        "    guarded(null(), || {\n        log::error!(\"incontext: per-route",
        "    log::error!(\"x\");\n    guarded(null(), || {\n        log::error!(\"incontext: per-route",
        1,
    );
    assert_ne!(text, HOOKS);
    let bare: Vec<String> = hooks(&text)
        .into_iter()
        .filter(|(_, body)| !guarded(body))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        bare,
        ["envoy_dynamic_module_on_http_filter_per_route_config_new"]
    );
}
