"""A scripted SGLang server for fault injection: SGLang's HTTP request and reply shapes, with
a switch that makes one endpoint answer in the wrong shape.

The real SGLang runs in tests/sglang (scripts/sglang.sh); this stub exists only so a test can
make the count or window endpoints answer badly, which the real server never does. Counts are
real: the tiny Qwen3's own tokenizer and chat template through transformers (run this file
with the vLLM virtualenv's python, which has transformers), rendered the way SGLang renders a
chat request for a Jinja template. tests/sglang/test_sglang_stub_filter.py checks the stub's
replies and counts against the real server for the shapes the tests use.

Shapes, as defined by sglang 0.5.23 (PyPI wheel):
* GET /v1/models: `ModelList` / `ModelCard` (sglang/srt/entrypoints/openai/protocol.py), built
  in `available_models` (sglang/srt/entrypoints/http_server.py): `max_model_len` is the
  server's context length (`model_config.context_len`).
* POST /tokenize and /v1/tokenize: `TokenizeRequest` / `TokenizeResponse` (protocol.py),
  `OpenAIServingTokenize` (serving_tokenize.py): exactly one of `prompt` / `messages`;
  `messages` with `tools`, `tool_choice`, `reasoning_effort`, `chat_template_kwargs` is
  rendered as for a chat completion; reply `tokens`, `count`, `max_model_len` = the
  tokenizer's `model_max_length` (not the server's context length).
* POST /v1/messages/count_tokens: `AnthropicCountTokensResponse`
  (sglang/srt/entrypoints/anthropic/protocol.py): `{"input_tokens": N}`; the request is
  converted to a chat request (anthropic/serving.py `_convert_to_chat_completion_request`).
* POST /v1/chat/completions, /v1/completions: `ChatCompletionResponse`,
  `CompletionResponse`, `UsageInfo` (protocol.py); errors `ErrorResponse`
  (`object: "error"`, `message`, `type`, `param`, `code`). A cap above the context length is
  refused by `OpenAIServingChat._validate_request` (serving_chat.py, "max_completion_tokens
  is too large"); input + max_new_tokens above it by `TokenizerManager` (managers/
  tokenizer_manager.py, "Requested token count exceeds the model's maximum context length").
* POST /v1/messages: `AnthropicMessagesResponse` / `AnthropicUsage` (anthropic/protocol.py);
  errors in the Anthropic envelope (`_anthropic_error_response`, http_server.py).

Fault switch: POST /_stub/fault {"fault": NAME} (see FAULTS); GET /_stub/calls returns the
number of calls per path and, per path, the JSON keys and cap of the last request.

    python tests/sglang/fake_sglang.py --port 18400 --model-dir .cache/model/qwen3-tiny
"""

from __future__ import annotations

import argparse
import copy
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = {
    "none": "every endpoint answers as SGLang does",
    "tokenize-count-string": "/tokenize answers `count` as a string",
    "tokenize-no-count": "/tokenize answers without `count`",
    "tokenize-not-json": "/tokenize answers 200 with a body that is not JSON",
    "count-tokens-shape": "/v1/messages/count_tokens answers {\"tokens\": N}",
    "models-shape": "/v1/models answers without `max_model_len`",
}


class Model:
    def __init__(self, model_dir: str, served_name: str, context_length: int):
        from transformers import AutoTokenizer  # the vLLM virtualenv has it

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.name = served_name
        self.context_length = context_length
        self.lock = threading.Lock()

    @property
    def tokenizer_limit(self) -> int:
        return int(self.tok.model_max_length)

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        with self.lock:
            return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def chat_ids(self, req: dict) -> list:
        """Token ids of a chat request as SGLang renders it for a Jinja chat template."""
        messages = [_message(m) for m in req.get("messages") or []]
        tools = None
        if req.get("tools") and req.get("tool_choice") != "none":
            tools = [_tool(t) for t in req["tools"]]
        kwargs = {}
        if req.get("reasoning_effort") is not None:
            kwargs["reasoning_effort"] = req["reasoning_effort"]
        kwargs.update(req.get("chat_template_kwargs") or {})
        agp = req.get("add_generation_prompt")
        with self.lock:
            text = self.tok.apply_chat_template(
                messages, tools=tools, tokenize=False,
                add_generation_prompt=agp is not False, **kwargs)
            return self.tok.encode(text, add_special_tokens=False)


def _message(m: dict) -> dict:
    """A message as SGLang passes it to the template: fields left out or null are absent,
    text parts joined with spaces (Qwen3's template takes string content), assistant
    tool-call arguments parsed from their JSON string."""
    m = copy.deepcopy(m)
    if m.get("content") is None:
        m["content"] = ""
    if isinstance(m["content"], list):
        texts = [p.get("text", "") for p in m["content"]
                 if isinstance(p, dict) and p.get("type") in ("text", "input_text")]
        m["content"] = " ".join(texts)
    for call in m.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass
    return {k: v for k, v in m.items() if v is not None}


def _tool(t: dict) -> dict:
    """`Tool.model_dump()`: the function's keys in the client's order, `description` and
    `parameters` null when absent, `strict` / `defer_loading` only when set; the wrapper's
    `defer_loading` always present."""
    f = dict(t.get("function") or {})
    known = ("description", "name", "parameters", "strict", "defer_loading")
    fd = {k: f[k] for k in f if k in known}
    for k in ("description", "parameters"):
        fd.setdefault(k, None)
    for k in ("strict", "defer_loading"):
        if fd.get(k) is None:
            fd.pop(k, None)
    return {"type": t.get("type", "function"), "function": fd,
            "defer_loading": t.get("defer_loading")}


def anthropic_to_chat(req: dict) -> dict:
    """The chat request SGLang builds from an Anthropic one (system first, text blocks,
    tool_use / tool_result blocks as tool calls and tool messages, tools as functions with
    `strict` false unless set: `AnthropicCustomTool.strict` defaults to False)."""
    messages = []
    system = req.get("system")
    if isinstance(system, list):
        system = "\n".join(b.get("text", "") for b in system if isinstance(b, dict))
    if system:
        messages.append({"role": "system", "content": system})
    for m in req.get("messages") or []:
        content = m.get("content")
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        texts, calls, results = [], [], []
        for b in content or []:
            kind = b.get("type")
            if kind == "text":
                texts.append(b.get("text", ""))
            elif kind == "tool_use":
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"),
                                           "arguments": json.dumps(b.get("input") or {})}})
            elif kind == "tool_result":
                c = b.get("content")
                if isinstance(c, list):
                    c = "\n".join(x.get("text", "") for x in c if isinstance(x, dict))
                results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                                "content": c or ""})
        messages.extend(results)
        if texts or calls:
            msg = {"role": m["role"], "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    out = {"messages": messages}
    if req.get("tools"):
        out["tools"] = [{"type": "function", "defer_loading": t.get("defer_loading"),
                         "function": {"name": t.get("name"),
                                      "description": t.get("description") or "",
                                      "parameters": t.get("input_schema"),
                                      "strict": bool(t.get("strict", False))}}
                        for t in req["tools"] if "input_schema" in t]
    return out


class BadRequest(Exception):
    pass


class Stub:
    def __init__(self, model: Model):
        self.model = model
        self.fault = "none"
        self.calls: dict = {}
        self.last: dict = {}
        self.lock = threading.Lock()

    def record(self, path: str, body):
        with self.lock:
            self.calls[path] = self.calls.get(path, 0) + 1
            if isinstance(body, dict):
                info = {"keys": sorted(body.keys())}
                for k in ("max_tokens", "max_completion_tokens"):
                    if k in body:
                        info[k] = body[k]
                self.last[path] = info

    # --- endpoints ---------------------------------------------------------------------
    def models(self):
        card = {"id": self.model.name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": self.model.name, "parent": None,
                "max_model_len": self.model.context_length}
        if self.fault == "models-shape":
            del card["max_model_len"]
        return 200, {"object": "list", "data": [card]}

    def tokenize(self, req: dict):
        if (req.get("prompt") is None) == (req.get("messages") is None):
            raise BadRequest("Exactly one of 'prompt' or 'messages' must be provided.")
        if req.get("messages") is not None:
            tokens = self.model.chat_ids(req)
            count = len(tokens)
        elif isinstance(req["prompt"], str):
            tokens = self.model.encode(req["prompt"], req.get("add_special_tokens", True))
            count = len(tokens)
        else:
            tokens = [self.model.encode(p, req.get("add_special_tokens", True))
                      for p in req["prompt"]]
            count = [len(t) for t in tokens]
        reply = {"tokens": tokens, "count": count, "max_model_len": self.model.tokenizer_limit}
        if self.fault == "tokenize-count-string":
            reply["count"] = str(count)
        elif self.fault == "tokenize-no-count":
            del reply["count"]
        elif self.fault == "tokenize-not-json":
            return 200, f"count={count}"
        return 200, reply

    def count_tokens(self, req: dict):
        n = len(self.model.chat_ids(anthropic_to_chat(req)))
        if self.fault == "count-tokens-shape":
            return 200, {"tokens": n}
        return 200, {"input_tokens": n}

    def _limits(self, prompt_len: int, cap, chat: bool):
        c = self.model.context_length
        if chat and cap and cap > c:
            raise BadRequest(f"max_completion_tokens is too large: {cap}."
                             f"This model supports at most {c} completion tokens.")
        if prompt_len >= c:
            raise BadRequest(f"The input ({prompt_len} tokens) is longer than the model's "
                             f"context length ({c} tokens).")
        if cap is not None and cap + prompt_len > c:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {c} "
                f"tokens. You requested a total of {cap + prompt_len} tokens: {prompt_len} "
                f"tokens from the input messages and {cap} tokens for the completion. Please "
                f"reduce the number of tokens in the input messages or the completion to fit "
                f"within the limit.")
        return min(cap if cap is not None else c - prompt_len, c - prompt_len)

    @staticmethod
    def _usage(p: int, n: int) -> dict:
        return {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n,
                "prompt_tokens_details": None, "reasoning_tokens": 0,
                "completion_tokens_details": None}

    @staticmethod
    def _generate(n: int) -> str:
        return " a" * n   # one Qwen3 token each; a stub does not run a model

    def chat(self, req: dict):
        cap = req.get("max_completion_tokens") or req.get("max_tokens")
        p = len(self.model.chat_ids(req))
        n = min(self._limits(p, cap, True), 4)
        return 200, {
            "id": secrets.token_hex(16), "object": "chat.completion",
            "created": int(time.time()), "model": req.get("model", self.model.name),
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": self._generate(n),
                                     "reasoning_content": None},
                         "logprobs": None, "finish_reason": "length", "matched_stop": None}],
            "usage": self._usage(p, n),
            "metadata": {"weight_version": "default"}}

    def completions(self, req: dict):
        prompt = req.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("the stub serves string prompts only")
        p = len(self.model.encode(prompt))
        n = min(self._limits(p, req.get("max_tokens", 16), False), 4)
        return 200, {
            "id": secrets.token_hex(16), "object": "text_completion",
            "created": int(time.time()), "model": req.get("model", self.model.name),
            "choices": [{"index": 0, "text": self._generate(n), "logprobs": None,
                         "finish_reason": "length", "matched_stop": None}],
            "usage": self._usage(p, n),
            "metadata": {"weight_version": "default"}}

    def messages(self, req: dict):
        chat = anthropic_to_chat(req)
        p = len(self.model.chat_ids(chat))
        n = min(self._limits(p, req.get("max_tokens"), True), 4)
        return 200, {
            "id": "msg_" + secrets.token_hex(16), "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": self._generate(n)}],
            "model": req.get("model", self.model.name), "stop_reason": "max_tokens",
            "usage": {"input_tokens": p, "output_tokens": n}}


def make_handler(stub: Stub):
    posts = {"/tokenize": stub.tokenize, "/v1/tokenize": stub.tokenize,
             "/v1/messages/count_tokens": stub.count_tokens,
             "/v1/chat/completions": stub.chat, "/v1/completions": stub.completions,
             "/v1/messages": stub.messages}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body):
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            ctype = "text/plain" if isinstance(body, str) else "application/json"
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                stub.record(path, None)
                return self._send(200, "")
            if path == "/v1/models":
                stub.record(path, None)
                return self._send(*stub.models())
            if path == "/_stub/calls":
                with stub.lock:
                    return self._send(200, {"calls": dict(stub.calls),
                                            "last": copy.deepcopy(stub.last),
                                            "fault": stub.fault})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if path == "/_stub/fault":
                fault = json.loads(raw).get("fault")
                if fault not in FAULTS:
                    return self._send(400, {"error": f"unknown fault; one of {sorted(FAULTS)}"})
                stub.fault = fault
                return self._send(200, {"fault": fault})
            fn = posts.get(path)
            if fn is None:
                return self._send(404, {"detail": "Not Found"})
            anthropic = path.startswith("/v1/messages")
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                stub.record(path, body)
                return self._send(*fn(body))
            except (BadRequest, ValueError) as e:
                msg = str(e)
                if anthropic:
                    return self._send(400, {"type": "error", "error": {
                        "type": "invalid_request_error", "message": msg}})
                return self._send(400, {"object": "error", "message": msg,
                                        "type": "BadRequestError", "param": None,
                                        "code": 400})

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--served-model-name", default="qwen3-tiny")
    ap.add_argument("--context-length", type=int, default=512)
    args = ap.parse_args()
    stub = Stub(Model(args.model_dir, args.served_model_name, args.context_length))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(stub))
    server.daemon_threads = True
    print(f"fake_sglang: listening on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
