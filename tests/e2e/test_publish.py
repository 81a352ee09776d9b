"""docs/spec.md §9a through the real Envoy, both builds: the decision incontext publishes as
the stream's filter state (wasm: ``wasm.incontext.*``, module: ``incontext.*``), read by the
shipped access log (envoy/envoy.yaml, envoy/envoy-module.yaml). Every value of every line is
checked against the count the tokenizer gave and the cap docs/spec.md §2 computes; no prompt
text reaches the log."""

import json

from tests.e2e.common import C, F, R, W, cfg, chat, nonce
from tests.harness.envoy import file_access_logs, load_shipped
from tests.harness.spec import decide
from tests.harness.upstream import Answer

FIELDS = ("outcome", "prompt_tokens", "source", "window", "max_tokens", "charge",
          "usage_prompt_tokens")


def published(line: dict) -> dict:
    """The incontext fields of one access log line (None where the filter state is absent)."""
    return {k: line[f"incontext_{k}"] for k in FIELDS}


def expect(outcome, prompt=None, source=None, window=None, max_tokens=None, charge=None,
           usage=None) -> dict:
    text = lambda v: None if v is None else str(v)
    return {"outcome": outcome, "prompt_tokens": text(prompt), "source": source,
            "window": text(window), "max_tokens": text(max_tokens), "charge": text(charge),
            "usage_prompt_tokens": text(usage)}


def test_the_access_log_reads_every_decision_as_published(proxy, upstream):
    env = proxy.envoy
    before = len(env.access_log())
    P = 1500
    upstream.tokenizer.count(P)
    secrets = [f"secret-{nonce()}" for _ in range(3)]

    # Rewritten: the cap the filter wrote, charged with the prompt.
    big = chat(secrets[0], max_tokens=100000)
    d = decide(big, P, True, W=W, C=C, R=R, F=F)
    assert d.rewrite and d.value == C - P
    r1 = proxy.post(big)
    assert (r1.status, r1.action) == (200, "rewritten"), r1.describe()

    # The caller's cap fits: it goes up as the caller's, charged with the prompt; the answer's
    # usage (a scripted JSON answer) is published at its end.
    name = nonce()
    usage = P + 3
    upstream.answers[name] = Answer(200, [json.dumps(
        {"id": "x", "choices": [], "usage": {"prompt_tokens": usage, "completion_tokens": 7,
                                             "total_tokens": usage + 7}}).encode()])
    small = chat(secrets[1], max_tokens=2000)
    d2 = decide(small, P, True, W=W, C=C, R=R, F=F)
    assert d2.value == 2000
    r2 = proxy.post(small, headers={"x-test-answer": name})
    assert (r2.status, r2.action) == (200, "rewritten" if d2.rewrite else "unchanged:fits"), \
        r2.describe()

    # Not budgeted: the outcome alone.
    r3 = proxy.get("/v1/models")
    assert r3.action == "unchanged:method", r3.describe()

    # Not JSON: the outcome alone, no count.
    r4 = proxy.post(b"not json " + secrets[2].encode())
    assert r4.action == "unchanged:not_json", r4.describe()

    lines = env.access_log(before + 4)[before:]
    assert len(lines) == 4, lines
    assert [published(x) for x in lines] == [
        expect("rewritten", P, "exact", C, C - P, C),
        expect(r2.action, P, "exact", C, 2000, P + 2000, usage=usage),
        expect("unchanged:method"),
        expect("unchanged:not_json"),
    ]
    assert [int(x["status"]) for x in lines] == [200, 200, 200, 200]
    # The log names counts, never a prompt.
    text = env.access_log_path.read_text()
    assert [s for s in secrets if s in text] == []


def test_a_local_rejection_is_logged_with_its_decision(proxy_for, upstream):
    proxy = proxy_for(cfg(on_insufficient="reject"))
    env = proxy.envoy
    before = len(env.access_log())
    P = C - 10
    upstream.tokenizer.count(P)
    r = proxy.post(chat(max_tokens=100000))
    assert (r.status, r.action) == (400, "rejected"), r.describe()
    assert r.upstream == []
    lines = env.access_log(before + 1)[before:]
    assert [published(x) for x in lines] == [
        expect("rejected", P, "exact", C, 100000, P + 100000)]
    assert [int(x["status"]) for x in lines] == [400]


def test_the_shipped_configs_log_every_published_name():
    """The access log of both shipped configs reads each published name once, with its
    build's filter state prefix."""
    for glue, prefix in (("wasm", "wasm.incontext."), ("module", "incontext.")):
        logs = file_access_logs(load_shipped(glue))
        assert len(logs) == 1, glue
        fmt = logs[0]["typed_config"]["log_format"]["json_format"]
        got = {k: v for k, v in fmt.items() if k.startswith("incontext_")}
        assert got == {f"incontext_{k}": f"%FILTER_STATE({prefix}{k}:PLAIN)%" for k in FIELDS}
