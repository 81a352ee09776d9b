"""Every Envoy the session started so far ran without a wasm failure (marked `last`: it runs
after every other test of the session, see tests/conftest.py, which also reads the logs of any
Envoy started after it).

A panic inside the filter makes the VM fail; with failure_policy FAIL_RELOAD Envoy would
quietly start a new one, so the logs are the place where it shows. The Envoys are the ones
tests.harness.envoy registered when they started: the pool's, and those that single tests
start themselves (shared VM, layouts, security, refused configurations ...).
"""

import pytest

from tests.harness import envoy


@pytest.mark.last
def test_no_wasm_failures_in_any_envoy_log(envoys):
    envoys.stop_all()  # flushes the logs
    already = sum(w.checked for w in envoy.STARTED)
    checked, problems = envoy.check_logs()
    assert checked + already, "no Envoy was started before this test: no log to read"
    assert not problems, "wasm failures in Envoy logs, or no log:\n" + "\n".join(problems[:20])
