#!/usr/bin/env python3
"""Checks, against a real model server, the assumptions under which incontext skips a count
(docs/spec.md §15): a conversation's prompt P_k is bounded by its previous turn's count
P_{k-1} (the prefix) and the count of its new messages alone (the tail, T_k), and by the
bytes of those messages.

    bound_check.py --url http://127.0.0.1:PORT --backend vllm|sglang|llamacpp
                   [--turns 12] [--openai-seed 1] [--anthropic-seed 2] [--json FILE]

It replays the bench's agent sessions (bench/sessions/sessions.py: an OpenAI chat with tools,
an Anthropic exchange with tool_use / tool_result) and a few hand-made conversations (no
system prompt, thinking off, a tail that starts with a user message, a split tool result, an
assistant prefill, a plain chat), turn by turn. For each turn k >= 2 it asks the server's own
count endpoints, the ones the filter uses for that backend, for

  P_k      the whole request
  P_{k-1}  the previous request (the counted prefix)
  T_k      the messages after the prefix as a conversation of their own, as the filter sends a
           tail: OpenAI chat without `tools` (and `tool_choice`), Anthropic without `system`,
           `tools` and `tool_choice`

and reports per conversation the seam d = P_k - (P_{k-1} + T_k) (min and max), whether
P_k <= P_{k-1} + T_k + SEAM on every turn, whether the tail's raw bytes are at least T_k, and
whether the byte bound (crates/core/src/bound.rs, mirrored below) is at least P_k.

Requests are sent as compact JSON; the byte bound reads the same bytes. A count the server
refuses is reported as such (the filter then counts the whole prompt and stops counting
tails alone for that route). Exit status 0 when every assumption held on every turn, 1 when
one did not or a count was refused, 2 on a usage or transport error.
"""

import argparse
import http.client
import json
import os
import sys
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sessions  # noqa: E402

# crates/core/src/bound.rs
TAIL = 16
MESSAGE = 32
BLOCK = 48
FLOAT = 24
RESTYLE = 8
SEAM = 16


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Refused(Exception):
    """The server answered a count call with an error status or something not a count."""


class Server:
    def __init__(self, url, backend, model):
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.backend = backend
        self.model = model
        self.calls = 0

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            data = None if body is None else compact(body).encode()
            conn.request(method, path, data, {"content-type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post_count(self, path, body, key):
        self.calls += 1
        status, raw = self.request("POST", path, body)
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        n = reply.get(key) if isinstance(reply, dict) else None
        if status != 200 or not isinstance(n, int) or isinstance(n, bool):
            text = raw.decode("utf-8", "replace").replace("\n", " ")[:160]
            raise Refused(f"{path} {status}: {text}")
        return n

    # -- the filter's count calls (crates/core/src/backend) -------------------------------

    def chat_payload(self, body):
        """What the filter sends for an OpenAI chat (whole or tail: the caller drops tools)."""
        if self.backend == "vllm":  # docs/spec.md §5
            out = {"model": body["model"], "messages": body["messages"]}
            if isinstance(body.get("tools"), list):
                out["tools"] = body["tools"]
            out["add_generation_prompt"] = body.get("add_generation_prompt", True)
            for k in ("continue_final_message", "add_special_tokens", "chat_template",
                      "chat_template_kwargs"):
                if k in body:
                    out[k] = body[k]
            return "/tokenize", out, "count"
        if self.backend == "sglang":  # backend/sglang.rs: these members, alone
            out = {k: body[k] for k in ("model", "messages", "tools", "tool_choice",
                                        "reasoning_effort", "chat_template_kwargs")
                   if k in body and (k != "tools" or isinstance(body[k], list))}
            return "/tokenize", out, "count"
        # llamacpp: the request itself
        return "/v1/chat/completions/input_tokens", body, "input_tokens"

    def count(self, dialect, body):
        if dialect == "anthropic":
            return self.post_count("/v1/messages/count_tokens", body, "input_tokens")
        return self.post_count(*self.chat_payload(body))

    def version(self):
        probes = {"vllm": [("/version", "version")],
                  "sglang": [("/get_server_info", "version"), ("/server_info", "version")],
                  "llamacpp": [("/props", "build_info")]}[self.backend]
        for path, key in probes:
            try:
                status, raw = self.request("GET", path)
                if status == 200:
                    v = json.loads(raw).get(key)
                    if v:
                        return str(v)
            except (OSError, ValueError, http.client.HTTPException):
                pass
        return "?"


def tail_body(dialect, body, tail):
    """The request the filter counts for a tail: the same members, the tail as messages,
    without what renders before the first message (docs/spec.md §15)."""
    drop = ("tools", "tool_choice") if dialect == "openai" else ("system", "tools", "tool_choice")
    out = {k: v for k, v in body.items() if k not in drop and k != "messages"}
    out["messages"] = tail
    return out


# -- the byte bound (a mirror of crates/core/src/bound.rs) ---------------------------------

def reserialized_growth(text):
    growth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in ",:":
            growth += 1
        elif c == "-" or c.isdigit():
            start = i
            while i + 1 < n and (text[i + 1].isdigit() or text[i + 1] in ".eE+-"):
                i += 1
            if any(ch in ".eE" for ch in text[start:i + 1]):
                growth += FLOAT
        i += 1
    return growth


def message_bound(dialect, m):
    """The bound of one new message, None where the filter would not bound it."""
    raw = compact(m).encode()
    content = m.get("content")
    parts = content if isinstance(content, list) else []
    if dialect == "openai":
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            return None
        if any(p.get("type") != "text" for p in parts):
            return None
        calls = m.get("tool_calls") or []
        growth = sum(reserialized_growth(c.get("function", {}).get("arguments", ""))
                     for c in calls)
        return len(raw) + growth + MESSAGE + BLOCK * (len(parts) + len(calls))
    if m.get("role") not in ("user", "assistant") or "tool_calls" in m:
        return None
    growth = 0
    for b in parts:
        kind = b.get("type")
        if kind == "tool_use":
            growth += reserialized_growth(compact(b.get("input")))
        elif kind == "tool_result" and m["role"] == "user":
            inner = b.get("content")
            if isinstance(inner, list) and any(x.get("type") != "text" for x in inner):
                return None
        elif kind not in ("text", "thinking"):
            return None
    return len(raw) + growth + MESSAGE + BLOCK * len(parts)


def restyles(m):
    raw = compact(m)
    return "think" in raw or "reasoning" in raw


# -- conversations --------------------------------------------------------------------------

def edge_cases(model, cap):
    """Hand-made conversations: (name, dialect, [request bodies, each extending the last])."""
    sys_msg = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
    u1 = {"role": "user", "content": "What does the filter do with a cap that is too large?"}
    a1 = {"role": "assistant", "content": "It rewrites the cap so the prompt and the answer fit."}
    u2 = {"role": "user", "content": "And when the prompt alone is larger than the window?"}
    a2 = {"role": "assistant", "content": "Then it refuses the request the way the server would."}
    u3 = {"role": "user", "content": "Thanks. Summarise both answers in one line."}
    calls = [{"id": f"call_s{i}", "type": "function", "function": {
        "name": "read_file", "arguments": json.dumps({"path": f"src/lib_{i}.rs"})}}
        for i in (1, 2)]
    a_tools = {"role": "assistant", "content": "", "tool_calls": calls}
    r1 = {"role": "tool", "tool_call_id": "call_s1", "content": "fn main() {}\n" * 20}
    r2 = {"role": "tool", "tool_call_id": "call_s2", "content": "pub fn lib() -> u32 { 7 }\n" * 20}
    tools = sessions.openai_tools()
    # compact arguments full of floats: the case the byte bound's re-serialisation allowance
    # is for (a space after each separator, a float written as its repr)
    floats = {"values": [1e15, 0.1, -2.5e-7, 3.0] * 25, "label": "a,b:c"}
    a_floats = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_f", "type": "function",
        "function": {"name": "run", "arguments": compact(floats)}}]}
    r_floats = {"role": "tool", "tool_call_id": "call_f", "content": "ok"}

    def chat(messages, **extra):
        return dict({"model": model, "messages": messages, "max_tokens": cap}, **extra)

    cases = [
        ("openai/plain", "openai",
         [chat([sys_msg, u1]), chat([sys_msg, u1, a1, u2]), chat([sys_msg, u1, a1, u2, a2, u3])]),
        ("openai/plain-no-system", "openai",
         [chat([u1]), chat([u1, a1, u2]), chat([u1, a1, u2, a2, u3])]),
        # the prefix ends with an assistant message (a prefill), the tail is one user message
        ("openai/tail-starts-user", "openai",
         [chat([sys_msg, u1, a1]), chat([sys_msg, u1, a1, u2])]),
        # the tail is an assistant prefill alone
        ("openai/prefill-tail", "openai",
         [chat([sys_msg, u1]), chat([sys_msg, u1, a1])]),
        # the same prefill, continued rather than answered
        ("openai/prefill-continue", "openai",
         [chat([sys_msg, u1], add_generation_prompt=False, continue_final_message=True),
          chat([sys_msg, u1, a1], add_generation_prompt=False, continue_final_message=True)]),
        # the second of two tool results arrives alone
        ("openai/split-tool-results", "openai",
         [chat([sys_msg, u1], tools=tools), chat([sys_msg, u1, a_tools, r1], tools=tools),
          chat([sys_msg, u1, a_tools, r1, r2], tools=tools)]),
        ("openai/float-arguments", "openai",
         [chat([sys_msg, u1], tools=tools), chat([sys_msg, u1, a_floats, r_floats], tools=tools)]),
        ("openai/thinking-off", "openai",
         [chat([sys_msg, u1], tools=tools, chat_template_kwargs={"enable_thinking": False}),
          chat([sys_msg, u1, a_tools, r1, r2], tools=tools,
               chat_template_kwargs={"enable_thinking": False}),
          chat([sys_msg, u1, a_tools, r1, r2, a1, u3], tools=tools,
               chat_template_kwargs={"enable_thinking": False})]),
    ]

    def text(role, t):
        return {"role": role, "content": [{"type": "text", "text": t}]}

    def anth(messages, **extra):
        return dict({"model": model, "messages": messages, "max_tokens": cap}, **extra)

    au1, aa1 = text("user", u1["content"]), text("assistant", a1["content"])
    au2, aa2 = text("user", u2["content"]), text("assistant", a2["content"])
    au3 = text("user", u3["content"])
    cases += [
        ("anthropic/plain", "anthropic",
         [anth([au1], system=sys_msg["content"]), anth([au1, aa1, au2], system=sys_msg["content"]),
          anth([au1, aa1, au2, aa2, au3], system=sys_msg["content"])]),
        ("anthropic/plain-no-system", "anthropic",
         [anth([au1]), anth([au1, aa1, au2]), anth([au1, aa1, au2, aa2, au3])]),
        ("anthropic/tail-starts-user", "anthropic",
         [anth([au1, aa1], system=sys_msg["content"]),
          anth([au1, aa1, au2], system=sys_msg["content"])]),
        ("anthropic/float-input", "anthropic",
         [anth([au1], system=sys_msg["content"], tools=sessions.anthropic_tools()),
          anth([au1, {"role": "assistant", "content": [
              {"type": "tool_use", "id": "toolu_f", "name": "run", "input": floats}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_f", "content": "ok"}]}],
               system=sys_msg["content"], tools=sessions.anthropic_tools())]),
        ("anthropic/prefill-tail", "anthropic",
         [anth([au1], system=sys_msg["content"]), anth([au1, aa1], system=sys_msg["content"])]),
    ]
    return cases


def conversations(model, turns, openai_seed, anthropic_seed, cap):
    oa = sessions.openai_session(model, "bound", turns, openai_seed, cap)
    an = sessions.anthropic_session(model, "bound", turns, anthropic_seed, cap)
    no_sys_oa = [dict(b, messages=[m for m in b["messages"] if m["role"] != "system"])
                 for b in oa[:4]]
    no_sys_an = [{k: v for k, v in b.items() if k != "system"} for b in an[:4]]
    return ([(f"openai/session seed {openai_seed}", "openai", oa),
             (f"anthropic/session seed {anthropic_seed}", "anthropic", an),
             ("openai/session no system", "openai", no_sys_oa),
             ("anthropic/session no system", "anthropic", no_sys_an)]
            + edge_cases(model, cap))


# -- the check -------------------------------------------------------------------------------

def check(server, name, dialect, bodies):
    """One row per turn k >= 2 of a conversation."""
    rows = []
    try:
        prev = server.count(dialect, bodies[0])
    except Refused as e:
        return [{"case": name, "turn": 1, "refused": str(e)}]
    for k in range(1, len(bodies)):
        body, before = bodies[k], bodies[k - 1]["messages"]
        msgs = body["messages"]
        if msgs[:len(before)] != before:
            raise SystemExit(f"{name}: turn {k + 1} does not extend turn {k}")
        tail = msgs[len(before):]
        row = {"case": name, "turn": k + 1, "prefix": prev, "tail_messages": len(tail),
               "tail_first": tail[0]["role"]}
        try:
            whole = server.count(dialect, body)
        except Refused as e:
            row["refused"] = f"whole: {e}"
            rows.append(row)
            break
        row["whole"] = whole
        try:
            row["tail"] = server.count(dialect, tail_body(dialect, body, tail))
        except Refused as e:
            row["refused"] = f"tail: {e}"
        bounds = [message_bound(dialect, m) for m in tail]
        restyled = RESTYLE * sum(1 for m in before if restyles(m))
        row["tail_bytes"] = sum(len(compact(m).encode()) for m in tail)
        if None not in bounds:
            row["byte_bound"] = prev + TAIL + restyled + sum(bounds)
        if "tail" in row:
            row["seam"] = whole - (prev + row["tail"])
            row["tail_bound"] = prev + row["tail"] + SEAM + restyled
        rows.append(row)
        prev = whole
    return rows


def summarise(rows):
    """Per conversation: turns, seam min/max, and the three checks."""
    out = []
    for name in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == name]
        seams = [r["seam"] for r in rs if "seam" in r]
        refused = [r["refused"] for r in rs if "refused" in r]
        out.append({
            "case": name,
            "turns": len(rs),
            "tail_first": ",".join(sorted({r["tail_first"] for r in rs if "tail_first" in r})),
            "max_whole": max((r["whole"] for r in rs if "whole" in r), default=None),
            "seam_min": min(seams, default=None),
            "seam_max": max(seams, default=None),
            "tail_bound_holds": all(r["whole"] <= r["tail_bound"] for r in rs if "tail_bound" in r)
            if seams else None,
            "bytes_ge_tail": all(r["tail_bytes"] >= r["tail"] for r in rs if "tail" in r)
            if seams else None,
            "min_bytes_minus_tail": min((r["tail_bytes"] - r["tail"] for r in rs if "tail" in r),
                                        default=None),
            "byte_bound_holds": all(r["whole"] <= r["byte_bound"] for r in rs
                                    if "byte_bound" in r and "whole" in r),
            "min_byte_margin": min((r["byte_bound"] - r["whole"] for r in rs
                                    if "byte_bound" in r and "whole" in r), default=None),
            "refused": refused[0] if refused else "",
        })
    return out


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return str(v)


def table(summary):
    cols = [("case", "conversation"), ("turns", "turns"), ("tail_first", "tail starts"),
            ("max_whole", "max P"), ("seam_min", "d min"), ("seam_max", "d max"),
            ("tail_bound_holds", f"P <= prefix+tail+{SEAM}"), ("bytes_ge_tail", "bytes >= T"),
            ("min_bytes_minus_tail", "min bytes-T"), ("byte_bound_holds", "P <= byte bound"),
            ("min_byte_margin", "min margin"), ("refused", "refused")]
    lines = ["| " + " | ".join(h for _, h in cols) + " |",
             "|" + "---|" * len(cols)]
    for s in summary:
        lines.append("| " + " | ".join(fmt(s[k]) for k, _ in cols) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--backend", required=True, choices=("vllm", "sglang", "llamacpp"))
    ap.add_argument("--model", default="qwen3-tiny")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--openai-seed", type=int, default=1)
    ap.add_argument("--anthropic-seed", type=int, default=2)
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--json", help="write every turn's numbers here")
    args = ap.parse_args()
    if args.turns < 2:
        ap.error("--turns must be at least 2")

    server = Server(args.url, args.backend, args.model)
    try:
        version = server.version()
        rows = []
        for name, dialect, bodies in conversations(args.model, args.turns, args.openai_seed,
                                                   args.anthropic_seed, args.cap):
            rows += check(server, name, dialect, bodies)
    except (OSError, http.client.HTTPException) as e:
        print(f"bound_check: {args.url}: {e}", file=sys.stderr)
        return 2
    summary = summarise(rows)
    print(f"backend {args.backend}, server version {version}, model {args.model}, "
          f"{args.turns} session turns, {server.calls} count calls")
    print("d = P_k - (P_(k-1) + T_k); bytes: the tail's compact JSON; byte bound: "
          "crates/core/src/bound.rs")
    print(table(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"backend": args.backend, "version": version, "model": args.model,
                       "turns": args.turns, "rows": rows, "summary": summary}, f, indent=1)
    ok = all(s["tail_bound_holds"] is not False and s["bytes_ge_tail"] is not False
             and s["byte_bound_holds"] and not s["refused"] for s in summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
