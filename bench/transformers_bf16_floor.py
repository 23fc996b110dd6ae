#!/usr/bin/env python3
"""How far Hugging Face transformers itself moves from its float32 logits when it runs in
bfloat16, on the reference checkpoints of tests/data: the floor a bf16 engine is measured
against (the CUDA engine keeps bf16 activations and a bf16 latent cache; docs/PERF.md).

For each checkpoint: DeepseekV3ForCausalLM loaded from tests/data/checkpoints/<name> with
dtype float32 and with dtype bfloat16 (eager attention, CPU), one forward over every reference
prompt + continuation[:-1]; per row, max |logit - ref| / max |ref| and the rel-L2 against the
float32 reference logits stored in tests/data/references/<name>_logits.safetensors (the same
metric as the engine tests), and the rows whose argmax changes. FP8 checkpoints are skipped:
transformers' FP8 path needs a GPU and accelerate.

  pip install torch transformers safetensors
  python bench/transformers_bf16_floor.py [--json FILE] [NAME ...]   (default: dense moe_yarn)
"""
import argparse
import datetime
import json
import os

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(name):
    data = os.path.join(ROOT, "tests", "data")
    ref = json.load(open(os.path.join(data, "references", f"{name}.json")))
    ref_logits = load_file(os.path.join(data, "references", f"{name}_logits.safetensors"))
    out = {"checkpoint": name}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(data, "checkpoints", name),
                                                     dtype=dtype, attn_implementation="eager")
        model.eval()
        max_rel = max_l2 = 0.0
        changes = rows = 0
        for k, p in enumerate(ref["prompts"]):
            seq = p["prompt"] + p["continuation"][:-1]
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0].float()
            r = ref_logits[f"prompt{k}"]
            diff = logits - r
            max_rel = max(max_rel, (diff.abs().amax(1) / r.abs().amax(1)).max().item())
            max_l2 = max(max_l2, (diff.norm(dim=1) / r.norm(dim=1)).max().item())
            changes += int((logits.argmax(1) != r.argmax(1)).sum())
            rows += logits.shape[0]
        out[str(dtype).replace("torch.", "")] = {"max_rel": max_rel, "max_rel_l2": max_l2,
                                                 "argmax_changes": changes, "rows": rows}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=["dense", "moe_yarn"])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    results = [measure(n) for n in args.names]
    print("| checkpoint | dtype | max rel logit error | max rel-L2 | argmax changes |")
    print("|---|---|---|---|---|")
    for r in results:
        for dt in ("float32", "bfloat16"):
            m = r[dt]
            print(f"| {r['checkpoint']} | {dt} | {m['max_rel']:.3g} | {m['max_rel_l2']:.3g} | "
                  f"{m['argmax_changes']} of {m['rows']} |")
    if args.json:
        meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                "transformers": transformers.__version__, "device": "cpu"}
        with open(args.json, "w") as f:
            json.dump({"bench": "transformers_bf16_floor", "meta": meta, "results": results}, f,
                      indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
