#!/usr/bin/env python3
"""Writes the seed corpus under fuzz/seeds/<target>/ (committed; rerun after editing).

body_rewrite inputs start with a 6-byte header (see fuzz/README.md): flags, a u32 count
(little endian) and a max_model_len / learned selector; the request body follows.
tokenize_reply inputs start with 2 bytes: status selector, context-length selector.
bound, stop_reason and window_errors inputs start with a header too (see fuzz/README.md).
Inputs kept by hand (a crash's reproducer, seeds written before this script knew their shape)
are listed in KEPT and survive a rerun.
"""
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "seeds"

KEPT = [
    "body_rewrite/anthropic-thinking-lowered",
    "body_rewrite/anthropic-thinking-none-valid",
    "body_rewrite/anthropic-tools",
    "tokenize_reply/invalid-utf8-in-ignored-member",
]

EXACT, CACHE, ESTIMATE = 0, 1, 2
CFG_C, CFG_REJECT, CFG_LEARNED, CFG_WINDOW = 0, 1, 2, 3
SCALE_MOD, SCALE_RAW, SCALE_HUGE, SCALE_SMALL = 0, 1, 2, 3


def header(source, cfg, tokens, scale=SCALE_RAW, mml=False, sel=0):
    flags = source | (cfg << 2) | (0x10 if mml else 0) | (scale << 5)
    return bytes([flags]) + struct.pack("<I", tokens) + bytes([sel])


MSG = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Summarise the attached log."}]

BODIES = {
    # name: (header, body text)
    "chat_escaped_reasoning_content_key": (
        header(EXACT, CFG_C, 50),
        '{"messages":[{"role":"assistant","reasoning\\u005fcontent":"r","content":"a"}]}',
    ),
    "chat_escaped_reasoning_effort_none": (
        header(EXACT, CFG_C, 50),
        '{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"\\u006eone"}',
    ),
    "chat_max_tokens_exact": (
        header(EXACT, CFG_C, 1200),
        json.dumps({"model": "Qwen/Qwen3-8B", "messages": MSG, "max_tokens": 65536, "stream": True}),
    ),
    "chat_lax_caps_estimate": (
        header(ESTIMATE, CFG_C, 900),
        '{ "model" : "m",\n  "messages": [{"role":"user","content":"hi"}],\n'
        '  "max_completion_tokens" : "2_048" , "max_output_tokens": 5.0e3, "temperature": 0.7 }\n',
    ),
    "chat_duplicate_caps_tools": (
        header(CACHE, CFG_C, 30000),
        '{"max_tokens":999999,"messages":[{"role":"user","content":"weather?"}],'
        '"tools":[{"type":"function","function":{"name":"get","parameters":{}}}],'
        '"tool_choice":"required","max_tokens":"1_000_000","max_tokens":true}',
    ),
    "chat_escapes_unicode": (
        header(EXACT, CFG_C, 50),
        '{"messages":[{"role":"user","content":"\\u4f60\\u597d \u4f60\u597d \u00e9 \\ud83d\\ude00"}],'
        '"max\\u005ftokens":4096,"max_output_tokens":"  +512.00 ","x":[1e400,18446744073709551616,-0.0]}',
    ),
    "chat_no_cap_response_format": (
        header(ESTIMATE, CFG_C, 32000, mml=True),
        '\t{"messages":[{"role":"user","content":"json please"}],"response_format":{"type":"json_object"}}\r\n',
    ),
    "chat_truncate_multimodal": (
        header(EXACT, CFG_WINDOW, 20000),
        json.dumps({
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
                {"role": "assistant", "reasoning": None, "reasoning_content": "think", "content": "a cat"},
            ],
            "truncate_prompt_tokens": 8000,
            "max_completion_tokens": 30000,
        }),
    ),
    "chat_truncate_text": (
        header(CACHE, CFG_C, 20000),
        '{"messages":[{"role":"user","content":[{"type":"text","text":"long"}]}],'
        '"truncate_prompt_tokens":8000,"max_tokens":30000}',
    ),
    "chat_template_kwargs": (
        header(EXACT, CFG_LEARNED, 300, mml=True, sel=4),
        json.dumps({
            "model": "m", "messages": MSG, "reasoning_effort": "none", "documents": [{"title": "t", "text": "d"}],
            "chat_template_kwargs": {"enable_thinking": True}, "add_generation_prompt": False,
            "continue_final_message": False, "add_special_tokens": True, "chat_template": "{{x}}",
            "media_io_kwargs": {}, "mm_processor_kwargs": None, "max_output_tokens": 200,
        }, separators=(",", ":")),
    ),
    "chat_reject_insufficient": (
        header(EXACT, CFG_REJECT, 32700),
        json.dumps({"messages": MSG, "max_tokens": 1000}),
    ),
    "chat_learned_window": (
        header(CACHE, CFG_LEARNED, 100, scale=SCALE_SMALL, sel=1),
        '{"messages":[],"max_tokens":false,"max_completion_tokens":null,"max_output_tokens":-5}',
    ),
    "completion_string": (
        header(EXACT, CFG_C, 12000),
        json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "echo": False}),
    ),
    "completion_token_ids": (
        header(EXACT, CFG_C, 3),
        '{"prompt":[1,2,3],"max_output_tokens":"1_000","add_special_tokens":false}',
    ),
    "completion_batches": (
        header(ESTIMATE, CFG_C, 70000, scale=SCALE_MOD),
        '{"prompt":[[1,2],[3,4,5]],"max_tokens":100000}',
    ),
    "completion_string_batch": (
        header(ESTIMATE, CFG_C, 5),
        '{"prompt":["a","bb","\u4e2d\u6587"],"max_completion_tokens":12.0}',
    ),
    "completion_huge_count": (
        header(EXACT, CFG_C, 0, scale=SCALE_HUGE),
        '{"prompt":"x","max_tokens":18446744073709551616}',
    ),
    "chat_lone_surrogate": (
        header(EXACT, CFG_C, 10),
        '{"messages":[{"role":"user","content":"\\ud83dx"}],"max_tokens":5000}',
    ),
    "empty_object": (header(EXACT, CFG_C, 0), " { } "),
    "not_object": (header(EXACT, CFG_C, 0), '[{"messages":[]}]'),
    "not_json": (header(EXACT, CFG_C, 0), '{"messages":[],}'),
    "deep_nesting": (header(ESTIMATE, CFG_C, 10), '{"messages":[' + "[" * 300 + "]" * 300 + '],"max_tokens":7}'),
}

CAPS = [
    "5", "5.0", "50e-1", "1e300", "1e400", "true", "false", "null", "0", "-0", "-5", "1.5",
    '"5"', '" +7.00 "', '"1_000"', '"1__0"', '"_1"', '"5e3"', '"\\u0035"', '"-5"',
    "18446744073709551616", '"99999999999999999999999999"', "[5]", '{"a":5}', " 7 ", "05", "",
]

REPLIES = [
    (0, 0, {"count": 57, "max_model_len": 32768, "tokens": [1, 2, 3], "token_strs": None}),
    (0, 200, {"count": 0, "max_model_len": 32768}),
    (0, 130, {"count": 57, "max_model_len": 32768}),  # mismatch with C = 512
    (0, 0, {"count": -1, "max_model_len": 512}),
    (0, 0, {"count": True, "max_model_len": 512}),
    (0, 0, {"count": 5.0, "max_model_len": 512}),
    (0, 0, {"max_model_len": 512}),
    (165, 0, {"count": 1, "max_model_len": 1}),  # 225
    (200, 0, {"object": "error", "message": "boom", "code": 500}),  # 800
    (195, 0, {}),  # 504
    (185, 0, {}),  # no response
]
RAW_REPLIES = [
    (0, 0, b'{"count":5,"count":6,"max_model_len":512}'),
    (0, 0, b"<html>502</html>"),
    (0, 0, b'{"count":1e3,"max_model_len":18446744073709551616}'),
    (0, 0, b""),
    (0, 0, b"[5,32768]"),  # an array is not a reply
]

CONFIGS = [
    {"tokenizer": {"cluster": "vllm"}},
    {
        "tokenizer": {"backend": "vllm", "cluster": "vllm", "authority": "vllm:8000", "path": "/tokenize",
                      "timeout_ms": 30000, "headers": {"authorization": "Bearer ..."}},
        "model": "Qwen/Qwen3-8B", "context_length": 32768, "window_tokens": 32768, "min_output_tokens": 4096,
        "fallback_margin_tokens": 1024, "cache_entries": 4096, "max_body_bytes": 8388608,
        "on_insufficient": "passthrough", "response_headers": True,
    },
    {"tokenizer": {"cluster": "v", "headers": {"x-api-key": {"env": "TOKENIZER_KEY"}}},
     "model": ["a", "b"], "window_tokens": 8000, "min_output_tokens": 10, "fallback_margin_tokens": 0,
     "on_insufficient": "reject", "response_headers": False},
    {"tokenizer": {"cluster": "v"}, "context_length": 1000, "fallback_margin_tokens": 500, "min_output_tokens": 499},
    {"tokenizer": {"cluster": "v"}, "context_length": 1000, "window_tokens": 1001},
    {"tokenizer": {"cluster": "v", "tiemout_ms": 1}},
    {"routes": [{"model": "a", "tokenizer": {"cluster": "a", "headers": {"k": {"env": "K"}}}, "context_length": 8192},
                {"model": ["b", "c"], "tokenizer": {"cluster": "b", "backend": "sglang"}, "window_tokens": 2048,
                 "min_output_tokens": 64, "fallback_margin_tokens": 32, "on_insufficient": "reject"}]},
    {"tokenizer": {"cluster": "v"}, "context_length": 32768, "routes": [{"model": "a"}, {"model": ["b", "a"]}]},
    {"tokenizer": {"cluster": "v"}, "context_length": 16384, "routes": [{"model": ["c", "c"]}]},
]


def bound_header(messages_form, k, prefix, need=3000, window=32768):
    return (bytes([(1 if messages_form else 0) | (k << 1)]) + struct.pack("<Q", prefix)
            + struct.pack("<I", need) + struct.pack("<I", window))


TOOL_ARGS = json.dumps({"city": "Paris", "days": 3, "ratio": 1.5e-3, "nested": {"a": [1, 2.0]}})
BOUND = [
    # (Anthropic?, k, prefix count, body)
    (False, 2, 1040, json.dumps({"model": "m", "max_tokens": 3000, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "reasoning_content": "think first"},
        {"role": "user", "content": [{"type": "text", "text": "more"}, {"type": "text", "text": "and more"}]},
    ]})),
    (False, 1, 500, json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": TOOL_ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ], "tools": [{"type": "function", "function": {"name": "get", "parameters": {}}}]})),
    (False, 0, 0, json.dumps({"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]})),
    (False, 1, 2 ** 64 - 20, json.dumps({"messages": [
        {"role": "developer", "content": "x"}, {"role": "user", "content": "y"}]})),
    (False, 3, 7, '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"<think>b</think>c"}]}'),
    (True, 1, 2000, json.dumps({"model": "m", "max_tokens": 32000, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                          {"type": "tool_use", "id": "t", "name": "get", "input": {"x": 1.25, "y": [1, 2]}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "ok"}]}]},
    ]})),
    (True, 0, 10, json.dumps({"max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]})),
    # A message alone (message_bound and reserialized_growth read the whole body).
    (False, 0, 0, json.dumps({"role": "assistant", "content": "x", "tool_calls": [
        {"function": {"arguments": TOOL_ARGS}}]})),
    (False, 0, 0, '{"a" : [1e15, -0.5, "x,:y\\\"", {"b":true}], "c": null}'),
    # Not messages: an array of a message's fields, a content part that is an array.
    (False, 0, 0, '\t["assistant"]\t'),
    (True, 0, 5, '{"messages":[{"role":"user","content":[["text"]]}],"max_tokens":9}'),
    # A number past what a double holds is JSON all the same.
    (True, 0, 5, '{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n",'
                 '"input":{"x":1e400}}]}],"max_tokens":9}'),
    (True, 1, 5, '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text",'
                 '"text":"<think>a</think>b"},{"type":"tool_use","id":"t","name":"n","input":{"x":1e400}}]}],'
                 '"max_tokens":9}'),
]

STOP_JSON = ('{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":'
             '"a \\"stop_reason\\":\\"max_tokens\\" quote, {\\"usage\\":1}"}],"model":"m",'
             '"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3000,"output_tokens":1096}}')


def stop_stream(output=1096, end="\n", last_blank=True):
    events = [
        ("message_start", '{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":3000,"output_tokens":0}}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"message_delta"}}'),
        ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":3000,"output_tokens":%d}}' % output),
        ("message_stop", '{"type":"message_stop"}'),
    ]
    text = "".join(f"event: {n}\ndata: {d}\n\n" for n, d in events)
    if not last_blank:
        text = text[:text.index("event: message_stop")].rstrip("\n")
    return text.replace("\n", end)


def stop_header(sse, trailers, cap, cuts=()):
    flags = (1 if sse else 0) | (2 if trailers else 0) | (len(cuts) << 2)
    cuts = list(cuts) + [0] * (3 - len(cuts))
    return bytes([flags]) + struct.pack("<H", cap) + struct.pack("<HHH", *cuts)


STOP = [
    (False, False, 1096, (60,), STOP_JSON),
    (False, True, 1096, (200, 240), STOP_JSON),
    (False, False, 1095, (), STOP_JSON),
    (False, True, 8, (3, 30),
     '{ "usage" : {"output_tokens": 8}, "content": [], "stop_reason" : "max_tokens" }'),
    (False, False, 8, (), '{"stop_reason":"max_tokens","stop_reason":"end_turn","usage":{"output_tokens":8}}'),
    (True, False, 1096, (17, 400), stop_stream()),
    (True, True, 1096, (101, 555, 700), stop_stream(end="\r\n")),
    (True, False, 1096, (300,), stop_stream(end="\r")),
    (True, True, 1096, (50,), stop_stream(end="\r", last_blank=False)),
    (True, False, 500, (300,), stop_stream(500)),
    (True, False, 8, (), 'event: message_delta\ndata: {"type":"message_delta",\ndata: "delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":8}}\n\n'),
    (True, False, 8, (9,), 'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":8}}\r\n\n'),
]


def window_header(dialect, exact, too_long, prompt, context, cap, no_count=False):
    flags = dialect | (4 if exact else 0) | (8 if too_long else 0) | (0x10 if no_count else 0)
    return bytes([flags]) + struct.pack("<I", prompt) + struct.pack("<HH", context, cap)


def vllm_body(message):
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}})


WINDOW_MESSAGES = [
    "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=4097)",
    "This model's maximum context length is 4096 tokens. However, your prompt contains 90000 characters (more than 81920 characters, which is the upper bound for 4096 input tokens). Please reduce the length of the input prompt. (parameter=input_text, value=90000)",
    "max_completion_tokens=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_completion_tokens, value=32000)",
    "This model's maximum context length is 4096 tokens. However, you requested 96 output tokens and your prompt contains 90000 characters (more than 80000 characters, which is the upper bound for 4000 input tokens). Please reduce the length of the input prompt or the number of requested output tokens.",
    "This model's maximum context length is 512 tokens. However, you requested 200 output tokens and your prompt contains at least 313 input tokens, for a total of at least 513 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=313)",
    "Input length (5000) exceeds model's maximum context length (4096).",
    "'max_tokens' or 'max_completion_tokens' is too large: 200. This model's maximum context length is 512 tokens and your request has 430 input tokens (200 > 512 - 430).",
    "This model's maximum context length is 312 tokens. However, your request has 430 input tokens. Please reduce the length of the input messages.",
    "max_tokens=-1 cannot be greater than max_model_len=4096. Please request fewer output tokens.",
    "This model's maximum context length is 99999999999999999999 tokens. However, your prompt contains 5 input tokens, which exceeds this limit even without any output tokens.",
]
WINDOW_RAW = [
    json.dumps({"object": "error", "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).", "type": "BadRequestError", "param": None, "code": 400}),
    json.dumps({"object": "error", "message": "Requested token count exceeds the model's maximum context length of 512 tokens. You requested a total of 630 tokens: 430 tokens from the input messages and 200 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.", "type": "BadRequestError", "param": None, "code": 400}),
    json.dumps({"object": "error", "message": "max_completion_tokens is too large: 32000.This model supports at most 512 completion tokens.", "code": 400}),
    json.dumps({"error": {"code": 400, "message": "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}),
    json.dumps({"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 1, "n_ctx": 0}}),
    json.dumps({"type": "error", "error": {"type": "BadRequestError", "message": "max_tokens=32000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=32000)"}}),
    json.dumps({"error": {"message": 7}, "message": "The input (5 tokens) is longer than the model's context length (4 tokens)."}),
    "<html>400</html>",
    json.dumps({"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}),
]


def write(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def main():
    kept = {name: (ROOT / name).read_bytes() for name in KEPT}
    shutil.rmtree(ROOT, ignore_errors=True)
    for name, data in kept.items():
        target, file = name.split("/")
        write(target, file, data)
    for name, (h, body) in BODIES.items():
        write("body_rewrite", name, h + body.encode())
    for i, c in enumerate(CAPS):
        write("caps", f"cap_{i:02}", c.encode())
    for i, (s, c, reply) in enumerate(REPLIES):
        write("tokenize_reply", f"reply_{i:02}", bytes([s, c]) + json.dumps(reply).encode())
    for i, (s, c, raw) in enumerate(RAW_REPLIES, start=len(REPLIES)):
        write("tokenize_reply", f"reply_{i:02}", bytes([s, c]) + raw)
    for i, cfg in enumerate(CONFIGS):
        write("config", f"config_{i:02}", json.dumps(cfg, indent=1 if i == 1 else None).encode())
    write("config", "config_bad_json", b'{"tokenizer":{"cluster":"v"},}')
    for i, (anthropic, k, prefix, body) in enumerate(BOUND):
        write("bound", f"bound_{i:02}", bound_header(anthropic, k, prefix) + body.encode())
    for i, (sse, trailers, cap, cuts, body) in enumerate(STOP):
        write("stop_reason", f"stop_{i:02}", stop_header(sse, trailers, cap, cuts) + body.encode())
    budgets = [
        window_header(0, True, False, 3000, 4096, 1096),
        window_header(1, False, False, 250, 0, 0),
        window_header(2, True, True, 5009, 4096, 32000),
        window_header(0, False, False, 0, 0, 0, no_count=True),
    ]
    bodies = [vllm_body(m) for m in WINDOW_MESSAGES] + WINDOW_RAW
    for i, body in enumerate(bodies):
        write("window_errors", f"window_{i:02}", budgets[i % len(budgets)] + body.encode())
    write("config", "config_empty_key", b'{"tokenizer":{"cluster":"v"},"":1}')


if __name__ == "__main__":
    main()
