#!/usr/bin/env bash
# The native module's unit tests under Miri and under AddressSanitizer (docs/reliability.md,
# "Sanitizers"). Needs the nightly toolchain with the miri and rust-src components
# (rustup component add miri rust-src --toolchain nightly). Each run has a target directory
# of its own (target/miri, target/asan).
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
  RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR="$ROOT/target/asan" \
    cargo +nightly test -p incontext-module --lib --target "$HOST"
fi
