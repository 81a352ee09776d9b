# Sourced by scripts/setup-sglang.sh, scripts/sglang.sh and tests/sglang: where the SGLang
# virtualenv lives. Needs REPO. It is layered on the vLLM virtualenv (scripts/vllm-paths.sh).
# Override: INCONTEXT_SGLANG_VENV.
# shellcheck source=scripts/vllm-paths.sh
. "$REPO/scripts/vllm-paths.sh"   # VENV (vLLM), MODEL_DIR
VLLM_VENV="$VENV"
SGLANG_VENV="${INCONTEXT_SGLANG_VENV:-$REPO/.venv-sglang}"
