"""Per-key token budgets (docs/operations.md, "Token budgets") through the real Envoy, both
builds: the shipped layout (envoy/envoy-budgets.yaml, envoy/envoy-module-budgets.yaml) as it
is, its local rate limit filter charging each request the prompt + cap incontext published.
A key under its budget is served; a request its key cannot pay is answered 429 before the
upstream sees it (its prompt never arrives there); the charges add up to the token exactly;
requests without a key or that incontext does not count are not charged."""

import pytest

from tests.harness.envoy import Envoy, render_file
from tests.harness.upstream import DEFAULT_MAX_MODEL_LEN
from tests.e2e.common import MODEL, Proxy, nonce

C = DEFAULT_MAX_MODEL_LEN   # the window the shipped plugin configuration learns
BUDGET_B = 200000           # team-b's bucket in the shipped layouts
LAYOUT = {"wasm": "envoy-budgets.yaml", "module": "envoy-module-budgets.yaml"}


@pytest.fixture
def budgets(envoy_bin, upstream, glue, tmp_path):
    env = Envoy(envoy_bin, tmp_path, None, None, name=f"budgets-{glue}", glue=glue,
                config=lambda port, admin: render_file(
                    LAYOUT[glue], listen_port=port, admin_port=admin,
                    upstream=(upstream.host, upstream.port)))
    env.start()
    proxy = Proxy(env, upstream)
    yield proxy
    proxy.close()
    env.stop()


def ask(proxy, upstream, key, prompt_tokens, max_tokens):
    """One chat request of `key` whose prompt the tokenizer counts as `prompt_tokens`: its
    status, its unique marker, and whether the upstream saw it."""
    marker = f"marker-{nonce()}"
    upstream.tokenizer.count(prompt_tokens)
    body = {"model": MODEL, "messages": [{"role": "user", "content": marker}],
            "max_tokens": max_tokens}
    headers = {"x-api-key": key} if key else {}
    res = proxy.post(body, headers=headers, counters=False)
    seen = [r for r in upstream.find(marker.encode()) if r.path != "/tokenize"]
    return res, marker, len(seen)


def rate_limit_stats(env) -> dict:
    out = {}
    for line in env.stats_text("token_budget.http_local_rate_limit").splitlines():
        k, _, v = line.strip().partition(": ")
        out[k.rsplit(".", 1)[-1]] = int(v)
    return out


def test_a_key_is_served_until_its_budget_and_refused_before_the_upstream_after(
        budgets, upstream):
    proxy = budgets
    before = len(proxy.envoy.access_log())
    P = 1000
    rewritten = C - P            # the cap incontext writes for max_tokens 100000
    full = P + rewritten         # each such request's charge: the whole window
    outcomes = []
    # team-b: six requests of a whole window each fit its 200000 tokens...
    for _ in range(6):
        outcomes.append(ask(proxy, upstream, "team-b", P, 100000))
    left = BUDGET_B - 6 * full
    assert left == 3392
    # ... a seventh does not: 429, and the upstream never sees it.
    outcomes.append(ask(proxy, upstream, "team-b", P, 100000))
    # A request charging exactly what is left is served (its cap fits: the caller's stays).
    outcomes.append(ask(proxy, upstream, "team-b", P, left - P))
    # Then the bucket is empty: even 2 tokens are refused.
    outcomes.append(ask(proxy, upstream, "team-b", 1, 1))
    # team-a has its own bucket; a request without a key is not charged.
    outcomes.append(ask(proxy, upstream, "team-a", P, 100000))
    outcomes.append(ask(proxy, upstream, None, P, 100000))
    # Not counted by incontext (no charge published): not charged, served.
    models = proxy.get("/v1/models", headers={"x-api-key": "team-b"})

    statuses = [res.status for res, _, _ in outcomes]
    assert statuses == [200] * 6 + [429, 200, 429, 200, 200]
    assert [seen for _, _, seen in outcomes] == [1] * 6 + [0, 1, 0, 1, 1]
    assert models.status == 200 and len(models.upstream) == 1
    for res, _, _ in outcomes:
        if res.status == 429:
            assert res.response.text == "local_rate_limited"
    # The filter's own headers say what each served team-b request left, token for token.
    remaining = [res.h("x-ratelimit-remaining") for res, _, _ in outcomes[:6] + outcomes[7:8]]
    assert remaining == [str(BUDGET_B - full * i) for i in range(1, 7)] + ["0"]
    # Each request was counted (once) before the rate limit filter charged it.
    assert [len(res.tokenize) for res, _, _ in outcomes] == [1] * 11

    lines = proxy.envoy.access_log(before + 12)[before:]
    assert len(lines) == 12
    charges = [x["incontext_charge"] for x in lines]
    assert charges == [str(full)] * 7 + [str(left), "2", str(full), str(full), None]
    assert [int(x["status"]) for x in lines] == statuses + [200]
    assert [x["flags"] for x in lines] == ["-"] * 6 + ["RL", "-", "RL", "-", "-", "-"]
    # The charged requests add up to the bucket exactly: 6 * 32768 + 3392 = 200000.
    assert sum(int(charges[i]) for i in (0, 1, 2, 3, 4, 5, 7)) == BUDGET_B
    # No prompt reaches the access log, Envoy's log or the published values.
    markers = [m for _, m, _ in outcomes]
    logs = proxy.envoy.access_log_path.read_text() + proxy.envoy.log_text()
    assert [m for m in markers if m in logs] == []
    stats = rate_limit_stats(proxy.envoy)
    assert (stats["rate_limited"], stats["enforced"]) == (2, 2), stats
