#!/usr/bin/env bash
# Fuzzes the native core with libFuzzer (libfuzzer-sys); see fuzz/README.md.
#
#   scripts/fuzz.sh                    every target, 600 s each, one after another
#   scripts/fuzz.sh body_rewrite 1800  one target for 30 minutes
#   scripts/fuzz.sh all 0              replay the seeds and the saved corpus only (a quick check)
#
# Targets: body_rewrite caps tokenize_reply config bound stop_reason window_errors. Built
# with plain cargo and the flags cargo-fuzz would pass (SanitizerCoverage, --cfg fuzzing,
# debug assertions, one codegen unit), so nothing is installed. Runs at nice 19, one target per core at a time (FUZZ_JOBS). New
# corpus entries go to fuzz/corpus/<target>/ (ignored by git; the committed seeds are
# fuzz/seeds/<target>/). A crash leaves its input in fuzz/artifacts/<target>/ and makes this
# script exit 1; reproduce it with
#   fuzz/target/x86_64-unknown-linux-gnu/release/<target> fuzz/artifacts/<target>/crash-...
# and shrink it with the same binary and -minimize_crash=1.
# Environment: FUZZ_SANITIZER (default none: the core has no unsafe code; `address` works too,
# through RUSTC_BOOTSTRAP=1), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/fuzz"

ALL=(body_rewrite caps tokenize_reply config bound stop_reason window_errors)
TARGET="${1:-all}"
SECONDS_EACH="${2:-600}"
SANITIZER="${FUZZ_SANITIZER:-none}"
if [ "$TARGET" = all ]; then
  TARGETS=("${ALL[@]}")
else
  case " ${ALL[*]} " in
    *" $TARGET "*) TARGETS=("$TARGET") ;;
    *) echo "unknown target '$TARGET' (known: ${ALL[*]} all)" >&2; exit 2 ;;
  esac
fi
case "$SECONDS_EACH" in
  ''|*[!0-9]*) echo "seconds must be a whole number, got '$SECONDS_EACH'" >&2; exit 2 ;;
esac

TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
FLAGS+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
FLAGS+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cdebug-assertions -Ccodegen-units=1"
case "$TRIPLE" in *-linux-*) FLAGS+=" -Cllvm-args=-sanitizer-coverage-stack-depth" ;; esac
case "$SANITIZER" in
  none) ;;
  address|leak|memory|thread) FLAGS+=" -Zsanitizer=$SANITIZER"; export RUSTC_BOOTSTRAP=1 ;;
  *) echo "unknown FUZZ_SANITIZER '$SANITIZER' (none address leak memory thread)" >&2; exit 2 ;;
esac

echo "==> building fuzz targets (sanitizer: $SANITIZER)"
# --target: the flags reach the targets and the core, not build scripts or proc macros.
RUSTFLAGS="$FLAGS ${RUSTFLAGS:-}" nice -n 19 cargo build --manifest-path Cargo.toml \
  --target "$TRIPLE" --release --config 'profile.release.debug="line-tables-only"' --bins
BIN="target/$TRIPLE/release"

# fuzz_one TARGET: one target's run; its report goes to artifacts/TARGET.summary, exit 1 on a
# crash.
fuzz_one() {
  local t="$1" log args
  mkdir -p "corpus/$t" "artifacts/$t"
  args=(-dict="dict/$t.dict" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
  [ "$t" = body_rewrite ] && args+=(-max_len=16384)
  if [ "$SECONDS_EACH" = 0 ]; then
    args+=(-runs=0)
  else
    args+=(-max_total_time="$SECONDS_EACH")
  fi
  # shellcheck disable=SC2206
  args+=(${FUZZ_ARGS:-})
  log="artifacts/$t.log"
  {
    echo "==> $t: ${SECONDS_EACH}s (log: fuzz/$log)"
    if nice -n 19 "$BIN/$t" -artifact_prefix="artifacts/$t/" "${args[@]}" "corpus/$t" "seeds/$t" \
        >"$log" 2>&1; then
      grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
      echo "    corpus: $(find "corpus/$t" -type f | wc -l) new + $(find "seeds/$t" -type f | wc -l) seeds, crashes: 0"
    else
      echo "!!! $t failed; last lines of fuzz/$log:"
      grep -E 'panicked|ERROR|Test unit written|SUMMARY' "$log" || tail -20 "$log"
      return 1
    fi
  } >"artifacts/$t.summary" 2>&1
}

# FUZZ_JOBS targets at a time (default: one per core; libFuzzer runs one thread).
JOBS="${FUZZ_JOBS:-$(nproc)}"
case "$JOBS" in ''|*[!0-9]*|0) echo "FUZZ_JOBS must be a positive number, got '$JOBS'" >&2; exit 2 ;; esac
echo "==> ${#TARGETS[@]} target(s), $JOBS at a time"
pids=()
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  fuzz_one "$t" &
  pids+=($!)
done
status=0
for i in "${!TARGETS[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "artifacts/${TARGETS[$i]}.summary"
done
exit "$status"
