#!/usr/bin/env bash
# The native module's unit tests under Miri and under AddressSanitizer (docs/reliability.md,
# "Sanitizers"). Miri needs the nightly toolchain with the miri and rust-src components
# (rustup component add miri rust-src --toolchain nightly); AddressSanitizer runs on the
# machine's own toolchain, whose standard library ships the runtime (RUSTC_BOOTSTRAP=1 lets
# it take the sanitizer flag). Each run has a target directory of its own (target/miri,
# target/asan). `scripts/test.sh unit` runs the AddressSanitizer one.
#
#   scripts/sanitize.sh          # both
#   scripts/sanitize.sh miri     # one
#   scripts/sanitize.sh asan
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WHAT="${1:-all}"
HOST="$(rustc -vV | sed -n 's/^host: //p')"

if [ "$WHAT" = all ] || [ "$WHAT" = miri ]; then
  # The clock is read (isolation off); proptest's generated cases are few (an interpreter).
  PROPTEST_CASES="${PROPTEST_CASES:-4}" MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}" \
    cargo +nightly miri test -p incontext-module --lib
fi
if [ "$WHAT" = all ] || [ "$WHAT" = asan ]; then
  # --target keeps build scripts and proc macros uninstrumented.
  RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR="$ROOT/target/asan" \
    cargo test -p incontext-module --lib --target "$HOST"
fi
