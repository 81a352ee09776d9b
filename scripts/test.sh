#!/usr/bin/env bash
# Runs every check: native unit tests, clippy (host and wasm target), the wasm build, and the
# pytest suites under tests/ (end-to-end through a real Envoy; other suites may be added there).
# Every step runs even when an earlier one failed (except pytest, which needs the wasm build);
# the exit status is non-zero when any step failed, and the failed steps are listed at the end.
# It first runs scripts/setup.sh and scripts/setup-vllm.sh (idempotent: quick when done), so a
# fresh clone goes green with this one command. INCONTEXT_SKIP_SETUP=1 skips them.
# Extra arguments go to pytest, e.g. scripts/test.sh -k cache -x
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAILED=()
step() {
  printf '\n==> %s\n' "$*"
  "$@" || { echo "==> FAILED: $*"; FAILED+=("$*"); return 1; }
}

if [ "${INCONTEXT_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh || { echo "==> FAILED: scripts/setup.sh" >&2; exit 1; }
  bash scripts/setup-vllm.sh || { echo "==> FAILED: scripts/setup-vllm.sh" >&2; exit 1; }
fi

step cargo test
step cargo clippy --all-targets -- -D warnings
# The fuzz targets replay their committed seeds, then fuzz briefly (scripts/fuzz.sh runs longer).
step bash scripts/fuzz.sh all "${INCONTEXT_FUZZ_SECONDS:-15}"
step cargo clippy --target wasm32-wasip1 -- -D warnings
# The core's unit tests again, compiled to wasm32-wasip1 (SIMD paths included) and run in
# Node's V8, the engine Envoy embeds.
CARGO_TARGET_WASM32_WASIP1_RUNNER="node $ROOT/scripts/wasi-runner.mjs" \
  step cargo test --target wasm32-wasip1 -p incontext-core --lib
if step bash scripts/build-wasm.sh; then
  WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
  echo "wasm: $WASM ($(stat -c %s "$WASM") bytes)"
  PY="$ROOT/.venv/bin/python"
  if [ -x "$PY" ]; then
    step "$PY" -m pytest tests/ "$@"
  else
    echo "no $ROOT/.venv: run scripts/setup.sh first" >&2
    FAILED+=("pytest (no .venv)")
  fi
else
  FAILED+=("pytest (not run: the wasm did not build)")
fi

echo
if [ ${#FAILED[@]} -eq 0 ]; then
  echo "==> all checks passed"
else
  echo "==> failed steps:"
  printf '    %s\n' "${FAILED[@]}"
  exit 1
fi
