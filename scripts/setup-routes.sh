#!/usr/bin/env bash
# Setup of tests/routes: the default vLLM release and the model (scripts/setup-vllm.sh; quick when
# done).
exec bash "$(dirname "${BASH_SOURCE[0]}")/setup-vllm.sh" "$@"
