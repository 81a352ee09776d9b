#!/usr/bin/env bash
# Install the Kubernetes kinds' validators tests/deploy uses: the npm packages pinned in
# tests/deploy/schemas/package.json and package-lock.json (@kubernetes-models/istio,
# @kubernetes-models/gateway-api, kubernetes-models), with `npm ci` into .tools/deploy-schemas/.
#
#   scripts/setup-deploy.sh
#
# Idempotent: skipped when the stamp names the current lock file. No install scripts run.
# The kinds only ../shared/crds has schemas for (Envoy Gateway, AI Gateway, InferencePool) need
# nothing installed: tests/deploy reads those CRDs when they are there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/tests/deploy/schemas"
DEST="$ROOT/.tools/deploy-schemas"
STAMP="$DEST/.incontext-stamp"

say() { printf 'setup-deploy: %s\n' "$*"; }
die() { printf 'setup-deploy: error: %s\n' "$*" >&2; exit 1; }

want="$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -d "$DEST/node_modules" ]; then
  say "Kubernetes validators already installed in ${DEST#$ROOT/}"
  exit 0
fi
command -v npm >/dev/null 2>&1 || die "npm is needed (scripts/setup.sh installs it)"
start=$(date +%s)
say "installing the Kubernetes validators (npm ci, tests/deploy/schemas/package-lock.json) into ${DEST#$ROOT/}"
rm -rf "$DEST"
mkdir -p "$DEST"
cp "$SRC/package.json" "$SRC/package-lock.json" "$DEST/"
npm ci --prefix "$DEST" --ignore-scripts --no-audit --no-fund --silent >/dev/null \
  || die "npm ci failed in $DEST"
echo "$want" >"$STAMP"
say "installed in $(($(date +%s) - start)) s"
