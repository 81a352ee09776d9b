#!/usr/bin/env bash
# Prints the path of the pinned uv (PyPI package uv, a prebuilt binary), installing it first
# into ${INCONTEXT_CACHE:-~/.cache/incontext}/uv-<version>/ with pip when it is not there.
#
#   UV="$(bash scripts/uv.sh)"
#
# The setup scripts install their big virtualenvs with `uv pip install`: it downloads in
# parallel and links the files from its cache (~/.cache/uv, or UV_CACHE_DIR), so the vLLM
# releases, which share most of their wheels, are unpacked once.
set -euo pipefail
UV_VERSION="0.13.8"
DIR="${INCONTEXT_CACHE:-$HOME/.cache/incontext}/uv-$UV_VERSION"
UV="$DIR/bin/uv"
ok() { [ -x "$UV" ] && [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" = "$UV_VERSION" ]; }
if ! ok; then
  mkdir -p "$(dirname "$DIR")"
  exec 6>"$DIR.lock"
  flock 6
  if ! ok; then
    printf 'uv: installing uv %s into %s\n' "$UV_VERSION" "$DIR" >&2
    rm -rf "$DIR"
    "${PYTHON:-python3}" -m venv "$DIR" >&2
    "$DIR/bin/python" -m pip install --disable-pip-version-check --no-input -q \
      --only-binary :all: "uv==$UV_VERSION" >&2
    ok || { printf 'uv: error: %s does not report version %s\n' "$UV" "$UV_VERSION" >&2; exit 1; }
  fi
fi
echo "$UV"
