#!/usr/bin/env python3
"""Writes the benchmark request bodies: realistic agent chat requests of an exact size.

    bodies.py OUTDIR SIZE...        (SIZE in bytes, e.g. 2048 32768 409600 1572864)

For each SIZE it writes:
  chat-SIZE.json   a chat completion request: model, system prompt, tools, multi-turn
                   messages (user / assistant with tool_calls / tool results), max_tokens.
                   The first user message contains the marker @@UNIQ@@ exactly once; the
                   wrk script replaces it by a per-request id in cache-miss mode and by a
                   fixed id in cache-hit mode (so both modes send the same bytes but one).
  input-SIZE.json  the same content under "input" instead of "messages" (no `messages`, no
                   `prompt`): a request the filter scans and leaves unchanged (shape).
  messages-SIZE.json  an Anthropic Messages request, streamed: system prompt, user and
                   assistant turns of text, max_tokens 100000 (more than the window leaves, so
                   the filter writes the cap and watches the answer's stop reason). The marker
                   as in chat-SIZE.json.
Bodies are deterministic (fixed seed), pure ASCII apart from a few escaped characters, and
exactly SIZE bytes long.
"""

import json
import random
import sys

MARKER = "@@UNIQ@@"

WORDS = ("the of to and a in is it you that he was for on are with as his they be at one "
         "have this from or had by hot word but what some we can out other were all there "
         "when up use your how said an each she which do their time if will way about many "
         "then them write would like so these her long make thing see him two has look more "
         "day could go come did number sound no most people my over know water than call "
         "first who may down side been now find any new work part take get place made live "
         "where after back little only round man year came show every good me give our under "
         "name very through just form sentence great think say help low line differ turn "
         "cause much mean before move right boy old too same tell does set three want air "
         "well also play small end put home read hand port large spell add even land here "
         "must big high such follow act why ask men change went light kind off need house "
         "function return value error stack trace request response buffer config cluster "
         "listener filter tokenizer budget window context prompt count cache hash splice").split()

CODE = [
    "def handler(request):\n    body = json.loads(request.body)\n    return {\"ok\": True}\n",
    "fn main() {\n    let v: Vec<u8> = Vec::with_capacity(1024);\n    println!(\"{}\", v.len());\n}\n",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id LIMIT 50;\n",
    "for (let i = 0; i < items.length; i++) {\n  total += items[i].price * items[i].qty;\n}\n",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file",
        "description": "Read a file from the repository and return its contents.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root"},
            "offset": {"type": "integer", "description": "First line to read"},
            "limit": {"type": "integer", "description": "Number of lines"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_command",
        "description": "Run a shell command in the sandbox and return stdout and stderr.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "search_code",
        "description": "Search the code base for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"},
            "glob": {"type": "string", "description": "Only files matching this glob"}},
            "required": ["pattern"]}}},
]

SYSTEM = ("You are a careful coding agent working in a large repository. Use the tools to read "
          "files and run commands before answering. Think step by step, keep answers short, "
          "cite file paths, and never invent APIs. When a command fails, read the error and "
          "try again with a fix. Café ünïcode ✓ and \"quotes\" and a tab\there.")


def prose(rng: random.Random, n_words: int) -> str:
    out = []
    for i in range(n_words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i % 17 == 0 else w)
        if i % 23 == 22:
            out[-1] += "."
    return " ".join(out)


def turn(rng: random.Random, k: int) -> list:
    call_id = f"call_{k:05d}"
    code = rng.choice(CODE)
    return [
        {"role": "user", "content": prose(rng, rng.randint(20, 60))},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "read_file",
                         "arguments": json.dumps({"path": f"src/mod{k}.rs", "limit": 200})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": code + prose(rng, rng.randint(40, 120))},
        {"role": "assistant", "content": prose(rng, rng.randint(15, 50))},
    ]


def dump(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def build(size: int, key: str):
    """The body of exactly `size` bytes (UTF-8), or None if size is too small."""
    rng = random.Random(size)
    head = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Session {MARKER}: fix the failing build."}]
    filler = {"role": "user", "content": ""}

    def body(turns, fill):
        filler["content"] = fill
        obj = {"model": "qwen3-coder", key: head + turns + [filler], "tools": TOOLS,
               "temperature": 0.2, "stream": False, "max_tokens": 65536}
        return dump(obj)

    turns = []
    k = 0
    while True:
        nxt = turns + turn(rng, k)
        if len(body(nxt, "").encode()) > size:
            break
        turns = nxt
        k += 1
    base = len(body(turns, "").encode())
    if base > size:
        return None
    fill = prose(rng, (size - base) // 4 + 8)[: size - base]
    text = body(turns, fill)
    assert len(text.encode()) == size, (size, len(text.encode()))
    return text


def build_messages(size: int):
    """An Anthropic Messages request of exactly `size` bytes, or None if size is too small."""
    rng = random.Random(size + 1)

    def body(turns, fill):
        msgs = [{"role": "user", "content": f"Session {MARKER}: fix the failing build."}]
        msgs += turns + [{"role": "user", "content": fill}]
        return dump({"model": "qwen3-coder", "max_tokens": 100000, "system": SYSTEM,
                     "messages": msgs, "stream": True})

    turns = []
    while True:
        nxt = turns + [{"role": "assistant", "content": prose(rng, 60)},
                       {"role": "user", "content": prose(rng, 120)}]
        if len(body(nxt, "").encode()) > size:
            break
        turns = nxt
    base = len(body(turns, "").encode())
    if base > size:
        return None
    fill = prose(rng, (size - base) // 4 + 8)[: size - base]
    text = body(turns, fill)
    assert len(text.encode()) == size, (size, len(text.encode()))
    return text


def main():
    outdir, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
    for size in sizes:
        for key, name in (("messages", "chat"), ("input", "input")):
            text = build(size, key)
            if text is None:
                sys.exit(f"size {size} is too small for a chat body")
            assert text.count(MARKER) == 1
            json.loads(text)
            with open(f"{outdir}/{name}-{size}.json", "w", encoding="utf-8") as f:
                f.write(text)
        text = build_messages(size)
        if text is None:
            sys.exit(f"size {size} is too small for a Messages body")
        assert text.count(MARKER) == 1
        json.loads(text)
        with open(f"{outdir}/messages-{size}.json", "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
