"""Runs the Envoy service of docker-compose.yml as a container would, without Docker.

Started by test_compose.py as ``unshare -rnm python -m tests.compose.compose_netns RUN.json``
(what to run and check): in a private
network namespace (nothing to clash with on the host, only loopback) and mount namespace,
it

* makes the name `vllm` resolve, as the compose network's DNS does (a bind-mounted /etc/hosts);
* serves a fake vLLM on 127.0.0.1:8000 (tests/harness/upstream.py: echo + /tokenize);
* runs the host's Envoy binary with the compose service's own command-line arguments and
  environment, on a copy of its Envoy config whose paths are those of the compose bind mounts
  (the container path of each mount replaced by its source on the host, in the environment
  too);
* runs the compose health check command until it passes;
* sends one chat request to the published listener port, reads the names of the incontext
  metrics on the admin port's /stats/prometheus, and prints a JSON report.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.harness.upstream import Upstream

spec = json.loads(Path(sys.argv[1]).read_text())

report = {"ok": False}
tmp = Path(tempfile.mkdtemp(prefix="compose-netns-"))
envoy = None
try:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {n}\n" for n in spec["names"]))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)

    up = Upstream(host="127.0.0.1", port=spec["vllm_port"]).start()
    up.tokenizer.count(spec["tokenize_count"], max_model_len=spec["max_model_len"])

    args = list(spec["envoy_args"])
    log = tmp / "envoy.log"
    envoy = subprocess.Popen([spec["envoy_bin"], *args, "--disable-hot-restart",
                              "--log-path", str(log)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env={**os.environ, **spec.get("env", {})})
    t0 = time.monotonic()
    healthy = False
    while time.monotonic() - t0 < spec.get("timeout", 60):
        if envoy.poll() is not None:
            break
        if subprocess.run(spec["healthcheck"], capture_output=True, timeout=10).returncode == 0:
            healthy = True
            break
        time.sleep(0.3)
    report["healthy"] = healthy
    report["healthy_after_s"] = round(time.monotonic() - t0, 1)

    # Listening sockets (address, port) from /proc/net/tcp: state 0A = LISTEN.
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A":
            addr, port = f[1].split(":")
            ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
            listening.add((ip, int(port, 16)))
    report["listening"] = sorted(listening)

    if healthy:
        body = json.dumps(spec["request"]).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{spec['listen_port']}/v1/chat/completions",
                                     data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            report["status"] = r.status
            report["headers"] = {k.lower(): v for k, v in r.headers.items()
                                 if k.lower().startswith("x-incontext")}
        report["upstream"] = [{"path": rec.path, "body": rec.body.decode("utf-8", "replace"),
                               "host": rec.header(":authority") or rec.header("host")}
                              for rec in up.snapshot()]
        report["tokenize"] = [{"path": rec.path, "host": rec.header(":authority")
                               or rec.header("host")} for rec in up.tokenizer.snapshot()]
        # The metric names Prometheus would scrape (names only, no values).
        with urllib.request.urlopen(f"http://127.0.0.1:{spec['admin_port']}/stats/prometheus",
                                    timeout=30) as r:
            report["metrics"] = sorted({line.split()[2] for line in r.read().decode().splitlines()
                                        if line.startswith("# TYPE ") and "incontext" in line})
        report["ok"] = True
except Exception as e:  # noqa: BLE001 - reported to the test
    report["error"] = f"{type(e).__name__}: {e}"
finally:
    if envoy is not None and envoy.poll() is None:
        envoy.terminate()
        try:
            envoy.wait(timeout=15)
        except subprocess.TimeoutExpired:
            envoy.kill()
    log = tmp / "envoy.log"
    report["log"] = str(log)   # read by the test session with every other Envoy's log
    if log.exists():
        report["log_tail"] = log.read_text(errors="replace").splitlines()[-15:]
print(json.dumps(report))
