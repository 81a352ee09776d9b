"""Hermes Agent through Envoy + incontext against the real vLLM 0.32, and decision for decision
against the seed plugin (PyPI `incontext`, Hermes' own output budgeting) — docs/agents.md,
"Hermes Agent". Both pinned in their own virtualenv (scripts/setup-hermes.sh); a missing one
FAILS the tests.

Hermes refuses a model window under 64,000 tokens, and compresses at its threshold
(64,000 for a 65,536-token window), so these tests serve the tiny Qwen3 with a 65,536-token
window (one vLLM for the module, greedy decoding so that two runs of one conversation send the
same prompts token for token). Hermes' cap is `model.max_tokens` B = 16 here (it doubles it
for each of the three continuations of a reply cut by its cap: a turn is four main requests,
16, 32, 64, 128), so the random-weight model's replies stay short; its default (65,536, the
cap it sends to a custom provider) is the control's, against the suite's 12,288-token vLLM.

The parity conversation runs three times: Hermes with the seed plugin straight to vLLM; Hermes
without it through incontext configured as the seed decides (`window_tokens` = Hermes'
threshold, the same R and F, reject mode) with `skip_count: false`; and the same on the
shipped `skip_count` default. Its four turns (sixteen main requests and a summary): a first
user message of ~63k tokens that leaves ROOM tokens of room; a short second one; a third sized
by a probe so that its last request has less room than Hermes' cap (the one cap of the
conversation that is W − P, written from a bound on the default); a fourth that no longer fits,
on which both compress. From a copy of the first turn's state the second turn is also run at
the edge: its first request at exactly R tokens of room, and at R − 1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import httpx
import pytest

from tests.clients.stack import MODEL, Stack, Vllm
from tests.harness.envoy import WASM, no_filter
from tests.harness.servers import start_or_fail
from tests.sessions import hermes as H
from tests.sessions.clis import Tap
from tests.sessions.conftest import WINDOW as SMALL_WINDOW
from tests.sessions.hermes import Decision, Hermes, Probe

# The parity fixture runs Hermes' conversation three times (twenty-odd minutes on a busy
# 2-core machine): generous, and no test asserts a time.
pytestmark = pytest.mark.timeout(5400)

B = 16                          # Hermes' model.max_tokens in the parity runs
R = 8                           # INCONTEXT_MIN_OUTPUT_TOKENS / min_output_tokens (below B)
F = 1024                        # the seed's default fallback margin, on both
W = H.threshold(H.WINDOW, B)    # 64,000: Hermes' threshold, the seed's W
SLACK = 64                      # a cap written from a bound may sit this far below (§15a)
ROOM = 1000                     # room left by the first turn's first request
LAST = 140                      # room the third turn's third request is sized to
CAPS = [B, 2 * B, 4 * B, 8 * B]     # one turn: the request and its three continuations
# Test-only additions to the configuration docs/agents.md shows: Hermes' cap; compression may
# summarise the first messages and keeps the last three (the first turn's long message is
# what it summarises); the summary request gets a cap (extra_body), which Hermes leaves out.
EXTRA = {"model": {"max_tokens": B},
         "compression": {"protect_first_n": 0, "protect_last_n": 3},
         "auxiliary": {"compression": {"extra_body": {"max_tokens": 64}}}}
FIRST = "Read this:"
SECOND = "More:"
TALK = ("Go on.", "More:", "More:")     # the conversation's turns 2, 3 (+ filler), 4 (+ FOURTH)
FOURTH = 300                    # the fourth message's filler: past the window in every run
FILL = " a"                     # one Qwen3 token each
DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


class WideVllm(Vllm):
    """The tiny Qwen3 with a 65,536-token window (above its config's 40,960 positions, which
    dummy weights do not mind) and greedy decoding."""

    def _env(self):
        env = super()._env()
        env["INCONTEXT_VLLM_MAX_MODEL_LEN"] = str(H.WINDOW)
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        return env


@pytest.fixture(scope="module")
def hermes_ready():
    if not H.HERMES.exists():
        pytest.fail(f"{H.HERMES} is missing: run scripts/setup-hermes.sh", pytrace=False)
    found = subprocess.run(
        [str(H.VENV / "bin" / "python"), "-c", "import importlib.metadata as m; "
         "print(m.version('hermes-agent'), m.version('incontext'))"],
        capture_output=True, text=True, timeout=60).stdout.split()
    if found != [H.HERMES_VERSION, H.SEED_VERSION]:
        pytest.fail(f"{H.VENV} holds hermes-agent/incontext {found}, not "
                    f"{H.HERMES_VERSION}/{H.SEED_VERSION}: run scripts/setup-hermes.sh",
                    pytrace=False)
    if not WASM.is_file() and not no_filter():
        pytest.fail(f"{WASM} is missing: run scripts/setup.sh", pytrace=False)


GREEDY = ("--override-generation-config", json.dumps({"temperature": 0}))


@pytest.fixture(scope="module")
def wide(hermes_ready, tmp_path_factory):
    """The 65,536-token vLLM; INCONTEXT_HERMES_VLLM_STATE + INCONTEXT_HERMES_VLLM_PORT reuse a
    running one (started as README.md shows; left running)."""
    state = os.environ.get("INCONTEXT_HERMES_VLLM_STATE")
    port = os.environ.get("INCONTEXT_HERMES_VLLM_PORT")
    if state and port:
        server, keep = WideVllm(Path(state), int(port)), True
    else:
        server, keep = WideVllm(tmp_path_factory.mktemp("vllm-wide"), extra_args=GREEDY), False
    start_or_fail(server, "vLLM (65,536-token window)", stop_on_failure=not keep)
    stack = Stack(server, tmp_path_factory.mktemp("hermes-envoy"))
    yield server, stack
    stack.stop()
    if not keep:
        server.stop()


def envoy(stack, name: str, **changes):
    """An Envoy in front of the stack's vLLM. Counting a 64k-token prompt on a busy 2-core
    machine can take longer than the test configurations' 10 s: a count that times out would
    fall back to the estimate (+ F), which is not what these tests compare."""
    tokenizer = {"backend": "vllm", "cluster": "vllm",
                 "authority": f"127.0.0.1:{stack.vllm.port}", "timeout_ms": 120000}
    return stack.envoy(name, tokenizer=tokenizer, **changes)


_COUNTS: Dict[tuple, int] = {}


def count(server, body: dict) -> int:
    """vLLM's count of a request's prompt. The three parity runs send the same prompts token
    for token up to their summaries, each of ~64k tokens: each is counted once."""
    key = (server.url, json.dumps([body["messages"], body.get("tools")], sort_keys=True))
    if key not in _COUNTS:
        _COUNTS[key] = server.count_chat(body["messages"], tools=body.get("tools"))
    return _COUNTS[key]


# --- one run of the parity conversation -----------------------------------------------------
@dataclass
class Part:
    """One turn: its main requests, how many summary requests it made, and which kind of
    request it sent first ("main" or "summary")."""
    decisions: List[Decision]
    summaries: int
    first: str


@dataclass
class Run:
    """One system's run: the conversation's turns, the second turn at the edge, and the
    filler the probes chose."""
    talk: List[Part]                        # turns 1–4
    edge: Dict[str, Part]                   # "R", "R-1": the second turn from turn 1's state
    second: int                             # the edge message's filler (room R)
    third: int                              # the third message's filler

    @property
    def turn1(self) -> List[Decision]:
        return self.talk[0].decisions


SEED_LINE = re.compile(r"incontext model=\S+ source=\S+ prompt_tokens=(\d+) "
                       r"compression_window=(\d+) (?:max_tokens=(\d+)|action=requires_compression)")


def seed_decisions(h: Hermes, since: int) -> List[tuple]:
    """The seed's own record of each main request, from Hermes' log since offset ``since``:
    (its P, its cap or None when it left the request as Hermes made it)."""
    text = (h.hermes_home / "logs" / "agent.log").read_text(errors="replace")[since:]
    return [(int(m.group(1)), int(m.group(3)) if m.group(3) else None)
            for m in SEED_LINE.finditer(text) if int(m.group(2)) == W]


def log_size(h: Hermes) -> int:
    p = h.hermes_home / "logs" / "agent.log"
    return len(p.read_text(errors="replace")) if p.exists() else 0


def decisions(server, sent, seed: Optional[List[tuple]] = None) -> List[Decision]:
    """Every main request of one turn, in order; ``seed``: the seed's log lines of the same
    traffic (one per main request: it leaves Hermes' summary requests, which go out under the
    provider `auto`, to Hermes)."""
    out: List[Decision] = []
    chats = H.chat_calls(sent)
    if seed is not None:
        assert len(seed) == len(H.main_calls(sent)), \
            (seed, [(s.status, H.is_summary(s)) for s in chats])
    after_summary = False
    i = -1
    for s in chats:
        if H.is_summary(s):
            after_summary = True
            continue
        i += 1
        body = s.body
        p = count(server, body)
        if seed is not None:
            seed_p, seed_cap = seed[i]
            assert seed_p == p, (i, seed_p, p)
            d = Decision(p, body["max_tokens"], s.status,
                         "unchanged" if seed_cap is None else "rewritten", "exact",
                         after_summary)
            if seed_cap is not None:
                assert seed_cap == body["max_tokens"], (i, seed_cap, body["max_tokens"])
        else:
            ic = H.incontext_of(s)
            action = ic.get("x-incontext-action", "")
            cap = int(ic["x-incontext-max-tokens"]) if action == "rewritten" else \
                (None if action == "rejected" else body["max_tokens"])
            d = Decision(p, cap, s.status, action, ic.get("x-incontext-source", ""),
                         after_summary, int(ic["x-incontext-prompt-tokens"]))
            if d.source == "exact":
                assert int(ic["x-incontext-prompt-tokens"]) == p, (i, ic, p)
            else:
                assert int(ic["x-incontext-prompt-tokens"]) >= p, (i, ic, p)
        out.append(d)
        after_summary = False
    return out


def run_turn(h: Hermes, server, target: str, text: str, seed: bool, name: str,
             first: bool = False) -> Part:
    """One turn through a Tap in front of ``target``, read into a Part."""
    since = log_size(h)
    with Tap(target) as tap:
        t = h.turn(text, first=first, base_url=tap.url)
    assert t.returncode == 0, (name, t.stdout[-500:], t.stderr[-500:])
    chats = H.chat_calls(tap.sent)
    return Part(decisions(server, tap.sent, seed_decisions(h, since) if seed else None),
                sum(H.is_summary(s) for s in chats),
                "summary" if chats and H.is_summary(chats[0]) else "main")


def probe_room(h: Hermes, server, text: str, filler: int) -> int:
    """The room below W of the next turn's first request with ``filler`` tokens of FILL,
    read by a probe (the turn is not kept: the caller restores the state)."""
    with Probe() as probe:
        h.turn(text + FILL * filler, first=False, base_url=probe.url)
    assert probe.body is not None, "Hermes sent no request to the probe"
    return W - count(server, probe.body)


def converse(name: str, server, target: str, workdir: Path, fill: int, sized: Optional[Run],
             seed: bool, parts=("R", "R-1")) -> Run:
    """Hermes (with the seed plugin when ``seed``) through Taps in front of ``target``: the
    conversation's four turns, and the second turn from turn 1's state at R and at R − 1.
    ``sized``: the run whose probes sized the edge and third messages; None: size them here."""
    env = H.seed_env(server.url, R, F) if seed else None
    h = Hermes(workdir, target, extra=EXTRA, seed=env).fresh()
    saved = workdir.parent / f"{workdir.name}-{name}-state"
    if saved.exists():
        shutil.rmtree(saved)
    talk = [run_turn(h, server, target, FIRST + FILL * fill, seed, name, first=True)]
    h.snapshot(saved)
    if sized is None:
        second = 100 + probe_room(h, server, SECOND, 100) - R
    else:
        second = sized.second
    edge = {}
    for part in parts:
        h.restore(saved)
        n = second if part == "R" else second + 1
        edge[part] = run_turn(h, server, target, SECOND + FILL * n, seed, f"{name} {part}")
    h.restore(saved)
    talk.append(run_turn(h, server, target, TALK[0], seed, name))
    if sized is None:
        # The third turn's third request: its first + the growth of turn 1's first three.
        growth = talk[0].decisions[2].prompt - talk[0].decisions[0].prompt
        shutil.rmtree(saved)
        h.snapshot(saved)
        third = 100 + probe_room(h, server, TALK[1], 100) - growth - LAST
        h.restore(saved)
    else:
        third = sized.third
    talk.append(run_turn(h, server, target, TALK[1] + FILL * third, seed, name))
    talk.append(run_turn(h, server, target, TALK[2] + FILL * FOURTH, seed, name))
    shutil.rmtree(saved)
    return Run(talk, edge, second, third)


def first_fill(server, workdir: Path) -> int:
    """The filler of the first message that leaves ROOM tokens of room below W in the first
    request: Hermes' prompt without it, read by a probe (fresh HOME, same directory)."""
    with Probe() as probe:
        Hermes(workdir, probe.url, extra=EXTRA).fresh().turn(FIRST + FILL * 100, first=True)
    assert probe.body is not None, "Hermes sent no chat request to the probe"
    return W - ROOM - (count(server, probe.body) - 100)


@pytest.fixture(scope="module")
def parity(wide, tmp_path_factory):
    server, stack = wide
    workdir = tmp_path_factory.mktemp("hermes-parity") / "w"
    fill = first_fill(server, workdir)
    seed = converse("seed", server, server.url, workdir, fill, None, seed=True)
    runs = {"seed": seed}
    # The default decides at exactly R as with skip_count off (the R decision needs P, so it
    # counts): its run leaves that part out.
    for name, changes, parts in (("exact", {"skip_count": False}, ("R", "R-1")),
                                 ("default", {}, ("R-1",))):
        env = envoy(stack, f"hermes-as-seed-{name}", context_length=H.WINDOW,
                          **H.seed_plugin_config(R, F, W), **changes)
        runs[name] = converse(name, server, env.url, workdir, fill, seed, seed=False,
                              parts=parts)
    return runs


def caps(ds: List[Decision]) -> list:
    return [d.cap for d in ds]


# --- parity with the seed ---------------------------------------------------------------------
def outcome(part: Part) -> list:
    """A turn's decisions, system-neutral: "compress" where the seed made Hermes compress
    before sending (a summary first) or incontext rejected the request; else the cap vLLM
    got."""
    out = ["compress"] if part.first == "summary" else []
    return out + ["compress" if d.action == "rejected" else d.cap for d in part.decisions]


def report(line: str):
    """A measured number, printed in the test's output (pytest -rA shows it)."""
    print(f"hermes parity: {line}")


def test_first_turn_same_prompt_decision_and_cap(parity):
    """Four main requests (the reply and its three continuations), each with room for
    Hermes' own cap: the seed writes it, incontext keeps or writes the same value; the same P
    (the seed's /tokenize count = incontext's = vLLM's)."""
    seed, exact, default = parity["seed"], parity["exact"], parity["default"]
    for d in seed.turn1 + exact.turn1 + default.turn1:
        assert d.status == 200, d
    assert caps(seed.turn1) == caps(exact.turn1) == caps(default.turn1) == CAPS
    assert [d.prompt for d in seed.turn1] == [d.prompt for d in exact.turn1] == \
        [d.prompt for d in default.turn1]
    # (A first Hermes run on a machine may have sent a slightly longer system prompt to the
    # probe that sized the first message.)
    assert W - ROOM - SLACK <= seed.turn1[0].prompt <= W - ROOM, seed.turn1[0]
    assert [d.action for d in exact.turn1] == ["rewritten"] * 4
    assert {d.source for d in exact.turn1} == {"exact"}
    # Shipped default: the first counted, the continuations proved to fit by a bound.
    assert [(d.action, d.source) for d in default.turn1] == \
        [("rewritten", "exact")] + [("unchanged:fits", "bound")] * 3


def test_four_turns_same_decisions_and_compression_turn(parity):
    """The conversation's four turns, sixteen main requests: turns 1 and 2 served with
    Hermes' caps; the third's last request with W − P (less room than its cap 8B); the
    fourth no longer fits — the seed makes Hermes compress before sending, incontext rejects
    its first request and Hermes compresses on that — then served with Hermes' caps. With
    `skip_count: false` every request is counted and every cap and P is the seed's."""
    seed, exact = parity["seed"], parity["exact"]
    last = seed.talk[2].decisions[3]
    assert 0 < W - last.prompt < 8 * B, last
    expected = [CAPS, CAPS, CAPS[:3] + [W - last.prompt], ["compress"] + CAPS]
    assert [outcome(t) for t in seed.talk] == expected, [outcome(t) for t in seed.talk]
    assert [outcome(t) for t in exact.talk] == expected, [outcome(t) for t in exact.talk]
    assert [t.summaries for t in seed.talk] == [t.summaries for t in exact.talk] == [0, 0, 0, 1]
    assert [t.first for t in seed.talk] == ["main", "main", "main", "summary"]
    assert [t.first for t in exact.talk] == ["main"] * 4
    # Up to the summary the prompts are the same token for token.
    before = [d.prompt for t in seed.talk[:3] for d in t.decisions]
    assert [d.prompt for t in exact.talk[:3] for d in t.decisions] == before
    assert len(before) == 12
    rejected = exact.talk[3].decisions[0]
    assert (rejected.action, rejected.status, rejected.source) == ("rejected", 400, "exact")
    assert rejected.prompt > W - R, rejected
    served = [d for t in exact.talk for d in t.decisions if d.action != "rejected"]
    assert len(served) == 16
    assert {(d.status, d.source) for d in served} == {(200, "exact")}
    assert {d.status for t in seed.talk for d in t.decisions} == {200}
    for name, run in parity.items():
        for i, t in enumerate(run.talk, 1):
            report(f"{name} turn {i}: " + ", ".join(
                f"P {d.prompt} {d.action}/{d.source} cap {d.cap}" for d in t.decisions)
                + f"; summaries {t.summaries}")


def test_compression_on_the_same_turn_at_r_minus_1(parity):
    """Room R − 1 at the second turn's first request: the seed makes Hermes compress before
    sending it (its preflight count); incontext rejects it (P = W − R + 1) and Hermes
    compresses on that answer. Then the same four main requests, each served with Hermes'
    cap."""
    seed = parity["seed"].edge["R-1"]
    assert seed.first == "summary" and seed.summaries == 1
    assert caps(seed.decisions) == CAPS
    assert [d.after_summary for d in seed.decisions] == [True, False, False, False]
    for name in ("exact", "default"):
        part = parity[name].edge["R-1"]
        rejected, *served = part.decisions
        assert (rejected.action, rejected.status, rejected.source) == ("rejected", 400, "exact")
        assert rejected.prompt == W - R + 1, rejected
        assert part.summaries == 1 and part.first == "main"
        assert caps(served) == caps(seed.decisions) == CAPS, (name, served)
        assert [d.after_summary for d in served] == [True, False, False, False]
        assert {d.status for d in served} == {200}
        assert outcome(part) == outcome(seed) == ["compress"] + CAPS


def test_exactly_r_of_room_is_served_with_r(parity):
    """Room R at the second turn's first request: both write R (the boundary keeps the
    request). The reply then fills the window, and the continuation Hermes sends next no
    longer fits: that is where they part (docs/agents.md) — the seed leaves it as Hermes made
    it (its check runs at a turn's start; mid-turn Hermes' own rough estimate decides, and it
    sees no pressure), so vLLM serves it past W up to its own window; incontext answers the
    window-full error and Hermes compresses there."""
    seed = parity["seed"].edge["R"]
    first, *rest = seed.decisions
    assert (first.prompt, first.cap, first.status) == (W - R, R, 200)
    assert seed.summaries == 0
    assert [(d.cap, d.action, d.status) for d in rest] == \
        [(c, "unchanged", 200) for c in CAPS[1:]]
    assert all(d.prompt > W - R for d in rest), rest
    part = parity["exact"].edge["R"]
    first_i, rejected, *served = part.decisions
    assert (first_i.prompt, first_i.cap, first_i.status, first_i.action,
            first_i.source) == (W - R, R, 200, "rewritten", "exact"), first_i
    assert (rejected.action, rejected.status) == ("rejected", 400), rejected
    assert rejected.prompt == rest[0].prompt, (rejected, rest[0])
    assert part.summaries == 1
    # After compressing it sends the continuation again, then continues twice more (its caps:
    # measured).
    assert [(d.cap, d.status) for d in served] == [(B, 200), (4 * B, 200), (8 * B, 200)], served
    assert [d.after_summary for d in served] == [True, False, False]


def test_bounded_caps_within_their_slack(parity):
    """The shipped default (skip_count on), on every main request of the conversation and of
    the R − 1 turn: the same decision as the seed's; every cap it kept or counted is the
    seed's; a cap written from a bound is the seed's less the bound's slack P_hi − P (at most
    SLACK), never above. The third turn's last request is such a cap."""
    seed, default = parity["seed"], parity["default"]
    parts = list(zip(seed.talk, default.talk)) + [(seed.edge["R-1"], default.edge["R-1"])]
    bounded = []
    n = 0
    for s_part, d_part in parts:
        assert [o if o == "compress" else "cap" for o in outcome(s_part)] == \
            [o if o == "compress" else "cap" for o in outcome(d_part)], (s_part, d_part)
        assert s_part.summaries == d_part.summaries
        d_served = [d for d in d_part.decisions if d.action != "rejected"]
        assert len(s_part.decisions) == len(d_served), (s_part, d_part)
        for s, d in zip(s_part.decisions, d_served):
            n += 1
            assert d.status == 200, d
            if d.source == "bound" and d.action == "rewritten":
                bounded.append((s, d))
                assert d.told - d.prompt == s.cap - d.cap, (s, d)
                assert 0 < d.told - d.prompt <= SLACK, (s, d)
            else:
                assert d.cap == s.cap, (s, d)
    assert n == 20
    assert len(bounded) == 1, bounded
    (s, d), = bounded
    assert (s.prompt, s.cap) == (d.prompt, W - d.prompt), (s, d)
    assert d is default.talk[2].decisions[3]
    report(f"from a bound: P {d.prompt}, P_hi {d.told}, cap {d.cap} (the seed's {s.cap}, "
           f"{s.cap - d.cap} below)")


# --- through incontext: served the first time --------------------------------------------------
def test_conversation_served_first_time_through_incontext(wide, tmp_path):
    """A two-turn conversation through Envoy + incontext (the suite's base configuration at
    Hermes' window): eight main requests, each served the first time. What Hermes sends:
    streamed with usage, 17 tools, its cap doubled for each continuation, no session
    header."""
    server, stack = wide
    env = envoy(stack, "hermes-served", context_length=H.WINDOW, min_output_tokens=64)
    h = Hermes(tmp_path / "w", env.url, extra=EXTRA).fresh()
    with Tap(env.url) as tap:
        for i, text in enumerate(("Say hello.", "Say goodbye.")):
            t = h.turn(text, first=i == 0, base_url=tap.url)
            assert t.returncode == 0, (t.stdout[-500:], t.stderr[-500:])
    chats = H.chat_calls(tap.sent)
    main = H.main_calls(tap.sent)
    assert len(main) == len(chats) == 8, [(s.status, H.is_summary(s)) for s in chats]
    assert [s.status for s in main] == [200] * 8
    assert [s.body["max_tokens"] for s in main] == CAPS * 2
    for s in main:
        assert s.body["stream"] is True and s.body["stream_options"] == {"include_usage": True}
        assert len(s.body["tools"]) == 17, len(s.body["tools"])
        assert not [k for k in s.headers if "session" in k], s.headers
        ic = H.incontext_of(s)
        assert ic["x-incontext-action"] in ("rewritten", "unchanged:fits"), ic
        if ic["x-incontext-source"] == "exact":
            assert int(ic["x-incontext-prompt-tokens"]) == count(server, s.body)


# --- the control: Hermes' default cap against a smaller window ---------------------------------
REFUSED = f"max_tokens=65536 cannot be greater than max_model_len={SMALL_WINDOW}"


def test_default_cap_refused_straight_served_through_incontext(vllm, stack, hermes_ready,
                                                              tmp_path):
    """A server window smaller than Hermes' configured one: Hermes' own cap (65,536 for a
    custom provider, no model.max_tokens) at its configured window 65,536 against the suite's
    vLLM with 12,288 (the vLLM of the other sessions tests). Straight to vLLM every request is
    refused (the cap is above the window): one chat request, refused; Hermes reads that as a
    full window and stops, the model's 12,288-token window being below the 64,000 it needs
    for compression. Through incontext (reject mode, a window of P + 96 so the reply is
    short) vLLM refuses none: the same request is served with W − P; its continuation, which
    no longer fits any window, gets incontext's window-full answer (no upstream request), and
    Hermes stops as before."""
    work = tmp_path / "w"
    with Tap(vllm.url) as tap:
        h = Hermes(work, tap.url).fresh()
        t = h.oneshot("Say hello.")
    chats = H.chat_calls(tap.sent)
    assert [(s.status, H.is_summary(s), s.body["max_tokens"]) for s in chats] == \
        [(400, False, 65536)], [(s.status, s.body.get("max_tokens")) for s in chats]
    assert "below the minimum 64,000" in t.stdout + t.stderr + h.log()
    p = count(vllm, chats[0].body)
    # What vLLM answered it (Hermes' one-shot mode logs nothing): the same body, not streamed.
    again = httpx.post(vllm.url + "/v1/chat/completions", timeout=60,
                       json={**chats[0].body, "stream": False, "stream_options": None})
    assert again.status_code == 400 and REFUSED in again.text, again.text[:500]

    env = envoy(stack, "hermes-control", context_length=SMALL_WINDOW, window_tokens=p + 96,
                min_output_tokens=64, on_insufficient="reject")
    with Tap(env.url) as tap:
        h = Hermes(work, tap.url).fresh()
        t = h.oneshot("Say hello.")
    chats = H.chat_calls(tap.sent)
    assert [(s.status, H.is_summary(s), s.body["max_tokens"],
             H.incontext_of(s).get("x-incontext-action")) for s in chats] == \
        [(200, False, 65536, "rewritten"), (400, False, 65536, "rejected")], \
        [(s.status, s.body.get("max_tokens"), H.incontext_of(s)) for s in chats]
    ic = H.incontext_of(chats[0])
    # Hermes' prompt can differ by some tokens from one run to the next (what it found on
    # the machine): the cap is W − P of this run's own prompt, at least R = 64.
    p_here = count(vllm, chats[0].body)
    assert abs(p_here - p) <= 32, (p_here, p)
    assert (int(ic["x-incontext-prompt-tokens"]), int(ic["x-incontext-max-tokens"]),
            ic["x-incontext-source"]) == (p_here, p + 96 - p_here, "exact"), ic
    # vLLM refused nothing through this Envoy, counts included (its 404s are Hermes' probes
    # of other servers' paths, `GET /api/tags` and the like).
    assert env.cluster_stat("vllm", "upstream_rq_400") == 0
    assert "below the minimum 64,000" in t.stdout + t.stderr, (t.stdout[-500:], t.stderr[-500:])


# --- docs/agents.md ---------------------------------------------------------------------------
def test_docs_show_the_hermes_configurations():
    """docs/agents.md shows each Hermes configuration these tests run, verbatim: the blocks
    after `<!-- tests/sessions/hermes: NAME -->`."""
    text = DOC.read_text()
    found = re.findall(r"<!-- tests/sessions/hermes: (\S+) -->\n```[a-z]*\n(.*?)```", text,
                       re.S)
    assert sorted(n for n, _ in found) == sorted(H.SNIPPETS), \
        "docs/agents.md must show each Hermes configuration exactly once"
    for name, block in found:
        assert block == H.SNIPPETS[name], f"docs/agents.md's {name} differs from the tests'"
    assert MODEL in H.HERMES_CONFIG
