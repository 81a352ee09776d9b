#!/usr/bin/env python3
"""Writes crates/module/abi/bound.h: the part of Envoy's dynamic-module ABI header that
crates/module/src/abi.rs binds (the version, every typedef and function declaration it names),
comments removed, one declaration per line. crates/module/tests/abi.rs checks the Rust
bindings against it.

    scripts/module-abi.py ABI_H ENVOY_COMMIT          # rewrite bound.h from that abi.h
    scripts/module-abi.py ABI_H ENVOY_COMMIT --check  # exit 1 when bound.h differs

ABI_H is source/extensions/dynamic_modules/abi/abi.h of Envoy at ENVOY_COMMIT. To move to a
new ABI: bind the new declarations in abi.rs, run this on the new header, then `cargo test -p
incontext-module` names every binding that no longer matches.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The bindings and the hooks (abi.rs and abi/hooks.rs).
RUST = (ROOT / "crates" / "module" / "src" / "abi.rs",
        ROOT / "crates" / "module" / "src" / "abi" / "hooks.rs")
BOUND = ROOT / "crates" / "module" / "abi" / "bound.h"
PREFIX = "envoy_dynamic_module_type_"


def camel(c_name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in c_name[len(PREFIX):].split("_"))


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("( ", "(").replace(" )", ")")


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    header, commit = Path(sys.argv[1]), sys.argv[2]
    check = "--check" in sys.argv[3:]
    raw = header.read_bytes()
    src = strip_comments(raw.decode("utf-8"))
    rust = "".join(p.read_text(encoding="utf-8") for p in RUST)
    functions = set(re.findall(r"\bfn (envoy_dynamic_module_\w+)", rust))
    types = set(re.findall(r"\bpub (?:type|struct) (\w+)", rust))

    version = re.search(r'#define ENVOY_DYNAMIC_MODULES_ABI_VERSION "([^"]+)"', src)
    if not version:
        print(f"{header}: no ENVOY_DYNAMIC_MODULES_ABI_VERSION", file=sys.stderr)
        return 1
    typedefs = []
    for m in re.finditer(r"typedef\s+(enum|struct)\s+\w+\s*\{(.*?)\}\s*(\w+)\s*;", src, re.S):
        kind, body, name = m.groups()
        if camel(name) in types:
            members = [one_line(x) for x in re.split(r"[;,]", body) if x.strip()]
            sep = "," if kind == "enum" else ";"
            inner = "".join(f"\n  {x}{sep}" for x in members)
            typedefs.append(f"typedef {kind} {name} {{{inner}\n}} {name};")
    for m in re.finditer(r"typedef\s+([^;{}()]+?)\s*\b(\w+)\s*;", src):
        base, name = m.groups()
        if name.startswith(PREFIX) and camel(name) in types and not base.startswith(("enum", "struct")):
            typedefs.append(f"typedef {one_line(base)} {name};")
    declared = []
    pattern = re.compile(r"(?:(?<=;)|(?<=\})|(?<=#endif)|^)\s*([A-Za-z_][\w \t\n\*]*?\b"
                         r"(envoy_dynamic_module_(?:on|callback)_\w+)\s*\([^;{)]*\))\s*;", re.S)
    for m in pattern.finditer(src):
        if m.group(2) in functions:
            declared.append((m.group(2), one_line(m.group(1)) + ";"))
    missing = functions - {n for n, _ in declared}
    if missing:
        print(f"{header} does not declare: {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    out = "\n".join([
        "// An excerpt of source/extensions/dynamic_modules/abi/abi.h of Envoy (Apache-2.0,",
        "// Copyright the Envoy Project Authors): what crates/module/src/abi.rs binds, comments",
        "// removed, one declaration a line. Written by scripts/module-abi.py; checked against",
        "// the Rust bindings by crates/module/tests/abi.rs.",
        f"// Envoy commit: {commit}",
        f"// abi.h sha256: {hashlib.sha256(raw).hexdigest()}",
        "",
        f'#define ENVOY_DYNAMIC_MODULES_ABI_VERSION "{version.group(1)}"',
        "",
        *sorted(typedefs, key=lambda t: t.split()[-1]),
        "",
        *[d for _, d in sorted(declared)],
        "",
    ])
    if check:
        same = BOUND.is_file() and BOUND.read_text(encoding="utf-8") == out
        print("bound.h matches" if same else f"{BOUND} differs from {header}")
        return 0 if same else 1
    BOUND.parent.mkdir(parents=True, exist_ok=True)
    BOUND.write_text(out, encoding="utf-8")
    print(f"wrote {BOUND}: ABI {version.group(1)}, {len(typedefs)} types, {len(declared)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
