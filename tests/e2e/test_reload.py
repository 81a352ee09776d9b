"""The listener updated under load while counts are in flight (file-based dynamic
configuration: LDS from a file, replaced by rename, as a control plane's file drop does).

Each update changes the plugin configuration, so Envoy builds the filter configuration anew
and destroys the old one once its connections have drained, while requests keep arriving and
their tokenizer calls are out. Nothing may break: every request is answered by the upstream,
Envoy stays up, each update is taken, no listener is left draining, and Envoy's allocated
memory comes back to where it was after a first round of the same (the old configurations
and what they held are freed).
"""
from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse

import pytest
import yaml

from tests.e2e.common import MAIN, chat, dumps
from tests.harness.envoy import WASM, Envoy, no_filter, render
from tests.harness.upstream import ok

pytestmark = pytest.mark.timeout(240)

UPDATES = 6
CLIENTS = 4


def plugin_config(i: int) -> dict:
    return {**MAIN, "fallback_margin_tokens": 1000 + i}


class Listener:
    """The listener, served to Envoy from an LDS file."""

    def __init__(self, workdir, glue, upstream):
        self.path = workdir / "lds.yaml"
        self.glue = glue
        self.upstream = upstream
        self.listener = None

    def bootstrap(self, port: int, admin_port: int) -> dict:
        cfg = render(wasm_path=str(WASM), listen_port=port, admin_port=admin_port,
                     upstream=(self.upstream.host, self.upstream.port),
                     plugin_config=plugin_config(0), remove_filter=no_filter(), glue=self.glue)
        self.listener = cfg["static_resources"].pop("listeners")[0]
        self.write(0)
        cfg["node"] = {"id": "incontext-test", "cluster": "incontext-test"}
        cfg["dynamic_resources"] = {"lds_config": {
            "path_config_source": {"path": str(self.path)}, "resource_api_version": "V3"}}
        return cfg

    def write(self, i: int):
        """The listener with plugin configuration ``i``, swapped in by rename."""
        listener = json.loads(json.dumps(self.listener))
        for f in listener["filter_chains"][0]["filters"]:
            for h in f.get("typed_config", {}).get("http_filters", []):
                tc = h.get("typed_config", {})
                if "filter_config" in tc:
                    tc["filter_config"]["value"] = json.dumps(plugin_config(i))
                elif "config" in tc and "configuration" in tc["config"]:
                    tc["config"]["configuration"]["value"] = json.dumps(plugin_config(i))
        doc = {"resources": [{"@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                              **listener}]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        os.rename(tmp, self.path)


def load(port: int, stop: threading.Event, results: list, tag: str):
    """Requests, each on its own connection, each a prompt of its own (a count each)."""
    i = 0
    while not stop.is_set():
        body = dumps(chat(f"reload {tag} {i}", max_tokens=100000))
        i += 1
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/chat/completions", body,
                      {"content-type": "application/json"})
            r = c.getresponse()
            r.read()
            results.append(r.status)
            c.close()
        except OSError as e:
            results.append(repr(e))


def round_of_updates(envoy, listener, first: int, tag: str) -> list:
    stop = threading.Event()
    results: list = []
    threads = [threading.Thread(target=load, args=(envoy.port, stop, results, f"{tag} {n}"))
               for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for i in range(first, first + UPDATES):
        time.sleep(0.4)
        listener.write(i)
    time.sleep(0.4)
    stop.set()
    for t in threads:
        t.join(60)
    return results


def stats(envoy) -> dict:
    """The listener manager's stats and Envoy's allocated memory."""
    flt = urllib.parse.quote(r"^listener_manager\.|^server\.memory_allocated$")
    out = {}
    for line in envoy.stats_text(flt).splitlines():
        k, _, v = line.strip().partition(": ")
        if v.isdigit():
            out[k] = int(v)
    return out


def settle(envoy, modified: int) -> dict:
    """Once Envoy has taken ``modified`` updates and drained every old listener."""
    deadline = time.monotonic() + 30
    while True:
        got = stats(envoy)
        if (got.get("listener_manager.listener_modified") == modified
                and got.get("listener_manager.total_listeners_draining") == 0):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def test_listener_updates_under_load_with_counts_in_flight(envoy_bin, glue, upstream,
                                                          tmp_path):
    upstream.tokenizer.slow(0.2, ok(1000))
    listener = Listener(tmp_path, glue, upstream)
    envoy = Envoy(envoy_bin, tmp_path, None, (upstream.host, upstream.port), glue=glue,
                  name=f"envoy-reload-{glue}", config=listener.bootstrap)
    envoy.start()
    try:
        warm = round_of_updates(envoy, listener, 1, "warm")
        settle(envoy, UPDATES)
        time.sleep(2)
        before = stats(envoy)["server.memory_allocated"]
        results = round_of_updates(envoy, listener, 1 + UPDATES, "measured")
        taken = settle(envoy, 2 * UPDATES)
        time.sleep(2)
        after = stats(envoy)["server.memory_allocated"]
        assert envoy.proc.poll() is None, envoy.log_tail()
        for got in (warm, results):
            assert len(got) >= 3 * CLIENTS, got
            assert [r for r in got if r != 200] == [], got
        assert taken["listener_manager.listener_modified"] == 2 * UPDATES
        assert len(upstream.tokenizer.snapshot()) >= len(warm) + len(results)
        # The old configurations and what they held are gone: no growth beyond noise.
        assert after - before < 4 * 2**20, (before, after)
    finally:
        envoy.stop()
