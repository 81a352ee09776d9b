#!/usr/bin/env bash
# Run the real llama.cpp `llama-server` (CPU, tiny Qwen3 GGUF) in the background.
#
#   scripts/llamacpp.sh start [port] [extra llama-server args...]   start on 127.0.0.1 (default
#                                                                   port 8080), wait until it
#                                                                   answers /health
#   scripts/llamacpp.sh stop                                        stop it
#   scripts/llamacpp.sh status                                      exit 0 running+healthy,
#                                                                   1 unhealthy, 3 not running
#
# Run scripts/setup-llamacpp.sh first. Served model name: qwen3-tiny; one slot of 512 tokens
# (--ctx-size 512 --parallel 1, so GET /props reports n_ctx 512); --jinja renders the model's own
# chat template, tools included.
# State: <repo>/.cache/llamacpp.pid, llamacpp.port, log llamacpp.log.
# Environment overrides:
#   INCONTEXT_CACHE, INCONTEXT_LLAMACPP_DIR  where the build lives (scripts/llamacpp-paths.sh)
#   INCONTEXT_LLAMACPP_CTX            context size (default 512)
#   INCONTEXT_LLAMACPP_THREADS        CPU threads (default 1: the tiny model needs no more)
#   INCONTEXT_LLAMACPP_START_TIMEOUT  seconds to wait for /health (default 120)
#   INCONTEXT_LLAMACPP_STATE          directory for pid/port/log files (default <repo>/.cache)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/llamacpp-paths.sh
. "$REPO/scripts/llamacpp-paths.sh"   # LLAMACPP_BIN, LLAMACPP_GGUF
CTX="${INCONTEXT_LLAMACPP_CTX:-512}"
THREADS="${INCONTEXT_LLAMACPP_THREADS:-1}"
TIMEOUT="${INCONTEXT_LLAMACPP_START_TIMEOUT:-120}"
STATE="${INCONTEXT_LLAMACPP_STATE:-$REPO/.cache}"
PIDFILE="$STATE/llamacpp.pid"
PORTFILE="$STATE/llamacpp.port"
LOG="$STATE/llamacpp.log"
SERVED_NAME="qwen3-tiny"

say() { printf 'llamacpp.sh: %s\n' "$*"; }
die() { printf 'llamacpp.sh: error: %s\n' "$*" >&2; exit 1; }

# pid of our running server, or nothing (a pid file whose process is gone, or was reused
# by something else, does not count).
our_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null \
    && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$LLAMACPP_BIN")" ]; then
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
  local port="${1:-8080}"
  shift || true
  [[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number, got '$port'"
  [ -x "$LLAMACPP_BIN" ] || die "no llama-server at $LLAMACPP_BIN: run scripts/setup-llamacpp.sh first"
  [ -f "$LLAMACPP_GGUF" ] || die "no GGUF model at $LLAMACPP_GGUF: run scripts/setup-llamacpp.sh first"
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
    die "llama-server already running (pid $pid, port $running_port): run scripts/llamacpp.sh stop first"
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
    die "something else already answers on 127.0.0.1:$port"
  fi

  say "starting llama-server (CPU, model $SERVED_NAME, ctx $CTX, 1 slot) on 127.0.0.1:$port; log: $LOG"
  local start
  start=$(date +%s)
  # No web UI, no model download (-m names a local file), loopback only.
  setsid "$LLAMACPP_BIN" \
    --model "$LLAMACPP_GGUF" \
    --alias "$SERVED_NAME" \
    --host 127.0.0.1 --port "$port" \
    --ctx-size "$CTX" --parallel 1 \
    --jinja \
    --threads "$THREADS" --threads-batch "$THREADS" \
    --no-webui \
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
      die "llama-server exited during startup (see $LOG)"
    fi
    if [ "$waited" -ge "$((TIMEOUT * 4))" ]; then
      log_tail
      cmd_stop >/dev/null 2>&1 || true
      die "llama-server did not answer /health within ${TIMEOUT}s (see $LOG)"
    fi
    sleep 0.25
    waited=$((waited + 1))
  done
  # /health answers once the model is loaded; make sure it is served under our name.
  if ! curl -sf --max-time 5 "http://127.0.0.1:$port/v1/models" | grep -q "\"$SERVED_NAME\""; then
    log_tail
    cmd_stop >/dev/null 2>&1 || true
    die "llama-server is up but does not serve $SERVED_NAME"
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
  say "stopping llama-server (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 40); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after 10 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
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
  port="$(cat "$PORTFILE" 2>/dev/null || echo 8080)"
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
  *) echo "usage: $0 start [port] [extra llama-server args...] | stop | status" >&2; exit 2 ;;
esac
