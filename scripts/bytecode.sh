#!/usr/bin/env bash
# Compiles a virtualenv's Python files to bytecode, once:
#
#   bash scripts/bytecode.sh VENV
#
# Where PYTHONDONTWRITEBYTECODE is set (CI machines often set it), Python never writes the
# bytecode it compiles on import, so every process compiles its imports from source again: a
# vLLM start is three processes each importing vLLM, torch and transformers (about 7 s of
# compiling each on 2 cores), and the suites start a dozen. Compiled here, every later import
# only reads. Idempotent: a stamp of the installed distributions makes it instant when nothing
# changed. Files written for another Python (templates, vendored examples) do not compile;
# nothing imports them, so their errors are ignored.
set -euo pipefail
VENV="$1"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "bytecode: no virtualenv at $VENV" >&2; exit 1; }
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
STAMP="$VENV/.incontext-bytecode"
exec 7>"$STAMP.lock"
flock 7
# (__pycache__ left out: compiling adds it for the top-level modules)
want="$("$PY" -c 'import sys; print(sys.version)'; ls "$SITE" | grep -vx __pycache__)"
want="$(printf '%s' "$want" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
start=$(date +%s)
"$PY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
echo "$want" >"$STAMP"
echo "bytecode: compiled $SITE in $(($(date +%s) - start)) s"
