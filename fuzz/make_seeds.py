#!/usr/bin/env python3
"""Writes the seed corpus under fuzz/seeds/<target>/ (committed; rerun after editing).

body_rewrite inputs start with a 6-byte header (see fuzz/README.md): flags, a u32 count
(little endian) and a max_model_len / learned selector; the request body follows.
tokenize_reply inputs start with 2 bytes: status selector, context-length selector.
"""
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "seeds"

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


def write(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
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
    write("config", "config_empty_key", b'{"tokenizer":{"cluster":"v"},"":1}')


if __name__ == "__main__":
    main()
