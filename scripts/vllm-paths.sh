# Sourced by scripts/setup-vllm.sh and scripts/vllm.sh: where the CPU vLLM and the tiny model
# live, so that the script that installs them and the one that runs them agree.
# Needs REPO (the repository root). Overrides: INCONTEXT_VLLM_VENV, INCONTEXT_VLLM_MODEL.
VENV="${INCONTEXT_VLLM_VENV:-$REPO/.venv-vllm}"
MODEL_DIR="${INCONTEXT_VLLM_MODEL:-$REPO/.cache/model/qwen3-tiny}"
