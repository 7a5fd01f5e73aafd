#!/usr/bin/env python3
"""Write the random-weight bf16 Gemma 4 checkpoint used by the benchmarks (the pinned bench shape).

    python3 bench/gen_bench_checkpoint.py --out DIR [--seed S]

Writes DIR/config.json (model_type gemma4_text, official style: head_dim + global_head_dim, own layer_types,
no per_layer_config) and DIR/model.safetensors (written directly: 8-byte little-endian header length, JSON header
padded with spaces so the data section starts 8-byte aligned, then the tensors back to back in name order).
Needs only Python 3 and numpy (Debian: python3-numpy). ~320 MB, well under a minute.

Shape: hidden 1024, intermediate 4096, 8 layers (sliding x3 + full, twice), 8 heads, 2 KV heads, head_dim 128 on
sliding / 256 on full layers, window 512, vocab 32768, no PLE, no KV sharing, final softcap 30, tied embeddings.
Weights: normal(0, 0.02) rounded to bf16 (round to nearest even); RMSNorm weights 1 + normal(0, 0.02);
layer_scalar exactly 1. Each tensor has its own generator seeded by (seed, crc32(name)), so any one tensor can
be regenerated alone. The weights are random: the benchmark measures speed, the output is noise.
"""

import argparse
import json
import os
import struct
import sys
import time
import zlib

try:
    import numpy as np
except ImportError:
    sys.exit("gen_bench_checkpoint: needs numpy (Debian: apt-get install python3-numpy)")

S, F = "sliding_attention", "full_attention"
CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "dtype": "bfloat16",
    "vocab_size": 32768,
    "vocab_size_per_layer_input": 32768,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 8,
    "layer_types": [S, S, S, F, S, S, S, F],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "global_head_dim": 256,
    "sliding_window": 512,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
    "attention_k_eq_v": False,
    "enable_moe_block": False,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_bidirectional_attention": None,
    "rms_norm_eps": 1e-06,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "initializer_range": 0.02,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
WEIGHT_STD = 0.02
NORM_STD = 0.02
CHUNK = 1 << 22  # elements generated at a time (bounds memory)


def tensor_list(c):
    """(name, shape, kind) for every tensor, kind in {"weight", "norm", "scalar"}; gemma4.md §2 naming."""
    D, H, V, I = c["hidden_size"], c["num_attention_heads"], c["vocab_size"], c["intermediate_size"]
    out = [("model.embed_tokens.weight", [V, D], "weight"), ("model.norm.weight", [D], "norm")]
    for i, t in enumerate(c["layer_types"]):
        hd = c["global_head_dim"] if t == F else c["head_dim"]
        K = c["num_key_value_heads"]
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [D], "norm"),
            (p + "self_attn.q_proj.weight", [H * hd, D], "weight"),
            (p + "self_attn.q_norm.weight", [hd], "norm"),
            (p + "self_attn.k_proj.weight", [K * hd, D], "weight"),
            (p + "self_attn.k_norm.weight", [hd], "norm"),
            (p + "self_attn.v_proj.weight", [K * hd, D], "weight"),
            (p + "self_attn.o_proj.weight", [D, H * hd], "weight"),
            (p + "post_attention_layernorm.weight", [D], "norm"),
            (p + "pre_feedforward_layernorm.weight", [D], "norm"),
            (p + "mlp.gate_proj.weight", [I, D], "weight"),
            (p + "mlp.up_proj.weight", [I, D], "weight"),
            (p + "mlp.down_proj.weight", [D, I], "weight"),
            (p + "post_feedforward_layernorm.weight", [D], "norm"),
            (p + "layer_scalar", [1], "scalar"),
        ]
    return sorted(out)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def f32_to_bf16(x):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even (inputs are finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))
    return (u >> np.uint32(16)).astype("<u2")


def bf16_to_f32(b):
    return (np.asarray(b, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


def tensor_chunks(name, shape, kind, seed):
    """Yields the tensor's bf16 bytes in chunks."""
    n = numel(shape)
    if kind == "scalar":
        yield f32_to_bf16(np.ones(n, dtype=np.float32)).tobytes()
        return
    rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        x = rng.standard_normal(m, dtype=np.float32)
        if kind == "norm":
            x = x * np.float32(NORM_STD) + np.float32(1.0)
        else:
            x *= np.float32(WEIGHT_STD)
        yield f32_to_bf16(x).tobytes()
        done += m


def build_header(tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        size = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-(8 + len(raw))) % 8)  # data section starts 8-byte aligned
    return raw, off


def write_checkpoint(out_dir, seed):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    tensors = tensor_list(CONFIG)
    raw, data_len = build_header(tensors)
    path = os.path.join(out_dir, "model.safetensors")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, kind in tensors:
            for chunk in tensor_chunks(name, shape, kind, seed):
                f.write(chunk)
    os.replace(tmp, path)
    return path, tensors, 8 + len(raw) + data_len


def verify(path, tensors, seed):
    """Read the file back: header, alignment, contiguous offsets, sizes, and sampled values."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
    start = 8 + n
    problems = []
    if start % 8:
        problems.append(f"data section starts at {start}, not 8-byte aligned")
    meta = hdr.pop("__metadata__", None)
    if meta != {"format": "pt"}:
        problems.append(f"__metadata__ is {meta}")
    want = {name: (shape, kind) for name, shape, kind in tensors}
    if set(hdr) != set(want):
        problems.append(f"tensor names differ: {sorted(set(hdr) ^ set(want))[:5]}")
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], k) for k, e in hdr.items())
    pos = 0
    for b, e, k in spans:
        if b != pos:
            problems.append(f"{k}: starts at {b}, expected {pos} (gap or overlap)")
        pos = e
        ent = hdr[k]
        if ent["dtype"] != "BF16":
            problems.append(f"{k}: dtype {ent['dtype']}")
        if k in want and (ent["shape"] != want[k][0] or e - b != numel(want[k][0]) * 2):
            problems.append(f"{k}: shape {ent['shape']} / {e - b} bytes, expected {want[k][0]}")
    if start + pos != size:
        problems.append(f"file is {size} bytes, header covers {start + pos}")

    def sample(name, count):
        b = hdr[name]["data_offsets"][0]
        with open(path, "rb") as f:
            f.seek(start + b)
            return bf16_to_f32(np.frombuffer(f.read(count * 2), dtype="<u2"))

    emb = sample("model.embed_tokens.weight", 1 << 16)
    if not (0.018 < float(emb.std()) < 0.022 and abs(float(emb.mean())) < 0.001):
        problems.append(f"embed_tokens sample mean {emb.mean():.4g} std {emb.std():.4g}, expected ~0 / 0.02")
    first = next(tensor_chunks("model.embed_tokens.weight", [1, 8], "weight", seed))
    if sample("model.embed_tokens.weight", 8).tobytes() != bf16_to_f32(np.frombuffer(first, "<u2")).tobytes():
        problems.append("embed_tokens first values do not match a regeneration from the seed")
    norm = sample("model.norm.weight", CONFIG["hidden_size"])
    if not (0.99 < float(norm.mean()) < 1.01):
        problems.append(f"model.norm.weight mean {norm.mean():.4g}, expected ~1")
    for i in range(CONFIG["num_hidden_layers"]):
        v = sample(f"model.layers.{i}.layer_scalar", 1)
        if float(v[0]) != 1.0:
            problems.append(f"layer {i} layer_scalar is {v[0]}, expected 1")
    return problems, len(hdr), sum(numel(want[k][0]) for k in want)


def self_test_rounding():
    x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e-41, 65504.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8],
                 dtype=np.float32)
    # 1+2^-8 is a tie between 1.0 (even) and 1+2^-7: rounds to 1.0; 1+3*2^-8 ties up to 1+2^-6 (even)
    want = np.array([1.0, -2.5, 1.0, 1.015625, 0.0, 65536.0, 1.0, 1.015625], dtype=np.float32)
    got = bf16_to_f32(f32_to_bf16(x))
    # 3e-41 is subnormal: bf16 keeps subnormals; compare bit patterns except for that entry
    ok = all(got[i] == want[i] for i in (0, 1, 2, 3, 5, 6, 7))
    if not ok:
        sys.exit(f"gen_bench_checkpoint: bf16 rounding self-test failed: {got} vs {want}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)
    self_test_rounding()
    t0 = time.time()
    path, tensors, expect_size = write_checkpoint(args.out, args.seed)
    t1 = time.time()
    problems, n_tensors, n_params = verify(path, tensors, args.seed)
    size = os.path.getsize(path)
    if size != expect_size:
        problems.append(f"file size {size}, expected {expect_size}")
    print(f"wrote {args.out}/config.json and {path}: {n_tensors} tensors, {n_params} parameters, {size} bytes "
          f"(bf16), seed {args.seed}, {t1 - t0:.1f} s; verified in {time.time() - t1:.1f} s")
    if problems:
        for p in problems:
            print("FAIL:", p, file=sys.stderr)
        return 1
    print("header read back: OK (aligned, contiguous, shapes/dtypes as configured, sampled values as expected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
