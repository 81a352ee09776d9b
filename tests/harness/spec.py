"""The rules of docs/spec.md re-implemented in Python, so tests compute expected values themselves.

Nothing here looks at what the filter did: the caps (docs/spec.md §3), the rule (§2), the tokenize
payload (§5) and the rough estimator (§7) are written from the text of docs/spec.md.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Tuple

CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
SATURATE = (1 << 64) - 1  # "huge values saturate"; any bound larger than every window works

_LAX_INT = re.compile(r"[+-]?[0-9]+(_[0-9]+)*(\.0+)?")


# --- §3 caller caps ---------------------------------------------------------------------------
def parse_cap(v) -> Optional[int]:
    """A caller cap as vLLM's lax parsing reads it, or None when invalid."""
    if isinstance(v, bool):
        return 1 if v else None
    if isinstance(v, int):
        return min(v, SATURATE) if v > 0 else None
    if isinstance(v, float):
        if math.isfinite(v) and v == int(v) and v > 0:
            return min(int(v), SATURATE)
        return None
    if isinstance(v, str):
        s = v.strip()
        if not _LAX_INT.fullmatch(s):
            return None
        n = int(s.split(".", 1)[0].replace("_", ""))
        return min(n, SATURATE) if n > 0 else None
    return None


def caller_cap(obj: dict) -> Tuple[Optional[int], Optional[str]]:
    """(B, field of B): the smallest valid top-level cap; ties in CAP_FIELDS order."""
    best, name = None, None
    for f in CAP_FIELDS:
        if f in obj:
            v = parse_cap(obj[f])
            if v is not None and (best is None or v < best):
                best, name = v, f
    return best, name


# --- §2 the rule ------------------------------------------------------------------------------
@dataclass
class Decision:
    rewrite: bool
    value: int
    required: int
    field: Optional[str]  # the field written, when rewritten


def decide(obj: dict, P: int, exact: bool, *, W: int, C: int, R: int, F: int,
           T: Optional[int] = None) -> Decision:
    margin = 0 if exact else F
    remaining = W - P - margin
    B, bfield = caller_cap(obj)
    required = min(R, B) if B is not None else R
    candidates = [remaining]
    if B is not None:
        candidates.append(B)
    if T is not None and T >= 0:
        candidates.append(C - T)
    value = min(candidates)
    field = bfield or "max_tokens"
    if field == "max_output_tokens" and isinstance(obj.get("messages"), list):
        field = "max_tokens"
    return Decision(value >= required, value, required, field)


def rewritten_obj(obj: dict, d: Decision) -> dict:
    out = OrderedDict((k, v) for k, v in obj.items() if k not in CAP_FIELDS)
    out[d.field] = d.value
    return out


# --- §7 rough estimator -----------------------------------------------------------------------
_CJK = ((0x1100, 0x11FF), (0x2E80, 0x9FFF), (0xA960, 0xA97F), (0xAC00, 0xD7AF),
        (0xF900, 0xFAFF), (0xFF00, 0xFFEF))


def rough(raw: bytes) -> int:
    """Hermes' rough estimate of one piece of JSON text, as docs/spec.md §7 defines it."""
    if all(b < 0x80 for b in raw):
        return -(-len(raw) // 4)
    text = raw.decode("utf-8")
    cjk = 0
    other = 0
    for ch in text:
        cp = ord(ch)
        if any(lo <= cp <= hi for lo, hi in _CJK):
            cjk += 1
        else:
            other += len(ch.encode("utf-8"))
    return cjk + -(-other // 4)


def estimates(body: bytes) -> set:
    """P for a chat body from the rough estimate: max(1, estimate over the raw text of
    `messages` and `tools` as they stand in the body).

    docs/spec.md §7 does not say whether `messages` and `tools` are estimated as one text or
    separately and summed; both readings are returned (they are equal without tools).
    """
    members = top_level_members(body)
    pieces = [members[k][1] for k in ("messages", "tools") if k in members]
    raw = [body[s:e] for s, e in pieces]
    separate = sum(rough(r) for r in raw)
    together = rough(b"".join(raw))
    return {max(1, separate), max(1, together)}


def estimate(body: bytes) -> int:
    """The estimate for a body without `tools` (unambiguous)."""
    (e,) = estimates(body)
    return e


# --- raw JSON member spans -------------------------------------------------------------------
_WS = b" \t\r\n"


def _skip_ws(b: bytes, i: int) -> int:
    while i < len(b) and b[i] in _WS:
        i += 1
    return i


def _skip_string(b: bytes, i: int) -> int:
    assert b[i:i + 1] == b'"'
    i += 1
    while True:
        c = b[i]
        if c == 0x5C:  # backslash
            i += 2
        elif c == 0x22:
            return i + 1
        else:
            i += 1


def _skip_value(b: bytes, i: int) -> int:
    c = b[i:i + 1]
    if c == b'"':
        return _skip_string(b, i)
    if c in (b"{", b"["):
        depth = 0
        while True:
            c = b[i:i + 1]
            if c == b'"':
                i = _skip_string(b, i)
                continue
            if c in (b"{", b"["):
                depth += 1
            elif c in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    while i < len(b) and b[i:i + 1] not in (b",", b"}", b"]") and b[i] not in _WS:
        i += 1
    return i


def top_level_members(body: bytes) -> "OrderedDict[str, Tuple[Tuple[int,int], Tuple[int,int]]]":
    """{key: ((member start, member end), (value start, value end))} of a JSON object body.

    The member span runs from the key's opening quote to the end of its value.
    """
    out = OrderedDict()
    i = _skip_ws(body, 0)
    assert body[i:i + 1] == b"{"
    i = _skip_ws(body, i + 1)
    if body[i:i + 1] == b"}":
        return out
    while True:
        ks = i
        ke = _skip_string(body, i)
        key = json.loads(body[ks:ke])
        i = _skip_ws(body, ke)
        assert body[i:i + 1] == b":"
        vs = _skip_ws(body, i + 1)
        ve = _skip_value(body, vs)
        out[key] = ((ks, ve), (vs, ve))
        i = _skip_ws(body, ve)
        if body[i:i + 1] == b",":
            i = _skip_ws(body, i + 1)
            continue
        assert body[i:i + 1] == b"}", body[i:i + 20]
        return out


def member_raw(body: bytes, key: str) -> bytes:
    (s, e), _ = top_level_members(body)[key]
    return body[s:e]


def value_raw(body: bytes, key: str) -> bytes:
    _, (s, e) = top_level_members(body)[key]
    return body[s:e]


# --- §5 tokenize payloads ---------------------------------------------------------------------
CHAT_TAIL = ("add_generation_prompt", "continue_final_message", "add_special_tokens",
             "chat_template", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs")


def _loads(b):
    return json.loads(b, object_pairs_hook=OrderedDict)


def dumps_compact(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def chat_payload_obj(body: bytes) -> OrderedDict:
    req = _loads(body)
    out = OrderedDict()
    out["model"] = req.get("model")
    msgs = []
    for m in req["messages"]:
        if isinstance(m, dict) and "reasoning_content" in m and m.get("reasoning") is None:
            m2 = OrderedDict()
            for k, v in m.items():
                if k == "reasoning":
                    continue
                m2["reasoning" if k == "reasoning_content" else k] = v
            m = m2
        msgs.append(m)
    out["messages"] = msgs
    if isinstance(req.get("tools"), list):
        out["tools"] = req["tools"]
    kwargs = req.get("chat_template_kwargs")
    fold = "documents" in req or "reasoning_effort" in req
    if fold:
        kwargs = OrderedDict(kwargs or {})
        if "documents" in req:
            kwargs["documents"] = req["documents"]
        if "reasoning_effort" in req:
            kwargs["reasoning_effort"] = req["reasoning_effort"]
            if "enable_thinking" not in kwargs:
                kwargs["enable_thinking"] = req["reasoning_effort"] != "none"
    for k in CHAT_TAIL:
        if k == "add_generation_prompt":
            out[k] = req.get(k, True)
        elif k == "chat_template_kwargs":
            if kwargs is not None or k in req:
                out[k] = kwargs
        elif k in req:
            out[k] = req[k]
    return out


def completion_payload_obj(body: bytes) -> OrderedDict:
    req = _loads(body)
    out = OrderedDict([("model", req.get("model")), ("prompt", req["prompt"])])
    if "add_special_tokens" in req:
        out["add_special_tokens"] = req["add_special_tokens"]
    return out


# --- helpers for comparing a rewritten body --------------------------------------------------
def non_cap_members_kept(original: bytes, upstream: bytes) -> List[str]:
    """Problems found when checking that every non-cap member of ``original`` appears in
    ``upstream`` with its raw text unchanged and in the same order. Empty when all is well."""
    problems = []
    orig = top_level_members(original)
    up = top_level_members(upstream)
    order_orig = [k for k in orig if k not in CAP_FIELDS]
    order_up = [k for k in up if k not in CAP_FIELDS]
    if order_orig != order_up:
        problems.append(f"member order {order_orig} != {order_up}")
    for k in order_orig:
        (s, e), _ = orig[k]
        if k not in up:
            problems.append(f"member {k!r} missing")
            continue
        (us, ue), _ = up[k]
        if original[s:e] != upstream[us:ue]:
            problems.append(f"member {k!r} changed: {original[s:e][:80]!r} -> "
                            f"{upstream[us:ue][:80]!r}")
    return problems
