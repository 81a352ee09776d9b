"""Give the tiny Qwen3 model directory random weights, for conversion to GGUF.

    python scripts/llamacpp-weights.py --src <model dir> --out <new dir> [--seed 0]

The source directory (scripts/make-model.py) holds the config, the real Qwen3 tokenizer and its
chat template, and no weights: vLLM serves it with dummy weights. llama.cpp needs real tensors,
so this copies the directory and adds model.safetensors with weights drawn from the config's
initializer (seeded, so the same inputs give the same file). Run it with the vLLM virtualenv's
Python (torch and transformers). Nothing is downloaded.
"""

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(args.src.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            shutil.copy2(f, tmp / f.name)

    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(args.src)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    # save_pretrained rewrites config.json (and generation_config.json) in its own format;
    # keep the source's files so the GGUF carries exactly the vLLM suites' settings.
    for name in ("config.json", "generation_config.json"):
        if (args.src / name).is_file():
            shutil.copy2(args.src / name, tmp / name)

    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"llamacpp-weights: {n} parameters written to {args.out}")


if __name__ == "__main__":
    main()
