# The life cycle of one model server started in the background on 127.0.0.1, shared by
# scripts/vllm.sh, scripts/sglang.sh and scripts/llamacpp.sh (sourced, not run).
#
# The including script sets
#   SERVER       its name in messages ("vLLM", "SGLang", "llama-server")
#   SCRIPT       its own name for messages and hints ("vllm.sh")
#   PIDFILE PORTFILE LOG    the state files
#   SERVED_NAME  the model name GET /v1/models must list
#   TIMEOUT      seconds to wait for /health
#   DEFAULT_PORT the port of `start` without one, and of `status` without a port file
# and defines `ours PID` (exit 0 when that live process is this script's server: each server
# is recognised by its own command line or binary).

say() { printf '%s: %s\n' "$SCRIPT" "$*"; }
die() { printf '%s: error: %s\n' "$SCRIPT" "$*" >&2; exit 1; }

# pid of our running server, or nothing (a pid file whose process is gone, or was reused by
# something else, does not count).
our_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && ours "$pid"; then
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

# Before a start on PORT: checks the port, creates the state directory and sets START (the
# start time, for await_ready). Exit 0 when our server already runs there (nothing to do), 1
# when the start may go ahead; dies when ours runs elsewhere or something else holds the port.
already_running() {
  local port="$1" pid running_port
  [[ "$port" =~ ^[0-9]+$ ]] || die "port must be a number, got '$port'"
  mkdir -p "$(dirname "$PIDFILE")"
  START=$(date +%s)
  pid="$(our_pid)"
  if [ -n "$pid" ]; then
    running_port="$(cat "$PORTFILE" 2>/dev/null || echo '?')"
    if [ "$running_port" = "$port" ] && healthy "$port"; then
      say "already running (pid $pid, port $port)"
      return 0
    fi
    die "$SERVER already running (pid $pid, port $running_port): run scripts/$SCRIPT stop first"
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
    die "something else already answers on 127.0.0.1:$port"
  fi
  return 1
}

# Records PID (started with setsid: its own process group) on PORT, waits for /health and for
# SERVED_NAME in /v1/models.
await_ready() {
  local pid="$1" port="$2" waited=0
  echo "$pid" >"$PIDFILE"
  echo "$port" >"$PORTFILE"
  while ! healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log_tail
      rm -f "$PIDFILE" "$PORTFILE"
      die "$SERVER exited during startup (see $LOG)"
    fi
    if [ "$waited" -ge "$((TIMEOUT * 4))" ]; then
      log_tail
      cmd_stop >/dev/null 2>&1 || true
      die "$SERVER did not answer /health within ${TIMEOUT}s (see $LOG)"
    fi
    sleep 0.25
    waited=$((waited + 1))
  done
  if ! curl -sf --max-time 5 "http://127.0.0.1:$port/v1/models" | grep -q "\"$SERVED_NAME\""; then
    log_tail
    cmd_stop >/dev/null 2>&1 || true
    die "$SERVER is up but does not serve $SERVED_NAME"
  fi
  say "ready after $(($(date +%s) - START)) s (pid $pid, http://127.0.0.1:$port)"
}

cmd_stop() {
  local pid i
  pid="$(our_pid)"
  if [ -z "$pid" ]; then
    rm -f "$PIDFILE" "$PORTFILE"
    say "not running"
    return 0
  fi
  say "stopping $SERVER (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  # The server was started in its own session (setsid): its pid is the process group of any
  # engine and worker processes. Whatever is left of that group goes too.
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after 30 s; killing process group $pid"
    kill -KILL -- "-$pid" 2>/dev/null || true
  else
    kill -TERM -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$PORTFILE"
  say "stopped"
}

# Exit 0 running and healthy, 1 running but /health does not answer, 3 not running.
cmd_status() {
  local pid port
  pid="$(our_pid)"
  if [ -z "$pid" ]; then
    say "not running"
    return 3
  fi
  port="$(cat "$PORTFILE" 2>/dev/null || echo "$1")"
  if healthy "$port"; then
    say "running (pid $pid, http://127.0.0.1:$port, healthy)"
    return 0
  fi
  say "running (pid $pid, port $port) but /health does not answer"
  return 1
}

# The command line: start [port] [extra server args...] | stop | status.
main() {
  case "${1:-}" in
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status "$DEFAULT_PORT" ;;
    *) echo "usage: $0 start [port] [extra $SERVER args...] | stop | status" >&2; exit 2 ;;
  esac
}
