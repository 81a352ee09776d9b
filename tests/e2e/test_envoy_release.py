"""The Envoy under test is the release the run asked for.

scripts/test.sh runs this suite once per Envoy release (the one in .venv, then each one of
scripts/envoy-releases.txt through ENVOY_BIN) and sets INCONTEXT_E2E_ENVOY_VERSION to the release
it meant; the running server must report that release, so a run that silently fell back to
another binary fails here.
"""

import json
import os
import urllib.request

from tests.harness.envoy import envoy_version


def test_running_envoy_is_the_requested_release(proxy, envoy_bin):
    with urllib.request.urlopen(proxy.envoy.admin + "/server_info", timeout=10) as r:
        running = json.loads(r.read())["version"]
    release = envoy_version(envoy_bin)
    assert release, f"`{envoy_bin} --version` names no release"
    assert f"/{release}/" in running, (running, release)
    wanted = os.environ.get("INCONTEXT_E2E_ENVOY_VERSION")
    if wanted:
        assert release == wanted, f"asked for Envoy {wanted}, {envoy_bin} is {release}"
