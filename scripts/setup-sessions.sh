#!/usr/bin/env bash
# Setup of the agent-session suite (tests/sessions): the real vLLM (scripts/setup-vllm.sh), the
# client SDKs (scripts/setup.sh puts them in .venv) and the two real agents, installed pinned
# from the npm registry into one directory outside the clone (reused by later runs):
#   @anthropic-ai/claude-code  (Claude Code: `claude -p ... --output-format json`)
#   @openai/codex              (Codex CLI: `codex exec`)
# Idempotent. The agents run offline against Envoy; nothing here logs in anywhere.
#
# Environment: INCONTEXT_AGENTS_DIR (default $HOME/.cache/incontext/agents).
# setup: background
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
DIR="${INCONTEXT_AGENTS_DIR:-$HOME/.cache/incontext/agents}"

bash "$ROOT/scripts/setup-vllm.sh"

want="claude-code@$CLAUDE_CODE_VERSION codex@$CODEX_VERSION"
if [ "$(cat "$DIR/.installed" 2>/dev/null)" = "$want" ] \
    && [ -x "$DIR/node_modules/.bin/claude" ] && [ -x "$DIR/node_modules/.bin/codex" ]; then
  echo "setup-sessions: agents ready in $DIR ($want)"
  exit 0
fi
mkdir -p "$DIR"
command -v npm >/dev/null || { echo "setup-sessions: npm is needed (apt-get install nodejs npm)" >&2; exit 1; }
t0=$(date +%s)
# --no-fund/--no-audit: no calls beyond the registry's package downloads.
npm install --prefix "$DIR" --no-fund --no-audit --no-save --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
"$DIR/node_modules/.bin/claude" --version
"$DIR/node_modules/.bin/codex" --version
echo "$want" >"$DIR/.installed"
echo "setup-sessions: agents installed in $DIR in $(( $(date +%s) - t0 )) s ($(du -sh "$DIR" | cut -f1))"
