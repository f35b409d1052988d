"""Reference Llama decoder in plain PyTorch, plus a minimal safetensors reader/writer.

This is the independent implementation that Tessera's 1-rank run is checked against
(tests/golden/make_golden.py) and the eager PyTorch peer of the training benchmark
(bench/pytorch_llama.py).  It follows the semantics of Hugging Face's LlamaForCausalLM
(eager attention, no KV cache, no dropout, no biases) and uses the same parameter names,
so a checkpoint written here loads in either framework.

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
    """The subset of Hugging Face's LlamaConfig that the model needs (same key names)."""

    KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
            "tie_word_embeddings")

    def __init__(self, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
                 num_attention_heads, num_key_value_heads=None, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False):
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
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("num_attention_heads must divide hidden_size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def as_dict(self):
        return {k: getattr(self, k) for k in self.KEYS}


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


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, cos, sin):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


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

    def forward(self, input_ids):
        cfg = self.cfg
        cos, sin = rope_tables(input_ids.shape[1], cfg.head_dim, cfg.rope_theta,
                               device=input_ids.device)
        return self.lm_head(self.model(input_ids, cos, sin))


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
