"""Agent sessions to replay: an OpenAI chat with tools and an Anthropic Messages exchange with
tool_use / tool_result, each a list of requests that grow turn by turn as an agent's do; with
`reasoning`, every assistant turn also carries the reasoning that came before its tool call
(OpenAI chat: in the member `reasoning` names, `reasoning_content` as agents send it or
`reasoning`, which vLLM 0.32 gives the template; an Anthropic `thinking` block), as reasoning
agents send their history back (Qwen3's template keeps it only after the last user message).

Everything is deterministic (seeded): the assistant turns are scripted (a tiny model with
random weights cannot play the agent), the tool results are code- and log-like text of a few
kilobytes, and every few turns the user speaks again. `tag` makes the conversation of each
path its own (its own prefix-cache entries on the server) without changing its length.
"""

import json
import random

WORDS = ("def class return import self value index buffer request response token window "
         "count prompt message stream config cluster route header status error result "
         "parse write read file path line offset length limit cache entry slot hash").split()
USER_TURNS = {0: "The tests in crates/core fail after the last change. Find out why and fix it.",
              9: "Good. Now also check that the benchmarks still build, and keep the diff small.",
              18: "Also run the linters and fix what they report.",
              26: "Last: write a short summary of what you changed and why."}
TOOLS = [("read_file", "Read a file of the repository.", {"path": "string"}),
         ("write_file", "Write a file of the repository.", {"path": "string", "content": "string"}),
         ("run", "Run a shell command in the repository and return its output.",
          {"command": "string", "timeout_s": "integer"}),
         ("search", "Search the repository for a regular expression.",
          {"pattern": "string", "glob": "string"}),
         ("list_dir", "List a directory of the repository.", {"path": "string"})]
SYSTEM = ("You are a coding agent working in a Rust repository. Use the tools to read, search, "
          "run and edit. Keep changes minimal and explain each one. " * 12).strip()


def code_text(rng, lines):
    out = []
    for i in range(lines):
        indent = "    " * rng.randint(0, 3)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        out.append(f"{i + 1:4} {indent}{words}({rng.randint(0, 4096)});")
    return "\n".join(out)


def script(turns, seed):
    """[(user_text or None, tool_name, arguments, tool_output)] for each turn."""
    rng = random.Random(seed)
    steps = []
    for t in range(turns):
        name, _, params = TOOLS[rng.randrange(len(TOOLS))]
        args = {}
        for p, kind in params.items():
            if kind == "integer":
                args[p] = rng.randint(10, 600)
            elif p == "content":
                args[p] = code_text(rng, 6)
            else:
                args[p] = f"crates/core/src/{rng.choice(WORDS)}_{rng.randint(1, 99)}.rs"
        output = code_text(rng, rng.randint(55, 75))
        steps.append((USER_TURNS.get(t), name, args, output))
    return steps


def openai_tools():
    return [{"type": "function", "function": {
        "name": n, "description": d,
        "parameters": {"type": "object", "properties": {p: {"type": k} for p, k in ps.items()},
                       "required": list(ps)}}} for n, d, ps in TOOLS]


def anthropic_tools():
    return [{"name": n, "description": d,
             "input_schema": {"type": "object",
                              "properties": {p: {"type": k} for p, k in ps.items()},
                              "required": list(ps)}} for n, d, ps in TOOLS]


# OpenAI agents read a streamed answer to its end, where `stream_options.include_usage` puts
# the prompt's usage. The bench closes each stream at its first token, so it also asks vLLM to
# report the usage on every chunk (`continuous_usage_stats`, a vLLM extension): the filter then
# reads at the first token what a whole answer carries at its end. Every path sends the same.
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def thoughts(seed, turns):
    """A reasoning text for each turn (deterministic): 80 to 400 words."""
    rng = random.Random(seed * 7919 + 1)
    return [("Let me think. " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(80, 400)))
             + ".") for _ in range(turns)]


def openai_session(model, tag, turns, seed, cap, reasoning=None):
    """The request bodies (dicts) of each turn, streamed, with the caller's cap; `reasoning`:
    the assistant message's member that carries its reasoning (none without)."""
    messages = [{"role": "system", "content": f"[{tag}] {SYSTEM}"}]
    bodies = []
    thought = thoughts(seed, turns)
    for t, (user, name, args, output) in enumerate(script(turns, seed)):
        if user:
            messages.append({"role": "user", "content": user})
        bodies.append({"model": model, "messages": json.loads(json.dumps(messages)),
                       "tools": openai_tools(), "max_tokens": cap, "stream": True,
                       "stream_options": STREAM_OPTIONS})
        call = f"call_{seed}_{t}"
        turn = {"role": "assistant", "content": f"Step {t + 1}: using {name}.",
                "tool_calls": [{"id": call, "type": "function", "function": {
                    "name": name, "arguments": json.dumps(args)}}]}
        if reasoning:
            turn[reasoning] = thought[t]
        messages.append(turn)
        messages.append({"role": "tool", "tool_call_id": call, "content": output})
    return bodies


def anthropic_session(model, tag, turns, seed, cap, reasoning=False):
    messages = []
    bodies = []
    pending_results = None
    thought = thoughts(seed, turns)
    for t, (user, name, args, output) in enumerate(script(turns, seed)):
        content = list(pending_results or [])
        if user:
            content.append({"type": "text", "text": user})
        messages.append({"role": "user", "content": content})
        bodies.append({"model": model, "system": f"[{tag}] {SYSTEM}",
                       "messages": json.loads(json.dumps(messages)), "tools": anthropic_tools(),
                       "max_tokens": cap, "stream": True})
        use = f"toolu_{seed}_{t}"
        thinking = ([{"type": "thinking", "thinking": thought[t], "signature": f"sig-{seed}-{t}"}]
                    if reasoning else [])
        messages.append({"role": "assistant", "content": thinking + [
            {"type": "text", "text": f"Step {t + 1}: using {name}."},
            {"type": "tool_use", "id": use, "name": name, "input": args}]})
        pending_results = [{"type": "tool_result", "tool_use_id": use, "content": output}]
    return bodies
