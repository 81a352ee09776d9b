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
MODULE="sglang.launch_server"

say() { printf 'sglang.sh: %s\n' "$*"; }
die() { printf 'sglang.sh: error: %s\n' "$*" >&2; exit 1; }

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
  local port="${1:-30000}"
  shift || true
  [[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number, got '$port'"
  [ -x "$SGLANG_VENV/bin/python" ] || die "no SGLang in $SGLANG_VENV: run scripts/setup-sglang.sh first"
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
    die "SGLang already running (pid $pid, port $running_port): run scripts/sglang.sh stop first"
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
    die "something else already answers on 127.0.0.1:$port"
  fi

  say "starting SGLang (CPU, model $SERVED_NAME, context length $CONTEXT_LENGTH) on 127.0.0.1:$port; log: $LOG"
  local start
  start=$(date +%s)
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
  pid=$!
  echo "$pid" >"$PIDFILE"
  echo "$port" >"$PORTFILE"

  local waited=0
  while ! healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log_tail
      rm -f "$PIDFILE" "$PORTFILE"
      die "SGLang exited during startup (see $LOG)"
    fi
    if [ "$waited" -ge "$TIMEOUT" ]; then
      log_tail
      cmd_stop >/dev/null 2>&1 || true
      die "SGLang did not answer /health within ${TIMEOUT}s (see $LOG)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  if ! curl -sf --max-time 5 "http://127.0.0.1:$port/v1/models" | grep -q "\"$SERVED_NAME\""; then
    log_tail
    cmd_stop >/dev/null 2>&1 || true
    die "SGLang is up but does not serve $SERVED_NAME"
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
  say "stopping SGLang (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  # Started in its own session (setsid): its pid is the process group of the scheduler and
  # detokenizer processes. Whatever is left of that group goes too.
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
  port="$(cat "$PORTFILE" 2>/dev/null || echo 30000)"
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
  *) echo "usage: $0 start [port] [extra SGLang args...] | stop | status" >&2; exit 2 ;;
esac
