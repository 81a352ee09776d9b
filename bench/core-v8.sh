#!/usr/bin/env bash
# The criterion micro-benchmark of the core (benches/core.rs), compiled to wasm32-wasip1 with
# the module's flags (simd128) and run in Node's V8, the engine Envoy embeds: the numbers the
# filter's own work is closest to. Arguments go to criterion, e.g. bench/core-v8.sh hit_path
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v node >/dev/null || { echo "node not found: run scripts/setup.sh" >&2; exit 1; }
rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
CARGO_TARGET_WASM32_WASIP1_RUNNER="node $ROOT/scripts/wasi-runner.mjs" \
  exec cargo bench --target wasm32-wasip1 -p incontext-core --bench core -- "$@"
