#!/usr/bin/env bash
# Memory soak: BENCH_SOAK_REQUESTS (default 100000) cache-miss requests (a unique prompt each,
# so the count cache fills and must stay bounded at cache_entries) against a fresh Envoy with
# the filter; VM linear memory, Envoy heap and RSS sampled after every BENCH_SOAK_CHUNK (5s).
# How memory is measured: see bench/memstat.py. Writes bench/results.md (or BENCH_OUT).
#   bench/soak-memory.sh
#   BENCH_SOAK_REQUESTS=20000 BENCH_OUT=/tmp/soak.md bench/soak-memory.sh
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" soak "$@"
