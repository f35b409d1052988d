#!/usr/bin/env python3
"""Checks Hugging Face model folders with nothing but the standard library (no torch, no numpy).

  hf_check.py layout DIR        the folder against the format transformers reads: config.json
                                (architectures, model_type, the keys Tessera writes, torch_dtype),
                                one model.safetensors or model-0000N-of-0000M.safetensors shards
                                with model.safetensors.index.json (weight_map both ways,
                                metadata.total_size), every file a valid safetensors file
  hf_check.py same A B          A and B (folders or safetensors files) hold the same tensors:
                                names, dtypes, shapes and bytes
  hf_check.py bf16 DIR SRC      DIR holds SRC's f32 tensors as BF16, rounded to nearest even
  hf_check.py half DIR OUT      writes OUT: DIR's config.json and its f32 tensors as F16 (nearest
                                even), one model.safetensors, for loading an F16 folder
  hf_check.py widened DIR SRC   DIR holds SRC's F16 tensors as F32, exactly
Prints "<mode>: ok" or the first problem and exits 1.
"""

import json
import os
import re
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1}


def fail(msg):
    print(msg)
    sys.exit(1)


def read_st(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, checked as the format requires."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(f"{path}: header length {n} past the end")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        fail(f"{path}: metadata format is {meta.get('format')!r}, transformers wants 'pt'")
    out, pos = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        count = 1
        for d in e["shape"]:
            count *= d
        if b != pos or end - b != count * SIZES[e["dtype"]]:
            fail(f"{path}: {name}: offsets [{b}, {end}) do not pack {e['dtype']} {e['shape']}")
        pos = end
        out[name] = (e["dtype"], tuple(e["shape"]), data[8 + n + b:8 + n + end])
    if 8 + n + pos != len(data):
        fail(f"{path}: bytes after the last tensor")
    return out


def read_weights(path):
    if not os.path.isdir(path):
        return read_st(path)
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return read_st(single)
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read_st(os.path.join(path, shard)))
    return out


def layout(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    moe = cfg.get("model_type") == "mixtral"
    want_arch = "MixtralForCausalLM" if moe else "LlamaForCausalLM"
    if cfg.get("architectures") != [want_arch] or cfg.get("model_type") not in ("llama", "mixtral"):
        fail(f"config.json: architectures {cfg.get('architectures')}, model_type "
             f"{cfg.get('model_type')}")
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
            "tie_word_embeddings", "max_position_embeddings", "hidden_act", "torch_dtype"]
    if moe:
        keys += ["num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"]
    for k in keys:
        if k not in cfg:
            fail(f"config.json: no {k}")
    if cfg["hidden_act"] != "silu" or cfg.get("rope_scaling") is not None:
        fail("config.json: hidden_act or rope_scaling")
    dtype = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    index_path = os.path.join(d, "model.safetensors.index.json")
    if files == ["model.safetensors"]:
        if os.path.exists(index_path):
            fail("model.safetensors beside an index")
        tensors = read_st(os.path.join(d, files[0]))
    else:
        index = json.load(open(index_path))
        m = len(files)
        for i, f in enumerate(files):
            if f != f"model-{i + 1:05d}-of-{m:05d}.safetensors":
                fail(f"shard {f} is not model-{i + 1:05d}-of-{m:05d}.safetensors")
        tensors, total = {}, 0
        for f in files:
            part = read_st(os.path.join(d, f))
            for name, t in part.items():
                if index["weight_map"].get(name) != f:
                    fail(f"index: {name} is in {f} but the index says "
                         f"{index['weight_map'].get(name)}")
                total += len(t[2])
            tensors.update(part)
        if set(index["weight_map"]) != set(tensors):
            fail("index: weight_map names a tensor no shard holds")
        if index["metadata"]["total_size"] != total:
            fail(f"index: total_size {index['metadata']['total_size']} != {total}")
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * (h // nh)
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
        i = cfg["intermediate_size"]
        if moe:
            shapes[p + "block_sparse_moe.gate.weight"] = (cfg["num_local_experts"], h)
            for e in range(cfg["num_local_experts"]):
                q = p + f"block_sparse_moe.experts.{e}."
                shapes.update({q + "w1.weight": (i, h), q + "w3.weight": (i, h),
                               q + "w2.weight": (h, i)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                           p + "mlp.down_proj.weight": (h, i)})
    if set(shapes) != set(tensors):
        fail(f"tensors differ from the config's: {sorted(set(shapes) ^ set(tensors))[:5]}")
    for name, (dt, shape, _) in tensors.items():
        if dt != dtype or shape != shapes[name]:
            fail(f"{name}: {dt} {shape}, expected {dtype} {shapes[name]}")
    print(f"layout: ok ({len(files)} file(s), {len(tensors)} tensors, {dtype})")


def same(a, b):
    x, y = read_weights(a), read_weights(b)
    if set(x) != set(y):
        fail(f"names differ: {sorted(set(x) ^ set(y))[:5]}")
    for name in x:
        if x[name] != y[name]:
            fail(f"{name}: differs ({x[name][0]} {x[name][1]} vs {y[name][0]} {y[name][1]})")
    print(f"same: ok ({len(x)} tensors bit-identical)")


def bf16(d, src):
    x, y = read_weights(d), read_weights(src)
    for name, (dt, shape, raw) in y.items():
        n = len(raw) // 4
        want = bytearray(2 * n)
        for i, (u,) in enumerate(struct.iter_unpack("<I", raw)):
            r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            struct.pack_into("<H", want, 2 * i, r & 0xFFFF)
        if x[name] != ("BF16", shape, bytes(want)):
            fail(f"{name}: not the nearest-even bf16 of the f32 tensor")
    print(f"bf16: ok ({len(y)} tensors)")


def half(d, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["torch_dtype"] = "float16"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    header, blobs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dt, shape, raw) in sorted(read_weights(d).items()):
        vals = [v for (v,) in struct.iter_unpack("<f", raw)]
        blob = struct.pack(f"<{len(vals)}e", *vals)
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    print(f"half: ok ({len(header) - 1} tensors)")


def widened(d, src):
    x, y = read_weights(d), read_weights(src)
    for name, (dt, shape, raw) in y.items():
        vals = [v for (v,) in struct.iter_unpack("<e", raw)]
        if x[name] != ("F32", shape, struct.pack(f"<{len(vals)}f", *vals)):
            fail(f"{name}: not the f32 value of the F16 tensor")
    print(f"widened: ok ({len(y)} tensors)")


if __name__ == "__main__":
    mode = sys.argv[1]
    {"layout": layout, "same": same, "bf16": bf16, "half": half,
     "widened": widened}[mode](*sys.argv[2:])
