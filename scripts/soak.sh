#!/usr/bin/env bash
# Chaos soak (docs/reliability.md): sends REQUESTS (default 30000) requests over CONCURRENCY
# (default 32) connections through the real Envoy with the built incontext.wasm, while the fake
# tokenizer flaps (2 s of load and at least 8 calls per phase) between up, refused, slow (past
# timeout_ms 200), garbage, 503 and reset. Fails unless every request reached the echo upstream with an intact body (identical,
# or exactly the docs/spec.md rewrite), the counters agree, no wasm VM failed or was reloaded, and
# Envoy's memory stayed flat after the warm-up.
#
#   scripts/soak.sh [requests] [concurrency] [extra soak.py options, e.g. --json report.json]
#
# Needs scripts/setup.sh (.venv with Envoy) and the release wasm build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUESTS="${1:-30000}"
CONCURRENCY="${2:-32}"
shift $(( $# < 2 ? $# : 2 ))
WASM="${INCONTEXT_WASM:-$ROOT/target/wasm32-wasip1/release/incontext.wasm}"
if [ ! -f "$WASM" ]; then
  echo "soak: $WASM is missing: run scripts/build-wasm.sh" >&2
  exit 2
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "soak: no $ROOT/.venv: run scripts/setup.sh first" >&2
  exit 2
fi
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m tests.soak.soak \
  --requests "$REQUESTS" --concurrency "$CONCURRENCY" "$@"
