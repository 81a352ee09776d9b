"""What the real-server suites (vLLM, SGLang, llama.cpp, the clients) share about their servers."""

from __future__ import annotations

import pytest


class StackError(RuntimeError):
    """A model server or the Envoy in front of it could not be started or used."""


def start_or_fail(server, what: str, *, stop_on_failure: bool = True):
    """Starts ``server``; a server that cannot start fails the test (never a skip)."""
    try:
        server.start()
    except (StackError, OSError) as e:
        if stop_on_failure:
            server.stop()
        pytest.fail(f"{what} could not be started: {e}", pytrace=False)
    return server
