#!/usr/bin/env python3
"""Golden data for Tessera's 1-rank Llama run, from an independent PyTorch implementation.

For each case this writes, under tests/data/golden/<case>/:

  model.safetensors     initial parameters, Hugging Face names, F32
  batch.safetensors     input_ids, labels (I32, [B, L]; labels aligned with positions)
  expected.safetensors  what Tessera's `[output] dump` must contain for step 1:
                        logits [B, L, V], loss [], grad.<name> (before clipping),
                        after.<name> (after clip_grad_norm_ and one AdamW step)
  job.ini               a Tessera job that reproduces the case on one rank
  routing.safetensors   (MoE cases only) each MoE layer's router logits, selected experts
                        and weights, and the two parts of the loss: for debugging, not
                        part of the dump

Usage:
  make_golden.py                       regenerate every case (tests/data/golden)
  make_golden.py --case gqa --out DIR  one case, elsewhere
  make_golden.py --check DUMP [--case NAME | --expected FILE]
                                       compare a Tessera dump with a case's expectation

See tests/golden/README.md.
"""

import argparse
import math
import re
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import (LlamaConfig, LlamaForCausalLM, init_weights, load_safetensors,  # noqa: E402
                       route_top_k, save_safetensors, set_matmul_bf16, total_loss)

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "golden")

DUMP_FORMAT = "tessera-dump-v1"

# --check's default tolerance: |dump - expected| <= atol + rtol * |expected| elementwise.
CHECK_RTOL, CHECK_ATOL = 1e-4, 1e-5

# Optimizer of the golden step; job.ini states the same values.
OPT = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0)

# Each case exercises something the others do not:
#   gqa     grouped-query attention (2 q heads per kv head), the example model of
#           docs/design.md section 6
#   uneven  sizes that split unevenly (vocab 250, hidden 48, intermediate 100, 3 layers,
#           3 q heads per kv head), a tiny eps and a large RoPE base
#   tied    tie_word_embeddings (one matrix, two gradient contributions) with plain MHA
#   bf16    [job] dtype = bf16: every linear layer (the tied lm_head too) with bf16 operands and
#           f32 sums; GQA and tied embeddings. Checked at its own tolerance ("tol"): two correct
#           implementations whose f32 sums differ in order round a few GEMM operands to
#           neighbouring bf16 values, which moves results by far more than f32 rounding does
#           (the float64 rerun below measures how much)
#   moe     mixture of experts on every layer (E 4, top-2, router_aux_loss_coef 0.02), with an
#           exact router tie: after init, layer 0's gate row 2 is copied into row 3
#           ("tie_router"), so experts 2 and 3 have equal probabilities on every token of that
#           layer and, where only one of them fits in the top k, the lower index (2) must win
#   moe_sparse  decoder_sparse_step 2 (3 layers, only layer 1 is MoE; 0 and 2 stay dense),
#           E 6, top-3, coef 0.05, tied embeddings, uneven sizes
CASES = {
    "gqa": dict(seed=1, batch=2, seq=16,
                cfg=dict(vocab_size=256, hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
    "uneven": dict(seed=2, batch=3, seq=10,
                   cfg=dict(vocab_size=250, hidden_size=48, intermediate_size=100,
                            num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                            rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False)),
    "tied": dict(seed=3, batch=2, seq=8,
                 cfg=dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)),
    "bf16": dict(seed=4, batch=2, seq=16, dtype="bf16", tol=(2e-2, 1e-3),
                 cfg=dict(vocab_size=256, hidden_size=64, intermediate_size=176,
                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)),
    "moe": dict(seed=5, batch=2, seq=16, tie_router=(0, 2, 3),
                cfg=dict(vocab_size=256, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         num_local_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                         router_aux_loss_coef=0.02)),
    "moe_sparse": dict(seed=6, batch=3, seq=10,
                       cfg=dict(vocab_size=250, hidden_size=48, intermediate_size=64,
                                num_hidden_layers=3, num_attention_heads=6,
                                num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                                tie_word_embeddings=True, num_local_experts=6,
                                num_experts_per_tok=3, decoder_sparse_step=2,
                                router_aux_loss_coef=0.05)),
}


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------

def make_batch(vocab, batch, seq, generator):
    """Random tokens; labels are the next token, with a few positions set to -100.

    A sequence of seq+1 tokens is drawn so that every position, the last included, has a
    real next-token label before some are masked.
    """
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator, dtype=torch.int64)
    input_ids = tokens[:, :seq].clone()
    labels = tokens[:, 1:].clone()
    n_ignore = max(2, batch * seq // 8)
    flat = labels.view(-1)
    flat[torch.randperm(batch * seq, generator=generator)[:n_ignore]] = -100
    return input_ids, labels


# --------------------------------------------------------------------------------------
# Self-checks (cheap, independent recomputations of the riskiest parts)
# --------------------------------------------------------------------------------------

def loop_attention_one_head(attn, x, head, b):
    """Attention output of one (batch row, q head), by explicit loops in float64.

    Recomputes the projections, RoPE (as pair rotations of element i with i + D/2, angle
    pos * theta^(-2i/D)), the GQA head mapping (q head h reads kv head h // g) and the causal
    softmax without any of the vectorised helpers.  Returns [L, D].
    """
    cfg = attn.cfg
    d, g = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
    kvh = head // g
    xb = x[b].double()                                          # [L, hidden]
    wq = attn.q_proj.weight.detach().double()[head * d:(head + 1) * d]
    wk = attn.k_proj.weight.detach().double()[kvh * d:(kvh + 1) * d]
    wv = attn.v_proj.weight.detach().double()[kvh * d:(kvh + 1) * d]
    q, k, v = xb @ wq.T, xb @ wk.T, xb @ wv.T                   # [L, D]

    def rope(m):
        out = m.clone()
        half = d // 2
        for pos in range(m.shape[0]):
            for i in range(half):
                ang = pos * cfg.rope_theta ** (-2.0 * i / d)
                c, s = math.cos(ang), math.sin(ang)
                a0, a1 = m[pos, i].item(), m[pos, i + half].item()
                out[pos, i] = a0 * c - a1 * s
                out[pos, i + half] = a1 * c + a0 * s
        return out

    q, k = rope(q), rope(k)
    length = x.shape[1]
    out = torch.zeros(length, d, dtype=torch.float64)
    for i in range(length):
        scores = [float(q[i] @ k[j]) / math.sqrt(d) for j in range(i + 1)]
        top = max(scores)
        w = [math.exp(s - top) for s in scores]
        total = sum(w)
        for j in range(i + 1):
            out[i] += (w[j] / total) * v[j]
    return out


def check_attention(model, input_ids):
    """Compare layer 0's attention (vectorised) with the explicit loop, head by head."""
    attn = model.model.layers[0].self_attn
    captured = {}

    def hook(_module, args, _output):
        captured["x"] = args[0].detach()
    handle = attn.register_forward_hook(hook)
    attn.keep_qkv = True
    with torch.no_grad():
        model(input_ids)
    attn.keep_qkv = False
    handle.remove()
    _, _, _, out = attn.saved
    attn.saved = None
    # Every q head of the last batch row: one head alone could not tell a right kv-head
    # mapping (h // g) from a wrong one that happens to agree on it (h % Hkv for the last).
    b = input_ids.shape[0] - 1
    err = 0.0
    for head in range(model.cfg.num_attention_heads):
        ref = loop_attention_one_head(attn, captured["x"], head, b)
        err = max(err, (out[b, head].double() - ref).abs().max().item())
    assert err < 1e-6, f"attention loop check: max |diff| {err:.3e}"
    return err


def check_loss(logits, labels, loss, extra=0.0):
    """Recompute the mean CE in float64 from the stored logits and labels (plus `extra`, the
    MoE cases' router_aux_loss_coef * aux recomputed by check_routing)."""
    lg = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    lb = labels.reshape(-1).astype(np.int64)
    keep = lb != -100
    top = lg.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(lg - top).sum(axis=1, keepdims=True)))[:, 0]
    ref = float(np.mean(lse[keep] - lg[keep, lb[keep]])) + extra
    err = abs(ref - float(loss))
    assert err <= 1e-6 * max(1.0, abs(ref)), f"loss check: stored {float(loss)} vs {ref}"
    return err


def loop_moe_block(block, x):
    """A sparse MoE block's output [T, hidden], by explicit loops in float64.

    Per token: router logits as dot products with the gate rows, softmax by exp / sum, the top
    k picked one at a time as the largest remaining probability (strict >, scanning experts in
    ascending index, so a tie goes to the lower index), weights renormalised over the k, then
    the experts' SwiGLU outputs (silu(a) = a / (1 + exp(-a))) added in ascending expert order.
    Returns (output, list of each token's selected experts in selection order).
    """
    n_exp, k = block.num_experts, block.top_k
    xs = x.reshape(-1, x.shape[-1]).double()
    gate = block.gate.weight.detach().double()
    ws = [tuple(getattr(block.experts[e], w).weight.detach().double() for w in ("w1", "w2", "w3"))
          for e in range(n_exp)]
    out = torch.zeros_like(xs)
    chosen_all = []
    for t in range(xs.shape[0]):
        logits = [float(xs[t] @ gate[e]) for e in range(n_exp)]
        top = max(logits)
        ex = [math.exp(z - top) for z in logits]
        probs = [v / sum(ex) for v in ex]
        chosen = []
        for _ in range(k):
            best = None
            for e in range(n_exp):
                if e not in chosen and (best is None or probs[e] > probs[best]):
                    best = e
            chosen.append(best)
        chosen_all.append(chosen)
        total = sum(probs[e] for e in chosen)
        for e in sorted(chosen):
            w1, w2, w3 = ws[e]
            a = xs[t] @ w1.T
            hidden = (a / (1.0 + torch.exp(-a))) * (xs[t] @ w3.T)
            out[t] += (probs[e] / total) * (hidden @ w2.T)
    return out, chosen_all


def check_moe_loop(model, input_ids):
    """Compare every MoE block's output (vectorised, f32) with loop_moe_block on its input."""
    captured = {}
    handles = []
    for l, layer in enumerate(model.model.layers):
        if layer.is_moe:
            def hook(_module, args, output, l=l):
                captured[l] = (args[0].detach(), output[0].detach(), output[1].detach())
            handles.append(layer.block_sparse_moe.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids)
    for h in handles:
        h.remove()
    err = 0.0
    for l, (x, out, logits) in captured.items():
        block = model.model.layers[l].block_sparse_moe
        ref, chosen = loop_moe_block(block, x)
        _, _, experts = route_top_k(logits, block.top_k)
        assert experts.tolist() == chosen, f"MoE loop check: layer {l} selects other experts"
        err = max(err, (out.reshape(ref.shape).double() - ref).abs().max().item())
    assert err < 1e-6, f"MoE loop check: max |diff| {err:.3e}"
    return err


def check_routing(routing, cfg):
    """From the written routing file, in float64 numpy: the selection (stable top-k, ties to
    the lower index), the renormalised weights and HF's load-balancing loss, against what was
    written.  Returns (coef * aux in float64, |d aux|, the smallest gap between the k-th and
    the (k+1)-th probability of a token other than an exact tie, number of exact ties at the
    k-th place, i.e. tokens whose selection the tie rule decides)."""
    n_exp, k = cfg.num_local_experts, cfg.num_experts_per_tok
    layers = cfg.moe_layers()
    all_logits = []
    min_gap, ties = math.inf, 0
    for l in layers:
        lg = routing[f"router_logits.{l}"].astype(np.float64)
        all_logits.append(lg)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        order = np.argsort(-p, axis=1, kind="stable")      # equal keys keep ascending index
        sel = order[:, :k]
        assert np.array_equal(sel, routing[f"selected_experts.{l}"]), f"layer {l}: selection"
        w = np.take_along_axis(p, sel, axis=1)
        w /= w.sum(axis=1, keepdims=True)
        werr = np.abs(w - routing[f"routing_weights.{l}"]).max()
        assert werr < 1e-6, f"layer {l}: routing weights |d| {werr:.3e}"
        if k < n_exp:
            # the f32 probabilities the forward used decide ties; gaps measured on them
            lg32 = torch.from_numpy(routing[f"router_logits.{l}"].copy())
            p32 = torch.softmax(lg32, dim=-1).double().numpy()
            ranked = -np.sort(-p32, axis=1)
            gap = ranked[:, k - 1] - ranked[:, k]
            ties += int((gap == 0).sum())
            if (gap > 0).any():
                min_gap = min(min_gap, float(gap[gap > 0].min()))
    lg = np.concatenate(all_logits, axis=0)
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    sel = np.argsort(-p, axis=1, kind="stable")[:, :k]
    tokens_per_expert = np.zeros((k, n_exp))
    for slot in range(k):
        for e in range(n_exp):
            tokens_per_expert[slot, e] = np.mean(sel[:, slot] == e)
    aux = float((tokens_per_expert * p.mean(axis=0)[None, :]).sum() * n_exp)
    aux_err = abs(aux - float(routing["aux_loss"]))
    assert aux_err <= 1e-6 * max(1.0, aux), \
        f"aux loss: written {float(routing['aux_loss'])} vs {aux}"
    return cfg.router_aux_loss_coef * aux, aux_err, min_gap, ties


def check_adamw(before, grads, after):
    """Closed form of clip_grad_norm_ then AdamW step 1, in float64, against torch's result."""
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    coef = min(1.0, OPT["max_norm"] / (norm + 1e-6))    # clip_grad_norm_'s formula
    b1, b2, lr, eps, wd = OPT["beta1"], OPT["beta2"], OPT["lr"], OPT["eps"], OPT["weight_decay"]
    worst = 0.0
    for name, p0 in before.items():
        g = grads[name].double() * coef
        m = (1 - b1) * g
        v = (1 - b2) * g * g
        p = p0.double() * (1 - lr * wd)
        p = p - (lr / (1 - b1)) * m / (v.sqrt() / math.sqrt(1 - b2) + eps)
        worst = max(worst, (p - after[name].double()).abs().max().item())
    assert worst < 1e-6, f"AdamW closed-form check: max |diff| {worst:.3e}"
    return norm, coef, worst


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------

def job_ini(case, spec):
    c = spec["cfg"]

    def num(x):
        # Short text that parses back to the same double: 1e-05 -> "1e-5", 10000.0 -> "10000".
        x = float(x)
        text = "%g" % x
        if float(text) != x:
            text = repr(x)
        text = re.sub(r"e([+-])0*(\d)", r"e\1\2", text)
        assert float(text) == x, (text, x)
        return text

    moe = []
    if c.get("num_local_experts", 0):
        moe = [f"num_local_experts = {c['num_local_experts']}",
               f"num_experts_per_tok = {c['num_experts_per_tok']}",
               f"decoder_sparse_step = {c['decoder_sparse_step']}",
               f"router_aux_loss_coef = {num(c['router_aux_loss_coef'])}"]
    lines = [
        f"; Golden case '{case}': reproduces tests/data/golden/{case}/expected.safetensors.",
        "; Generated by tests/golden/make_golden.py; paths are relative to this file.",
        "",
        "[job]", "mode = train", "steps = 1", "seed = 0", "backend = local", "device = cpu",
        f"dtype = {spec.get('dtype', 'f32')}",
        "",
        "[mesh]", "dims = dp, tp", "shape = 1, 1",
        "",
        "[model]",
        f"vocab_size = {c['vocab_size']}",
        f"hidden_size = {c['hidden_size']}",
        f"intermediate_size = {c['intermediate_size']}",
        f"num_hidden_layers = {c['num_hidden_layers']}",
        f"num_attention_heads = {c['num_attention_heads']}",
        f"num_key_value_heads = {c['num_key_value_heads']}",
        f"rms_norm_eps = {num(c['rms_norm_eps'])}",
        f"rope_theta = {num(c['rope_theta'])}",
        f"tie_word_embeddings = {'true' if c['tie_word_embeddings'] else 'false'}",
    ] + moe + [
        "",
        "[data]", "source = safetensors:batch.safetensors",
        f"batch_size = {spec['batch']}", f"seq_len = {spec['seq']}",
        "",
        "[optimizer]",
        f"lr = {num(OPT['lr'])}", "lr_schedule = constant", "warmup_steps = 0",
        f"beta1 = {num(OPT['beta1'])}", f"beta2 = {num(OPT['beta2'])}",
        f"eps = {num(OPT['eps'])}", f"weight_decay = {num(OPT['weight_decay'])}",
        f"max_norm = {num(OPT['max_norm'])}",
        "",
        "[checkpoint]", "load = model.safetensors",
        "",
        "[output]", "dump = dump.safetensors",
        "",
    ]
    return "\n".join(lines)


def train_step(model, input_ids, labels, parts=None):
    """One step as the dump describes it: logits, loss, pre-clip grads, params after AdamW.

    The loss is the total (cross-entropy + router_aux_loss_coef * aux for an MoE model).  A
    dict passed as `parts` receives the cross-entropy, the aux loss and the router logits.
    """
    params = dict(model.named_parameters())
    logits, router_logits = model(input_ids, with_router_logits=True)
    loss, ce, aux = total_loss(model.cfg, logits, labels, router_logits)
    if parts is not None:
        parts.update(ce=ce.detach(), aux=None if aux is None else aux.detach(),
                     router_logits=[r.detach() for r in router_logits])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}   # before clipping
    torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm=OPT["max_norm"])
    opt = torch.optim.AdamW(list(params.values()), lr=OPT["lr"],
                            betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    opt.step()
    after = {n: p.detach().clone() for n, p in params.items()}
    return logits.detach(), loss.detach(), grads, after


def check_float64(d, cfg, input_ids, labels, expected, spec):
    """Rerun the step in float64 from the written files and measure the f32 golden against it.

    An f32 implementation that is correct but sums in another order lands about this far
    from the golden data, so this shows that --check's default tolerance is attainable (the
    tightest spot is after.*: AdamW's first step divides g by |g| + eps, which amplifies the
    rounding of gradients near eps).  Returns (worst ratio to the tolerance, tensor name).
    """
    model = model_from(d, cfg).double()
    set_matmul_bf16(model, spec.get("dtype") == "bf16")
    parts = {}
    logits, loss, grads, after = train_step(model, input_ids, labels, parts)
    if cfg.num_local_experts:
        # A different selection in float64 would make the comparison meaningless; the gaps
        # check_routing reports say how far each token is from such a flip.
        routing, _ = load_safetensors(os.path.join(d, "routing.safetensors"))
        for l, r in zip(cfg.moe_layers(), parts["router_logits"]):
            _, _, experts = route_top_k(r, cfg.num_experts_per_tok)
            assert np.array_equal(experts.numpy(), routing[f"selected_experts.{l}"]), \
                f"float64 rerun: layer {l} selects other experts"
    ref = {"logits": logits, "loss": loss}
    ref.update({"grad." + n: g for n, g in grads.items()})
    ref.update({"after." + n: p for n, p in after.items()})
    rtol, atol = spec.get("tol", (CHECK_RTOL, CHECK_ATOL))
    worst = (0.0, "")
    for name, t in expected:
        r = ((t.double() - ref[name]).abs() / (atol + rtol * ref[name].abs())).max().item()
        worst = max(worst, (r, name))
    assert worst[0] < 1, f"float64 rerun: {worst[1]} is {worst[0]:.2f}x the --check tolerance"
    return worst


def generate(case, spec, out_root):
    cfg = LlamaConfig(**spec["cfg"])
    # Global seed too: module construction draws from the global generator before
    # init_weights overwrites everything, and nothing should depend on leftover state.
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    model = LlamaForCausalLM(cfg)
    init_weights(model, gen)
    if "tie_router" in spec:
        # An exact router tie: equal gate rows give equal logits and probabilities on every
        # token of that layer, so the selection rule for ties is part of the golden data.
        layer, src, dst = spec["tie_router"]
        with torch.no_grad():
            gate = model.model.layers[layer].block_sparse_moe.gate.weight
            gate[dst] = gate[src]
    set_matmul_bf16(model, spec.get("dtype") == "bf16")
    input_ids, labels = make_batch(cfg.vocab_size, spec["batch"], spec["seq"], gen)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    parts = {}
    logits, loss, grads, after = train_step(model, input_ids, labels, parts)
    if "tie_router" in spec:
        r = parts["router_logits"][cfg.moe_layers().index(layer)]
        assert torch.equal(r[:, src], r[:, dst]), "the tied gate rows gave different logits"

    d = os.path.join(out_root, case)
    os.makedirs(d, exist_ok=True)
    save_safetensors(os.path.join(d, "model.safetensors"), before, {"format": "pt"})
    save_safetensors(os.path.join(d, "batch.safetensors"),
                     [("input_ids", input_ids.to(torch.int32)), ("labels", labels.to(torch.int32))],
                     {"format": "pt"})
    expected = [("logits", logits), ("loss", loss.reshape(()))]
    expected += [("grad." + n, g) for n, g in grads.items()]
    expected += [("after." + n, p) for n, p in after.items()]
    save_safetensors(os.path.join(d, "expected.safetensors"), expected, {"format": DUMP_FORMAT})
    with open(os.path.join(d, "job.ini"), "w", newline="\n") as f:
        f.write(job_ini(case, spec))
    if cfg.num_local_experts:
        routing = []
        for l, r in zip(cfg.moe_layers(), parts["router_logits"]):
            _, weights, experts = route_top_k(r, cfg.num_experts_per_tok)
            routing += [(f"router_logits.{l}", r),
                        (f"selected_experts.{l}", experts.to(torch.int32)),
                        (f"routing_weights.{l}", weights)]
        routing += [("cross_entropy", parts["ce"].reshape(())),
                    ("aux_loss", parts["aux"].reshape(()))]
        save_safetensors(os.path.join(d, "routing.safetensors"), routing, {"format": "pt"})

    # Self-checks, on what was written where possible (so the reader is checked too).
    got, meta = load_safetensors(os.path.join(d, "expected.safetensors"))
    assert meta == {"format": DUMP_FORMAT}
    assert list(got) == [n for n, _ in expected], "tensor order changed on the round trip"
    for n, t in expected:
        assert np.array_equal(got[n], t.numpy()), f"round trip changed {n}"
    batch, _ = load_safetensors(os.path.join(d, "batch.safetensors"))
    extra = 0.0
    if cfg.num_local_experts:
        routing, _ = load_safetensors(os.path.join(d, "routing.safetensors"))
        extra, aux_err, min_gap, ties = check_routing(routing, cfg)
        moe_err = check_moe_loop(model_from(d, cfg), input_ids)
    loss_err = check_loss(got["logits"], batch["labels"], got["loss"], extra)
    attn_err = check_attention(model_from(d, cfg), input_ids)
    norm, coef, adam_err = check_adamw(before, grads, after)
    f64_ratio, f64_name = check_float64(d, cfg, input_ids, labels, expected, spec)
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in before     # HF stores a tied matrix once
    n_ign = int((labels == -100).sum())
    print(f"{case}: params={sum(p.numel() for p in before.values())} tensors={len(before)} "
          f"loss={loss.item():.6f} ignored={n_ign}/{labels.numel()} grad_norm={norm:.6f} "
          f"clip_coef={coef:.6f}")
    print(f"{case}: self-check attention-loop |d|={attn_err:.2e} loss-recompute |d|="
          f"{loss_err:.2e} adamw-closed-form |d|={adam_err:.2e} float64-rerun worst "
          f"{f64_ratio:.2f}x tolerance ({f64_name}): ok")
    if cfg.num_local_experts:
        print(f"{case}: moe layers={cfg.moe_layers()} cross_entropy={parts['ce'].item():.6f} "
              f"aux={parts['aux'].item():.6f} (loss = CE + {cfg.router_aux_loss_coef:g} * aux)")
        print(f"{case}: self-check moe-loop |d|={moe_err:.2e} aux-recompute |d|={aux_err:.2e}; "
              f"k-th vs (k+1)-th probability: smallest gap {min_gap:.2e}, exact ties decided "
              f"by the lower index {ties}: ok")


def model_from(d, cfg):
    """A fresh model loaded from the written model.safetensors (checks the file, too)."""
    model = LlamaForCausalLM(cfg)
    tensors, _ = load_safetensors(os.path.join(d, "model.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    assert list(tensors) == names, "model.safetensors names differ from the module's"
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[n].copy()))
    return model


# --------------------------------------------------------------------------------------
# --check: compare a Tessera dump with an expectation
# --------------------------------------------------------------------------------------

def check_dump(dump_path, expected_path, rtol, atol):
    dump, dmeta = load_safetensors(dump_path)
    exp, _ = load_safetensors(expected_path)
    print(f"dump     {dump_path} ({len(dump)} tensors, metadata {dmeta})")
    print(f"expected {expected_path} ({len(exp)} tensors)")
    failures = []
    # A forward-mode dump has only logits and loss; compare what that mode promises.
    forward_only = not any(n.startswith(("grad.", "after.")) for n in dump)
    if forward_only:
        print("dump has no grad./after. tensors: comparing logits and loss only (forward mode)")
    worst = None   # (ratio, name, max_abs, at_index, got, want)
    for name, want in exp.items():
        if forward_only and name.startswith(("grad.", "after.")):
            continue
        if name not in dump:
            failures.append(f"{name}: missing from the dump")
            continue
        got = dump[name]
        if got.shape != want.shape:
            failures.append(f"{name}: shape {list(got.shape)} != expected {list(want.shape)}")
            continue
        g, w = got.astype(np.float64), want.astype(np.float64)
        if not np.all(np.isfinite(g)):
            failures.append(f"{name}: non-finite values in the dump")
            continue
        diff = np.abs(g - w)
        # ratio > 1 means outside |got - want| <= atol + rtol * |want| (numpy.isclose's rule)
        ratio = diff / (atol + rtol * np.abs(w)) if diff.size else np.zeros(0)
        if ratio.size == 0:
            continue
        i = int(np.argmax(ratio))
        r = float(ratio.flat[i])
        idx = np.unravel_index(i, ratio.shape) if ratio.ndim else ()
        entry = (r, name, float(diff.max()), tuple(int(k) for k in idx), float(g.flat[i]),
                 float(w.flat[i]))
        if worst is None or r > worst[0]:
            worst = entry
        if r > 1:
            failures.append(f"{name}: max |diff| {entry[2]:.3e}, worst at {list(entry[3])}: "
                            f"got {entry[4]:.8g} want {entry[5]:.8g} ({r:.2f}x tolerance)")
    for name in dump:
        if name not in exp:
            failures.append(f"{name}: in the dump but not expected")
    if worst is not None:
        r, name, mx, idx, gv, wv = worst
        print(f"worst tensor: {name} max |diff| {mx:.3e}; at {list(idx)} got {gv:.8g} want "
              f"{wv:.8g}; {r:.3f}x of tolerance (rtol {rtol:g}, atol {atol:g})")
    for f in failures:
        print("FAIL " + f)
    print(f"{'FAIL' if failures else 'PASS'}: {len(failures)} tensor(s) out of tolerance or "
          f"mismatched")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output root (default tests/data/golden)")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="only this case (repeatable); default all")
    ap.add_argument("--check", metavar="DUMP", help="compare a Tessera dump instead of generating")
    ap.add_argument("--expected", help="with --check: expected file (default: the --case's, or "
                                       "expected.safetensors next to DUMP)")
    ap.add_argument("--rtol", type=float, default=CHECK_RTOL)
    ap.add_argument("--atol", type=float, default=CHECK_ATOL)
    args = ap.parse_args()

    if args.check:
        if args.expected:
            expected = args.expected
        elif args.case:
            expected = os.path.join(args.out, args.case[0], "expected.safetensors")
        else:
            expected = os.path.join(os.path.dirname(os.path.abspath(args.check)),
                                    "expected.safetensors")
        sys.exit(check_dump(args.check, expected, args.rtol, args.atol))

    # One thread: PyTorch's CPU reductions may split differently with more threads, and the
    # files must not depend on the machine's core count.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for case in args.case or list(CASES):
        generate(case, CASES[case], args.out)


if __name__ == "__main__":
    main()
