#!/usr/bin/env bash
# Install the npm packages tests/deploy (and tests/e2e/test_dashboard.py) use, each pinned by its
# package.json and package-lock.json and installed with `npm ci`:
#   tests/deploy/schemas -> .tools/deploy-schemas/   the Kubernetes kinds' validators
#                           (@kubernetes-models/istio, @kubernetes-models/gateway-api,
#                           kubernetes-models)
#   tests/deploy/promql  -> .tools/deploy-promql/    Prometheus' PromQL parser and linter
#                           (@prometheus-io/codemirror-promql and its CodeMirror peers)
#
#   scripts/setup-deploy.sh
#
# Idempotent: each is skipped when its stamp names its current lock file. No install scripts run.
# The kinds only ../shared/crds has schemas for (Envoy Gateway, AI Gateway, InferencePool) need
# nothing installed: tests/deploy reads those CRDs when they are there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf 'setup-deploy: %s\n' "$*"; }
die() { printf 'setup-deploy: error: %s\n' "$*" >&2; exit 1; }

# install NAME SRC DEST
install() {
  local name="$1" src="$2" dest="$3" stamp="$3/.incontext-stamp" want start
  want="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest/node_modules" ]; then
    say "$name already installed in ${dest#$ROOT/}"
    return 0
  fi
  command -v npm >/dev/null 2>&1 || die "npm is needed (scripts/setup.sh installs it)"
  start=$(date +%s)
  say "installing $name (npm ci, ${src#$ROOT/}/package-lock.json) into ${dest#$ROOT/}"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  npm ci --prefix "$dest" --ignore-scripts --no-audit --no-fund --silent >/dev/null \
    || die "npm ci failed in $dest"
  echo "$want" >"$stamp"
  say "$name installed in $(($(date +%s) - start)) s"
}

install "the Kubernetes validators" "$ROOT/tests/deploy/schemas" "$ROOT/.tools/deploy-schemas"
install "the PromQL parser" "$ROOT/tests/deploy/promql" "$ROOT/.tools/deploy-promql"
