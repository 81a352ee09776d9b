#!/usr/bin/env bash
# Build a real llama.cpp `llama-server` (CPU) and a tiny GGUF model for it.
#
#   scripts/setup-llamacpp.sh
#
# Idempotent: each step leaves a stamp and is skipped when its stamp is current. Everything lives
# outside the clone, in ${INCONTEXT_CACHE:-~/.cache/incontext}/llamacpp-<version>/ (see
# scripts/llamacpp-paths.sh), so CI runs on the same machine reuse it:
#   1. src/      the llama-cpp-python source distribution from PyPI (pinned version and sha256);
#                it vendors the llama.cpp sources under vendor/llama.cpp
#   2. bin/llama-server   only the `llama-server` CMake target: Release, CPU, static, portable
#                (x86-64 with AVX2, not -march=native), no curl/openssl, no web UI download
#                (≈12 minutes on 2 cores, once)
#   3. model/    random weights for the tiny Qwen3 of scripts/setup-vllm.sh (same config,
#                tokenizer and chat template; scripts/llamacpp-weights.py, torch from the vLLM
#                virtualenv), converted to qwen3-tiny-f16.gguf by the vendored converter
# Runs scripts/setup-vllm.sh before step 3 (idempotent): its virtualenv and model directory are
# the inputs (same overrides: INCONTEXT_VLLM_VENV, INCONTEXT_VLLM_MODEL). Steps 1 and 2 need
# only the system python3, cmake and a C++ compiler.
# Build parallelism: INCONTEXT_LLAMACPP_JOBS (default 2).
# Start and stop the server with scripts/llamacpp.sh.
# scripts/test.sh may run this beside scripts/setup.sh: it needs nothing that one installs.
# setup: background
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"       # VENV, MODEL_DIR
# shellcheck source=scripts/llamacpp-paths.sh
. "$REPO/scripts/llamacpp-paths.sh"   # LLAMACPP_*
WEIGHTS_PY="$REPO/scripts/llamacpp-weights.py"
JOBS="${INCONTEXT_LLAMACPP_JOBS:-2}"
SEED=0

say() { printf 'setup-llamacpp: %s\n' "$*"; }
die() { printf 'setup-llamacpp: error: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

mkdir -p "$LLAMACPP_DIR"
# One setup at a time (CI and a developer may both call this).
exec 9>"$LLAMACPP_DIR.lock"
flock 9

# ---------------------------------------------------------------- 1. sources
SRC_TOP="$LLAMACPP_DIR/src"
SRC_STAMP="$SRC_TOP/.incontext-stamp"
want_src="sdist=$LLAMACPP_SDIST_SHA256"
if stamp_ok "$SRC_STAMP" "$want_src" && [ -f "$LLAMACPP_SRC/CMakeLists.txt" ]; then
  say "sources already unpacked: $LLAMACPP_SRC"
else
  say "downloading llama-cpp-python $LLAMACPP_PY_VERSION (source distribution, ≈77 MB) from PyPI"
  dl="$LLAMACPP_DIR/download"
  rm -rf "$dl" "$SRC_TOP"
  mkdir -p "$dl"
  # The sdist's address comes from the package index's JSON API (PEP 691, the one pip reads),
  # read with the system Python; nothing is built (`pip download --no-binary` would prepare the
  # sdist's metadata, building its build requirements, CMake among them, from source).
  tarball="$dl/llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz"
  python3 - "$LLAMACPP_PY_VERSION" "$LLAMACPP_SDIST_SHA256" "$tarball" <<'PYEOF' \
    || die "could not download the llama-cpp-python $LLAMACPP_PY_VERSION source distribution from PyPI"
import json, os, sys, urllib.request
version, want, out = sys.argv[1:4]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
api = f"{index}/llama-cpp-python/"
name = f"llama_cpp_python-{version}.tar.gz"
req = urllib.request.Request(api, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=60) as r:
    files = [f for f in json.load(r)["files"] if f["filename"] == name]
if len(files) != 1:
    sys.exit(f"setup-llamacpp: error: {api} lists {len(files)} files named {name}, not one")
if files[0].get("hashes", {}).get("sha256") != want:
    sys.exit(f"setup-llamacpp: error: the index's sha256 for {name} is not the pinned one")
with urllib.request.urlopen(files[0]["url"], timeout=600) as r, open(out, "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
PYEOF
  [ -f "$tarball" ] || die "no $tarball after the download"
  [ "$(sha "$tarball")" = "$LLAMACPP_SDIST_SHA256" ] \
    || die "sha256 of $tarball is not the pinned $LLAMACPP_SDIST_SHA256"
  mkdir -p "$SRC_TOP.tmp"
  tar -xzf "$tarball" -C "$SRC_TOP.tmp"
  mv "$SRC_TOP.tmp" "$SRC_TOP"
  rm -rf "$dl"
  [ -f "$LLAMACPP_SRC/CMakeLists.txt" ] || die "no vendor/llama.cpp in the source distribution"
  echo "$want_src" >"$SRC_STAMP"
fi

# ---------------------------------------------------------------- 2. llama-server
# GGML_NATIVE=OFF: a portable build (ggml then enables SSE4.2/AVX/AVX2/FMA/F16C/BMI2, any
# x86-64-v3 CPU) that a CI cache can carry between machines. Static, so bin/ holds one file.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
  -DGGML_BACKEND_DL=OFF
  -DGGML_CPU_ALL_VARIANTS=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
)
BUILD="$LLAMACPP_DIR/build"
BIN_STAMP="$LLAMACPP_DIR/bin/.incontext-stamp"
want_bin="$want_src cmake=${CMAKE_FLAGS[*]}"
if stamp_ok "$BIN_STAMP" "$want_bin" && [ -x "$LLAMACPP_BIN" ]; then
  say "llama-server already built: $LLAMACPP_BIN"
else
  rm -f "$BIN_STAMP"
  if ! command -v cmake >/dev/null; then
    say "cmake not found; installing it with apt-get"
    bash "$REPO/scripts/apt-install.sh" cmake
  fi
  command -v c++ >/dev/null || die "no C++ compiler (apt-get install g++)"
  BLOG="$LLAMACPP_DIR/build.log"
  say "building llama-server with CMake (-j$JOBS; ≈12 minutes on 2 cores); log: $BLOG"
  start=$(date +%s)
  rm -rf "$BUILD"
  (
    set -e
    cmake -S "$LLAMACPP_SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}"
    nice cmake --build "$BUILD" --target llama-server -j "$JOBS"
  ) >"$BLOG" 2>&1 &
  build_pid=$!
  # Say something every 60 s so nobody thinks it hangs.
  while kill -0 "$build_pid" 2>/dev/null; do
    for _ in $(seq 1 60); do
      kill -0 "$build_pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$build_pid" 2>/dev/null; then
      pct="$(grep -o '^\[ *[0-9]*%\]' "$BLOG" | tail -n 1 | tr -d '[] ' || true)"
      say "  … compiling (${pct:-0%}; $(($(date +%s) - start)) s)"
    fi
  done
  if ! wait "$build_pid"; then
    tail -n 30 "$BLOG" >&2
    die "the llama-server build failed (full log: $BLOG)"
  fi
  mkdir -p "$LLAMACPP_DIR/bin"
  install -m 0755 "$BUILD/bin/llama-server" "$LLAMACPP_BIN"
  "$LLAMACPP_BIN" --version >/dev/null 2>&1 || die "the built llama-server does not run"
  secs=$(($(date +%s) - start))
  echo "$secs" >"$LLAMACPP_DIR/build-seconds"
  echo "$want_bin" >"$BIN_STAMP"
  say "llama-server built in $secs s ($(stat -c %s "$LLAMACPP_BIN") bytes)"
fi

# ---------------------------------------------------------------- 3. model
# The vLLM virtualenv and the tiny model (quick when done): the inputs of the model step. The
# sources and the build above need neither, so they can run beside the vLLM install.
bash "$REPO/scripts/setup-vllm.sh" || die "scripts/setup-vllm.sh failed"

[ -x "$VENV/bin/python" ] || die "no vLLM virtualenv in $VENV: run scripts/setup-vllm.sh first"
[ -f "$MODEL_DIR/config.json" ] && [ -f "$MODEL_DIR/tokenizer.json" ] \
  || die "no model directory in $MODEL_DIR: run scripts/setup-vllm.sh first"
PY="$VENV/bin/python"
HF_DIR="$LLAMACPP_DIR/model/qwen3-tiny"
MODEL_STAMP="$LLAMACPP_DIR/model/.incontext-stamp"
model_inputs=""
for f in config.json generation_config.json tokenizer.json tokenizer_config.json; do
  [ -f "$MODEL_DIR/$f" ] && model_inputs+="$f=$(sha "$MODEL_DIR/$f") "
done
want_model="${model_inputs}weights=$(sha "$WEIGHTS_PY") seed=$SEED $want_src"
if stamp_ok "$MODEL_STAMP" "$want_model" && [ -f "$LLAMACPP_GGUF" ]; then
  say "GGUF model already converted: $LLAMACPP_GGUF"
else
  rm -f "$MODEL_STAMP"
  start=$(date +%s)
  say "writing random weights for the tiny Qwen3 into $HF_DIR"
  rm -rf "$HF_DIR"
  # Offline: the model directory is complete; nothing is fetched from a model hub.
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    "$PY" "$WEIGHTS_PY" --src "$MODEL_DIR" --out "$HF_DIR" --seed "$SEED"
  say "converting to GGUF with the vendored convert_hf_to_gguf.py"
  CLOG="$LLAMACPP_DIR/convert.log"
  if ! HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 NO_LOCAL_GGUF=1 \
      PYTHONPATH="$LLAMACPP_SRC/gguf-py" \
      "$PY" "$LLAMACPP_SRC/convert_hf_to_gguf.py" "$HF_DIR" \
      --outfile "$LLAMACPP_GGUF.tmp" --outtype f16 --model-name qwen3-tiny >"$CLOG" 2>&1; then
    tail -n 30 "$CLOG" >&2
    die "GGUF conversion failed (full log: $CLOG)"
  fi
  mv "$LLAMACPP_GGUF.tmp" "$LLAMACPP_GGUF"
  echo "$want_model" >"$MODEL_STAMP"
  say "GGUF written in $(($(date +%s) - start)) s: $LLAMACPP_GGUF ($(stat -c %s "$LLAMACPP_GGUF") bytes)"
fi

say "ready: start the server with scripts/llamacpp.sh start [port]"
