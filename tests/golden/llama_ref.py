"""Reference Llama decoder in plain PyTorch, plus a minimal safetensors reader/writer.

This is the independent implementation that Tessera's 1-rank run is checked against
(tests/golden/make_golden.py) and the eager PyTorch peer of the training benchmark
(bench/pytorch_llama.py).  It follows the semantics of Hugging Face's LlamaForCausalLM
(eager attention, no KV cache, no dropout, no biases) and uses the same parameter names,
so a checkpoint written here loads in either framework.

With num_local_experts > 0 it is a mixture-of-experts model with Hugging Face Mixtral's sparse
block (softmax router, top-k experts, renormalised weights, SwiGLU experts w1/w2/w3, the
load-balancing auxiliary loss) on the layers Qwen2-MoE's decoder_sparse_step selects; every
other layer keeps the dense MLP.

Everything is float32, except that set_matmul_bf16() makes every linear layer multiply in mixed
precision (bf16 operands, f32 sums), as Tessera's `[job] dtype = bf16`.  Nothing here depends on
packages beyond torch and numpy.
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

class LlamaConfig:
    """The subset of Hugging Face's LlamaConfig that the model needs (same key names), plus
    Mixtral's / Qwen2-MoE's mixture-of-experts keys (num_local_experts = 0: a dense model)."""

    KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
            "tie_word_embeddings")
    MOE_KEYS = ("num_local_experts", "num_experts_per_tok", "decoder_sparse_step",
                "router_aux_loss_coef")

    def __init__(self, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
                 num_attention_heads, num_key_value_heads=None, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False, num_local_experts=0,
                 num_experts_per_tok=2, decoder_sparse_step=1, router_aux_loss_coef=0.001):
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        # HF: an absent num_key_value_heads means plain multi-head attention.
        self.num_key_value_heads = int(num_key_value_heads or num_attention_heads)
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        # Mixture of experts (defaults as HF Mixtral, except that 0 experts means dense).
        self.num_local_experts = int(num_local_experts)
        self.num_experts_per_tok = int(num_experts_per_tok)
        self.decoder_sparse_step = int(decoder_sparse_step)
        self.router_aux_loss_coef = float(router_aux_loss_coef)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("num_attention_heads must divide hidden_size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        if self.num_local_experts < 0:
            raise ValueError("num_local_experts must be >= 0")
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError("num_experts_per_tok must be in 1 .. num_local_experts")
        if self.decoder_sparse_step < 1:
            raise ValueError("decoder_sparse_step must be >= 1")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, layer):
        """Layer `layer` (0-based) is sparse iff experts exist and (layer + 1) % step == 0."""
        return self.num_local_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0

    def moe_layers(self):
        return [l for l in range(self.num_hidden_layers) if self.is_moe_layer(l)]

    def as_dict(self):
        keys = self.KEYS + (self.MOE_KEYS if self.num_local_experts else ())
        return {k: getattr(self, k) for k in keys}


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------

class Bf16Matmul(torch.autograd.Function):
    """x @ w.T with both operands rounded to bf16 (nearest even) and the products summed in
    f32.  The backward rounds the incoming gradient the same way and multiplies it with the
    rounded operands; the roundings themselves pass gradients straight through."""

    @staticmethod
    def forward(ctx, x, w):
        # rounded values held in the operands' own dtype: f32 sums, or f64 for the self-check
        xr, wr = x.bfloat16().to(x.dtype), w.bfloat16().to(w.dtype)
        ctx.save_for_backward(xr, wr)
        return xr @ wr.t()

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        gr = g.bfloat16().to(g.dtype)
        dx = gr @ wr
        dw = gr.reshape(-1, gr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
        return dx, dw


class Linear(nn.Linear):
    """nn.Linear without bias whose product is Bf16Matmul once set_matmul_bf16() says so."""

    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features, bias=False)
        self.bf16 = False

    def forward(self, x):
        return Bf16Matmul.apply(x, self.weight) if self.bf16 else super().forward(x)


def set_matmul_bf16(model, on=True):
    for m in model.modules():
        if isinstance(m, Linear):
            m.bf16 = on


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        # HF upcasts to f32 for the statistics; the model is f32 throughout, so the cast is
        # a no-op here but keeps the semantics explicit should someone run it in bf16.
        dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(dtype)


def rope_tables(seq_len, head_dim, theta, device=None):
    """cos, sin tables of shape [seq_len, head_dim] for positions 0 .. seq_len-1.

    The frequencies are computed in f32 like HF (arange in int64, then .float() / D) so that
    the tables match it bit for bit.  Each frequency appears twice, in the first and in the
    second half of the head (the "rotate_half" layout, not interleaved pairs).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                             device=device).float() / head_dim))
    positions = torch.arange(seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, L, D]; cos, sin: [L, D] broadcast over batch and heads."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, groups):
    """[B, Hkv, L, D] -> [B, Hkv*groups, L, D]; kv head j serves q heads j*g .. j*g+g-1."""
    if groups == 1:
        return x
    return torch.repeat_interleave(x, groups, dim=1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, d = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim)
        self.q_proj = Linear(h, nh * d)
        self.k_proj = Linear(h, nkv * d)
        self.v_proj = Linear(h, nkv * d)
        self.o_proj = Linear(nh * d, h)
        # Set by forward() when a caller asks for it (the self-check in make_golden.py
        # recomputes one head from these by an explicit loop).
        self.keep_qkv = False
        self.saved = None

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, l, _ = x.shape
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(b, l, nh, d).transpose(1, 2)
        k = self.k_proj(x).view(b, l, nkv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, l, nkv, d).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_rep = repeat_kv(k, nh // nkv)
        v_rep = repeat_kv(v, nh // nkv)

        scores = torch.matmul(q, k_rep.transpose(2, 3)) / math.sqrt(d)
        # Causal mask: -inf strictly above the diagonal, so position i sees 0 .. i.
        mask = torch.full((l, l), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v_rep)                       # [B, H, L, D]
        if self.keep_qkv:
            self.saved = (q.detach(), k.detach(), v.detach(), out.detach())
        out = out.transpose(1, 2).reshape(b, l, nh * d)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(h, i)
        self.up_proj = Linear(h, i)
        self.down_proj = Linear(i, h)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route_top_k(router_logits, k):
    """Mixtral's routing of T tokens over E experts: router_logits [T, E] -> (probs [T, E],
    weights [T, k], experts [T, k]).

    probs = softmax(router_logits) in float32 (float64 when the model is float64); the k
    largest per token by a STABLE descending sort, so that among equal probabilities the lower
    expert index comes first (an exact tie at the k-th place selects the lower index);
    weights = those k probabilities divided by their sum.  experts[t] is in that descending
    order, not ascending.
    """
    probs = F.softmax(router_logits, dim=-1,
                      dtype=torch.promote_types(router_logits.dtype, torch.float32))
    ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, experts = ranked[:, :k], order[:, :k]
    return probs, top / top.sum(dim=-1, keepdim=True), experts


class MoeExpert(nn.Module):
    """One expert: the SwiGLU MLP under Mixtral's names, w2(silu(w1(x)) * w3(x))."""

    def __init__(self, cfg):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.w1 = Linear(h, i)
        self.w2 = Linear(i, h)
        self.w3 = Linear(h, i)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """Mixtral's sparse MoE block: no capacity limit, no token dropping, no jitter.

    Registered as `block_sparse_moe` with `gate` (the router, [E, hidden]) before
    `experts.{e}` so that named_parameters() lists gate, experts.0.w1, .w2, .w3, experts.1 ...
    """

    def __init__(self, cfg):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_local_experts, cfg.num_experts_per_tok
        self.gate = Linear(cfg.hidden_size, self.num_experts)
        self.experts = nn.ModuleList(MoeExpert(cfg) for _ in range(self.num_experts))

    def forward(self, x):
        """x [B, L, hidden] -> (output [B, L, hidden], router_logits [B*L, E]).

        output[t] = sum over the selected experts e, in ascending e, of
        weight[t, e] * expert_e(x[t]); tokens are flattened row-major (t = b*L + position).
        """
        b, l, h = x.shape
        flat = x.reshape(b * l, h)
        router_logits = self.gate(flat)
        _, weights, experts = route_top_k(router_logits, self.top_k)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        # Expert by expert in ascending index, accumulated with index_add_ (as HF), so each
        # token's sum runs over its experts in ascending order, starting from zero.
        for e in range(self.num_experts):
            tokens, slot = torch.where(experts == e)
            if tokens.numel() == 0:
                continue
            y = self.experts[e](flat[tokens]) * weights[tokens, slot, None]
            out = out.index_add(0, tokens, y)
        return out.reshape(b, l, h), router_logits


def load_balancing_loss(router_logits, num_experts, top_k):
    """HF's load_balancing_loss_func with attention_mask None.

    router_logits: the MoE layers' [T, E] logits, in layer order.  On their concatenation
    [layers*T, E]: routing = softmax; the same stable top-k as the forward; expert_mask =
    one_hot(selected) [layers*T, k, E] (no gradient); tokens_per_expert = mean over rows [k, E];
    router_prob_per_expert = mean of routing over rows [E];
    aux = sum(tokens_per_expert * router_prob_per_expert) * E.
    """
    logits = torch.cat(list(router_logits), dim=0)
    routing = F.softmax(logits, dim=-1)
    _, selected = torch.sort(routing, dim=-1, descending=True, stable=True)
    expert_mask = F.one_hot(selected[:, :top_k], num_experts)
    tokens_per_expert = torch.mean(expert_mask.to(routing.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        # Registration order is the parameter order: attention, MLP or MoE block, norms.
        self.is_moe = cfg.is_moe_layer(layer)
        if self.is_moe:
            self.block_sparse_moe = SparseMoeBlock(cfg)
        else:
            self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        """Returns (x, router_logits [B*L, E] or None for a dense layer)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        if self.is_moe:
            y, router_logits = self.block_sparse_moe(self.post_attention_layernorm(x))
            return x + y, router_logits
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, None


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, l)
                                    for l in range(cfg.num_hidden_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, cos, sin):
        """Returns (final hidden states, list of the MoE layers' router logits in order)."""
        x = self.embed_tokens(input_ids)
        router_logits = []
        for layer in self.layers:
            x, r = layer(x, cos, sin)
            if r is not None:
                router_logits.append(r)
        return self.norm(x), router_logits


class LlamaForCausalLM(nn.Module):
    """Module tree mirrors HF so that named_parameters() yields HF's names."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            # One tensor, two uses: named_parameters() reports it once, under
            # model.embed_tokens.weight, and autograd sums the two gradient contributions.
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, with_router_logits=False):
        """logits [B, L, V]; with_router_logits: (logits, [router_logits of each MoE layer])."""
        cfg = self.cfg
        cos, sin = rope_tables(input_ids.shape[1], cfg.head_dim, cfg.rope_theta,
                               device=input_ids.device)
        hidden, router_logits = self.model(input_ids, cos, sin)
        logits = self.lm_head(hidden)
        return (logits, router_logits) if with_router_logits else logits


def init_weights(model, generator):
    """Deterministic init: matrices ~ N(0, 0.02^2), norm weights = 1 + 0.1 N(0, 1).

    Norm weights are deliberately not all ones so that their gradient path (and any
    mistake in where the weight multiplies) shows up in the golden data.  Parameters are
    drawn in named_parameters() order from one generator, so the result depends only on
    the seed and the config.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def loss_fn(logits, labels):
    """Mean cross-entropy over positions whose label is not -100.

    Labels are already aligned with the logits (label[t] is the target of position t);
    unlike HF's `labels=` argument, nothing is shifted here.
    """
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), labels.reshape(-1).long(), ignore_index=-100)


def total_loss(cfg, logits, labels, router_logits):
    """(loss, cross_entropy, aux): loss = CE + router_aux_loss_coef * aux, as HF's Mixtral adds
    it, whenever the model has MoE layers and the coefficient is not 0.  aux is None for a
    dense model (no router logits) and computed, but not added, when the coefficient is 0."""
    ce = loss_fn(logits, labels)
    if not router_logits:
        return ce, ce, None
    aux = load_balancing_loss(router_logits, cfg.num_local_experts, cfg.num_experts_per_tok)
    if cfg.router_aux_loss_coef == 0:
        return ce, ce, aux
    return ce + cfg.router_aux_loss_coef * aux, ce, aux


def param_count(model):
    # named_parameters() deduplicates a tied matrix, so it is counted once.
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------
# safetensors, written and read by hand
# --------------------------------------------------------------------------------------
#
# Layout: u64 little-endian header length N, N bytes of JSON, then the raw tensor data.
# The JSON maps each name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets are
# relative to the first byte after the header) and may hold "__metadata__" (str -> str).
# The header is padded with spaces to a multiple of 8 so the data starts aligned.

_DTYPES = {  # safetensors name -> numpy little-endian dtype
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?",
}
_NUMPY_TO_ST = {np.dtype(v).str: k for k, v in _DTYPES.items()}


def _to_numpy(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous().numpy()
    a = np.asarray(t)
    # Force little-endian and C order so the bytes are the row-major layout the format wants.
    # (np.ascontiguousarray would turn a 0-d array into shape [1]; astype(order="C") does not.)
    return a.astype(a.dtype.newbyteorder("<"), order="C", copy=False)


def save_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor) or an ordered dict; stored in that order.

    The output depends only on the inputs (no timestamps, fixed key order, compact JSON), so
    regenerating the golden data gives byte-identical files.
    """
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    header = {}
    blobs = []
    offset = 0
    for name, t in items:
        a = _to_numpy(t)
        st_dtype = _NUMPY_TO_ST.get(a.dtype.str)
        if st_dtype is None:
            raise TypeError(f"{name}: dtype {a.dtype} has no safetensors name here")
        raw = a.tobytes(order="C")
        header[name] = {"dtype": st_dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def load_safetensors(path):
    """Returns (dict name -> numpy array in file order, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        dt = _DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * np.dtype(dt).itemsize or base + end > len(data):
            raise ValueError(f"{path}: {name}: data_offsets do not match shape and dtype")
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=base + begin).reshape(shape)
    return out, meta
