#!/usr/bin/env bash
# Setup of the agent-session suite (tests/sessions): the real vLLM (scripts/setup-vllm.sh), the
# client SDKs (scripts/setup.sh puts them in .venv) and the four real agents, installed pinned
# from the npm registry into one directory outside the clone (reused by later runs):
#   @anthropic-ai/claude-code  (Claude Code: `claude -p ... --output-format json`)
#   @openai/codex              (Codex CLI: `codex exec`)
#   opencode-ai                (OpenCode: `opencode run --format json`; its postinstall links
#                               the binary of the platform's optional package)
#   @qwen-code/qwen-code       (Qwen Code: `qwen PROMPT --output-format json`)
# Idempotent. The agents run offline against Envoy; nothing here logs in anywhere.
#
# Environment: INCONTEXT_AGENTS_DIR (default $HOME/.cache/incontext/agents).
# setup: background
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
OPENCODE_VERSION=1.18.33
QWEN_CODE_VERSION=0.24.4
DIR="${INCONTEXT_AGENTS_DIR:-$HOME/.cache/incontext/agents}"

bash "$ROOT/scripts/setup-vllm.sh"
bash "$ROOT/scripts/setup-hermes.sh"   # Hermes Agent + the seed plugin (PyPI)

want="claude-code@$CLAUDE_CODE_VERSION codex@$CODEX_VERSION opencode@$OPENCODE_VERSION"
want="$want qwen-code@$QWEN_CODE_VERSION"
BINS=(claude codex opencode qwen)
ready=1
for b in "${BINS[@]}"; do [ -x "$DIR/node_modules/.bin/$b" ] || ready=0; done
if [ "$(cat "$DIR/.installed" 2>/dev/null)" = "$want" ] && [ "$ready" = 1 ]; then
  echo "setup-sessions: agents ready in $DIR ($want)"
  exit 0
fi
mkdir -p "$DIR"
command -v npm >/dev/null || { echo "setup-sessions: npm is needed (apt-get install nodejs npm)" >&2; exit 1; }
t0=$(date +%s)
# --no-fund/--no-audit: no calls beyond the registry's package downloads.
npm install --prefix "$DIR" --no-fund --no-audit --no-save --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" \
  "opencode-ai@$OPENCODE_VERSION" "@qwen-code/qwen-code@$QWEN_CODE_VERSION"
# Each prints its version (HOME apart: none writes into the user's configuration).
home="$(mktemp -d)"
for b in "${BINS[@]}"; do
  HOME="$home" "$DIR/node_modules/.bin/$b" --version </dev/null
done
rm -rf "$home"
echo "$want" >"$DIR/.installed"
echo "setup-sessions: agents installed in $DIR in $(( $(date +%s) - t0 )) s ($(du -sh "$DIR" | cut -f1))"
