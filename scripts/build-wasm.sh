#!/usr/bin/env bash
# Builds the filter as shipped: cargo's release build for wasm32-wasip1 (simd128, see
# .cargo/config.toml), then binaryen's wasm-opt -Oz, which takes the module from ~350 KB to
# under 330 KB without changing what it does (the whole test suite runs on the optimised file).
#
#   scripts/build-wasm.sh          -> target/wasm32-wasip1/release/incontext.wasm
#
# wasm-opt comes from the npm package binaryen (pinned below), installed into .tools/ on first
# use. INCONTEXT_NO_WASM_OPT=1 skips it (the module then works the same, only larger).
# Rebuilding is cheap: wasm-opt runs again only when cargo produced a different module.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BINARYEN_VERSION="132.0.0"
TOOLS="$ROOT/.tools/binaryen-$BINARYEN_VERSION"
WASM_OPT="$TOOLS/node_modules/.bin/wasm-opt"
REL="$ROOT/target/wasm32-wasip1/release"
RAW="$REL/deps/incontext.wasm"      # what cargo built
OUT="$REL/incontext.wasm"           # what everything loads
OPT="$REL/incontext.optimized.wasm" # wasm-opt's output, kept: cargo re-links OUT to RAW on
STAMP="$OPT.from"                   #   every build; STAMP is the sha256 of the RAW it came from

say() { printf '==> %s\n' "$*" >&2; }

(cd "$ROOT" && cargo build --release --target wasm32-wasip1 -p incontext -q)
[ -f "$RAW" ] || { echo "build-wasm: cargo produced no $RAW" >&2; exit 1; }

if [ "${INCONTEXT_NO_WASM_OPT:-0}" = 1 ]; then   # cargo has just linked OUT to RAW
  say "incontext.wasm: $(stat -c %s "$OUT") bytes (wasm-opt skipped)"
  exit 0
fi

put() { cp "$1" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; }   # never write through the link
raw_sum="$(sha256sum "$RAW" | cut -d' ' -f1)"
if [ -f "$OPT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$raw_sum" ]; then
  put "$OPT"   # already optimised from this very build
  exit 0
fi

if [ ! -x "$WASM_OPT" ]; then
  command -v npm >/dev/null 2>&1 || {
    echo "build-wasm: npm is needed to install binaryen's wasm-opt (scripts/setup.sh installs it)," \
         "or set INCONTEXT_NO_WASM_OPT=1" >&2
    exit 1
  }
  say "installing wasm-opt (npm binaryen@$BINARYEN_VERSION) into ${TOOLS#$ROOT/}"
  mkdir -p "$TOOLS"
  npm install --silent --no-audit --no-fund --prefix "$TOOLS" "binaryen@$BINARYEN_VERSION" >/dev/null
fi

# The features are exactly what rustc enables for the target (rustc --print cfg), so
# wasm-opt neither drops nor introduces any.
"$WASM_OPT" -Oz --strip-debug --strip-producers \
  --enable-bulk-memory --enable-multivalue --enable-mutable-globals \
  --enable-nontrapping-float-to-int --enable-reference-types --enable-sign-ext --enable-simd \
  "$RAW" -o "$OPT"
printf '%s\n' "$raw_sum" >"$STAMP"
put "$OPT"
say "incontext.wasm: $(stat -c %s "$RAW") -> $(stat -c %s "$OUT") bytes (wasm-opt -Oz)"
