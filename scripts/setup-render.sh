#!/usr/bin/env bash
# Setup of tests/render: the default vLLM release and the model (scripts/setup-vllm.sh; quick when
# done).
# The render server runs from the same virtualenv (scripts/render.sh).
exec bash "$(dirname "${BASH_SOURCE[0]}")/setup-vllm.sh" "$@"
