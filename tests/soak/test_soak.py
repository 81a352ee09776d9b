"""The short chaos soak that runs in CI (`pytest tests/`): 3 000 requests at 32 connections
while the tokenizer flaps every 0.7 s. The full one is `scripts/soak.sh` (30 000 requests).

Everything the full soak checks is checked here (see soak.py): every request answered by the
echo upstream with an intact body, counters consistent, no wasm VM failure or reload, memory
flat after the warm-up. On top of that, every fault was actually met during the run.
"""

import os

import pytest

from tests.soak.soak import CACHE_ENTRIES, Soak, human

REQUESTS = int(os.environ.get("INCONTEXT_SOAK_REQUESTS", "3000"))


@pytest.mark.timeout(420)
def test_short_chaos_soak(tmp_path):
    soak = Soak(REQUESTS, 32, phase_seconds=0.7, workdir=tmp_path)
    try:
        soak.start()
        report = soak.run()
    finally:
        soak.stop()
    text = human(report)
    print(text)
    assert report["failures"] == 0, text
    assert not report["counter_problems"], text
    assert not report["vm_problems"], text
    assert not report["memory_problems"], text
    c = report["counters"]
    # every kind of tokenizer trouble was met, and answered from the estimate
    for kind in ("timeout", "status", "bad_json", "contract", "mismatch"):
        assert c.get(f"incontext_tokenizer_failures_{kind}", 0) > 0, (kind, text)
    assert report["sources"].get("estimate", 0) > 0, text
    # ... while the tokenizer's good phases still gave exact counts and cache hits
    assert report["sources"].get("exact", 0) > 0 and report["sources"].get("cache", 0) > 0, text
    # far more distinct prompts than cache slots, all answered correctly (the cache is bounded)
    assert report["distinct_prompts"] > 10 * CACHE_ENTRIES, text
    assert report["ok"], text
