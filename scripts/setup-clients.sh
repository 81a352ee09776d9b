#!/usr/bin/env bash
# Setup of the tests/clients tier (scripts/test.sh clients): the suite runs the client
# libraries (tests/clients/requirements.txt, installed into .venv by scripts/setup.sh) against
# the real vLLM, so it needs what scripts/setup-vllm.sh installs. Idempotent.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup-vllm.sh" "$@"
