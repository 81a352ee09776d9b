#!/usr/bin/env bash
# Install the real SGLang server (PyPI sglang 0.5.23) for CPU, for tests/sglang.
#
#   scripts/setup-sglang.sh
#
# Runs scripts/setup-vllm.sh first (idempotent): the SGLang virtualenv reuses the vLLM
# virtualenv's packages (torch, transformers, fastapi ...) through a .pth file and adds SGLang
# itself and the modules in scripts/sglang-requirements.txt (≈60 MB download). SGLang's
# kernel package is CUDA-only on PyPI; scripts/sglang-cpu/sgl_kernel stands in for it
# (names only, every call fails; docs/backends.md explains why the CPU path needs none).
# Idempotent: skipped when its stamp is current.
# Environment overrides: INCONTEXT_SGLANG_VENV (default <repo>/.venv-sglang),
# INCONTEXT_VLLM_VENV, INCONTEXT_VLLM_MODEL. Start and stop the server with scripts/sglang.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/sglang-paths.sh
. "$REPO/scripts/sglang-paths.sh"   # SGLANG_VENV, VLLM_VENV, MODEL_DIR
REQS="$REPO/scripts/sglang-requirements.txt"
SHIM="$REPO/scripts/sglang-cpu/sgl_kernel"
CACHE="$REPO/.cache"

say() { printf 'setup-sglang: %s\n' "$*"; }
die() { printf 'setup-sglang: error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE"
# The vLLM virtualenv and the tiny model first (quick when done).
bash "$REPO/scripts/setup-vllm.sh" || die "scripts/setup-vllm.sh failed"

exec 9>"$CACHE/setup-sglang.lock"
flock 9

[ -x "$VLLM_VENV/bin/python" ] || die "no vLLM virtualenv in $VLLM_VENV: run scripts/setup-vllm.sh first"
[ -f "$MODEL_DIR/config.json" ] || die "no model in $MODEL_DIR: run scripts/setup-vllm.sh first"
PY="$VLLM_VENV/bin/python"
BASE_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

sha() { sha256sum "$1" | cut -d' ' -f1; }
want_stamp="reqs=$(sha "$REQS") shim=$(sha "$SHIM/__init__.py") base=$BASE_SITE"
STAMP="$SGLANG_VENV/.incontext-sglang-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] && [ -x "$SGLANG_VENV/bin/python" ]; then
  say "SGLang already installed in $SGLANG_VENV"
  bash "$REPO/scripts/bytecode.sh" "$SGLANG_VENV" | sed 's/^/setup-sglang: /'
  exit 0
fi

start=$(date +%s)
if [ ! -x "$SGLANG_VENV/bin/python" ]; then
  say "creating virtualenv $SGLANG_VENV (on the vLLM virtualenv's Python)"
  rm -rf "$SGLANG_VENV"
  # The base interpreter of the vLLM virtualenv, so both run the same Python version.
  BASE_PY="$("$PY" -c 'import sys; print(sys._base_executable)')"
  "$BASE_PY" -m venv "$SGLANG_VENV"
fi
rm -f "$STAMP"
SITE="$("$SGLANG_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# After SGLang's own site-packages: the vLLM virtualenv's (torch, transformers, ...).
echo "$BASE_SITE" >"$SITE/zz-incontext-vllm-base.pth"

PIPLOG="$CACHE/setup-sglang-uv.log"
say "installing SGLang 0.5.23 with uv (scripts/uv.sh; log: $PIPLOG)"
UV="$(bash "$REPO/scripts/uv.sh")" || die "could not install uv (scripts/uv.sh)"
"$UV" pip install --python "$SGLANG_VENV/bin/python" --no-progress --no-deps --only-binary :all: \
  -r "$REQS" >"$PIPLOG" 2>&1 \
  || { tail -n 30 "$PIPLOG" >&2; die "uv pip install failed (full log: $PIPLOG)"; }

# The stand-in kernel package (a CUDA sglang-kernel, if one was installed by hand, goes).
rm -rf "$SITE/sgl_kernel" "$SITE"/sglang_kernel-*.dist-info
cp -r "$SHIM" "$SITE/sgl_kernel"

say "checking that SGLang imports"
SGLANG_USE_CPU_ENGINE=1 "$SGLANG_VENV/bin/python" -c \
  'import sglang, torch; from sglang.srt.entrypoints import http_server; print("setup-sglang:   sglang", sglang.__version__, "torch", torch.__version__)' \
  2>>"$PIPLOG" || { tail -n 30 "$PIPLOG" >&2; die "SGLang does not import (log: $PIPLOG)"; }
bash "$REPO/scripts/bytecode.sh" "$SGLANG_VENV" | sed 's/^/setup-sglang: /'
echo "$want_stamp" >"$STAMP"
say "SGLang installed in $(($(date +%s) - start)) s; start it with scripts/sglang.sh start [port]"
