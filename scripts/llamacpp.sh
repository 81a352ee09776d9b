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
SERVER="llama-server"
SCRIPT="llamacpp.sh"
DEFAULT_PORT=8080
# shellcheck source=scripts/server-lib.sh
. "$REPO/scripts/server-lib.sh"
ours() { [ "$(readlink "/proc/$1/exe" 2>/dev/null)" = "$(readlink -f "$LLAMACPP_BIN")" ]; }

cmd_start() {
  local port="${1:-$DEFAULT_PORT}"
  shift || true
  [ -x "$LLAMACPP_BIN" ] || die "no llama-server at $LLAMACPP_BIN: run scripts/setup-llamacpp.sh first"
  [ -f "$LLAMACPP_GGUF" ] || die "no GGUF model at $LLAMACPP_GGUF: run scripts/setup-llamacpp.sh first"
  if already_running "$port"; then
    return 0
  fi

  say "starting llama-server (CPU, model $SERVED_NAME, ctx $CTX, 1 slot) on 127.0.0.1:$port; log: $LOG"
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
  await_ready "$!" "$port"
}

main "$@"
