//! The hand-written bindings (src/abi.rs and its hooks) against Envoy's declarations (abi/bound.h, an
//! excerpt of Envoy's abi.h at a pinned commit, written by scripts/module-abi.py): the ABI
//! version, every typedef, enumerator, struct and function signature, both ways. Each C type
//! `envoy_dynamic_module_type_<x>` is the Rust type `<X>` (camel case); `T*` is `*mut T`,
//! `const T*` is `*const T`, a C enum is `u32`.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

const BOUND: &str = include_str!("../abi/bound.h");
const RUST: &str = concat!(
    include_str!("../src/abi.rs"),
    include_str!("../src/abi/hooks.rs")
);
const LIB: &str = include_str!("../src/lib.rs");
const PREFIX: &str = "envoy_dynamic_module_type_";

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn camel(c: &str) -> String {
    c.trim_start_matches(PREFIX)
        .split('_')
        .map(|p| {
            let mut cs = p.chars();
            cs.next()
                .map(|f| f.to_uppercase().chain(cs).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// A C type as the Rust type it binds to.
fn rust_of(c: &str) -> String {
    let c = squash(c);
    let (konst, rest) = match c.strip_prefix("const ") {
        Some(r) => (true, r.to_string()),
        None => (false, c.clone()),
    };
    if let Some(inner) = rest.strip_suffix('*') {
        let inner = match inner.trim() {
            "void" => "c_void".to_string(),
            "char" => "c_char".to_string(),
            other => rust_of(other),
        };
        return format!("{} {inner}", if konst { "*const" } else { "*mut" });
    }
    match rest.as_str() {
        "bool" => "bool".into(),
        "size_t" => "usize".into(),
        "uint64_t" => "u64".into(),
        "uint32_t" => "u32".into(),
        "void" => String::new(),
        t if t.starts_with(PREFIX) => camel(t),
        t => format!("<unknown C type {t}>"),
    }
}

/// A function: its parameter types and its return type ("" for none).
type Sig = (Vec<String>, String);

#[derive(Default, Debug)]
struct Api {
    version: String,
    functions: BTreeMap<String, Sig>,
    /// Type aliases: name → Rust type.
    aliases: BTreeMap<String, String>,
    /// Structs: name → fields (name, Rust type), in order.
    structs: BTreeMap<String, Vec<(String, String)>>,
    /// Enumerators: name → (enum's Rust name, value).
    constants: BTreeMap<String, (String, u64)>,
}

/// Envoy's side, from bound.h (one declaration a line; an enum's or a struct's members one a
/// line).
fn c_api(text: &str) -> Api {
    let mut api = Api::default();
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"));
    while let Some(line) = lines.next() {
        if let Some(v) = line.strip_prefix("#define ENVOY_DYNAMIC_MODULES_ABI_VERSION ") {
            api.version = v.trim_matches('"').to_string();
        } else if let Some(name) = line.strip_prefix("typedef enum ") {
            let name = name.trim_end_matches(" {");
            let mut value = 0u64;
            for m in lines.by_ref().take_while(|l| !l.starts_with('}')) {
                let m = m.trim_end_matches(',');
                let m = match m.split_once('=') {
                    Some((m, v)) => {
                        value = v.trim().parse().expect("a value");
                        m.trim()
                    }
                    None => m,
                };
                api.constants.insert(m.to_string(), (camel(name), value));
                value += 1;
            }
            api.aliases.insert(camel(name), "u32".into());
        } else if let Some(name) = line.strip_prefix("typedef struct ") {
            let name = name.trim_end_matches(" {");
            let fields = lines
                .by_ref()
                .take_while(|l| !l.starts_with('}'))
                .map(|f| {
                    let (ty, n) = f.trim_end_matches(';').rsplit_once(' ').expect("a field");
                    (n.to_string(), rust_of(ty))
                })
                .collect();
            api.structs.insert(camel(name), fields);
        } else if let Some(def) = line.strip_prefix("typedef ") {
            let (base, name) = def
                .trim_end_matches(';')
                .rsplit_once(' ')
                .expect("a typedef");
            api.aliases.insert(camel(name), rust_of(base));
        } else {
            let (head, params) = line.split_once('(').expect("a function");
            let (ret, name) = head.rsplit_once(' ').expect("a return type");
            let types = params
                .trim_end_matches(");")
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty() && *p != "void")
                .map(|p| rust_of(p.rsplit_once(' ').expect("a parameter").0))
                .collect();
            api.functions
                .insert(name.to_string(), (types, rust_of(ret)));
        }
    }
    api
}

/// The Rust side, from abi.rs.
fn rust_api(text: &str) -> Api {
    let mut api = Api::default();
    let flat = squash(text);
    if let Some(v) = flat.split("const ABI_VERSION_C: &CStr = c\"").nth(1) {
        api.version = v.split('"').next().unwrap_or_default().to_string();
    }
    for part in flat.split("fn envoy_dynamic_module_").skip(1) {
        let (name, rest) = part.split_once('(').expect("a function");
        let (params, after) = rest.split_once(')').expect("its parameters");
        let ret = after
            .split(['{', ';'])
            .next()
            .unwrap_or_default()
            .trim()
            .strip_prefix("->")
            .map(squash)
            .unwrap_or_default();
        let types = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| squash(p.split_once(':').expect("name: type").1))
            .collect();
        api.functions
            .insert(format!("envoy_dynamic_module_{name}"), (types, ret));
    }
    for part in flat.split("pub type ").skip(1) {
        let (name, rest) = part.split_once(" = ").expect("an alias");
        let ty = rest.split(';').next().unwrap_or_default();
        api.aliases.insert(name.to_string(), squash(ty));
    }
    for part in flat
        .split("#[repr(C)] #[derive(Clone, Copy)] pub struct ")
        .skip(1)
    {
        let (name, rest) = part.split_once(" {").expect("a struct");
        let fields = rest.split('}').next().unwrap_or_default();
        let fields = fields
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (n, t) = f
                    .trim_start_matches("pub ")
                    .split_once(':')
                    .expect("a field");
                (n.trim().to_string(), squash(t))
            })
            .collect();
        api.structs.insert(name.to_string(), fields);
    }
    for part in flat.split("pub const envoy_dynamic_module_type_").skip(1) {
        let (name, rest) = part.split_once(':').expect("a constant");
        let (ty, value) = rest.split_once('=').expect("its value");
        let value = value.split(';').next().unwrap_or_default().trim();
        api.constants.insert(
            format!("{PREFIX}{name}"),
            (ty.trim().to_string(), value.parse().expect("a number")),
        );
    }
    api
}

/// Every way the Rust side differs from Envoy's.
fn differences(c: &Api, rust: &Api) -> Vec<String> {
    let mut out = Vec::new();
    if c.version != rust.version {
        out.push(format!(
            "ABI version: Envoy {:?}, Rust {:?}",
            c.version, rust.version
        ));
    }
    let names = |m: &BTreeMap<String, Sig>| m.keys().cloned().collect::<BTreeSet<_>>();
    for n in names(&c.functions).symmetric_difference(&names(&rust.functions)) {
        out.push(format!("{n}: declared on one side only"));
    }
    for (n, sig) in &c.functions {
        if let Some(r) = rust.functions.get(n) {
            if r != sig {
                out.push(format!("{n}: Envoy {sig:?}, Rust {r:?}"));
            }
        }
    }
    for (n, ty) in &rust.aliases {
        if c.aliases.get(n) != Some(ty) {
            out.push(format!("type {n} = {ty}: Envoy has {:?}", c.aliases.get(n)));
        }
    }
    for n in c.aliases.keys() {
        if !rust.aliases.contains_key(n) {
            out.push(format!("type {n}: not bound"));
        }
    }
    for (n, fields) in &c.structs {
        if rust.structs.get(n) != Some(fields) {
            out.push(format!(
                "struct {n}: Envoy {fields:?}, Rust {:?}",
                rust.structs.get(n)
            ));
        }
    }
    for n in rust.structs.keys() {
        if !c.structs.contains_key(n) {
            out.push(format!("struct {n}: not in Envoy's"));
        }
    }
    for (n, v) in &rust.constants {
        if c.constants.get(n) != Some(v) {
            out.push(format!("{n} = {v:?}: Envoy has {:?}", c.constants.get(n)));
        }
    }
    out
}

#[test]
fn the_bindings_are_envoys_declarations() {
    let c = c_api(BOUND);
    let rust = rust_api(RUST);
    // What the checks cover, so that a parser that read nothing cannot pass.
    assert_eq!(c.functions.len(), 49);
    assert_eq!(rust.functions.len(), 49);
    assert_eq!(c.structs.len(), 4);
    assert!(c.structs.values().all(|f| !f.is_empty()));
    assert_eq!(rust.constants.len(), 21);
    assert_eq!(c.version, "v0.1.0");
    let diff = differences(&c, &rust);
    assert!(
        diff.is_empty(),
        "bindings differ from abi/bound.h:\n{}",
        diff.join("\n")
    );
    assert!(LIB.contains(&format!("pub const ABI_VERSION: &str = \"{}\";", c.version)));
}

#[test]
fn a_binding_that_differs_is_named() {
    let c = c_api(BOUND);
    let cases = [
        (
            "number_of_bytes: usize,",
            "number_of_bytes: u32,",
            "envoy_dynamic_module_callback_http_drain_body",
        ),
        (
            "OnHttpFilterRequestBodyStatus = 3;",
            "OnHttpFilterRequestBodyStatus = 2;",
            "request_body_status_StopIterationNoBuffer",
        ),
        (
            "pub length: usize,",
            "pub length: u64,",
            "struct EnvoyBuffer",
        ),
        ("c\"v0.1.0\"", "c\"v0.2.0\"", "ABI version"),
        (
            "pub type HttpFilterEnvoyPtr = *mut c_void;",
            "pub type HttpFilterEnvoyPtr = *const c_void;",
            "type HttpFilterEnvoyPtr",
        ),
        (
            ") -> HttpCalloutInitResult;",
            ") -> u32;",
            "envoy_dynamic_module_callback_http_filter_http_callout",
        ),
    ];
    for (from, to, named) in cases {
        assert!(RUST.contains(from), "{from}");
        let changed = RUST.replacen(from, to, 1);
        let diff = differences(&c, &rust_api(&changed));
        assert!(
            diff.iter().any(|d| d.contains(named)),
            "{from} -> {to}: {diff:?}"
        );
    }
}
