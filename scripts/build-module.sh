#!/usr/bin/env bash
# Builds incontext as a native Envoy dynamic module: target/module/libincontext_module.so.
# The `module` profile is release with panic=unwind (the module catches every panic at the
# ABI boundary; the workspace's release profile aborts) and opt-level 3 throughout.
#
# Deploy: put the .so in a directory named by ENVOY_DYNAMIC_MODULES_SEARCH_PATH and load it
# with envoy/envoy-module.yaml (docs/module.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
cargo build --profile module -p incontext-module "$@"
ls -l target/module/libincontext_module.so
