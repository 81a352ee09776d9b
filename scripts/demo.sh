#!/usr/bin/env bash
# The first thing to run: installs what is missing, starts a real vLLM (CPU, tiny Qwen3 model,
# 512-token window) and Envoy with the incontext filter in front of it, then sends the same
# chat request with an oversized max_tokens twice: straight to vLLM (rejected), and through
# Envoy + incontext (served). Stops both at the end.
#
#   scripts/demo.sh          the demo; stops vLLM and Envoy at the end
#   scripts/demo.sh --keep   the same, then leaves vLLM and Envoy running to try your own
#                            client; prints the URLs and where the Envoy config is
#   scripts/demo.sh --down   stops what `--keep` left running
#   scripts/demo.sh --agent  the demo, then the real Claude Code (npm, pinned; a 760 MB
#                            download the first time) in print mode against a second vLLM
#                            with a 12288-token window: straight to vLLM (its 400), in reject
#                            mode at a window its prompt overflows (its own "Prompt is too
#                            long"), and served through incontext. Adds 2-3 minutes.
#
# The demo's window is 512 tokens (a tiny model on CPU), so its plugin configuration uses
# min_output_tokens 64 and fallback_margin_tokens 32 instead of the shipped 4096 and 1024,
# which need a window above 5120 tokens.
#
# Environment (optional):
#   INCONTEXT_DEMO_VLLM_PORT    vLLM port        (default 8000, or a free one if taken)
#   INCONTEXT_DEMO_ENVOY_PORT   Envoy listener   (default 10000, or a free one if taken)
#   INCONTEXT_DEMO_ADMIN_PORT   Envoy admin      (default 9901, or a free one if taken)
#   INCONTEXT_DEMO_MAX_TOKENS   the oversized cap the request sends (default 32768)
#   INCONTEXT_DEMO_SKIP_SETUP=1 do not run scripts/setup.sh and scripts/setup-vllm.sh
#   (scripts/vllm.sh's INCONTEXT_VLLM_* variables apply too)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KEEP=0
WITH_AGENT=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    --down) DOWN=1 ;;
    --agent) WITH_AGENT=1 ;;
    *) echo "usage: scripts/demo.sh [--keep | --down] [--agent]" >&2; exit 2 ;;
  esac
done
# What --keep leaves running: Envoy's pid, config and log, and whether the demo started vLLM.
KEPT="$ROOT/.cache/demo"
if [ "${DOWN:-0}" = 1 ]; then
  if [ -f "$KEPT/envoy.pid" ] && kill -0 "$(cat "$KEPT/envoy.pid")" 2>/dev/null; then
    echo "==> stopping Envoy (pid $(cat "$KEPT/envoy.pid"))"
    kill "$(cat "$KEPT/envoy.pid")" 2>/dev/null || true
  else
    echo "==> no Envoy left running by scripts/demo.sh --keep"
  fi
  rm -f "$KEPT/envoy.pid"
  if [ -f "$KEPT/stop-vllm" ]; then
    echo "==> stopping vLLM"
    scripts/vllm.sh stop || true
    rm -f "$KEPT/stop-vllm"
  fi
  exit 0
fi
if [ "$KEEP" = 1 ] && [ -f "$KEPT/envoy.pid" ] && kill -0 "$(cat "$KEPT/envoy.pid")" 2>/dev/null; then
  echo "an Envoy from scripts/demo.sh --keep is still running (pid $(cat "$KEPT/envoy.pid")): run scripts/demo.sh --down first" >&2
  exit 1
fi
MAX_TOKENS="${INCONTEXT_DEMO_MAX_TOKENS:-32768}"
MODEL="qwen3-tiny"

if [ -t 1 ]; then BOLD=$'\033[1m'; PLAIN=$'\033[0m'; else BOLD=""; PLAIN=""; fi
step() { printf '\n%s==> %s%s\n' "$BOLD" "$*" "$PLAIN"; }
note() { printf '    %s\n' "$*"; }

if [ "$KEEP" = 1 ]; then
  WORK="$KEPT"
  rm -rf "$WORK"
  mkdir -p "$WORK"
else
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/incontext-demo.XXXXXX")"
fi
ENVOY_PID=""
STOP_VLLM=0
AGENT_ENVOYS=()
AGENT_VLLM_STATE=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$KEEP" = 1 ] && [ $rc -eq 0 ]; then
    exit 0   # left running on purpose; scripts/demo.sh --down stops it
  fi
  if [ -n "$ENVOY_PID" ] && kill -0 "$ENVOY_PID" 2>/dev/null; then
    step "stopping Envoy (pid $ENVOY_PID)"
    kill "$ENVOY_PID" 2>/dev/null || true
    wait "$ENVOY_PID" 2>/dev/null || true
  fi
  for pid in ${AGENT_ENVOYS[@]+"${AGENT_ENVOYS[@]}"}; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$AGENT_VLLM_STATE" ]; then
    step "stopping the 12288-token vLLM"
    INCONTEXT_VLLM_STATE="$AGENT_VLLM_STATE" scripts/vllm.sh stop || true
  fi
  if [ "$STOP_VLLM" = 1 ]; then
    step "stopping vLLM"
    scripts/vllm.sh stop || true
  fi
  rm -f "$KEPT/envoy.pid" "$KEPT/stop-vllm"
  if [ $rc -ne 0 ]; then
    echo "demo failed (exit $rc); Envoy log and config kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------------------ 1. install
if [ "${INCONTEXT_DEMO_SKIP_SETUP:-0}" != 1 ]; then
  step "1/7 setup: Rust wasm target, Envoy in .venv/, the filter build (scripts/setup.sh --demo)"
  scripts/setup.sh --demo
  step "1/7 setup: vLLM for CPU in .venv-vllm/ and a tiny Qwen3 model in .cache/ (scripts/setup-vllm.sh)"
  note "the first run downloads about 3.5 GB; later runs find everything in place"
  scripts/setup-vllm.sh
fi
PY="$ROOT/.venv/bin/python"
ENVOY="$(scripts/envoy-path.sh)"
WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
[ -f "$WASM" ] || { echo "no $WASM: run scripts/setup.sh" >&2; exit 1; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pick_port() { if port_free "$1"; then echo "$1"; else free_port; fi; }

# ------------------------------------------------------------------------------ 2. vLLM
step "2/7 starting vLLM (CPU build, model $MODEL with random weights, max_model_len 512)"
if scripts/vllm.sh status >/dev/null 2>&1; then
  VLLM_PORT="$(cat "${INCONTEXT_VLLM_STATE:-$ROOT/.cache}/vllm.port")"
  note "a vLLM started by scripts/vllm.sh is already running on port $VLLM_PORT: using it (and leaving it running)"
else
  VLLM_PORT="$(pick_port "${INCONTEXT_DEMO_VLLM_PORT:-8000}")"
  note "this takes 30-120 s on CPU"
  STOP_VLLM=1
  scripts/vllm.sh start "$VLLM_PORT"
fi
VLLM="http://127.0.0.1:$VLLM_PORT"

# ------------------------------------------------------------------------------ 3. Envoy
ENVOY_PORT="$(pick_port "${INCONTEXT_DEMO_ENVOY_PORT:-10000}")"
ADMIN_PORT="$(pick_port "${INCONTEXT_DEMO_ADMIN_PORT:-9901}")"
step "3/7 starting Envoy with incontext on 127.0.0.1:$ENVOY_PORT (admin 127.0.0.1:$ADMIN_PORT)"
note "config: envoy/envoy.yaml with the 'vllm' cluster -> 127.0.0.1:$VLLM_PORT, the wasm -> $WASM,"
note "plugin configuration for the 512-token window (the window itself is learned from vLLM's /tokenize):"
PLUGIN_CONFIG="$(cat <<EOF
{"tokenizer": {"backend": "vllm", "cluster": "vllm", "authority": "127.0.0.1:$VLLM_PORT", "timeout_ms": 30000},
 "min_output_tokens": 64, "fallback_margin_tokens": 32, "on_insufficient": "passthrough", "response_headers": true}
EOF
)"
printf '%s\n' "$PLUGIN_CONFIG" | sed 's/^/      /'
"$PY" - "$WORK/envoy.yaml" "$WASM" "$ENVOY_PORT" "$ADMIN_PORT" "$VLLM_PORT" "$PLUGIN_CONFIG" <<'PYEOF'
import json, sys
from pathlib import Path
import yaml
from tests.harness.envoy import render   # renders envoy/envoy.yaml with these substitutions only
out, wasm, port, admin, vllm_port, plugin = sys.argv[1:]
cfg = render(wasm_path=wasm, listen_port=int(port), admin_port=int(admin),
             upstream=("127.0.0.1", int(vllm_port)), plugin_config=json.loads(plugin))
Path(out).write_text(yaml.safe_dump(cfg, sort_keys=False))
PYEOF
"$ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 -l warn --log-path "$WORK/envoy.log" \
  --disable-hot-restart >"$WORK/envoy.out" 2>&1 </dev/null &
ENVOY_PID=$!
if [ "$KEEP" = 1 ]; then
  echo "$ENVOY_PID" >"$WORK/envoy.pid"
  [ "$STOP_VLLM" = 1 ] && : >"$WORK/stop-vllm"
fi
for _ in $(seq 1 100); do
  if curl -sf --max-time 1 "http://127.0.0.1:$ADMIN_PORT/ready" 2>/dev/null | grep -q LIVE; then break; fi
  kill -0 "$ENVOY_PID" 2>/dev/null || { cat "$WORK/envoy.out" "$WORK/envoy.log" >&2; echo "Envoy exited" >&2; exit 1; }
  sleep 0.2
done
curl -sf --max-time 1 "http://127.0.0.1:$ADMIN_PORT/ready" | grep -q LIVE || { echo "Envoy did not become ready" >&2; exit 1; }
note "Envoy is ready (pid $ENVOY_PID)"

BODY="$WORK/request.json"
cat >"$BODY" <<EOF
{"model": "$MODEL", "messages": [{"role": "user", "content": "Write a haiku about proxies."}], "max_tokens": $MAX_TOKENS, "temperature": 0}
EOF

# show <headers file> <body file>: status, x-incontext-* headers, error or usage + answer
show() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read().replace("\r", "")
blocks = [b for b in text.split("\n\n") if b.strip()]   # the last block: the final response
lines = blocks[-1].splitlines() if blocks else []
print("    HTTP status:", lines[0].split(" ", 1)[1] if lines else "?")
for line in lines[1:]:
    if line.lower().startswith("x-incontext-"):
        print("    " + line)
raw = open(sys.argv[2], encoding="utf-8", errors="replace").read()
try:
    body = json.loads(raw)
except ValueError:
    print("    body:", raw[:300]); sys.exit(0)
if "error" in body:
    err = body["error"]
    print("    error:", err.get("message") if isinstance(err, dict) else err)
elif body.get("type") == "message":   # Anthropic Messages
    u = body.get("usage", {})
    prompt = u.get("input_tokens", 0) + (u.get("cache_read_input_tokens") or 0)
    print(f"    usage: input_tokens={prompt} output_tokens={u.get('output_tokens')} "
          f"total={prompt + (u.get('output_tokens') or 0)} (window 512)")
    text = "".join(b.get("text", "") for b in body.get("content", []) if isinstance(b, dict))
    print(f"    stop_reason: {body.get('stop_reason')}")
    print(f"    answer (random weights, so gibberish): {text[:70]!r}...")
else:
    u = body.get("usage", {})
    print(f"    usage: prompt_tokens={u.get('prompt_tokens')} completion_tokens="
          f"{u.get('completion_tokens')} total={u.get('total_tokens')} (window 512)")
    ch = body["choices"][0]
    text = (ch.get("message") or {}).get("content") or ch.get("text") or ""
    print(f"    finish_reason: {ch.get('finish_reason')}")
    print(f"    answer (random weights, so gibberish): {text[:70]!r}...")
PYEOF
}

# ------------------------------------------------------------------------------ 4. without
step "4/7 the request straight to vLLM, without incontext: max_tokens=$MAX_TOKENS, window 512"
note "POST $VLLM/v1/chat/completions  $(cat "$BODY")"
curl -s -D "$WORK/direct.h" -o "$WORK/direct.json" -H 'content-type: application/json' \
  --data-binary @"$BODY" "$VLLM/v1/chat/completions" || true
show "$WORK/direct.h" "$WORK/direct.json"

# ------------------------------------------------------------------------------ 5. with
step "5/7 the same request through Envoy + incontext"
note "POST http://127.0.0.1:$ENVOY_PORT/v1/chat/completions  (same body)"
note "incontext asks vLLM's /tokenize how long the prompt is and rewrites max_tokens to fit;"
note "the tiny model then generates up to that many tokens on CPU (10-30 s)..."
curl -s -D "$WORK/filter.h" -o "$WORK/filter.json" -H 'content-type: application/json' \
  --data-binary @"$BODY" "http://127.0.0.1:$ENVOY_PORT/v1/chat/completions" || true
show "$WORK/filter.h" "$WORK/filter.json"
note "Envoy counters (curl -s 127.0.0.1:$ADMIN_PORT/stats?filter=incontext):"
curl -s "http://127.0.0.1:$ADMIN_PORT/stats?filter=incontext" \
  | grep -E 'incontext_(requests|rewritten|tokenizer_calls|cache_misses|estimates):' | sed 's/^/      /'

# ------------------------------------------------------------------------------ 6-7. Anthropic
# What Claude Code sends to ANTHROPIC_BASE_URL: the Messages API, max_tokens 32000, a system
# prompt in blocks, tools.
AGENT="$WORK/agent.json"
cat >"$AGENT" <<EOF
{"model": "$MODEL", "max_tokens": 32000, "temperature": 0,
 "system": [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Use the tools when they help."}],
 "tools": [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}],
 "messages": [{"role": "user", "content": "What does README.md say?"}]}
EOF
step "6/7 a Claude-Code-style Anthropic request straight to vLLM: POST /v1/messages, max_tokens=32000"
curl -s -D "$WORK/agent-direct.h" -o "$WORK/agent-direct.json" -H 'content-type: application/json' \
  --data-binary @"$AGENT" "$VLLM/v1/messages" || true
show "$WORK/agent-direct.h" "$WORK/agent-direct.json"
step "7/7 the same request through Envoy + incontext (counted by vLLM's /v1/messages/count_tokens)"
curl -s -D "$WORK/agent-filter.h" -o "$WORK/agent-filter.json" -H 'content-type: application/json' \
  --data-binary @"$AGENT" "http://127.0.0.1:$ENVOY_PORT/v1/messages" || true
show "$WORK/agent-filter.h" "$WORK/agent-filter.json"

step "done: without incontext vLLM refused both requests; with it, the caps were rewritten to fit the window"

# ------------------------------------------------------------------------------ --agent
if [ "$WITH_AGENT" = 1 ]; then
  step "agent 1/5 setup: Claude Code $(grep -o 'CLAUDE_CODE_VERSION=[0-9.]*' scripts/setup-sessions.sh | cut -d= -f2) from npm (scripts/setup-sessions.sh)"
  scripts/setup-sessions.sh
  if [ "$STOP_VLLM" = 1 ] && [ "$KEEP" = 0 ]; then
    step "stopping the 512-token vLLM (one model server at a time on this CPU)"
    scripts/vllm.sh stop || true
    STOP_VLLM=0
  fi
  CLAUDE="${INCONTEXT_AGENTS_DIR:-$HOME/.cache/incontext/agents}/node_modules/.bin/claude"
  AGENT_WINDOW=12288
  AGENT_VLLM_PORT="$(free_port)"
  step "agent 2/5 a second vLLM with a $AGENT_WINDOW-token window (Claude Code's own system prompt and tools are ~11.6k tokens)"
  AGENT_VLLM_STATE="$WORK/vllm-agent"
  mkdir -p "$AGENT_VLLM_STATE"
  INCONTEXT_VLLM_STATE="$AGENT_VLLM_STATE" INCONTEXT_VLLM_MAX_MODEL_LEN="$AGENT_WINDOW" \
    scripts/vllm.sh start "$AGENT_VLLM_PORT"
  AGENT_VLLM="http://127.0.0.1:$AGENT_VLLM_PORT"

  # agent_envoy NAME PLUGIN_CONFIG: an Envoy + incontext in front of that vLLM; sets AGENT_URL
  agent_envoy() {
    local port admin
    port="$(free_port)"; admin="$(free_port)"
    "$PY" - "$WORK/envoy-$1.yaml" "$WASM" "$port" "$admin" "$AGENT_VLLM_PORT" "$2" <<'PYEOF'
import json, sys
from pathlib import Path
import yaml
from tests.harness.envoy import render
out, wasm, port, admin, vllm_port, plugin = sys.argv[1:]
cfg = render(wasm_path=wasm, listen_port=int(port), admin_port=int(admin),
             upstream=("127.0.0.1", int(vllm_port)), plugin_config=json.loads(plugin))
Path(out).write_text(yaml.safe_dump(cfg, sort_keys=False))
PYEOF
    "$ENVOY" -c "$WORK/envoy-$1.yaml" --concurrency 1 -l warn --log-path "$WORK/envoy-$1.log" \
      --disable-hot-restart >"$WORK/envoy-$1.out" 2>&1 </dev/null &
    AGENT_ENVOYS+=("$!")
    for _ in $(seq 1 100); do
      curl -sf --max-time 1 "http://127.0.0.1:$admin/ready" 2>/dev/null | grep -q LIVE && break
      sleep 0.2
    done
    AGENT_URL="http://127.0.0.1:$port"
  }
  # claude_p URL: Claude Code in print mode, offline, against URL; prints what it reported
  claude_p() {
    mkdir -p "$WORK/claude-home" "$WORK/claude-work"
    (cd "$WORK/claude-work" && env -i PATH="$PATH" HOME="$WORK/claude-home" \
      ANTHROPIC_BASE_URL="$1" ANTHROPIC_API_KEY=x ANTHROPIC_MODEL="$MODEL" \
      ANTHROPIC_SMALL_FAST_MODEL="$MODEL" ANTHROPIC_DEFAULT_HAIKU_MODEL="$MODEL" \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 \
      DISABLE_ERROR_REPORTING=1 "$CLAUDE" -p "Say hello." --output-format json --model "$MODEL" \
      --max-turns 1 </dev/null >"$WORK/claude.out" 2>/dev/null || true)
    "$PY" - "$WORK/claude.out" <<'PYEOF'
import json, sys
lines = [l for l in open(sys.argv[1], errors="replace").read().splitlines() if l.startswith("{")]
r = json.loads(lines[-1]) if lines else {}
u = r.get("usage") or {}
print("    claude: is_error={} turns={} input_tokens={} output_tokens={}".format(
    r.get("is_error"), r.get("num_turns"), u.get("input_tokens"), u.get("output_tokens")))
print("    result:", (r.get("result") or "(no result)")[:240])
PYEOF
  }
  AGENT_CONFIG() {
    printf '{"tokenizer": {"backend": "vllm", "cluster": "vllm", "authority": "127.0.0.1:%s"}, "min_output_tokens": 64, "fallback_margin_tokens": 32%s}' \
      "$AGENT_VLLM_PORT" "$1"
  }

  step "agent 3/5 Claude Code straight to vLLM: it sends max_tokens 32000 > $AGENT_WINDOW"
  claude_p "$AGENT_VLLM"
  step "agent 4/5 Claude Code through incontext in reject mode, window_tokens 8192 (its prompt overflows it)"
  agent_envoy reject "$(AGENT_CONFIG ', "window_tokens": 8192, "on_insufficient": "reject"')"
  claude_p "$AGENT_URL" | tee "$WORK/claude-reject.txt"
  P="$(grep -o '~[0-9]* tokens' "$WORK/claude-reject.txt" | head -1 | tr -dc 0-9)"
  if [ -n "$P" ]; then
    step "agent 5/5 Claude Code through incontext, served: window_tokens $P + 256 so the tiny model's answer is short on CPU"
    note "its request is served (input_tokens = $P); the random-weight model never ends an answer, so the"
    note "window does, Claude Code continues, and what it gets then is its own \"Prompt is too long\""
    agent_envoy served "$(AGENT_CONFIG ", \"window_tokens\": $((P + 256))")"
    claude_p "$AGENT_URL"
  else
    note "Claude Code reported no prompt size: the served step is skipped"
  fi
  # The agent's servers are the demo's own: stopped here, also with --keep.
  for pid in "${AGENT_ENVOYS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  AGENT_ENVOYS=()
  INCONTEXT_VLLM_STATE="$AGENT_VLLM_STATE" scripts/vllm.sh stop || true
  AGENT_VLLM_STATE=""
fi

if [ "$KEEP" = 1 ]; then
  step "left running (--keep): try your own client"
  note "Envoy + incontext: http://127.0.0.1:$ENVOY_PORT  (OpenAI base URL http://127.0.0.1:$ENVOY_PORT/v1, model $MODEL)"
  note "Claude Code:       ANTHROPIC_BASE_URL=http://127.0.0.1:$ENVOY_PORT ANTHROPIC_MODEL=$MODEL claude"
  note "vLLM directly:     $VLLM"
  note "Envoy admin:       http://127.0.0.1:$ADMIN_PORT/stats?filter=incontext"
  note "Envoy config:      $WORK/envoy.yaml (envoy/envoy.yaml with the ports, the wasm and the plugin configuration above)"
  note "Envoy log:         $WORK/envoy.log"
  note "for example:  curl -si http://127.0.0.1:$ENVOY_PORT/v1/chat/completions -H 'content-type: application/json' --data-binary @$BODY"
  note "stop both:    scripts/demo.sh --down"
fi
