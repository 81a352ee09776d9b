#!/usr/bin/env bash
# Run vLLM's GPU-less render server (CPU, tiny Qwen3) in the background: the counter of the
# `vllm-render` backend (docs/spec.md §16). It tokenizes and renders (`/tokenize`, the
# `…/render` endpoints, `GET /v1/models` with `max_model_len`) and generates nothing; llm-d runs
# it as its own Deployment. Started from the vLLM virtualenv of scripts/setup-vllm.sh, with the
# generation server's tool flags (without them it answers 400 to every chat with tools).
#
#   scripts/render.sh start [port] [extra args...]   start on 127.0.0.1 (default port 8100),
#                                                    wait until it answers
#   scripts/render.sh stop                           stop it
#   scripts/render.sh status                         exit 0 running+healthy, 1 unhealthy,
#                                                    3 not running
#
# Environment: the INCONTEXT_VLLM_* variables of scripts/vllm.sh (release, virtualenv, model,
# max_model_len, served name, start timeout); state files in INCONTEXT_RENDER_STATE (default
# <repo>/.cache): render.pid, render.port, log render.log.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"   # RELEASE, VENV, MODEL_DIR
MAX_MODEL_LEN="${INCONTEXT_VLLM_MAX_MODEL_LEN:-512}"
TIMEOUT="${INCONTEXT_VLLM_START_TIMEOUT:-300}"
STATE="${INCONTEXT_RENDER_STATE:-$REPO/.cache}"
PIDFILE="$STATE/render.pid"
PORTFILE="$STATE/render.port"
LOG="$STATE/render.log"
SERVED_NAME="${INCONTEXT_VLLM_SERVED_NAME:-qwen3-tiny}"
SERVER="vLLM render server"
SCRIPT="render.sh"
DEFAULT_PORT=8100
# shellcheck source=scripts/server-lib.sh
. "$REPO/scripts/server-lib.sh"
MODULE="vllm.entrypoints.launchers.render.entry"
ours() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q "$MODULE"; }

cmd_start() {
  local port="${1:-$DEFAULT_PORT}"
  shift || true
  [ -x "$VENV/bin/python" ] || die "no vLLM $RELEASE in $VENV: run scripts/setup-vllm.sh $RELEASE first"
  [ -f "$MODEL_DIR/config.json" ] || die "no model in $MODEL_DIR: run scripts/setup-vllm.sh first"
  compgen -G "$VENV/lib/python3*/site-packages/vllm/entrypoints/launchers/render/entry.py" >/dev/null \
    || die "vLLM $RELEASE in $VENV has no render server ($MODULE)"
  if already_running "$port"; then
    return 0
  fi
  say "starting the vLLM $RELEASE render server (model $SERVED_NAME, max_model_len $MAX_MODEL_LEN) on 127.0.0.1:$port; log: $LOG"
  # No engine: one process, no KV cache. Nothing leaves the machine.
  setsid env \
    VLLM_TARGET_DEVICE=cpu \
    VLLM_HOST_IP=127.0.0.1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
    MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}" \
    TOKENIZERS_PARALLELISM=false \
    PYTHONUNBUFFERED=1 \
    "$VENV/bin/python" -m "$MODULE" \
    --model "$MODEL_DIR" \
    --served-model-name "$SERVED_NAME" \
    --host 127.0.0.1 --port "$port" \
    --max-model-len "$MAX_MODEL_LEN" \
    --enable-auto-tool-choice --tool-call-parser hermes \
    "$@" \
    >"$LOG" 2>&1 </dev/null &
  await_ready "$!" "$port"
}

main "$@"
