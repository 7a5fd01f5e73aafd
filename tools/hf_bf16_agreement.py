#!/usr/bin/env python3
"""Calibrate the bf16-mode agreement criterion (tests/test_gemma4_bf16_agreement.c) on transformers itself: run
each Gemma 4 fixture in bf16 (weights and activations bf16, as HF/vLLM serve) over prompt + reference continuation
in one forward, and compare with the fixture's fp32 full-forward logits: min cosine per row and argmax agreement
where the reference's top-2 margin exceeds 0.05. Run on the GPU machine:

    python3 tools/hf_bf16_agreement.py tests/fixtures/gemma4/*/
"""
import json
import os
import sys

import numpy as np
import torch
import transformers


def main(dirs):
    for d in dirs:
        ref = json.load(open(os.path.join(d, "reference.json")))
        V = ref["vocab_size"]
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
        except Exception as e:  # the multimodal wrapper needs another class
            print("%-16s skipped: %s" % (ref["variant"], str(e).splitlines()[0][:100]))
            continue
        worst, checked, flips = 1.0, 0, 0
        for p in ref["prompts"]:
            ids = p["ids"] + p["greedy"]
            full = np.fromfile(os.path.join(d, p["full_logits"]), dtype="<f4").reshape(len(ids), V)
            with torch.no_grad():
                out = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
            for r in range(len(ids) - 1):
                a, b = out[r].astype(np.float64), full[r].astype(np.float64)
                cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
                worst = min(worst, cos)
                top = np.argsort(-b)[:2]
                if b[top[0]] - b[top[1]] > 0.05:
                    checked += 1
                    flips += int(np.argmax(a) != top[0])
        print("%-16s HF bf16 vs fp32: min cosine %.6f, argmax flips %d of %d rows with margin > 0.05"
              % (ref["variant"], worst, flips, checked), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
