//! The flow's modules use each other in one direction: only `mod.rs` names the driver
//! (`exchange`), and no two modules reach each other, directly or through others. Read from
//! the sources as they are on disk when the test runs.

use std::collections::{BTreeMap, BTreeSet};

/// A module's uses: the flow modules a file names through `super::` or `crate::flow::`
/// (a name `mod.rs` re-exports counts as its own module's).
fn uses(
    text: &str,
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = BTreeSet::new();
    for prefix in ["super::", "crate::flow::"] {
        for (at, _) in text.match_indices(prefix) {
            for name in first_segments(&text[at + prefix.len()..]) {
                if modules.contains(&name) {
                    found.insert(name);
                } else if let Some(module) = reexports.get(&name) {
                    found.insert(module.clone());
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The first segment of a path (`count` of `count::send`), or of each path in a group
/// (`{check, context::learn, Metric}`).
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let mut names = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if c.is_whitespace() => {}
            _ if item_start && depth == 0 => {
                names.push(ident(&group[i..]));
                item_start = false;
            }
            _ => {}
        }
    }
    names
}

/// What is wrong with the flow's layout, given its files (`name.rs`, text): each module but
/// `mod.rs` that names `exchange`, then each set of modules that use each other.
fn problems(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(name, _)| name.strip_suffix(".rs"))
        .filter(|m| *m != "mod")
        .map(str::to_string)
        .collect();
    let mut reexports = BTreeMap::new();
    if let Some((_, root)) = files.iter().find(|(name, _)| name == "mod.rs") {
        for line in root.lines().map(str::trim) {
            let Some(path) = line.strip_prefix("pub use ") else {
                continue;
            };
            let Some((module, rest)) = path.split_once("::") else {
                continue;
            };
            if modules.contains(module) {
                for name in first_segments(rest) {
                    reexports.insert(name, module.to_string());
                }
            }
        }
    }
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for (name, text) in files {
        let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "mod") else {
            continue;
        };
        let edges: Vec<String> = uses(text, &modules, &reexports)
            .into_iter()
            .filter(|m| m != module)
            .collect();
        if module != "exchange"
            && (edges.iter().any(|m| m == "exchange") || text.contains("exchange::"))
        {
            out.push(format!("{module} names exchange"));
        }
        graph.insert(module.to_string(), edges);
    }
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut loops = BTreeSet::new();
    for (m, from_m) in &reached {
        let together: Vec<&str> = from_m
            .iter()
            .filter(|n| reached.get(n).is_some_and(|r| r.contains(*m)))
            .map(String::as_str)
            .collect();
        if !together.is_empty() {
            loops.insert(together.join(", "));
        }
    }
    out.extend(
        loops
            .into_iter()
            .map(|l| format!("modules use each other: {l}")),
    );
    out
}

/// The flow's own files: every `*.rs` directly in `src/flow`.
fn flow_files() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/flow");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("src/flow is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_file() && name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).expect("a flow source is readable");
            files.push((name, text));
        }
    }
    files.sort();
    files
}

#[test]
fn the_flow_modules_use_each_other_in_one_direction() {
    let files = flow_files();
    let root = &files.iter().find(|(name, _)| name == "mod.rs").unwrap().1;
    // Every module mod.rs declares was read, and nothing else.
    let declared: BTreeSet<String> = root
        .lines()
        .filter_map(|l| l.trim().trim_start_matches("pub ").strip_prefix("mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .filter(|m| *m != "tests")
        .map(|m| format!("{m}.rs"))
        .collect();
    let read: BTreeSet<String> = files
        .iter()
        .map(|(name, _)| name.clone())
        .filter(|name| name != "mod.rs")
        .collect();
    assert_eq!(read, declared);
    assert_eq!(problems(&files), Vec::<String>::new());
}

#[test]
fn uses_are_read_from_paths_groups_and_reexports() {
    let modules = ["check", "count", "exchange", "metric"]
        .map(String::from)
        .into_iter()
        .collect();
    let reexports = [("Metric".to_string(), "metric".to_string())]
        .into_iter()
        .collect();
    let text = "use super::{check, Host, Metric};\nfn f() { crate::flow::count::send(); }\n\
                use super::store::Flag;\n";
    assert_eq!(
        uses(text, &modules, &reexports),
        ["check", "count", "metric"].map(String::from)
    );
}

#[test]
fn a_loop_and_a_module_naming_the_driver_are_found() {
    let file = |name: &str, text: &str| (name.to_string(), text.to_string());
    let files = [
        file("mod.rs", "mod check;\npub use exchange::Exchange;\n"),
        file(
            "exchange.rs",
            "use super::count;\nuse super::{check, Host};\n",
        ),
        file("count.rs", "use super::{proof, Metric};\n"),
        file("proof.rs", "fn f() { super::check::start(); }\n"),
        file("check.rs", "use super::count;\n"),
        file("answer.rs", "use super::Exchange;\n"),
        file(
            "conclude.rs",
            "use super::state::Pending;\nimpl exchange::X {}\n",
        ),
        file("state.rs", ""),
    ];
    assert_eq!(
        problems(&files),
        [
            "answer names exchange",
            "conclude names exchange",
            "modules use each other: check, count, proof",
        ]
    );
}
