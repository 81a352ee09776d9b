#!/usr/bin/env python3
"""Renders the two Envoy configs of a session bench run from envoy/envoy.yaml.

    render.py OUTDIR WASM VLLM_PORT COUNT_PORT SKIP_PORT ENVOY_PORT ADMIN_BASE CONTEXT_LENGTH

count.yaml  envoy/envoy.yaml with the bench's addresses, the `vllm` cluster pointed at vLLM,
            `context_length` and `skip_count: false` (every turn counted); admin on ADMIN_BASE.
skip.yaml   the same with `skip_count: true`; admin on ADMIN_BASE+1.
envoy.yaml  the same Envoy without the filter (buffer filter and router kept); admin on
            ADMIN_BASE+2.
"""

import os
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from render import proxy  # noqa: E402


def main():
    outdir, wasm = sys.argv[1], sys.argv[2]
    vllm, count, skip, plain, admin, context = (int(x) for x in sys.argv[3:9])
    shipped_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "envoy", "envoy.yaml")
    with open(shipped_path, encoding="utf-8") as f:
        shipped = yaml.safe_load(f)
    for name, port, adm, extra in (
            ("count", count, admin, {"context_length": context, "skip_count": False}),
            ("skip", skip, admin + 1, {"context_length": context, "skip_count": True})):
        cfg = proxy(shipped, wasm, port, adm, vllm, extra, True)
        with open(f"{outdir}/{name}.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
    cfg = proxy(shipped, wasm, plain, admin + 2, vllm, {}, False)
    with open(f"{outdir}/envoy.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


if __name__ == "__main__":
    main()
