"""Every Envoy the suite started ran without a wasm failure (marked `last`: it runs after every
other test of the session, see tests/conftest.py).

A panic inside the filter makes the VM fail; with failure_policy FAIL_RELOAD Envoy would
quietly start a new one, so the logs are the place where it shows.
"""

import re

import pytest

BAD = re.compile(r"panicked|Wasm VM failed|Function: proxy_on_\w+ failed|\[critical\]|"
                 r"restricted_callback|Uncaught")


@pytest.mark.last
def test_no_wasm_failures_in_any_envoy_log(envoys):
    envoys.stop_all()  # flushes the logs
    logs = sorted(envoys.workdir.glob("envoy*.log"))
    # (no logs: no Envoy was started in this run, nothing to check)
    found = []
    for path in logs:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if BAD.search(line):
                found.append(f"{path.name}: {line[:300]}")
    assert not found, "wasm failures in Envoy logs:\n" + "\n".join(found[:20])
