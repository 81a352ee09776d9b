#!/usr/bin/env bash
# incontext performance bench: Envoy WITH the filter (the wasm build and the native module)
# vs the SAME Envoy WITHOUT it, in one run.
#
#   bench/run.sh              full run: throughput/latency tables + 100k-request memory soak,
#                             printed and written to bench/results.md (~8 min)
#   bench/run.sh bench        only the tables
#   bench/run.sh soak         only the memory soak (same as bench/soak-memory.sh)
#   BENCH_DURATION=2s BENCH_SOAK_REQUESTS=20000 bench/run.sh     quick CI variant (~2.5 min)
#
# What runs (all on 127.0.0.1):
#   upstream  a second Envoy answering with direct responses: POST /tokenize ->
#             {"count":1000,"max_model_len":32768}, anything else -> a small chat completion.
#   filter    envoy/envoy.yaml with only addresses, the wasm path and context_length: 32768
#             changed (bench/render.py), the `vllm` cluster pointed at the upstream.
#   nofilter  the same config without the wasm filter (buffer filter + router kept): Envoy alone.
#   module    envoy/envoy-module.yaml (the native dynamic module, no buffer filter) with the same
#             changes; the module is target/module/libincontext_module.so (scripts/build-module.sh).
# Every proxy runs with --concurrency 2. wrk (Debian package; installed if missing) drives one
# proxy at a time, 16 connections, 2 threads. Each point gets a warm-up per variant, then
# BENCH_DURATION per variant split into BENCH_ROUNDS interleaved rounds (no-filter, filter,
# module, then module, filter, no-filter, ...), so drifting background load hits every variant
# alike; the report gives total rps, the median of each build's per-round ratios to the
# no-filter Envoy (with their range) and median latencies.
# CPU pinning: none by default. On 2 cores every process (2 proxy workers, 2 wrk threads, the
# upstream) is CPU-bound, so a split (proxy on one CPU, wrk + upstream on the other) only
# halves the proxy's CPU and skews its two workers; BENCH_CPUS_* allow trying it.
#
# Modes (bodies from bench/bodies.py: system prompt + tools + multi-turn agent conversation):
#   hit   the same chat body every time: the filter scans, hashes, hits its cache, splices
#   miss  a unique id in the first user message per request: the filter misses, builds the
#         /tokenize payload, calls the upstream's /tokenize, stores, splices
#   pass  the same content under "input" (no messages/prompt): scanned, left unchanged (shape)
#   stream  the same Anthropic Messages body every time (cache hit, max_tokens rewritten), and
#         a streamed answer (SSE, 40 deltas) that used the whole cap: the filter watches it
#         event by event and reports the window's stop reason (docs/spec.md §13)
#   get   GET without a body: left unchanged at the headers (method)
#
# Environment (defaults in brackets):
#   BENCH_DURATION [10s, whole seconds]  BENCH_ROUNDS [5]  BENCH_WARMUP [1s]  BENCH_CONNECTIONS [16]  BENCH_THREADS [2]
#   BENCH_SIZES ["2048 32768 409600 1572864"]  BENCH_MODES ["hit miss pass stream get"]
#   BENCH_LATENCY_MODES ["hit get"] at BENCH_LATENCY_CONNECTIONS [1]: a second, unloaded pass
#     (1 connection: no queueing, so added p50 is the filter's own per-request latency;
#     at 16 connections the proxies are saturated and p50 is mostly queueing, ~16/rps)
#   BENCH_SOAK_REQUESTS [100000]  BENCH_SOAK_SIZE [2048]  BENCH_SOAK_CHUNK [5s]
#   BENCH_PORT_BASE [18180]: ports BASE..BASE+3 (listeners) and BASE+10..BASE+13 (admin)
#   BENCH_CPUS_PROXY / BENCH_CPUS_UPSTREAM / BENCH_CPUS_WRK: taskset -c lists [unpinned]
#   BENCH_WASM: use this .wasm instead of building target/wasm32-wasip1/release/incontext.wasm
#   BENCH_BUILDS ["wasm module"]: the builds measured beside the no-filter Envoy ("wasm" always;
#     "wasm" alone leaves the module out; BENCH_PROBE implies it)
#   BENCH_MODULE: use this .so instead of building target/module/libincontext_module.so
#   BENCH_PLUGIN_JSON: a JSON object merged into the plugin configuration, e.g.
#     '{"response_headers": false}' (context_length is always 32768)
#   BENCH_PROBE: none|buffer|read|write|report|lookups|head runs bench/probe (a filter doing only that much
#     of incontext's work) instead of incontext: see bench/floor.sh
#   BENCH_OUT [bench/results.md]   BENCH_KEEP=1 keeps the work directory (configs, logs)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="$ROOT/bench"
WHAT="${1:-all}"
case "$WHAT" in all|bench|soak) ;; *) echo "usage: $0 [all|bench|soak]" >&2; exit 2;; esac

DURATION="${BENCH_DURATION:-10s}"
ROUNDS="${BENCH_ROUNDS:-5}"
D_S="${DURATION%s}"; [[ "$D_S" =~ ^[0-9]+$ ]] || { echo "BENCH_DURATION must be whole seconds, e.g. 10s" >&2; exit 2; }
[ "$ROUNDS" -le "$D_S" ] || ROUNDS=$D_S
ROUND_S=$((D_S / ROUNDS))
WARMUP="${BENCH_WARMUP:-1s}"
CONNS="${BENCH_CONNECTIONS:-16}"
THREADS="${BENCH_THREADS:-2}"
SIZES="${BENCH_SIZES:-2048 32768 409600 1572864}"
MODES="${BENCH_MODES-hit miss pass stream get}"          # empty: no 16-connection pass
LAT_CONNS="${BENCH_LATENCY_CONNECTIONS:-1}"      # a second pass, unloaded: per-request latency
LAT_MODES="${BENCH_LATENCY_MODES-hit get}"       # empty: no latency pass
[ -n "$LAT_MODES" ] || LAT_CONNS=""
SOAK_REQUESTS="${BENCH_SOAK_REQUESTS:-100000}"
SOAK_SIZE="${BENCH_SOAK_SIZE:-2048}"
SOAK_CHUNK="${BENCH_SOAK_CHUNK:-5s}"
BASE="${BENCH_PORT_BASE:-18180}"
OUT="${BENCH_OUT:-$BENCH/results.md}"
UP_PORT=$BASE; F_PORT=$((BASE + 1)); N_PORT=$((BASE + 2)); M_PORT=$((BASE + 3))
ADMIN=$((BASE + 10)); F_ADMIN=$((ADMIN + 1)); N_ADMIN=$((ADMIN + 2)); M_ADMIN=$((ADMIN + 3))

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

# --- tools -----------------------------------------------------------------------------------
if ! command -v wrk >/dev/null 2>&1; then
  say "installing wrk (apt-get)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get install -y wrk >/dev/null 2>&1 || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y wrk >/dev/null; }
fi
ENVOY="$("$ROOT/scripts/envoy-path.sh")" || die "no Envoy: run scripts/setup.sh"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
"$PY" -c 'import yaml' 2>/dev/null || die "$PY has no PyYAML: run scripts/setup.sh"

WORK="$(mktemp -d /tmp/incontext-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PROBE="${BENCH_PROBE:-}"
if [ -n "$PROBE" ]; then
  say "building the probe filter (bench/probe, mode $PROBE)"
  (cd "$BENCH/probe" && cargo build --release --target wasm32-wasip1 -q) || die "probe build failed"
  SRC_WASM="$BENCH/probe/target/wasm32-wasip1/release/incontext_probe.wasm"
  BENCH_PLUGIN_JSON="{\"probe\": \"$PROBE\"}"
elif [ -n "${BENCH_WASM:-}" ]; then
  SRC_WASM="$BENCH_WASM"
else
  say "building the filter (scripts/build-wasm.sh)"
  bash "$ROOT/scripts/build-wasm.sh" || die "build failed"
  SRC_WASM="$ROOT/target/wasm32-wasip1/release/incontext.wasm"
fi
[ -f "$SRC_WASM" ] || die "no wasm at $SRC_WASM"
cp "$SRC_WASM" "$WORK/incontext.wasm"   # a private copy: a rebuild during the run changes nothing

# The variants, in the order of odd rounds (even rounds run them reversed).
BUILDS="${BENCH_BUILDS-wasm module}"; [ -z "$PROBE" ] || BUILDS=wasm
VARIANTS="nofilter filter"; MODULE=0; SRC_MODULE=""
case " $BUILDS " in *" module "*) VARIANTS="nofilter filter module"; MODULE=1 ;; esac
if [ "$MODULE" = 1 ]; then
  if [ -n "${BENCH_MODULE:-}" ]; then
    SRC_MODULE="$BENCH_MODULE"
  else
    say "building the module (scripts/build-module.sh)"
    bash "$ROOT/scripts/build-module.sh" >/dev/null || die "module build failed"
    SRC_MODULE="$ROOT/target/module/libincontext_module.so"
  fi
  [ -f "$SRC_MODULE" ] || die "no module at $SRC_MODULE"
  mkdir -p "$WORK/module"
  cp "$SRC_MODULE" "$WORK/module/libincontext_module.so"   # a private copy, as for the wasm
fi

for p in $UP_PORT $F_PORT $N_PORT $M_PORT $ADMIN $F_ADMIN $N_ADMIN $M_ADMIN; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    die "port $p is in use: set BENCH_PORT_BASE"
  fi
done

say "rendering configs and bodies in $WORK"
MODULE_PORT_ARG=""; [ "$MODULE" = 0 ] || MODULE_PORT_ARG=$M_PORT
"$PY" "$BENCH/render.py" "$WORK" "$WORK/incontext.wasm" "$UP_PORT" "$F_PORT" "$N_PORT" "$ADMIN" \
  "${BENCH_PLUGIN_JSON:-}" $MODULE_PORT_ARG
SOAK_SIZES="$SIZES"; [[ " $SIZES " == *" $SOAK_SIZE "* ]] || SOAK_SIZES="$SIZES $SOAK_SIZE"
"$PY" "$BENCH/bodies.py" "$WORK" $SOAK_SIZES

pin() { if [ -n "$1" ]; then echo "taskset -c $1"; fi; }
declare -A PID_OF
start_envoy() { # name concurrency cpus admin_port
  local name=$1 conc=$2 cpus=$3 admin=$4
  ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$WORK/module" \
  $(pin "$cpus") "$ENVOY" -c "$WORK/$name.yaml" --concurrency "$conc" --disable-hot-restart \
    -l warn --log-path "$WORK/$name.log" >"$WORK/$name.out" 2>&1 </dev/null &
  local pid=$!
  PIDS+=("$pid"); PID_OF[$name]=$pid
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$WORK/$name.log" "$WORK/$name.out" >&2; die "$name envoy exited"; }
    if curl -sf "http://127.0.0.1:$admin/ready" 2>/dev/null | grep -q LIVE; then return 0; fi
    sleep 0.1
  done
  die "$name envoy not ready after 30 s"
}
stop_envoy() { # name
  local pid=${PID_OF[$1]} keep=() p
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

declare -A PORT_OF=([filter]=$F_PORT [nofilter]=$N_PORT [module]=$M_PORT)
declare -A ADMIN_OF=([filter]=$F_ADMIN [nofilter]=$N_ADMIN [module]=$M_ADMIN)
counters() { # admin port [stat prefix] -> "name=value ..." of the incontext counters
  local prefix=${2:-wasmcustom}
  curl -sf "http://127.0.0.1:$1/stats?filter=^$prefix\.incontext_" \
    | sed -n "s/^$prefix\.\(incontext_[a-z_]*\): \([0-9]*\)\$/\1=\2/p" | tr '\n' ' '
}
module_counters() { counters $M_ADMIN dynamicmodulescustom; }
memsnap() { # name admin label
  "$PY" "$BENCH/memstat.py" "${PID_OF[$1]}" "$2" "$3" | sed "s/^{/{\"envoy\": \"$1\", /" >>"$WORK/memory.jsonl"
}

# wrk_run port mode size duration nonce -> the BENCH line on stdout
wrk_run() {
  local port=$1 mode=$2 size=$3 dur=$4 nonce=$5 conns=${6:-$CONNS}
  local threads=$THREADS; [ "$conns" -ge "$threads" ] || threads=$conns
  local body="" method=POST unique=0 path=/v1/chat/completions
  case $mode in
    hit) body="$WORK/chat-$size.json" ;;
    miss) body="$WORK/chat-$size.json"; unique=1 ;;
    pass) body="$WORK/input-$size.json" ;;
    stream) body="$WORK/messages-$size.json"; path=/v1/messages ;;
    get) method=GET; path=/v1/models ;;
  esac
  BENCH_BODY="$body" BENCH_METHOD=$method BENCH_UNIQUE=$unique BENCH_NONCE="$nonce" BENCH_PATH=$path \
    $(pin "${BENCH_CPUS_WRK:-}") wrk -t"$threads" -c"$conns" -d"$dur" --timeout 30s \
    -s "$BENCH/bench.lua" "http://127.0.0.1:$port$path" 2>&1 | grep '^BENCH ' || echo "BENCH failed"
}

RUN_ID="$(date +%s)-$$"
meta() {
  local wasm_size; wasm_size=$(stat -c %s "$WORK/incontext.wasm")
  "$PY" - "$WORK/meta.json" <<EOF
import json, sys
json.dump({
  "date": "$(date -u '+%Y-%m-%d %H:%M UTC')",
  "nproc": "$(nproc)",
  "cpu": "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')",
  "mem": "$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)",
  "kernel": "$(uname -r)",
  "envoy": "$("$ENVOY" --version | sed -n 's/.*version: \([^ ]*\).*/\1/p' | head -1)",
  "wrk": "$(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)",
  "wasm_size": $wasm_size,
  "wasm_src": "$SRC_WASM",
  "module_size": $( [ "$MODULE" = 1 ] && stat -c %s "$WORK/module/libincontext_module.so" || echo None),
  "module_src": "$SRC_MODULE", "variants": "$VARIANTS",
  "commit": "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)",
  "duration": "$DURATION", "rounds": $ROUNDS, "round_s": $ROUND_S, "warmup": "$WARMUP", "connections": $CONNS, "threads": $THREADS,
  "cpus_proxy": "${BENCH_CPUS_PROXY:-}", "cpus_upstream": "${BENCH_CPUS_UPSTREAM:-}",
  "cpus_wrk": "${BENCH_CPUS_WRK:-}", "plugin_json": json.loads('''${BENCH_PLUGIN_JSON:-null}'''),
  "load_start": "$LOAD_START", "load_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
  "soak_requests": $SOAK_REQUESTS, "soak_size": $SOAK_SIZE, "soak_chunk": "$SOAK_CHUNK", "what": "$WHAT",
}, open(sys.argv[1], "w"))
EOF
}
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"

say "starting upstream and the $VARIANTS Envoys ($ENVOY)"
start_envoy upstream 2 "${BENCH_CPUS_UPSTREAM:-}" "$ADMIN"
for variant in $VARIANTS; do start_envoy $variant 2 "${BENCH_CPUS_PROXY:-}" "${ADMIN_OF[$variant]}"; done

# counters of a filtering variant
counters_of() { if [ "$1" = module ]; then module_counters; else counters $F_ADMIN; fi; }

# Sanity: each filter rewrites a chat body and the no-filter Envoy answers.
sed 's/@@UNIQ@@/sanity/' "$WORK/chat-${SIZES%% *}.json" >"$WORK/sanity.json"
rewritten() { counters_of $1 | tr ' ' '\n' | sed -n 's/^incontext_rewritten=//p'; }
for variant in $VARIANTS; do
  r0=$(rewritten $variant)
  curl -sf -o /dev/null -H 'content-type: application/json' --data-binary @"$WORK/sanity.json" \
    "http://127.0.0.1:${PORT_OF[$variant]}/v1/chat/completions" || die "$variant sanity request failed"
  [ $variant = nofilter ] || [ -n "$PROBE" ] || [ "$(rewritten $variant)" = $((r0 + 1)) ] \
    || die "$variant sanity check: the request was not rewritten (see $WORK/$variant.log)"
done

for variant in $VARIANTS; do memsnap $variant ${ADMIN_OF[$variant]} start; done

# CPU time (ns) used so far by a process, all threads including exited ones (utime + stime
# from /proc/PID/stat, in clock ticks): the proxies' own CPU per request, which background
# load on a shared machine moves much less than it moves rps.
TICK_NS=$((1000000000 / $(getconf CLK_TCK)))
cpu_ns() { awk -v t=$TICK_NS '{sub(/^.*\) /, ""); printf "%.0f", ($12 + $13) * t}' /proc/"$1"/stat; }

REVERSED="$(tr ' ' '\n' <<<"$VARIANTS" | tac | tr '\n' ' ')"
# run_point i mode size conns: warm-up, then ROUNDS interleaved rounds of every variant.
run_point() {
  local i=$1 mode=$2 size=$3 conns=$4 r order variant port line before after pid c0 c1 mbefore mafter
  for variant in $VARIANTS; do
    wrk_run ${PORT_OF[$variant]} $mode $size "$WARMUP" "w$RUN_ID-$i-$variant" $conns >/dev/null
  done
  before=$(counters $F_ADMIN)
  [ "$MODULE" = 0 ] || mbefore=$(module_counters)
  for r in $(seq 1 $ROUNDS); do
    order="$VARIANTS"; [ $(((i + r) % 2)) = 0 ] && order="$REVERSED"
    for variant in $order; do
      port=${PORT_OF[$variant]}
      pid=${PID_OF[$variant]}
      c0=$(cpu_ns $pid)
      line=$(wrk_run $port $mode $size "${ROUND_S}s" "m$RUN_ID-$i-$r-$variant" $conns)
      c1=$(cpu_ns $pid)
      printf '%s\t%s\t%s\t%s\t%s\t%s cpu_ns=%s\n' "$mode" "$size" "$conns" "$variant" "$r" "$line" $((c1 - c0)) >>"$WORK/points.tsv"
      say "[$i/$total] $mode $size c$conns round $r/$ROUNDS $variant: $(sed 's/ p90_us.*//;s/BENCH //' <<<"$line")"
    done
  done
  after=$(counters $F_ADMIN)
  printf '%s\t%s\t%s\t%s\t%s\n' "$mode" "$size" "$conns" "$before" "$after" >>"$WORK/counters.tsv"
  if [ "$MODULE" = 1 ]; then
    mafter=$(module_counters)
    printf '%s\t%s\t%s\t%s\t%s\tmodule\n' "$mode" "$size" "$conns" "$mbefore" "$mafter" >>"$WORK/counters.tsv"
  fi
}

if [ "$WHAT" != soak ]; then
  POINTS=()
  for conns in $CONNS $LAT_CONNS; do
    modes="$MODES"; [ "$conns" = "$CONNS" ] || modes="$LAT_MODES"
    for mode in $modes; do
      sizes="$SIZES"; [ "$mode" = get ] && sizes=0
      for size in $sizes; do POINTS+=("$mode $size $conns"); done
    done
  done
  total=${#POINTS[@]}; i=0
  for pt in "${POINTS[@]}"; do
    i=$((i + 1))
    run_point $i $pt
  done
  for variant in $VARIANTS; do memsnap $variant ${ADMIN_OF[$variant]} "after bench"; done
fi

if [ "$WHAT" != bench ]; then
  # A fresh filter Envoy, so the soak starts from a clean VM; cache_entries as shipped.
  say "soak: $SOAK_REQUESTS cache-miss requests of $SOAK_SIZE bytes (fresh filter Envoy)"
  stop_envoy filter
  start_envoy filter 2 "${BENCH_CPUS_PROXY:-}" "$F_ADMIN"
  wrk_run $F_PORT miss $SOAK_SIZE 2s "s$RUN_ID-warm" >/dev/null
  base=$(counters $F_ADMIN | tr ' ' '\n' | sed -n 's/^incontext_requests=//p')
  memsnap filter $F_ADMIN "soak 0"
  n=0; chunk=0
  while [ "$n" -lt "$SOAK_REQUESTS" ]; do
    chunk=$((chunk + 1))
    line=$(wrk_run $F_PORT miss $SOAK_SIZE "$SOAK_CHUNK" "s$RUN_ID-$chunk")
    now=$(counters $F_ADMIN | tr ' ' '\n' | sed -n 's/^incontext_requests=//p')
    n=$((now - base))
    memsnap filter $F_ADMIN "soak $n"
    printf '%s\t%s\n' "$n" "$line" >>"$WORK/soak.tsv"
    say "soak: $n requests ($(sed 's/ p90_us.*//;s/BENCH //' <<<"$line"))"
  done
  counters $F_ADMIN >"$WORK/soak-counters.txt"
fi

meta
"$PY" "$BENCH/report.py" "$WORK" "$OUT"
say "written: $OUT"
