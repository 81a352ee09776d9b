#!/usr/bin/env bash
# Setup of Hermes Agent for the agent-session suite (tests/sessions/test_hermes.py): Hermes
# (PyPI hermes-agent) and the seed plugin (PyPI incontext, Hermes' own output budgeting, the
# design this project ports) in their own virtualenv, pinned by
# scripts/hermes-requirements.txt, installed with uv (scripts/uv.sh) from PyPI only.
# Idempotent (a stamp holds the requirements' hash). Hermes runs offline afterwards: the tests
# turn its lazy installs and its tirith download off.
#
# Environment: INCONTEXT_HERMES_VENV (default $HOME/.cache/incontext/venv-hermes).
# setup: background
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/scripts/hermes-requirements.txt"
VENV="${INCONTEXT_HERMES_VENV:-$HOME/.cache/incontext/venv-hermes}"
HERMES_VERSION="$(sed -n 's/^hermes-agent==//p' "$REQS")"
SEED_VERSION="$(sed -n 's/^incontext==//p' "$REQS")"

say() { printf 'setup-hermes: %s\n' "$*"; }
die() { printf 'setup-hermes: error: %s\n' "$*" >&2; exit 1; }

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "python3 not found (Hermes Agent needs Python 3.11+)"
"$PY" -c 'import sys; sys.exit(not sys.version_info[:2] >= (3, 11))' \
  || die "$("$PY" -V 2>&1) found; Hermes Agent needs Python 3.11+"
mkdir -p "$(dirname "$VENV")"
exec 8>"$VENV.lock"
flock 8

want="reqs=$(sha256sum "$REQS" | cut -d' ' -f1)"
STAMP="$VENV/.incontext-hermes-stamp"
if [ -x "$VENV/bin/hermes" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  say "Hermes Agent $HERMES_VERSION and incontext $SEED_VERSION ready in $VENV"
  exit 0
fi
t0=$(date +%s)
UV="$(bash "$ROOT/scripts/uv.sh")" || die "could not install uv (scripts/uv.sh)"
rm -rf "$VENV"
"$UV" venv --quiet --python "$PY" "$VENV"
# --no-deps: the file is the complete resolved set.
"$UV" pip install --quiet --python "$VENV/bin/python" --no-deps --only-binary :all: -r "$REQS"
# Both import, and the seed plugin is registered as a Hermes plugin entry point. (Not
# `hermes --version`: it asks the network for updates.)
[ -x "$VENV/bin/hermes" ] || die "no $VENV/bin/hermes"
"$VENV/bin/python" - "$HERMES_VERSION" "$SEED_VERSION" <<'EOF' \
  || die "Hermes or the seed plugin is not installed as pinned"
import importlib.metadata as m, sys
import hermes_cli.main, incontext  # noqa: F401
assert m.version("hermes-agent") == sys.argv[1] and m.version("incontext") == sys.argv[2]
assert [e.value for e in m.entry_points(group="hermes_agent.plugins")] == ["incontext"]
EOF
echo "$want" >"$STAMP"
say "Hermes Agent $HERMES_VERSION and incontext $SEED_VERSION installed in $VENV in $(( $(date +%s) - t0 )) s ($(du -sh "$VENV" | cut -f1))"
