"""What deploy/module/Dockerfile makes (the Envoy image that ships the native module), read
from the file: its base image, its ENV, and where COPY puts each file. tests/deploy and
tests/compose check the layouts against it."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "module" / "Dockerfile"


def module_image(path: Path = DOCKERFILE) -> dict:
    """{"from": [base images], "env": {name: value}, "files": {container path: context name}}"""
    out = {"from": [], "env": {}, "files": {}}
    for line in path.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            out["from"].append(words[1])
        elif words[0] == "ENV":
            key, _, value = words[1].partition("=")
            out["env"][key] = value
        elif words[0] == "COPY":
            *src, dst = [w for w in words[1:] if not w.startswith("--")]
            out["files"].update({dst: f for f in src})
    return out
