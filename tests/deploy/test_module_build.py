"""How the native module is built: only with unwinding panics.

The module catches every panic where Envoy calls it (docs/module.md); with `panic = "abort"`
(the workspace's release profile) `catch_unwind` catches nothing and a panic takes Envoy's
process down. crates/module refuses to compile that way, and the shipped build
(scripts/build-module.sh) uses the `module` profile, which unwinds.

Needs cargo; the refused build runs in a target directory of its own (target/panic-abort), so
its dependencies are built once and the shipped build's directory is left alone.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MESSAGE = 'incontext-module needs panic = "unwind"'


def cargo() -> str:
    found = shutil.which("cargo")
    if found is None:
        pytest.fail("cargo not found: needed to build the module", pytrace=False)
    return found


def test_a_release_build_with_aborting_panics_does_not_compile():
    env = {**os.environ, "CARGO_TARGET_DIR": str(REPO / "target" / "panic-abort")}
    r = subprocess.run(
        [cargo(), "build", "--release", "-p", "incontext-module"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert r.returncode == 101, r.stderr[-4000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error")]
    assert errors[0].startswith(f"error: {MESSAGE}: build it with the `module` profile"), errors
    assert errors[-1] == "error: could not compile `incontext-module` (lib) due to 1 previous error", errors
    assert len(errors) == 2, errors


def test_the_shipped_build_unwinds():
    script = (REPO / "scripts" / "build-module.sh").read_text()
    builds = [shlex.split(line) for line in script.splitlines() if line.startswith("cargo build")]
    assert builds == [["cargo", "build", "--profile", "module", "-p", "incontext-module", "$@"]]
    profiles = tomllib.loads((REPO / "Cargo.toml").read_text())["profile"]
    assert profiles["release"]["panic"] == "abort"
    assert (profiles["module"]["inherits"], profiles["module"]["panic"]) == ("release", "unwind")
    # Nothing else in the repository builds the module with another profile.
    others = []
    for path in [*REPO.glob("scripts/*"), *REPO.glob("deploy/**/Dockerfile"),
                 REPO / "docker-compose.yml", *REPO.glob(".ci/*")]:
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                if re.search(r"cargo (build|rustc)\b.*incontext-module", line) \
                        and "--profile module" not in line:
                    others.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert others == []
