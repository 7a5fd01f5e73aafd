#!/usr/bin/env python3
"""Hugging Face transformers reference for the GPU Gemma 4 benchmark: one batch size per process.

    python3 bench/hf_gemma4_bench.py --model DIR --batch B --prompt-len P --gen-len G
    python3 bench/hf_gemma4_bench.py --model DIR --prompt-len 2048 --ttft

Model: AutoModelForCausalLM (Gemma4ForCausalLM for a gemma4_text checkpoint) in bf16 on cuda, default attention
(SDPA). Generation: greedy, static KV cache (generation_config.cache_implementation = "static"), EOS ignored
(min_new_tokens = max_new_tokens), random prompt ids (BOS first, then uniform in [3, vocab)), attention mask of
ones. With a static cache on CUDA, generate() torch.compiles the decode step itself (transformers 5.x automatic
compile, mode "reduce-overhead", i.e. CUDA graphs); the prefill runs eagerly. --compile forward instead wraps
model.forward in torch.compile(mode="reduce-overhead", fullgraph=True) (prefill compiled too); --compile none
runs the static cache eagerly. If the compiled warm-up raises, the run falls back to eager and says so
("compiled": false, "compile_error").

Decode mode (default): warm-up generate(G) (this is where compilation happens: "warmup_s"), then generate(1);
then --repeats rounds of [generate(1), generate(G)], each timed with torch.cuda.synchronize() around it.
  prefill_s    = median time(generate 1)      (B x P prompt tokens + the first token)
  decode_tok_s = B * (G - 1) / (median time(generate G) - prefill_s)
  total_tok_s  = B * G / median time(generate G)
plus a cross-check from one more generate(G) with a streamer that timestamps each step:
  decode_tok_s_stream = B * (G - 1) / (time of token G - time of token 1)
The static cache is sized for P + G by the first generate(G); generate(1) needs less and reuses it, so the
compiled graph is not rebuilt between the timed calls ("dynamo_graphs_during_timing" says if anything was).

TTFT mode (--ttft): batch 1, generate(max_new_tokens=1) on a P-token prompt (fresh random ids each run), two
warm-ups, then --ttft-repeats timed runs: ttft_s = median.

Output: progress on stderr, one JSON object on stdout. --dry-run prints the plan without importing torch.
"""

import argparse
import json
import os
import statistics
import sys
import time


def log(msg):
    print("hf_gemma4_bench: " + msg, file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder (config.json + safetensors)")
    ap.add_argument("--batch", type=int, default=1, help="batch size B (default 1; --ttft forces 1)")
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens P (default 512)")
    ap.add_argument("--gen-len", type=int, default=128, help="generated tokens G (default 128)")
    ap.add_argument("--ttft", action="store_true", help="time to first token of a P-token prompt at batch 1")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds in decode mode (default 3)")
    ap.add_argument("--ttft-repeats", type=int, default=5, help="timed runs in TTFT mode (default 5)")
    ap.add_argument("--compile", choices=["auto", "forward", "none"], default="auto",
                    help="auto: generate() compiles the decode step (default); forward: torch.compile "
                         "model.forward; none: eager")
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers' choice, sdpa)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda; cpu only for testing the script)")
    ap.add_argument("--no-stream-check", action="store_true", help="skip the streamer cross-check run")
    ap.add_argument("--dry-run", action="store_true", help="print the plan as JSON; no torch needed")
    a = ap.parse_args(argv)
    if a.ttft:
        a.batch = 1
    for k in ("batch", "prompt_len", "gen_len", "repeats", "ttft_repeats"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if not a.ttft and a.gen_len < 2:
        ap.error("decode mode needs --gen-len >= 2 (use --ttft for first-token latency)")
    return a


class StepClock:
    """A generate() streamer that records when each put() reaches the host. generate() puts the prompt first and
    then each step's tokens, so the last G entries are the G generated steps."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def dynamo_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # private API: report nothing rather than fail the benchmark
        return -1


def main(argv=None):
    a = parse_args(argv)
    mode = "ttft" if a.ttft else "decode"
    result = {"tool": "transformers", "mode": mode, "model": os.path.abspath(a.model), "batch": a.batch,
              "prompt_len": a.prompt_len, "gen_len": 1 if a.ttft else a.gen_len, "compile": a.compile}
    if a.dry_run:
        result["dry_run"] = True
        result["plan"] = (f"ttft: 2 warm-ups + {a.ttft_repeats} x generate(1) at B=1, P={a.prompt_len}" if a.ttft else
                          f"warm-up generate({a.gen_len}) + generate(1), then {a.repeats} x [generate(1), "
                          f"generate({a.gen_len})] at B={a.batch}, P={a.prompt_len}"
                          + ("" if a.no_stream_check else f", + 1 streamed generate({a.gen_len})"))
        print(json.dumps(result))
        return 0

    t_start = time.perf_counter()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("hf_gemma4_bench: no CUDA device")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result.update(torch=torch.__version__, transformers=transformers.__version__,
                  gpu=torch.cuda.get_device_name(dev) if cuda else a.device)

    t0 = time.perf_counter()
    kw = dict(dtype=torch.bfloat16, device_map=a.device, output_loading_info=True)
    if a.attn:
        kw["attn_implementation"] = a.attn
    loaded = AutoModelForCausalLM.from_pretrained(a.model, **kw)
    model, info = loaded if isinstance(loaded, tuple) else (loaded, {})
    model.eval()
    sync()
    result["load_s"] = round(time.perf_counter() - t0, 3)
    result["model_class"] = type(model).__name__
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        # The benchmark still runs (speed does not depend on the values), but the checkpoint's names are wrong.
        log(f"WARNING: checkpoint does not match {type(model).__name__}: "
            + "; ".join(f"{k}: {len(v)} ({', '.join(map(str, v[:3]))}...)" for k, v in bad.items()))
        result["loading_problems"] = {k: v[:20] for k, v in bad.items()}
    log(f"loaded {type(model).__name__} in {result['load_s']} s"
        + (f" ({torch.cuda.memory_allocated(dev) / 2**30:.1f} GiB)" if cuda else ""))

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = int(cfg.vocab_size)
    gen_cfg = model.generation_config
    gen_cfg.cache_implementation = "static"
    gen_cfg.do_sample = False
    if a.compile != "auto":
        gen_cfg.disable_compile = True
    eager_forward = model.forward
    if a.compile == "forward":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else 2

    g = torch.Generator(device="cpu")
    g.manual_seed(a.seed)

    def prompt(batch):
        ids = torch.randint(3, vocab, (batch, a.prompt_len), generator=g)
        ids[:, 0] = bos
        return ids.to(dev), torch.ones_like(ids).to(dev)

    def generate(ids, mask, n, streamer=None):
        sync()
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, num_beams=1, pad_token_id=pad, streamer=streamer)
        sync()
        dt = time.perf_counter() - t
        if out.shape[1] != a.prompt_len + n:
            raise RuntimeError(f"generate returned {out.shape[1] - a.prompt_len} new tokens, expected {n}")
        return dt

    def warm(n_new, ids, mask):
        """First call of this shape; on a compile failure fall back to eager once."""
        t = time.perf_counter()
        try:
            generate(ids, mask, n_new)
        except Exception as e:  # noqa: BLE001 - report and fall back rather than lose the run
            if a.compile == "none" or result.get("compiled") is False:
                raise
            log(f"WARNING: compiled generate failed ({type(e).__name__}: {str(e)[:300]}); retrying eagerly")
            result["compiled"] = False
            result["compile_error"] = f"{type(e).__name__}: {str(e)[:500]}"
            gen_cfg.disable_compile = True
            model.forward = eager_forward
            import torch._dynamo
            torch._dynamo.reset()
            generate(ids, mask, n_new)
        return time.perf_counter() - t

    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    with torch.no_grad():  # what generate() itself uses; inference tensors and CUDA graphs mix less well
        if a.ttft:
            ids, mask = prompt(1)
            result["warmup_s"] = round(warm(1, ids, mask), 3)
            generate(*prompt(1), 1)
            times = [generate(*prompt(1), 1) for _ in range(a.ttft_repeats)]
            result["ttft_runs_s"] = [round(x, 6) for x in times]
            result["ttft_s"] = statistics.median(times)
        else:
            B, G = a.batch, a.gen_len
            ids, mask = prompt(B)
            result["warmup_s"] = round(warm(G, ids, mask), 3)
            log(f"warm-up generate({G}) at B={B}: {result['warmup_s']} s (includes compilation)")
            generate(ids, mask, 1)
            graphs0 = dynamo_graphs()
            t1, tg = [], []
            for _ in range(a.repeats):
                t1.append(generate(ids, mask, 1))
                tg.append(generate(ids, mask, G))
            graphs1 = dynamo_graphs()
            m1, mg = statistics.median(t1), statistics.median(tg)
            result.update(
                prefill_runs_s=[round(x, 6) for x in t1], gen_runs_s=[round(x, 6) for x in tg],
                prefill_s=m1, prefill_tok_s=B * a.prompt_len / m1, gen_s=mg, total_tok_s=B * G / mg,
                decode_tok_s=B * (G - 1) / (mg - m1) if mg > m1 else None,
                dynamo_graphs_after_warmup=graphs0,
                dynamo_graphs_during_timing=(graphs1 - graphs0) if graphs0 >= 0 and graphs1 >= 0 else None)
            if result["dynamo_graphs_during_timing"]:
                log("WARNING: torch.compile built new graphs during the timed runs: the times include compilation")
            if not a.no_stream_check:
                clock = StepClock()
                generate(ids, mask, G, streamer=clock)
                steps = clock.times[-G:]
                if len(steps) == G and steps[-1] > steps[0]:
                    result["decode_tok_s_stream"] = B * (G - 1) / (steps[-1] - steps[0])
                else:
                    result["decode_tok_s_stream"] = None
                    log(f"streamer saw {len(clock.times)} puts, expected at least {G}")
    if "compiled" not in result:
        # auto: generate() decides; dynamo having built graphs is the evidence (TTFT runs have no decode step)
        n = dynamo_graphs()
        result["compiled"] = (n > 0) if n >= 0 else None
        result["dynamo_graphs"] = n
    if cuda:
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    if a.ttft:
        log(f"B=1 P={a.prompt_len}: TTFT median {result['ttft_s'] * 1e3:.2f} ms; whole run {result['wall_s']} s")
    else:
        d = result["decode_tok_s"]
        log(f"B={a.batch} P={a.prompt_len} G={a.gen_len}: decode {d:.1f} tok/s, prefill {result['prefill_s'] * 1e3:.1f}"
            f" ms; whole run {result['wall_s']} s" if d else "decode time not measurable (generate(G) <= generate(1))")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
