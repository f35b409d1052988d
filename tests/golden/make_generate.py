#!/usr/bin/env python3
"""Golden greedy continuations for `tessera generate`, from the PyTorch reference (llama_ref.py).

For each case below this reads tests/data/golden/<case>/model.safetensors and the [model]
keys of its job.ini, takes as prompt the first PROMPT_LEN input ids of row 0 of its
batch.safetensors, and continues it greedily for NEW_TOKENS tokens: each step runs the whole
sequence through the model (no KV cache) and appends the argmax of the last position's logits
(the lowest id among equal maxima, as torch.argmax). It writes

  tests/data/golden/<case>/generate.json   {"prompt": [...], "greedy": [...], "min_margin": m}

min_margin is the smallest gap, over the steps, between the largest and the second largest
logit: how far from a tie the argmax was, so a reader knows how much rounding it tolerates.

Usage: make_generate.py [--out DIR]   (needs torch; run once, the output is committed)
"""

import argparse
import configparser
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaConfig, LlamaForCausalLM, load_safetensors  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "golden")
CASES = ("gqa", "tied", "moe")
PROMPT_LEN, NEW_TOKENS = 8, 24


def model_config(job_ini):
    ini = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
    ini.read(job_ini)
    m = ini["model"]
    keys = {}
    for k in LlamaConfig.KEYS + LlamaConfig.MOE_KEYS:
        if k in m:
            keys[k] = m[k] == "true" if k == "tie_word_embeddings" else float(m[k])
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "num_local_experts",
              "num_experts_per_tok", "decoder_sparse_step"):
        if k in keys:
            keys[k] = int(keys[k])
    return LlamaConfig(**keys)


def greedy(model, prompt, steps):
    ids = list(prompt)
    margin = float("inf")
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids], dtype=torch.long))[0, -1]
            top2 = torch.topk(logits, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margin


def run_case(case, out_dir):
    src = os.path.join(DEFAULT_OUT, case)
    cfg = model_config(os.path.join(src, "job.ini"))
    weights, _ = load_safetensors(os.path.join(src, "model.safetensors"))
    batch, _ = load_safetensors(os.path.join(src, "batch.safetensors"))
    prompt = [int(x) for x in batch["input_ids"][0][:PROMPT_LEN]]
    model = LlamaForCausalLM(cfg)
    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"{case}: missing {missing}, unexpected {unexpected}")
    model.eval()
    new, margin = greedy(model, prompt, NEW_TOKENS)
    os.makedirs(os.path.join(out_dir, case), exist_ok=True)
    path = os.path.join(out_dir, case, "generate.json")
    with open(path, "w") as f:
        json.dump({"prompt": prompt, "greedy": new, "min_margin": round(margin, 6)}, f)
        f.write("\n")
    print(f"{path}: prompt {prompt} -> {new} (min margin {margin:.4g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.manual_seed(0)
    for case in CASES:
        run_case(case, args.out)


if __name__ == "__main__":
    main()
