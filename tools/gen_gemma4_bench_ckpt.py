#!/usr/bin/env python3
"""Write a random-weight bf16 Gemma 4 checkpoint with the real E2B or E4B text-decoder shapes (for GPU benchmarks).

    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b|e4b --out DIR [--seed S] [--dry-run]

Writes DIR/config.json (model_type gemma4_text, official style: top-level keys, head_dim + global_head_dim,
explicit layer_types, no per_layer_config), DIR/model-0000N-of-0000M.safetensors and
DIR/model.safetensors.index.json. A shard holds at most --shard-bytes of tensor data (default 4 GB) unless one
tensor alone is larger (E2B's 4.7 GB per-layer-embedding table gets a shard of its own). The index is written
last, so a folder without it is an interrupted run.

Tensor names and shapes are those of HF Gemma4ForCausalLM (../shared/specs/gemma4.md §2, prefix "model.") and
of berth's plugins/model-gemma4/gemma4_weights.c: KV-shared layers carry no k_proj/v_proj/k_norm, the tied LM
head has no lm_head.weight, layer_scalar has no ".weight" suffix.

Values: normal(0, 0.02) in bf16 for matrices, 1 + normal(0, 0.02) for RMSNorm weights, exactly 1 for
layer_scalar. Each tensor has its own generator seeded from (seed, crc32(name)). The weights are noise (speed
benchmarks only); the sandwich norms keep activations finite.

Generation: torch on CUDA when available (then torch on the CPU, then numpy on the CPU). Writing:
safetensors.torch.save_file when torch and safetensors are importable, else a built-in streaming writer (same
format: 8-byte little-endian header length, JSON header padded with spaces to 8-byte alignment, tensors back to
back). Every shard's header is read back and checked against the plan.

Output: progress on stderr; on stdout one JSON object: shapes, byte counts and "bytes_read_per_decode_step" =
every weight byte except the per-layer-embedding table (a lookup: only L*Dp values per token are gathered, which
are added) with the tied embedding counted once (as the LM head). --dry-run prints the same JSON and the shard
plan without generating anything (needs neither torch nor numpy).

--shape mini is a small model with E2B's structure (PLE, KV sharing, double-wide MLP, 4 sliding + 1 full) for
testing this script and the loaders on a CPU.
"""

import argparse
import json
import os
import struct
import sys
import time
import zlib

S, F = "sliding_attention", "full_attention"

# Architecture values: ../shared/specs/gemma4.md §7 (E2B, E4B); "mini" only for tests.
SHAPES = {
    "e2b": dict(L=35, D=1536, H=8, K=1, hd=256, ghd=512, I=6144, period=5, W=512, shared=20, Dp=256,
                V=262144, double_wide=True),
    "e4b": dict(L=42, D=2560, H=8, K=2, hd=256, ghd=512, I=10240, period=6, W=512, shared=18, Dp=256,
                V=262144, double_wide=False),
    "mini": dict(L=10, D=256, H=4, K=1, hd=64, ghd=128, I=512, period=5, W=32, shared=4, Dp=16,
                 V=4096, double_wide=True),
}
WEIGHT_STD = 0.02
NORM_STD = 0.02
BF16 = 2  # bytes per element


def make_config(s):
    L = s["L"]
    layer_types = [F if (i + 1) % s["period"] == 0 else S for i in range(L)]
    if layer_types[-1] != F:
        raise ValueError("layer pattern must end with a full-attention layer")
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "dtype": "bfloat16",
        "vocab_size": s["V"],
        "vocab_size_per_layer_input": s["V"],
        "hidden_size": s["D"],
        "intermediate_size": s["I"],
        "num_hidden_layers": L,
        "layer_types": layer_types,
        "num_attention_heads": s["H"],
        "num_key_value_heads": s["K"],
        "num_global_key_value_heads": None,
        "head_dim": s["hd"],
        "global_head_dim": s["ghd"],
        "sliding_window": s["W"],
        "hidden_size_per_layer_input": s["Dp"],
        "num_kv_shared_layers": s["shared"],
        "use_double_wide_mlp": s["double_wide"],
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "num_experts": None,
        "top_k_experts": None,
        "moe_intermediate_size": None,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_bidirectional_attention": None,
        "rms_norm_eps": 1e-06,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }


def tensor_list(c):
    """(name, shape, kind) for every tensor, kind in {"weight", "norm", "scalar"}; gemma4.md §2 naming."""
    D, H, V, I = c["hidden_size"], c["num_attention_heads"], c["vocab_size"], c["intermediate_size"]
    L, Dp, K = c["num_hidden_layers"], c["hidden_size_per_layer_input"], c["num_key_value_heads"]
    first_shared = L - c["num_kv_shared_layers"]
    out = [("model.embed_tokens.weight", [V, D], "weight"), ("model.norm.weight", [D], "norm")]
    if Dp:
        out += [
            ("model.embed_tokens_per_layer.weight", [c["vocab_size_per_layer_input"], L * Dp], "weight"),
            ("model.per_layer_model_projection.weight", [L * Dp, D], "weight"),
            ("model.per_layer_projection_norm.weight", [Dp], "norm"),
        ]
    for i, t in enumerate(c["layer_types"]):
        hd = c["global_head_dim"] if t == F else c["head_dim"]
        width = 2 * I if (c["use_double_wide_mlp"] and first_shared > 0 and i >= first_shared) else I
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [D], "norm"),
            (p + "self_attn.q_proj.weight", [H * hd, D], "weight"),
            (p + "self_attn.q_norm.weight", [hd], "norm"),
        ]
        if i < first_shared:
            out += [
                (p + "self_attn.k_proj.weight", [K * hd, D], "weight"),
                (p + "self_attn.v_proj.weight", [K * hd, D], "weight"),
                (p + "self_attn.k_norm.weight", [hd], "norm"),
            ]
        out += [
            (p + "self_attn.o_proj.weight", [D, H * hd], "weight"),
            (p + "post_attention_layernorm.weight", [D], "norm"),
            (p + "pre_feedforward_layernorm.weight", [D], "norm"),
            (p + "mlp.gate_proj.weight", [width, D], "weight"),
            (p + "mlp.up_proj.weight", [width, D], "weight"),
            (p + "mlp.down_proj.weight", [D, width], "weight"),
            (p + "post_feedforward_layernorm.weight", [D], "norm"),
        ]
        if Dp:
            out += [
                (p + "per_layer_input_gate.weight", [Dp, D], "weight"),
                (p + "per_layer_projection.weight", [D, Dp], "weight"),
                (p + "post_per_layer_input_norm.weight", [D], "norm"),
            ]
        out.append((p + "layer_scalar", [1], "scalar"))
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def plan_shards(tensors, shard_bytes):
    """Greedy in tensor order; a tensor larger than shard_bytes gets a shard of its own (the others go on filling
    the current one)."""
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        b = numel(t[1]) * BF16
        if b > shard_bytes:
            shards.append([t])
            continue
        if cur and cur_bytes + b > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += b
    if cur:
        shards.append(cur)
    n = len(shards)
    return [(f"model-{k + 1:05d}-of-{n:05d}.safetensors", s) for k, s in enumerate(shards)]


def byte_counts(c, tensors):
    """The JSON figures: totals, the PLE table, bytes read per decode step, KV bytes per token."""
    total = sum(numel(s) for _, s, _ in tensors) * BF16
    L, Dp = c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    ple = c["vocab_size_per_layer_input"] * L * Dp * BF16 if Dp else 0
    ple_gather = L * Dp * BF16
    first_shared = L - c["num_kv_shared_layers"]
    kv_sliding = kv_full = 0
    for i, t in enumerate(c["layer_types"][:first_shared]):
        hd = c["global_head_dim"] if t == F else c["head_dim"]
        per = 2 * c["num_key_value_heads"] * hd * BF16  # K and V
        if t == F:
            kv_full += per
        else:
            kv_sliding += per
    ctx = 640  # 512-token prompt + 128 generated: the bench's longest context
    linear = sum(numel(s) for n, s, k in tensors if k == "weight" and len(s) == 2
                 and n not in ("model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"))
    return {
        "arch": {"layers": L, "hidden": c["hidden_size"], "heads": c["num_attention_heads"],
                 "kv_heads": c["num_key_value_heads"], "head_dim_sliding": c["head_dim"],
                 "head_dim_full": c["global_head_dim"], "sliding_window": c["sliding_window"],
                 "full_layers": c["layer_types"].count(F), "vocab": c["vocab_size"], "ple_dim": Dp,
                 "kv_shared_layers": c["num_kv_shared_layers"]},
        "linear_params_per_token": linear,
        "n_tensors": len(tensors),
        "n_params": total // BF16,
        "total_bytes": total,
        "ple_table_bytes": ple,
        "embed_bytes": c["vocab_size"] * c["hidden_size"] * BF16,
        "bytes_read_per_decode_step": total - ple + ple_gather,
        "bytes_read_note": "all weights except the PLE table, plus the L*Dp gathered PLE values of one token; "
                           "tied embedding counted once (LM head); KV-cache reads not included",
        "kv_bytes_per_token_sliding_layers": kv_sliding,
        "kv_bytes_per_token_full_layers": kv_full,
        "kv_read_bytes_per_step_at_ctx_640": min(ctx, c["sliding_window"]) * kv_sliding + ctx * kv_full,
    }


def log(msg):
    print("gen_gemma4_bench_ckpt: " + msg, file=sys.stderr, flush=True)


def seed_of(seed, name):
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode("utf-8"))) & 0x7FFFFFFFFFFF


# ---------------------------------------------------------------------------------------------------------------
# Generators: each yields (name, bytes-like of bf16 little-endian data) or keeps torch tensors for save_file.

class TorchGen:
    def __init__(self, torch):
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = f"torch {torch.__version__} on {self.device}"

    def tensor(self, name, shape, kind, seed):
        torch = self.torch
        if kind == "scalar":
            return torch.ones(shape, dtype=torch.bfloat16)
        g = torch.Generator(device=self.device)
        g.manual_seed(seed_of(seed, name))
        t = torch.empty(shape, dtype=torch.bfloat16, device=self.device)
        if kind == "norm":
            t.normal_(1.0, NORM_STD, generator=g)
        else:
            t.normal_(0.0, WEIGHT_STD, generator=g)
        return t.cpu()

    def raw(self, t):
        """bf16 tensor -> little-endian bytes (numpy has no bf16: go through int16)."""
        return t.contiguous().view(self.torch.int16).numpy().tobytes()


class NumpyGen:
    CHUNK = 1 << 22

    def __init__(self, np):
        self.np = np
        self.name = f"numpy {np.__version__} on the CPU"

    def f32_to_bf16(self, x):
        np = self.np
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        u = u + (((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))  # round to nearest even
        return (u >> np.uint32(16)).astype("<u2")

    def chunks(self, name, shape, kind, seed):
        np = self.np
        n = numel(shape)
        if kind == "scalar":
            yield self.f32_to_bf16(np.ones(n, dtype=np.float32)).tobytes()
            return
        rng = np.random.default_rng(seed_of(seed, name))
        done = 0
        while done < n:
            m = min(self.CHUNK, n - done)
            x = rng.standard_normal(m, dtype=np.float32) * np.float32(NORM_STD if kind == "norm" else WEIGHT_STD)
            if kind == "norm":
                x += np.float32(1.0)
            yield self.f32_to_bf16(x).tobytes()
            done += m


def header_bytes(entries):
    """entries: [(name, shape)] in data order -> padded JSON header bytes."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in entries:
        size = numel(shape) * BF16
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return raw + b" " * ((-(8 + len(raw))) % 8)


def write_shard_builtin(path, items, gen, seed):
    """Stream one shard: header, then each tensor as it is generated (bounded memory)."""
    raw = header_bytes([(n, s) for n, s, _ in items])
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, kind in items:
            if isinstance(gen, TorchGen):
                f.write(gen.raw(gen.tensor(name, shape, kind, seed)))
            else:
                for c in gen.chunks(name, shape, kind, seed):
                    f.write(c)


def write_shard_safetensors(path, items, gen, seed, save_file):
    tensors = {name: gen.tensor(name, shape, kind, seed) for name, shape, kind in items}
    save_file(tensors, path, metadata={"format": "pt"})


def check_shard(path, items):
    """Header read back: names, dtypes, shapes, contiguous offsets, file size; first values finite."""
    problems = []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
        start = 8 + n
        hdr.pop("__metadata__", None)
        want = {name: shape for name, shape, _ in items}
        if set(hdr) != set(want):
            problems.append(f"{path}: tensor names differ from the plan: {sorted(set(hdr) ^ set(want))[:4]}")
            return problems
        pos = 0
        for b, e, k in sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in hdr.items()):
            if b != pos:
                problems.append(f"{path}: {k} starts at {b}, expected {pos}")
            pos = e
            if hdr[k]["dtype"] != "BF16" or hdr[k]["shape"] != want[k] or e - b != numel(want[k]) * BF16:
                problems.append(f"{path}: {k} is {hdr[k]['dtype']} {hdr[k]['shape']}, expected BF16 {want[k]}")
        if start + pos != size:
            problems.append(f"{path}: file is {size} bytes, header covers {start + pos}")
        for name, _, kind in items[:3]:
            f.seek(start + hdr[name]["data_offsets"][0])
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                    for h in struct.unpack("<8H", f.read(16)[:16].ljust(16, b"\0"))]
            k = min(8, numel(want[name]))
            vals = vals[:k]
            if any(v != v or abs(v) > 2.0 for v in vals) or (kind == "weight" and all(v == 0 for v in vals)):
                problems.append(f"{path}: {name} starts with implausible values {vals}")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES), help="e2b, e4b (or mini, for tests)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the byte counts, write nothing")
    ap.add_argument("--shard-bytes", type=int, default=4_000_000_000,
                    help="most tensor bytes per shard (default 4000000000)")
    ap.add_argument("--backend", choices=["auto", "torch", "numpy"], default="auto",
                    help="random generator: auto = torch (CUDA if present), else numpy")
    ap.add_argument("--writer", choices=["auto", "safetensors", "builtin"], default="auto",
                    help="auto = safetensors.torch.save_file with torch when importable, else built-in")
    args = ap.parse_args(argv)
    if args.shard_bytes < 1:
        ap.error("--shard-bytes must be positive")

    cfg = make_config(SHAPES[args.shape])
    tensors = tensor_list(cfg)
    shards = plan_shards(tensors, args.shard_bytes)
    counts = byte_counts(cfg, tensors)
    summary = {"shape": args.shape, "out": os.path.abspath(args.out), "seed": args.seed, **counts,
               "shards": [{"file": fn, "n_tensors": len(items), "bytes": sum(numel(s) for _, s, _ in items) * BF16}
                          for fn, items in shards]}

    if args.dry_run:
        for s in summary["shards"]:
            log(f"plan: {s['file']}: {s['n_tensors']} tensors, {s['bytes']} bytes")
        log(f"plan: {counts['n_tensors']} tensors, {counts['n_params']} parameters, {counts['total_bytes']} bytes")
        summary["dry_run"] = True
        print(json.dumps(summary))
        return 0

    gen = None
    save_file = None
    if args.backend in ("auto", "torch"):
        try:
            import torch
            gen = TorchGen(torch)
        except ImportError:
            if args.backend == "torch":
                sys.exit("gen_gemma4_bench_ckpt: --backend torch but torch is not importable")
    if gen is None:
        try:
            import numpy
        except ImportError:
            sys.exit("gen_gemma4_bench_ckpt: needs torch or numpy")
        gen = NumpyGen(numpy)
    if isinstance(gen, TorchGen) and args.writer in ("auto", "safetensors"):
        try:
            from safetensors.torch import save_file
        except ImportError:
            if args.writer == "safetensors":
                sys.exit("gen_gemma4_bench_ckpt: --writer safetensors but safetensors is not importable")
    elif args.writer == "safetensors":
        sys.exit("gen_gemma4_bench_ckpt: --writer safetensors needs the torch backend")
    writer = "safetensors.torch.save_file" if save_file else "built-in"
    log(f"{args.shape}: {counts['n_tensors']} tensors, {counts['total_bytes'] / 1e9:.2f} GB in {len(shards)} "
        f"shards -> {args.out} ({gen.name}, {writer} writer)")

    os.makedirs(args.out, exist_ok=True)
    index_path = os.path.join(args.out, "model.safetensors.index.json")
    if os.path.exists(index_path):
        os.remove(index_path)  # the index marks a complete folder: drop it until the shards are rewritten
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    t0 = time.time()
    problems = []
    weight_map = {}
    for fn, items in shards:
        path = os.path.join(args.out, fn)
        t1 = time.time()
        if save_file:
            write_shard_safetensors(path + ".tmp", items, gen, args.seed, save_file)
        else:
            write_shard_builtin(path + ".tmp", items, gen, args.seed)
        os.replace(path + ".tmp", path)
        problems += check_shard(path, items)
        for name, _, _ in items:
            weight_map[name] = fn
        log(f"{fn}: {len(items)} tensors, {os.path.getsize(path) / 1e9:.2f} GB, {time.time() - t1:.1f} s")
    if problems:
        for p in problems:
            print("gen_gemma4_bench_ckpt: FAIL: " + p, file=sys.stderr)
        return 1
    with open(index_path + ".tmp", "w") as f:
        json.dump({"metadata": {"total_size": counts["total_bytes"]}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
        f.write("\n")
    os.replace(index_path + ".tmp", index_path)
    summary["seconds"] = round(time.time() - t0, 2)
    summary["generator"] = gen.name
    summary["writer"] = writer
    summary["file_bytes"] = sum(os.path.getsize(os.path.join(args.out, fn)) for fn, _ in shards)
    log(f"done in {summary['seconds']} s; headers read back OK")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
