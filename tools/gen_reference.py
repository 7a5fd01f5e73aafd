#!/usr/bin/env python3
"""Generate the Gemma 4 reference fixtures (tests/fixtures/gemma4/<variant>/ and tests/fixtures/tiny-gemma4/).

Needs Python 3.10+, torch and Hugging Face transformers 5.x (written against 5.17) plus `tokenizers` and
`numpy` (both come with transformers). Runs on CPU in fp32; no GPU is used (CUDA is hidden from torch).

    python3 tools/gen_reference.py --out DIR [--only VARIANT ...] [--list]

On the device machine (only two files come back from $OUT, so the tree goes to /tmp and is archived):
    export PYTHONUNBUFFERED=1; python3 tools/gen_reference.py --out /tmp/fx 2>&1 | tee $OUT/gen_reference.log;
    tar -C /tmp/fx -czf $OUT/fixtures.tgz .
then here: tar -C tests/fixtures -xzf fixtures.tgz

For every variant it builds a tiny random Gemma 4 model, randomises every parameter (normal, std =
initializer_range; every RMSNorm weight and every `layer_scalar` buffer uniform in [0.5, 1.5); rotary
`inv_freq` and `embed_scale` buffers are left alone), saves it with `save_pretrained`, reloads it from disk,
checks that the reload is bit-identical to what was saved, and records fp32 references computed from the
RELOADED model:
  promptK.f32       raw little-endian float32 logits [len(ids), V] of one forward over the prompt
  promptK_full.f32  logits [len(ids)+24, V] of one forward over prompt + the 24 greedy tokens
  reference.json    ids, greedy tokens (HF generate, EOS disabled; equal to the argmax chain of the full
                    forward), versions, per-layer shapes, incremental_max_abs (HF's cached decode vs the full
                    forward), reload_max_abs, min_top2_gap.
Output: DIR/gemma4/<variant>/..., DIR/tiny-gemma4/..., DIR/generation_summary.json.
Exit status: 0 all variants passed every check, 1 some variant failed (the others are still written), 2 the
environment is unusable (missing module, wrong transformers major version, bad arguments).
The format is described in tests/fixtures/README.md.
"""

import argparse
import copy
import json
import os
import random
import shutil
import struct
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_tiny_tokenizer as mtt  # noqa: E402  (same folder, plain Python)

NEW_TOKENS = 24
BOS_ID, EOS_ID, PAD_ID = 2, 1, 0
S, F = "sliding_attention", "full_attention"

# Tolerances (fp32 on CPU).
RELOAD_TOL = 1e-5        # pre-save vs reloaded logits (same weights; a silent random init moves them by ~1)
PREFIX_TOL = 1e-4        # prompt-only forward vs the first rows of the prompt+greedy forward (causality)
NEAR_TIE = 1e-4          # generate() may pick another token than the full forward only if the two are this close
MIN_GAP = 1e-5           # every greedy step must beat the runner-up by this much, else the prompt is redrawn
INCREMENTAL_WARN = 1e-4  # HF's own cached decode vs full forward; above this we warn (spec measured <= 2e-5)
MAX_PROMPT_TRIES = 16

# Spec §6 tiny config (every code path).
TINY = dict(
    vocab_size=256, vocab_size_per_layer_input=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
    layer_types=[S, S, F, S, S, F], num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
    sliding_window=8, num_kv_shared_layers=3, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
    final_logit_softcapping=1.0, initializer_range=0.1, max_position_embeddings=256,
)
# Official-style: period-5 pattern like E2B (full at 4 and 9), 1 KV head, KV sharing (F = 6: shared sliding
# layers read layer 5, the shared full layer reads layer 4), PLE, softcap 30. Saved config.json is rewritten to
# the official form (global_head_dim, no per_layer_config).
OFFICIAL = dict(
    vocab_size=256, vocab_size_per_layer_input=256, hidden_size=48, intermediate_size=96, num_hidden_layers=10,
    layer_types=[S, S, S, S, F] * 2, num_attention_heads=4, num_key_value_heads=1, head_dim=16, global_head_dim=32,
    sliding_window=12, num_kv_shared_layers=4, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
    final_logit_softcapping=30.0, initializer_range=0.1, max_position_embeddings=256,
)
# bf16-mode agreement (tests/test_gemma4_bf16_agreement.c): the official E2B-like layout, wide enough that the
# logits spread like a real model's (std ~1.5 rather than the tiny variants' ~0.1 under softcap 1.0). On the tiny
# variants transformers' own bf16 inference reaches only 0.73-0.95 logit cosine against fp32 (tools/
# hf_bf16_agreement.py, 2026-11-29): a bf16 criterion measured there would measure the fixture, not the engine.
BF16_WIDE = dict(OFFICIAL, hidden_size=256, intermediate_size=512, num_hidden_layers=6, layer_types=[S, S, F] * 2,
                 head_dim=64, global_head_dim=128, sliding_window=16, num_kv_shared_layers=2,
                 hidden_size_per_layer_input=16)
K_EQ_V = dict(TINY, attention_k_eq_v=True, num_global_key_value_heads=1)
PLAIN = dict(TINY, hidden_size_per_layer_input=0, num_kv_shared_layers=0, final_logit_softcapping=None)
TINY_GEMMA4 = dict(TINY, vocab_size=mtt.VOCAB_SIZE, vocab_size_per_layer_input=mtt.VOCAB_SIZE)
TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=16, pooling_kernel_size=2)

SEED_TINY, SEED_OFFICIAL, SEED_K_EQ_V, SEED_PLAIN, SEED_VISION, SEED_TINY_GEMMA4 = 1001, 1002, 1003, 1004, 1005, 1007
SEED_BF16_WIDE = 1008

VARIANTS = {
    "tiny": dict(kw=TINY, seed=SEED_TINY, dtype="float32",
                 desc="spec §6 tiny config exactly: 6 layers S,S,F,S,S,F; head_dim 16 / 32 on full layers "
                      "(per_layer_config); GQA 4/2; window 8; 3 KV-shared layers; double-wide MLP; PLE 8; "
                      "softcap 1.0; fp32"),
    "official_style": dict(kw=OFFICIAL, seed=SEED_OFFICIAL, dtype="float32", official=True,
                           desc="official-style config.json (global_head_dim 32, own layer_types, NO "
                                "per_layer_config): 10 layers, period 5 (full at 4, 9), D 48, 1 KV head, window "
                                "12, 4 KV-shared layers, double-wide MLP, PLE 8, softcap 30; fp32"),
    "k_eq_v": dict(kw=K_EQ_V, seed=SEED_K_EQ_V, dtype="float32",
                   desc="tiny + attention_k_eq_v, num_global_key_value_heads 1 (full layers: 1 KV head, no "
                        "v_proj; V = raw k_proj output); fp32"),
    "plain": dict(kw=PLAIN, seed=SEED_PLAIN, dtype="float32",
                  desc="tiny with no PLE (hidden_size_per_layer_input 0), no KV sharing, no softcap; fp32"),
    "bf16": dict(kw=TINY, seed=SEED_TINY, dtype="bfloat16",
                 desc="the tiny weights rounded to bf16 and saved as BF16; reference = HF fp32 on the "
                      "upcast weights (from_pretrained(dtype=float32), never model.to(bfloat16))"),
    "bf16_wide": dict(kw=BF16_WIDE, seed=SEED_BF16_WIDE, dtype="bfloat16", official=True, bf16_agreement=True,
                      scaled_qk_norm=True,
                      desc="official-style layout, D 256, head_dim 64 / 128 on full layers, 1 KV head, window 16, "
                           "2 KV-shared layers, PLE 16, softcap 30, q/k norm weights scaled by head_dim^-1/4 (scores spread "
                           "like 1/sqrt(d)-scaled ones), weights rounded to bf16 and saved as BF16; "
                           "reference = HF fp32 on the upcast weights. Logits spread like a real model's: the "
                           "fixture the CUDA bf16 mode's agreement criterion is measured on"),
    "f16": dict(kw=TINY, seed=SEED_TINY, dtype="float16",
                desc="the tiny weights rounded to fp16 and saved as F16; reference = HF fp32 on the upcast "
                     "weights"),
    "multimodal": dict(kw=TINY, seed=SEED_TINY, dtype="float32", multimodal=True,
                       desc="the tiny text weights in the gemma4 wrapper layout (model_type gemma4, text_config, "
                            "tensors under model.language_model.*) plus a tiny vision tower (model.vision_tower.*, "
                            "model.embed_vision.*) the loader must skip; logits equal the tiny variant's; fp32"),
    "sharded": dict(kw=TINY, seed=SEED_TINY, dtype="float32", shard=True,
                    desc="the tiny weights saved in >= 3 shards + model.safetensors.index.json; fp32"),
}
TINY_GEMMA4_NAME = "tiny-gemma4"
ALL_NAMES = list(VARIANTS) + [TINY_GEMMA4_NAME]

# Text prompts for the embedded default model (first ones that pass the checks are kept).
TEXT_PROMPTS = [
    "The harbour was quiet in the early morning.",
    "The harbour master wrote the times in his book.",
    "Hello, world!",
    "Good tests are small, fast and exact.",
    "Once upon a time there was a small model with random weights, and the text it wrote was noise.",
    "The lights of the town came on one by one.",
    "Why is the sky blue?",
    "In the evening the wind fell and the sky cleared, and the boats came home.",
]
README_PROMPT_IDS = [2, 17, 99]  # the README's main-job command uses these ids

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


class Failure(Exception):
    """A check failed: the message says which and with what values."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


# ----------------------------------------------------------------------------------------------------------------
# Environment

def import_stack():
    # CPU only, deterministic: hide GPUs before torch is imported.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Everything is local: never wait on the hub (the generating machine may have no network).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import numpy
        import torch
        import transformers
    except ImportError as e:
        print(f"gen_reference: cannot import {e.name}: needs torch, transformers 5.x and numpy "
              f"({e})", file=sys.stderr)
        sys.exit(2)
    del numpy  # only checked for presence (used to write the .f32 files)
    major = int(transformers.__version__.split(".")[0])
    if major != 5:
        print(f"gen_reference: transformers {transformers.__version__} found; this script needs 5.x "
              f"(written against 5.17)", file=sys.stderr)
        sys.exit(2)
    if not transformers.__version__.startswith("5.17"):
        log(f"WARNING: transformers {transformers.__version__}, the spec was validated on 5.17.0")
    names = ["Gemma4TextConfig", "Gemma4ForCausalLM", "Gemma4Config", "Gemma4ForConditionalGeneration",
             "Gemma4VisionConfig", "AutoModelForCausalLM"]
    missing = [n for n in names if not hasattr(transformers, n)]
    if missing:
        print(f"gen_reference: transformers {transformers.__version__} lacks {', '.join(missing)}",
              file=sys.stderr)
        sys.exit(2)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        transformers.logging.set_verbosity_warning()
    except Exception:
        pass
    return torch, transformers


def versions(torch, transformers):
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    for mod in ("tokenizers", "safetensors", "numpy"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = None
    return v


# ----------------------------------------------------------------------------------------------------------------
# Spec-derived expectations (gemma4.md §1.3, §2)

def expected_layers(kw):
    L = kw["num_hidden_layers"]
    types = list(kw["layer_types"])
    check(len(types) == L, f"layer_types has {len(types)} entries, num_hidden_layers is {L}")
    types[-1] = F  # HF forces the last layer to full
    n_shared = kw.get("num_kv_shared_layers") or 0
    first_shared = L - n_shared
    hd_s, hd_f = kw["head_dim"], kw.get("global_head_dim", 512)
    kv_s = kw["num_key_value_heads"]
    k_eq_v = bool(kw.get("attention_k_eq_v"))
    kv_f = kw["num_global_key_value_heads"] if k_eq_v and kw.get("num_global_key_value_heads") is not None else kv_s
    inter = kw["intermediate_size"]
    dw = bool(kw.get("use_double_wide_mlp"))
    out = []
    for i, t in enumerate(types):
        full = t == F
        shared = i >= first_shared
        out.append(dict(type=t, head_dim=hd_f if full else hd_s, kv_heads=kv_f if full else kv_s, kv_shared=shared,
                        has_k=not shared, has_v=(not shared) and not (k_eq_v and full),
                        mlp_width=2 * inter if (dw and shared and first_shared > 0) else inter))
    return out


def expected_tensors(kw, prefix):
    V, D, L, H = kw["vocab_size"], kw["hidden_size"], kw["num_hidden_layers"], kw["num_attention_heads"]
    Dp = kw.get("hidden_size_per_layer_input") or 0
    Vp = kw.get("vocab_size_per_layer_input", V)
    t = {prefix + "embed_tokens.weight": [V, D], prefix + "norm.weight": [D]}
    if Dp:
        t[prefix + "embed_tokens_per_layer.weight"] = [Vp, L * Dp]
        t[prefix + "per_layer_model_projection.weight"] = [L * Dp, D]
        t[prefix + "per_layer_projection_norm.weight"] = [Dp]
    for i, e in enumerate(expected_layers(kw)):
        p = f"{prefix}layers.{i}."
        hd, K, W = e["head_dim"], e["kv_heads"], e["mlp_width"]
        t[p + "input_layernorm.weight"] = [D]
        t[p + "self_attn.q_proj.weight"] = [H * hd, D]
        t[p + "self_attn.q_norm.weight"] = [hd]
        if e["has_k"]:
            t[p + "self_attn.k_proj.weight"] = [K * hd, D]
            t[p + "self_attn.k_norm.weight"] = [hd]
        if e["has_v"]:
            t[p + "self_attn.v_proj.weight"] = [K * hd, D]
        t[p + "self_attn.o_proj.weight"] = [D, H * hd]
        for n in ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            t[p + n + ".weight"] = [D]
        t[p + "mlp.gate_proj.weight"] = [W, D]
        t[p + "mlp.up_proj.weight"] = [W, D]
        t[p + "mlp.down_proj.weight"] = [D, W]
        if Dp:
            t[p + "per_layer_input_gate.weight"] = [Dp, D]
            t[p + "per_layer_projection.weight"] = [D, Dp]
            t[p + "post_per_layer_input_norm.weight"] = [D]
        t[p + "layer_scalar"] = [1]
    return t


# ----------------------------------------------------------------------------------------------------------------
# safetensors on disk (plain Python: what the C loader will see)

def read_st_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        check(len(raw) == 8, f"{path}: shorter than 8 bytes")
        n = struct.unpack("<Q", raw)[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
    hdr.pop("__metadata__", None)
    return hdr


def checkpoint_inventory(d):
    """name -> (dtype, shape, file) over model.safetensors or the shards named by the index."""
    index = os.path.join(d, "model.safetensors.index.json")
    single = os.path.join(d, "model.safetensors")
    inv = {}
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
        for fn in files:
            for name, e in read_st_header(os.path.join(d, fn)).items():
                check(name not in inv, f"{d}: tensor {name} appears in two shards")
                check(wmap.get(name) == fn, f"{d}: index maps {name} to {wmap.get(name)}, found in {fn}")
                inv[name] = (e["dtype"], e["shape"], fn)
        check(set(inv) == set(wmap), f"{d}: index names {len(wmap)} tensors, shards hold {len(inv)}")
    else:
        check(os.path.exists(single), f"{d}: neither model.safetensors nor model.safetensors.index.json written")
        for name, e in read_st_header(single).items():
            inv[name] = (e["dtype"], e["shape"], "model.safetensors")
    others = [fn for fn in os.listdir(d) if fn.endswith((".bin", ".pt", ".pth"))]
    check(not others, f"{d}: unexpected non-safetensors weight files {others}")
    return inv


def compare_inventory(inv, expected, warnings, what):
    """Spec §2 vs what save_pretrained wrote. Differences are warnings (the file is still HF's truth)."""
    missing = sorted(set(expected) - set(inv))
    extra = sorted(set(inv) - set(expected))
    shape_bad = sorted(n for n in set(expected) & set(inv) if list(inv[n][1]) != list(expected[n]))
    for label, lst in (("missing from checkpoint", missing), ("not in spec", extra), ("shape differs", shape_bad)):
        if lst:
            detail = ", ".join(f"{n} {list(inv[n][1]) if n in inv else ''}->{expected.get(n)}" for n in lst[:6])
            warnings.append(f"SPEC MISMATCH ({what}): {len(lst)} tensor(s) {label}: {detail}")
            log("  WARNING " + warnings[-1])
    return not (missing or extra or shape_bad)


def dir_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    return total


# ----------------------------------------------------------------------------------------------------------------
# Models

class Ctx:
    """torch / transformers handles plus the run-wide settings."""

    def __init__(self, torch, transformers):
        self.torch = torch
        self.tf = transformers
        self.dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        self.st_names = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def set_eager(ctx, model):
    try:
        model.set_attn_implementation("eager")
    except Exception:
        model.config._attn_implementation = "eager"
        text_cfg_of(model)._attn_implementation = "eager"
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        log(f"  note: attention implementation of the in-memory model is {impl!r} (eager requested)")


def text_cfg_of(model):
    return model.config.get_text_config()


def text_model(model):
    """Gemma4TextModel inside Gemma4ForCausalLM (model.model) or the wrapper (model.model.language_model)."""
    m = model.model
    return m.language_model if hasattr(m, "language_model") else m


def text_layers(model):
    return text_model(model).layers


def randomise(ctx, model, seed, std, scaled_qk_norm=False):
    """All parameters random; RMSNorm weights and layer_scalar uniform in [0.5, 1.5); other buffers untouched.
    scaled_qk_norm: q_norm and k_norm weights also times head_dim^-1/4, so that q.k has the spread of a
    1/sqrt(head_dim)-scaled product (Gemma 4 folds that scale into the trained norm weights; with weights near 1 the
    scores of a random model reach +-20 and its attention is an argmax that any rounding flips)."""
    torch = ctx.torch
    g = torch.Generator().manual_seed(seed)
    n_norm = n_normal = n_scalar = 0
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is listed once (as embed_tokens)
            if name.endswith("norm.weight") or name.endswith("router.scale") or name.endswith("per_expert_scale"):
                w = torch.rand(p.shape, generator=g, dtype=torch.float32) + 0.5
                if scaled_qk_norm and (name.endswith("q_norm.weight") or name.endswith("k_norm.weight")):
                    w = w * float(p.shape[-1]) ** -0.25
                p.copy_(w)
                n_norm += 1
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)
                n_normal += 1
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=g, dtype=torch.float32) + 0.5)
                n_scalar += 1
    param_names = {(mn + "." if mn else "") + pn for mn, m in model.named_modules()  # incl. tied aliases
                   for pn, p in m._parameters.items() if p is not None}
    persistent = sorted(k for k in model.state_dict() if k not in param_names)
    odd = [k for k in persistent if not k.endswith("layer_scalar")]
    log(f"  randomised {n_normal} parameters normal(0, {std}), {n_norm} norm weights and {n_scalar} layer_scalar "
        f"buffers uniform[0.5, 1.5)" + (f"; other persistent buffers left as initialised: {odd}" if odd else ""))
    check(n_scalar >= text_cfg_of(model).num_hidden_layers,
          f"found {n_scalar} layer_scalar buffers, expected {text_cfg_of(model).num_hidden_layers}")


def check_tied(model):
    lm = model.lm_head.weight
    emb = text_model(model).embed_tokens.weight
    check(lm.data_ptr() == emb.data_ptr(),
          "lm_head.weight is not tied to embed_tokens.weight (tie_word_embeddings should be true)")


def build_text_model(ctx, kw, seed, scaled_qk_norm=False):
    tf, torch = ctx.tf, ctx.torch
    torch.manual_seed(seed)
    cfg = tf.Gemma4TextConfig(**copy.deepcopy(kw))
    model = tf.Gemma4ForCausalLM(cfg).to(torch.float32).eval()
    set_eager(ctx, model)
    randomise(ctx, model, seed, kw["initializer_range"], scaled_qk_norm)
    check_tied(model)
    return model


def actual_layers(model, kw):
    H = kw["num_attention_heads"]
    types = list(text_cfg_of(model).layer_types)
    out = []
    for i, layer in enumerate(text_layers(model)):
        a = layer.self_attn
        q_rows = a.q_proj.weight.shape[0]
        check(q_rows % H == 0, f"layer {i}: q_proj has {q_rows} rows, not a multiple of {H} heads")
        hd = q_rows // H
        k = getattr(a, "k_proj", None)
        v = getattr(a, "v_proj", None)
        out.append(dict(type=types[i], head_dim=hd, kv_heads=(k.weight.shape[0] // hd) if k is not None else None,
                        kv_shared=k is None, has_k=k is not None, has_v=v is not None,
                        mlp_width=layer.mlp.gate_proj.weight.shape[0]))
    return out


def check_layers(model, kw, what):
    exp, act = expected_layers(kw), actual_layers(model, kw)
    check(len(exp) == len(act), f"{what}: model has {len(act)} layers, expected {len(exp)}")
    for i, (e, a) in enumerate(zip(exp, act)):
        for key in ("type", "head_dim", "has_k", "has_v", "mlp_width"):
            check(e[key] == a[key], f"{what}: layer {i} {key} is {a[key]!r}, expected {e[key]!r} (per spec §1.3)")
        if e["has_k"]:
            check(e["kv_heads"] == a["kv_heads"],
                  f"{what}: layer {i} kv_heads is {a['kv_heads']}, expected {e['kv_heads']}")
    return [dict(type=a["type"], head_dim=a["head_dim"], kv_heads=e["kv_heads"], kv_shared=e["kv_shared"],
                 has_v_proj=a["has_v"], mlp_width=a["mlp_width"]) for e, a in zip(exp, act)]


def round_weights(ctx, model, dtype_name):
    """Round every parameter and layer_scalar to dtype in place (kept in fp32; RoPE/scale buffers untouched)."""
    torch = ctx.torch
    dt = ctx.dtypes[dtype_name]
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(p.to(dt).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(b.to(dt).to(torch.float32))


def save_model(ctx, model, d, dtype_name, max_shard_size=None):
    """save_pretrained in dtype_name. A low-precision save goes through a copy so that the in-memory fp32 model
    (and its fp32 RoPE tables) stays untouched."""
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    target = model
    if dtype_name != "float32":
        try:
            target = copy.deepcopy(model)
        except Exception as e:
            log(f"  deepcopy failed ({e}); rebuilding from config for the {dtype_name} save")
            target = type(model)(model.config)
            target.load_state_dict(model.state_dict(), strict=True)
        target = target.to(ctx.dtypes[dtype_name])
    kwargs = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    target.save_pretrained(d, **kwargs)
    log(f"  saved {d} ({dtype_name}{', max_shard_size=' + str(max_shard_size) if max_shard_size else ''}): "
        f"{sorted(os.listdir(d))}")


def split_into_shards(d, n):
    """Fallback only: turn d/model.safetensors into n HF-style shards + model.safetensors.index.json."""
    from safetensors.torch import load_file, save_file
    single = os.path.join(d, "model.safetensors")
    sd = load_file(single)
    names = sorted(sd)
    per = -(-len(names) // n)
    wmap, total = {}, 0
    for j in range(n):
        part = {k: sd[k] for k in names[j * per:(j + 1) * per]}
        fn = f"model-{j + 1:05d}-of-{n:05d}.safetensors"
        save_file(part, os.path.join(d, fn), metadata={"format": "pt"})
        wmap.update({k: fn for k in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    os.remove(single)


def reload_model(ctx, d, loader, allow_unexpected=False):
    torch = ctx.torch
    cls = getattr(ctx.tf, loader)
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    info = None
    try:
        model, info = cls.from_pretrained(d, output_loading_info=True, **kwargs)
    except TypeError as e:
        log(f"  from_pretrained(output_loading_info=True) raised TypeError ({e}); retrying without it")
        model = cls.from_pretrained(d, **kwargs)
    model.eval()
    log(f"  reloaded with {loader}.from_pretrained -> {type(model).__name__}")
    if isinstance(info, dict):
        missing = [k for k in info.get("missing_keys", []) if not k.endswith("lm_head.weight")]
        unexpected = list(info.get("unexpected_keys", []))
        mismatched = list(info.get("mismatched_keys", []))
        if missing or unexpected or mismatched:
            log(f"  loading info: missing {missing[:8]} unexpected {unexpected[:8]} mismatched {mismatched[:8]}")
        check(not missing, f"{d}: {len(missing)} weights missing on reload (silently random): {missing[:6]}")
        check(not mismatched, f"{d}: {len(mismatched)} weights with mismatched shapes on reload: {mismatched[:6]}")
        check(allow_unexpected or not unexpected, f"{d}: {len(unexpected)} unexpected weights on reload: "
                                                  f"{unexpected[:6]}")
    bad = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
           if t.is_floating_point() and t.dtype != torch.float32]
    check(not bad, f"{d}: reloaded tensors not float32 although dtype=float32 was asked: {bad[:6]}")
    return model


def compare_states(ctx, pre, post, what):
    """Every saved tensor and every buffer (incl. rotary inv_freq, embed_scale) must be bit-identical."""
    torch = ctx.torch
    a, b = pre.state_dict(), post.state_dict()
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    check(not missing and not extra, f"{what}: state dict names differ: only before save {missing[:6]}, "
                                     f"only after reload {extra[:6]}")
    diff = [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k].float(), b[k].float())]
    check(not diff, f"{what}: {len(diff)} tensors changed between save and reload, e.g. {diff[:6]}")
    bufs_a, bufs_b = dict(pre.named_buffers()), dict(post.named_buffers())
    for name, buf in bufs_a.items():
        if name in bufs_b and buf.is_floating_point():
            check(buf.shape == bufs_b[name].shape and torch.equal(buf.float(), bufs_b[name].float()),
                  f"{what}: buffer {name} differs after reload (dtype {bufs_b[name].dtype}); RoPE/scale tables "
                  f"must stay fp32")
    log(f"  state dict identical after reload ({len(a)} tensors, {len(bufs_a)} buffers checked)")


# ----------------------------------------------------------------------------------------------------------------
# References

def forward_logits(ctx, model, ids):
    torch = ctx.torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    lg = out.logits
    check(lg.dim() == 3 and lg.shape[0] == 1 and lg.shape[1] == len(ids),
          f"forward returned logits of shape {tuple(lg.shape)} for {len(ids)} ids")
    return lg[0].float()


def incremental_logits(ctx, model, ids, new):
    """HF's own cached decode: prefill the prompt, then one token at a time with past_key_values."""
    torch = ctx.torch
    rows = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=True)
        check(out.past_key_values is not None, "prefill with use_cache=True returned no past_key_values")
        rows.append(out.logits[0].float())
        pkv, pos = out.past_key_values, len(ids)
        for t in new:
            out = model(input_ids=torch.tensor([[t]], dtype=torch.long), past_key_values=pkv, use_cache=True,
                        position_ids=torch.tensor([[pos]], dtype=torch.long))
            pkv = out.past_key_values
            rows.append(out.logits[0].float())
            pos += 1
    return torch.cat(rows, 0)


def hf_generate(ctx, model, ids):
    """Greedy, exactly NEW_TOKENS tokens, EOS disabled (the model's generation_config default eos is cleared so
    generate cannot fill it back in)."""
    torch = ctx.torch
    gc = model.generation_config
    gc.eos_token_id = None
    for cfg in (model.config, text_cfg_of(model)):  # so no code path can fill the default eos back in
        try:
            cfg.eos_token_id = None
        except Exception:
            pass
    x = torch.tensor([ids], dtype=torch.long)
    base = dict(attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                pad_token_id=PAD_ID)
    with torch.no_grad():
        try:
            out = model.generate(x, min_new_tokens=NEW_TOKENS, **base)
        except Exception as e:
            log(f"  generate(min_new_tokens=...) raised {type(e).__name__}: {e}; retrying without it")
            out = model.generate(x, **base)
    seq = out.sequences if hasattr(out, "sequences") else out
    seq = seq[0].tolist()
    check(seq[:len(ids)] == list(ids), "generate() output does not start with the prompt")
    return seq[len(ids):]


def evaluate_prompt(ctx, model, ids, V):
    """Returns a record with status 'ok', 'near_tie' or 'small_gap'; raises Failure on a real inconsistency."""
    torch = ctx.torch
    check(ids[0] == BOS_ID and all(0 <= i < V for i in ids), f"bad prompt ids {ids}")
    n = len(ids)
    prompt = forward_logits(ctx, model, ids)
    check(prompt.shape[1] == V, f"logits have {prompt.shape[1]} columns, vocab_size is {V}")
    greedy = hf_generate(ctx, model, ids)
    if len(greedy) < NEW_TOKENS and greedy and greedy[-1] == EOS_ID:
        log(f"  WARNING generate() stopped at EOS after {len(greedy)} tokens although EOS was disabled")
        return dict(ids=list(ids), greedy=greedy, status="eos_stop",
                    why=f"generate() stopped at EOS ({EOS_ID}) after {len(greedy)} tokens")
    check(len(greedy) == NEW_TOKENS, f"generate() returned {len(greedy)} new tokens for a {len(ids)}-token "
                                     f"prompt, expected {NEW_TOKENS}: {greedy}")
    full = forward_logits(ctx, model, ids + greedy)
    prefix_diff = (prompt - full[:n]).abs().max().item()
    check(prefix_diff <= PREFIX_TOL, f"prompt-only logits differ from the prompt rows of the prompt+greedy "
                                     f"forward by {prefix_diff:.3g} (> {PREFIX_TOL})")
    rows = full[n - 1:n - 1 + NEW_TOKENS]
    argmax = rows.argmax(dim=-1).tolist()
    rec = dict(ids=list(ids), greedy=greedy, prompt=prompt, full=full, status="ok")
    if argmax != greedy:
        k = next(i for i in range(NEW_TOKENS) if argmax[i] != greedy[i])
        gap = (rows[k, argmax[k]] - rows[k, greedy[k]]).item()
        if argmax[k] == EOS_ID:
            rec["status"] = "eos_suppressed"
            rec["why"] = f"step {k}: EOS ({EOS_ID}) is the argmax but generate() chose {greedy[k]} (EOS suppressed)"
            log(f"  WARNING generate() still treats {EOS_ID} as EOS: {rec['why']}")
            return rec
        if gap <= NEAR_TIE:
            rec["status"] = "near_tie"
            rec["why"] = f"step {k}: generate chose {greedy[k]}, full forward argmax {argmax[k]} (gap {gap:.3g})"
            return rec
        raise Failure(f"generate() disagrees with the full forward at step {k}: token {greedy[k]} vs argmax "
                      f"{argmax[k]}, logit gap {gap:.4g} (not a near-tie); greedy {greedy}")
    top2 = torch.topk(rows, 2, dim=-1).values
    min_gap = (top2[:, 0] - top2[:, 1]).min().item()
    rec["min_top2_gap"] = min_gap
    if min_gap < MIN_GAP:
        rec["status"] = "small_gap"
        rec["why"] = f"top-2 logit gap {min_gap:.3g} < {MIN_GAP}"
        return rec
    inc = incremental_logits(ctx, model, ids, greedy)
    check(inc.shape == full.shape, f"incremental logits shape {tuple(inc.shape)} != full {tuple(full.shape)}")
    rec["incremental_max_abs"] = (inc - full).abs().max().item()
    rec["greedy_contains_eos"] = EOS_ID in greedy
    return rec


def prompt_candidates(V, length):
    for attempt in range(MAX_PROMPT_TRIES):
        rng = random.Random(f"berth-gemma4-prompt/V={V}/len={length}/try={attempt}")
        yield attempt, [BOS_ID] + [rng.randrange(3, V) for _ in range(length - 1)]


def choose(ctx, model, V, candidates, label):
    """First candidate whose greedy chain is unambiguous and has no EOS; else the first unambiguous one."""
    fallback = None
    for tag, ids in candidates:
        rec = evaluate_prompt(ctx, model, ids, V)
        if rec["status"] != "ok":
            log(f"  {label}: candidate {tag} rejected: {rec['why']}")
            continue
        if not rec["greedy_contains_eos"]:
            return rec
        log(f"  {label}: candidate {tag} greedy contains EOS ({EOS_ID}); looking for one without")
        if fallback is None:
            fallback = rec
    check(fallback is not None, f"{label}: no candidate prompt gave an unambiguous greedy chain")
    log(f"  {label}: WARNING keeping a prompt whose greedy continuation contains EOS")
    return fallback


def write_f32(ctx, path, t):
    import numpy as np
    arr = np.ascontiguousarray(t.detach().cpu().float().numpy(), dtype="<f4")
    with open(path, "wb") as f:
        f.write(arr.tobytes())
    check(os.path.getsize(path) == arr.size * 4, f"{path}: wrote {os.path.getsize(path)} bytes, expected "
                                                  f"{arr.size * 4}")


def write_reference(ctx, d, name, desc, dtype_name, V, W, layers, recs, extra, vers):
    prompts = []
    for k, r in enumerate(recs):
        pl, fl = f"prompt{k}.f32", f"prompt{k}_full.f32"
        write_f32(ctx, os.path.join(d, pl), r["prompt"])
        write_f32(ctx, os.path.join(d, fl), r["full"])
        p = dict(ids=r["ids"], logits=pl, logits_shape=list(r["prompt"].shape), greedy=r["greedy"], full_logits=fl,
                 full_logits_shape=list(r["full"].shape), incremental_max_abs=r["incremental_max_abs"],
                 min_top2_gap=r["min_top2_gap"], greedy_contains_eos=r["greedy_contains_eos"])
        for key in ("text", "greedy_text"):
            if key in r:
                p[key] = r[key]
        prompts.append(p)
    ref = dict(variant=name, description=desc, weights_dtype=dtype_name, transformers=vers["transformers"],
               torch=vers["torch"], vocab_size=V, bos_id=BOS_ID, eos_disabled=True, num_new_tokens=NEW_TOKENS,
               sliding_window=W, layers=layers,
               incremental_max_abs=max(p["incremental_max_abs"] for p in prompts),
               min_top2_gap=min(p["min_top2_gap"] for p in prompts), prompts=prompts)
    ref.update(extra)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return ref


def random_prompts(ctx, model, V, W, label):
    lengths = [5, 13, 2 * W + 7]
    check(lengths[-1] > 2 * W, "internal: longest prompt must exceed twice the window")
    return [choose(ctx, model, V, prompt_candidates(V, n), f"{label} prompt len {n}") for n in lengths]


# ----------------------------------------------------------------------------------------------------------------
# Variants

def run_text_variant(ctx, out, name, spec, vers):
    kw, dtype_name = spec["kw"], spec["dtype"]
    V, W = kw["vocab_size"], kw["sliding_window"]
    d = os.path.join(out, "gemma4", name)
    warnings, extra = [], {}
    log(f"== {name}: {spec['desc']}")
    model = build_text_model(ctx, kw, spec["seed"], spec.get("scaled_qk_norm", False))
    check_layers(model, kw, f"{name} (in memory)")
    if dtype_name != "float32":
        round_weights(ctx, model, dtype_name)
        log(f"  weights rounded to {dtype_name} in place (kept fp32 in memory)")

    if spec.get("shard"):
        for size in ("300KB", "150KB", "80KB"):
            try:
                save_model(ctx, model, d, dtype_name, max_shard_size=size)
            except TypeError as e:
                warnings.append(f"{name}: save_pretrained(max_shard_size=...) raised TypeError ({e}); split the "
                                f"single-file save into 4 shards + index with safetensors instead")
                log("  WARNING " + warnings[-1])
                save_model(ctx, model, d, dtype_name)
                split_into_shards(d, 4)
            shards = [fn for fn in os.listdir(d) if fn.endswith(".safetensors")]
            if len(shards) >= 3 and os.path.exists(os.path.join(d, "model.safetensors.index.json")):
                break
            log(f"  only {len(shards)} shard(s) with max_shard_size={size}; trying smaller")
        check(len(shards) >= 3, f"{name}: could not get >= 3 shards (got {len(shards)})")
        extra["shards"] = sorted(shards)
    else:
        save_model(ctx, model, d, dtype_name)

    if spec.get("bf16_agreement"):
        extra["bf16_agreement"] = True
    if spec.get("official"):
        cfg_path = os.path.join(d, "config.json")
        with open(cfg_path) as f:
            c = json.load(f)
        had = "per_layer_config" in c
        c.pop("per_layer_config", None)
        c["head_dim"] = kw["head_dim"]
        c["global_head_dim"] = kw["global_head_dim"]
        c["layer_types"] = list(kw["layer_types"])
        with open(cfg_path, "w") as f:
            json.dump(c, f, indent=2)
            f.write("\n")
        log(f"  config.json rewritten to the official form: per_layer_config {'removed' if had else 'was absent'}, "
            f"head_dim {kw['head_dim']}, global_head_dim {kw['global_head_dim']}, own layer_types")
        extra["config_style"] = "official (global_head_dim, no per_layer_config)"

    inv = checkpoint_inventory(d)
    want = ctx.st_names[dtype_name]
    wrong = sorted(n for n, e in inv.items() if e[0] != want)
    check(not wrong, f"{name}: tensors not stored as {want}: {[(n, inv[n][0]) for n in wrong[:6]]}")
    check("lm_head.weight" not in inv, f"{name}: lm_head.weight written although embeddings are tied")
    spec_ok = compare_inventory(inv, expected_tensors(kw, "model."), warnings, name)
    with open(os.path.join(d, "config.json")) as f:
        saved_cfg = json.load(f)
    check(saved_cfg.get("model_type") == "gemma4_text", f"{name}: config.json model_type is "
                                                        f"{saved_cfg.get('model_type')!r}, expected gemma4_text")
    if not spec.get("official") and "per_layer_config" not in saved_cfg:
        warnings.append(f"{name}: save_pretrained wrote no per_layer_config (spec §1.3 says 5.17 does)")

    reloaded = reload_model(ctx, d, "Gemma4ForCausalLM")
    layers = check_layers(reloaded, kw, f"{name} (reloaded from {d}/config.json)")
    try:
        compare_states(ctx, model, reloaded, name)
        state_problem = None
    except Failure as e:
        state_problem = str(e)

    # The reference is HF's output for the files on disk; it is written even if the reload differs from the
    # pre-save model, so the difference can be inspected, and the variant is then reported as failed.
    recs = random_prompts(ctx, reloaded, V, W, name)
    reload_max = 0.0
    for r in recs:
        pre = forward_logits(ctx, model, r["ids"] + r["greedy"])
        reload_max = max(reload_max, (pre - r["full"]).abs().max().item())
    extra["reload_max_abs"] = reload_max
    if state_problem or reload_max > RELOAD_TOL:
        extra["reload_check"] = "FAILED: " + (state_problem or f"logits differ by {reload_max:.3g}")
    ref = write_reference(ctx, d, name, spec["desc"], dtype_name, V, W, layers, recs, extra, vers)
    check(state_problem is None, state_problem or "")
    check(reload_max <= RELOAD_TOL, f"{name}: reloaded-model logits differ from the pre-save model by "
                                    f"{reload_max:.3g} (> {RELOAD_TOL}): weights or config not loaded as saved "
                                    f"(reference.json written from the reloaded model anyway)")
    return summary_row(name, d, inv, reload_max, ref, warnings, spec_ok)


def build_multimodal(ctx, tiny_model, seed):
    tf, torch = ctx.tf, ctx.torch
    torch.manual_seed(seed)
    text_cfg = tf.Gemma4TextConfig(**copy.deepcopy(TINY))
    notes = []
    try:
        vis = tf.Gemma4VisionConfig(**TINY_VISION)
        cfg = tf.Gemma4Config(text_config=text_cfg, vision_config=vis, audio_config=None)
        model = tf.Gemma4ForConditionalGeneration(cfg)
        with_vision = True
    except Exception as e:
        notes.append(f"tiny vision tower could not be built ({type(e).__name__}: {e}); using no vision tower and "
                     f"injecting an extra model.embed_vision.* tensor into the file instead")
        log("  WARNING " + notes[-1])
        cfg = tf.Gemma4Config(text_config=text_cfg, vision_config=None, audio_config=None)
        model = tf.Gemma4ForConditionalGeneration(cfg)
        with_vision = False
    model = model.to(torch.float32).eval()
    set_eager(ctx, model)
    randomise(ctx, model, seed, TINY["initializer_range"])
    # Copy the tiny text weights in: model.X -> model.language_model.X
    src = tiny_model.state_dict()
    dst = model.state_dict()
    new = dict(dst)
    for k, v in src.items():
        nk = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        check(nk in dst, f"multimodal: wrapper has no tensor {nk} for tiny's {k}")
        check(tuple(dst[nk].shape) == tuple(v.shape), f"multimodal: {nk} shape {tuple(dst[nk].shape)} vs "
                                                      f"{tuple(v.shape)}")
        new[nk] = v.clone()
    text_keys = [k for k in dst if k.startswith("model.language_model.")]
    covered = {("model.language_model." + k[len("model."):]) for k in src if k.startswith("model.")}
    check(set(text_keys) == covered, f"multimodal: text tensors not covered by tiny: "
                                     f"{sorted(set(text_keys) - covered)[:6]}")
    model.load_state_dict(new, strict=True)
    check_tied(model)
    return model, with_vision, notes


def run_multimodal(ctx, out, name, spec, vers):
    torch = ctx.torch
    d = os.path.join(out, "gemma4", name)
    warnings, extra = [], {}
    log(f"== {name}: {spec['desc']}")
    tiny = build_text_model(ctx, TINY, SEED_TINY)
    model, with_vision, notes = build_multimodal(ctx, tiny, SEED_VISION)
    warnings.extend(notes)
    save_model(ctx, model, d, "float32")
    with open(os.path.join(d, "config.json")) as f:
        saved_cfg = json.load(f)
    check(saved_cfg.get("model_type") == "gemma4" and isinstance(saved_cfg.get("text_config"), dict),
          f"{name}: config.json has model_type {saved_cfg.get('model_type')!r} / text_config "
          f"{type(saved_cfg.get('text_config')).__name__}; expected gemma4 with a text_config object")
    check(saved_cfg["text_config"].get("model_type", "gemma4_text") == "gemma4_text",
          f"{name}: text_config.model_type is {saved_cfg['text_config'].get('model_type')!r}")

    inv = checkpoint_inventory(d)
    text_prefix = "model.language_model."
    other_prefixes = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
    text_names = [n for n in inv if n.startswith(text_prefix)]
    odd = [n for n in inv if not n.startswith(text_prefix) and not n.startswith(other_prefixes)]
    if not text_names or odd:
        # save_pretrained did not write the official layout: write it ourselves from the module names.
        from safetensors.torch import save_file
        warnings.append(f"{name}: save_pretrained wrote names like {sorted(inv)[:3]}; rewrote model.safetensors "
                        f"with the module names (model.language_model.*, model.vision_tower.*)")
        log("  WARNING " + warnings[-1])
        for fn in os.listdir(d):
            if fn.startswith("model") and (fn.endswith(".safetensors") or fn.endswith(".index.json")):
                os.remove(os.path.join(d, fn))
        sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        inv = checkpoint_inventory(d)
    injected = False
    if not any(n.startswith(other_prefixes) for n in inv):
        from safetensors.torch import load_file, save_file
        path = os.path.join(d, "model.safetensors")
        sd = load_file(path)
        g = torch.Generator().manual_seed(SEED_VISION)
        sd["model.embed_vision.embedding_projection.weight"] = torch.randn(TINY["hidden_size"], 16, generator=g)
        save_file(sd, path, metadata={"format": "pt"})
        injected = True
        warnings.append(f"{name}: injected model.embed_vision.embedding_projection.weight (no vision tower built)")
        log("  WARNING " + warnings[-1])
        inv = checkpoint_inventory(d)
    skipped = sorted(n for n in inv if n.startswith(other_prefixes))
    check(skipped, f"{name}: no model.vision_tower.* / model.embed_vision.* tensor in the checkpoint")
    check("lm_head.weight" not in inv, f"{name}: lm_head.weight written although embeddings are tied")
    wrong = sorted(n for n, e in inv.items() if e[0] != "F32")
    check(not wrong, f"{name}: tensors not stored as F32: {wrong[:6]}")
    spec_ok = compare_inventory({n: e for n, e in inv.items() if n.startswith(text_prefix)},
                                expected_tensors(TINY, text_prefix), warnings, name)
    extra["non_text_tensors"] = skipped
    extra["vision_tower_built"] = with_vision
    log(f"  {len(text_names)} text tensors under {text_prefix}, {len(skipped)} tensors the loader must skip "
        f"(e.g. {skipped[:2]})")

    # Spec pitfall 14: Gemma4ForCausalLM.from_pretrained leaves wrapped checkpoints random; use the Auto class.
    try:
        reloaded = reload_model(ctx, d, "AutoModelForCausalLM", allow_unexpected=injected)
        check(type(reloaded).__name__ != "Gemma4ForCausalLM", "AutoModelForCausalLM resolved to Gemma4ForCausalLM, "
                                                              "which does not map model.language_model.*")
        compare_states(ctx, model, reloaded, name + " (AutoModelForCausalLM)")
    except Exception as e:
        warnings.append(f"{name}: AutoModelForCausalLM did not load the wrapper correctly ({type(e).__name__}: "
                        f"{e}); used Gemma4ForConditionalGeneration.from_pretrained")
        log("  WARNING " + warnings[-1])
        reloaded = reload_model(ctx, d, "Gemma4ForConditionalGeneration", allow_unexpected=injected)
        compare_states(ctx, model, reloaded, name + " (Gemma4ForConditionalGeneration)")
    layers = check_layers(reloaded, TINY, f"{name} (reloaded)")
    recs = random_prompts(ctx, reloaded, TINY["vocab_size"], TINY["sliding_window"], name)
    reload_max = tiny_max = 0.0
    for r in recs:
        seq = r["ids"] + r["greedy"]
        reload_max = max(reload_max, (forward_logits(ctx, model, seq) - r["full"]).abs().max().item())
        tiny_max = max(tiny_max, (forward_logits(ctx, tiny, seq) - r["full"]).abs().max().item())
    check(reload_max <= RELOAD_TOL, f"{name}: reloaded logits differ from the pre-save wrapper by {reload_max:.3g}")
    check(tiny_max <= RELOAD_TOL, f"{name}: wrapper logits differ from the tiny text model by {tiny_max:.3g} "
                                  f"(> {RELOAD_TOL}); text weights not the tiny ones")
    log(f"  logits equal the tiny text model's (max |diff| {tiny_max:.3g})")
    extra["reload_max_abs"] = reload_max
    extra["max_abs_vs_tiny"] = tiny_max
    extra["loaded_with"] = f"AutoModelForCausalLM -> {type(reloaded).__name__}"
    ref = write_reference(ctx, d, name, spec["desc"], "float32", TINY["vocab_size"], TINY["sliding_window"], layers,
                          recs, extra, vers)
    return summary_row(name, d, inv, reload_max, ref, warnings, spec_ok)


def check_tokenizer(d, tok):
    """The written tokenizer.json must load in the `tokenizers` library and agree with the Python encoder."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    check(t.get_vocab_size(with_added_tokens=True) == mtt.VOCAB_SIZE,
          f"tokenizers reports vocab size {t.get_vocab_size(with_added_tokens=True)}, expected {mtt.VOCAB_SIZE}")
    for s, i in (("<pad>", PAD_ID), ("<eos>", EOS_ID), ("<bos>", BOS_ID)):
        check(t.token_to_id(s) == i, f"tokenizers: {s} has id {t.token_to_id(s)}, expected {i}")
    n = 0
    for s in mtt.CHECK_STRINGS_ASCII + mtt.CHECK_STRINGS_UNICODE + TEXT_PROMPTS:
        enc = t.encode(s)
        check(enc.ids[:1] == [BOS_ID], f"tokenizers: encoding {s!r} does not start with <bos>: {enc.ids[:4]}")
        back = t.decode(enc.ids, skip_special_tokens=True)
        check(back == s, f"tokenizers: {s!r} round-trips to {back!r}")
        if all(ord(c) < 128 for c in s):
            mine = tok.encode(s)
            check(enc.ids == mine, f"tokenizers ids for {s!r} differ from the Python encoder: {enc.ids} vs {mine}")
        n += 1
    log(f"  tokenizer.json loads in tokenizers and round-trips {n} strings (ASCII ones id-identical to the "
        f"Python encoder)")
    return t


def run_tiny_gemma4(ctx, out, vers):
    name = TINY_GEMMA4_NAME
    kw = TINY_GEMMA4
    d = os.path.join(out, name)
    V, W = kw["vocab_size"], kw["sliding_window"]
    warnings, extra = [], {}
    desc = (f"embedded default model: the tiny architecture with vocab_size = vocab_size_per_layer_input = {V} "
            f"(the size of the bundled byte-level BPE tokenizer.json); random weights, so its output is noise; fp32")
    log(f"== {name}: {desc}")
    tok = mtt.TinyTokenizer()
    check(len(tok.vocab) == V, f"tokenizer has {len(tok.vocab)} entries, model vocab is {V}")
    model = build_text_model(ctx, kw, SEED_TINY_GEMMA4)
    save_model(ctx, model, d, "float32")
    for p in tok.write(d):
        log(f"  wrote {p}")
    hf_tok = check_tokenizer(d, tok)
    try:
        auto = ctx.tf.AutoTokenizer.from_pretrained(d)
        ids = auto("Hello, world!")["input_ids"]
        if ids != hf_tok.encode("Hello, world!").ids:
            warnings.append(f"{name}: AutoTokenizer gives {ids} for 'Hello, world!', tokenizers gives "
                            f"{hf_tok.encode('Hello, world!').ids}")
    except Exception as e:
        warnings.append(f"{name}: AutoTokenizer.from_pretrained failed ({type(e).__name__}: {e}); "
                        f"tokenizers.Tokenizer works")
    inv = checkpoint_inventory(d)
    check(all(e[0] == "F32" for e in inv.values()), f"{name}: not all tensors F32")
    check("lm_head.weight" not in inv, f"{name}: lm_head.weight written although embeddings are tied")
    spec_ok = compare_inventory(inv, expected_tensors(kw, "model."), warnings, name)
    reloaded = reload_model(ctx, d, "Gemma4ForCausalLM")
    layers = check_layers(reloaded, kw, f"{name} (reloaded)")
    compare_states(ctx, model, reloaded, name)

    texts = {}
    ok = []  # (contains_eos, candidate index, record) for every usable text prompt
    for i, text in enumerate(TEXT_PROMPTS):
        ids = hf_tok.encode(text).ids
        texts[tuple(ids)] = text
        rec = evaluate_prompt(ctx, reloaded, ids, V)
        if rec["status"] != "ok":
            log(f"  text {i} skipped: {rec['why']}")
            continue
        ok.append((rec["greedy_contains_eos"], i, rec))
    ok.sort(key=lambda e: (e[0], e[1]))  # prefer greedy chains without EOS, then list order
    long_ones = [e for e in ok if len(e[2]["ids"]) > 2 * W]
    check(long_ones, f"{name}: no usable text prompt longer than 2W = {2 * W} tokens")
    picked = [long_ones[0]] + [e for e in ok if e is not long_ones[0]][:2]
    check(len(picked) == 3, f"{name}: only {len(ok)} text prompts usable, 3 needed")
    if any(e[0] for e in picked):
        warnings.append(f"{name}: some text prompts' greedy continuations contain EOS ({EOS_ID})")
    recs = [e[2] for e in sorted(picked, key=lambda e: e[1])]
    readme = evaluate_prompt(ctx, reloaded, README_PROMPT_IDS, V)
    if readme["status"] == "ok":
        recs.append(readme)
        extra["readme_prompt_index"] = len(recs) - 1
    elif "full" in readme:  # ambiguous greedy chain: still recorded, flagged by its min_top2_gap
        warnings.append(f"{name}: README prompt ids {README_PROMPT_IDS}: {readme['why']}; recorded anyway")
        readme["incremental_max_abs"] = (incremental_logits(ctx, reloaded, README_PROMPT_IDS, readme["greedy"])
                                         - readme["full"]).abs().max().item()
        readme["greedy_contains_eos"] = EOS_ID in readme["greedy"]
        readme.setdefault("min_top2_gap", 0.0)
        recs.append(readme)
        extra["readme_prompt_index"] = len(recs) - 1
    else:
        warnings.append(f"{name}: README prompt ids {README_PROMPT_IDS}: {readme['why']}; not recorded")
    for r in recs:
        r["text"] = texts.get(tuple(r["ids"]))
        r["greedy_text"] = hf_tok.decode(r["greedy"], skip_special_tokens=False)
    reload_max = 0.0
    for r in recs:
        reload_max = max(reload_max, (forward_logits(ctx, model, r["ids"] + r["greedy"]) - r["full"]).abs().max()
                         .item())
    check(reload_max <= RELOAD_TOL, f"{name}: reloaded logits differ from the pre-save model by {reload_max:.3g}")
    extra["reload_max_abs"] = reload_max
    extra["tokenizer"] = dict(file="tokenizer.json", vocab_size=V, merges=len(tok.merges),
                              note="byte-level BPE trained on text in tools/make_tiny_tokenizer.py")
    ref = write_reference(ctx, d, name, desc, "float32", V, W, layers, recs, extra, vers)
    return summary_row(name, d, inv, reload_max, ref, warnings, spec_ok)


def summary_row(name, d, inv, reload_max, ref, warnings, spec_ok):
    row = dict(variant=name, status="ok", tensors=len(inv), bytes=dir_bytes(d), reload_max_abs=reload_max,
               incremental_max_abs=ref["incremental_max_abs"], min_top2_gap=ref["min_top2_gap"],
               prompt_lengths=[len(p["ids"]) for p in ref["prompts"]], spec_inventory="ok" if spec_ok else "MISMATCH",
               warnings=list(warnings))
    if ref["incremental_max_abs"] > INCREMENTAL_WARN:
        row["warnings"].append(f"{name}: HF incremental decode differs from the full forward by "
                               f"{ref['incremental_max_abs']:.3g} (> {INCREMENTAL_WARN})")
    log(f"  done: {row['tensors']} tensors, {row['bytes']} bytes, reload max|diff| {reload_max:.3g}, "
        f"incremental max|diff| {ref['incremental_max_abs']:.3g}, min top-2 gap {ref['min_top2_gap']:.3g}")
    return row


# ----------------------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (gets gemma4/<variant>/, tiny-gemma4/, generation_summary.json)")
    ap.add_argument("--only", nargs="+", metavar="VARIANT", help=f"subset of: {' '.join(ALL_NAMES)}")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    args = ap.parse_args(argv)
    if args.list:
        for n, v in VARIANTS.items():
            print(f"{n:16s} {v['desc']}")
        print(f"{TINY_GEMMA4_NAME:16s} embedded default model + tokenizer.json (vocab {mtt.VOCAB_SIZE})")
        return 0
    if not args.out:
        ap.error("--out DIR is required")
    names = args.only or ALL_NAMES
    unknown = [n for n in names if n not in ALL_NAMES]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {ALL_NAMES}")

    torch, transformers = import_stack()
    ctx = Ctx(torch, transformers)
    vers = versions(torch, transformers)
    log(f"versions: {json.dumps(vers)}; torch threads {torch.get_num_threads()}; device cpu")
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "gemma4"), exist_ok=True)

    rows = []
    for n in names:
        t = time.time()
        try:
            if n == TINY_GEMMA4_NAME:
                row = run_tiny_gemma4(ctx, out, vers)
            elif VARIANTS[n].get("multimodal"):
                row = run_multimodal(ctx, out, n, VARIANTS[n], vers)
            else:
                row = run_text_variant(ctx, out, n, VARIANTS[n], vers)
        except Failure as e:
            log(f"FAILED {n}: {e}")
            row = dict(variant=n, status="FAIL", error=str(e), warnings=[])
        except Exception as e:
            traceback.print_exc()
            log(f"ERROR {n}: {type(e).__name__}: {e}")
            row = dict(variant=n, status="ERROR", error=f"{type(e).__name__}: {e}", warnings=[])
        row["seconds"] = round(time.time() - t, 1)
        rows.append(row)

    summary = dict(command="python3 tools/gen_reference.py --out DIR" + (" --only " + " ".join(args.only)
                                                                          if args.only else ""),
                   versions=vers, variants=rows)
    with open(os.path.join(out, "generation_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")

    print()
    hdr = f"{'variant':16s} {'status':6s} {'tensors':>7s} {'bytes':>9s} {'max|ref-reload|':>15s} " \
          f"{'incremental_max_abs':>19s} {'min_gap':>9s} {'spec':8s} prompts"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["status"] == "ok":
            print(f"{r['variant']:16s} {'ok':6s} {r['tensors']:7d} {r['bytes']:9d} {r['reload_max_abs']:15.3g} "
                  f"{r['incremental_max_abs']:19.3g} {r['min_top2_gap']:9.3g} {r['spec_inventory']:8s} "
                  f"{r['prompt_lengths']}")
        else:
            print(f"{r['variant']:16s} {r['status']:6s} {r['error']}")
    gem = os.path.join(out, "gemma4")
    print(f"\ntotal: gemma4/ {dir_bytes(gem)} bytes, everything {dir_bytes(out)} bytes, in {out}")
    warns = [w for r in rows for w in r.get("warnings", [])]
    for w in warns:
        print("WARNING", w)
    failed = [r["variant"] for r in rows if r["status"] != "ok"]
    if failed:
        print(f"FAILED: {' '.join(failed)}")
        return 1
    print(f"all {len(rows)} variant(s) passed" + (f" ({len(warns)} warning(s))" if warns else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
