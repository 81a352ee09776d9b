#!/usr/bin/env bash
# Run the real SGLang server on CPU (tiny Qwen3, dummy weights) in the background.
#
#   scripts/sglang.sh start [port] [extra SGLang args...]   start on 127.0.0.1 (default 30000),
#                                                           wait until it answers
#   scripts/sglang.sh stop                                  stop it
#   scripts/sglang.sh status                                exit 0 running+healthy,
#                                                           1 unhealthy, 3 not running
#
# Run scripts/setup-sglang.sh first. Served model name: qwen3-tiny, context length 512.
# Environment overrides:
#   INCONTEXT_SGLANG_VENV            virtualenv  (default <repo>/.venv-sglang)
#   INCONTEXT_VLLM_MODEL             model dir   (default <repo>/.cache/model/qwen3-tiny)
#   INCONTEXT_SGLANG_CONTEXT_LENGTH  context     (default 512)
#   INCONTEXT_SGLANG_START_TIMEOUT   seconds to wait for /health (default 400)
#   INCONTEXT_SGLANG_STATE           directory for pid/port/log files (default <repo>/.cache)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/sglang-paths.sh
. "$REPO/scripts/sglang-paths.sh"   # SGLANG_VENV, MODEL_DIR
CONTEXT_LENGTH="${INCONTEXT_SGLANG_CONTEXT_LENGTH:-512}"
TIMEOUT="${INCONTEXT_SGLANG_START_TIMEOUT:-400}"
STATE="${INCONTEXT_SGLANG_STATE:-$REPO/.cache}"
PIDFILE="$STATE/sglang.pid"
PORTFILE="$STATE/sglang.port"
LOG="$STATE/sglang.log"
SERVED_NAME="qwen3-tiny"
SERVER="SGLang"
SCRIPT="sglang.sh"
DEFAULT_PORT=30000
# shellcheck source=scripts/server-lib.sh
. "$REPO/scripts/server-lib.sh"
ours() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q "$MODULE"; }
MODULE="sglang.launch_server"

cmd_start() {
  local port="${1:-$DEFAULT_PORT}"
  shift || true
  [ -x "$SGLANG_VENV/bin/python" ] || die "no SGLang in $SGLANG_VENV: run scripts/setup-sglang.sh first"
  [ -f "$MODEL_DIR/config.json" ] || die "no model in $MODEL_DIR: run scripts/setup-vllm.sh first"
  if already_running "$port"; then
    return 0
  fi

  say "starting SGLang (CPU, model $SERVED_NAME, context length $CONTEXT_LENGTH) on 127.0.0.1:$port; log: $LOG"
  # SGLANG_USE_CPU_ENGINE=1 selects SGLang's CPU platform; torch_native attention and the
  # pytorch sampler need no kernel package (this CPU has no AMX for the intel_amx backend).
  # One OpenMP thread bound to core 0 (2-core machine shared with Envoy and the tests).
  # The KV pool is capped at 8192 tokens (otherwise a share of all RAM). Nothing leaves
  # the machine (offline hub, loopback only).
  setsid env \
    SGLANG_USE_CPU_ENGINE=1 \
    SGLANG_CPU_OMP_THREADS_BIND="${SGLANG_CPU_OMP_THREADS_BIND:-0}" \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    DO_NOT_TRACK=1 \
    TOKENIZERS_PARALLELISM=false \
    PYTHONUNBUFFERED=1 \
    "$SGLANG_VENV/bin/python" -m "$MODULE" \
    --model-path "$MODEL_DIR" \
    --served-model-name "$SERVED_NAME" \
    --host 127.0.0.1 --port "$port" \
    --device cpu \
    --load-format dummy \
    --context-length "$CONTEXT_LENGTH" \
    --attention-backend torch_native \
    --sampling-backend pytorch \
    --max-total-tokens 8192 \
    --max-running-requests 8 \
    --skip-server-warmup \
    "$@" \
    >"$LOG" 2>&1 </dev/null &
  await_ready "$!" "$port"
}

main "$@"
