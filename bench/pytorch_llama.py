#!/usr/bin/env python3
"""PyTorch eager peer of Tessera's training-step benchmark.

Runs the reference Llama of tests/golden/llama_ref.py (the model the golden data comes
from) in float32 on the CPU and times whole training steps: forward, cross-entropy,
backward, clip_grad_norm_ and one AdamW step, as Tessera's step does.

FLOPs per step follow docs/design.md section 8: (6*N + 6*L*h*s) * tokens, where N counts ALL
parameters (embedding and lm_head included, a tied matrix once), L = layers, h = hidden,
s = seq_len and tokens = batch * seq_len.  6*N is the matmul work of forward plus backward
(the embedding lookup does none, so N slightly overstates it); 6*L*h*s is causal
attention (q k^T and probs v, forward and backward, counting half of the L x L square).

The last line is machine-readable:
  pytorch_llama tokens_per_s=<x> step_s=<y> gflops=<z>
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "golden"))
from llama_ref import (LlamaConfig, LlamaForCausalLM, init_weights, loss_fn,  # noqa: E402
                       param_count)


def main():
    ap = argparse.ArgumentParser(description="PyTorch eager Llama training-step benchmark")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps (default 2)")
    # The preset; overridable to try other shapes, but the figure to compare is the default.
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peak", action="store_true",
                    help="also time a 1024^3 torch.mm to report MFU against it")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --threads >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads)
    model = LlamaForCausalLM(cfg)
    init_weights(model, gen)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=False)

    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=gen)
    input_ids, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(input_ids), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        opt.step()
        return loss.item()   # .item() also makes the step's work finish before timing stops

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)

    n_params = param_count(model)
    ntok = args.batch * args.seq
    flops = (6 * n_params + 6 * cfg.num_hidden_layers * cfg.hidden_size * args.seq) * ntok
    # Median: the machine is shared, and one preempted step should not move the figure.
    step_s = statistics.median(times)
    tok_s = ntok / step_s
    gflops = flops / step_s / 1e9

    print(f"model: vocab {cfg.vocab_size} hidden {cfg.hidden_size} intermediate "
          f"{cfg.intermediate_size} layers {cfg.num_hidden_layers} heads "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}; batch {args.batch} seq "
          f"{args.seq}; params {n_params} (all, embeddings included)")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, warm-up "
          f"{args.warmup}, measured {args.steps}")
    print(f"step times (s): {' '.join(f'{t:.3f}' for t in times)}; last loss {loss:.4f}")
    print(f"FLOPs per step {flops / 1e9:.1f} G = (6*N + 6*L*h*s) * tokens")
    print(f"median step {step_s:.3f} s, {tok_s:.1f} tokens/s, {gflops:.1f} GFLOP/s")
    if args.peak:
        a = torch.randn(1024, 1024)
        b = torch.randn(1024, 1024)
        torch.mm(a, b)
        # Best single multiply over about a second: on a shared machine the fastest run is
        # the closest to what the cores can do, and a peak that reads low inflates the MFU.
        best, t_end = float("inf"), time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        peak = 2 * 1024 ** 3 / best / 1e9
        print(f"torch.mm 1024^3 peak {peak:.1f} GFLOP/s, MFU {100 * gflops / peak:.1f}%")
    print(f"pytorch_llama tokens_per_s={tok_s:.1f} step_s={step_s:.4f} gflops={gflops:.2f}")


if __name__ == "__main__":
    main()
