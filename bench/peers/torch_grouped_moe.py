#!/usr/bin/env python3
"""Same-run peer for bench/moe_layer_bench: PyTorch's public grouped GEMM kernels on the routed
experts of one MoE layer at Kimi-K2's dimensions (hidden 7168, 384 experts, top-8,
moe_intermediate 2048), the expert GEMMs only (gate_up and down), at the same rows per step.

  bf16:  torch._grouped_mm (CUTLASS grouped GEMM inside PyTorch; what torchtitan's MoE uses)
  fp8:   torch._scaled_grouped_mm with rowwise scales (one per token and one per output
         channel: PyTorch's FP8 grouped kernel has no 128 x 128 block scaling, so this is a
         cheaper scaling than DeepSeek-V3's, labelled as such)

Routing: every row picks 8 distinct experts uniformly at random (as the bench's random
router does in effect); the pairs are grouped by expert, `offs` the cumulative group ends.
Timing: CUDA events around each GEMM, median of --iters after --warmup. A correctness check
of each kind against per-expert torch.matmul on the smallest row count runs first.

  python bench/peers/torch_grouped_moe.py --json /tmp/torch_moe.json
"""
import argparse
import json
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,64,256,1024,2048,8192")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top_k", type=int, default=8)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    H, E, K, I = a.hidden, a.experts, a.top_k, a.inter
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    # Weights in the checkpoint layout [E, N, K]; the grouped kernels take [E, K, N] views
    # (column-major), i.e. transposes of contiguous tensors.
    w_gu = (torch.randn(E, 2 * I, H, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    w_dn = (torch.randn(E, H, I, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    have_fp8 = hasattr(torch, "_scaled_grouped_mm")
    if have_fp8:
        w_gu8 = w_gu.to(torch.float8_e4m3fn)
        w_dn8 = w_dn.to(torch.float8_e4m3fn)
        s_gu = torch.ones(E, 2 * I, device=dev, dtype=torch.float32)
        s_dn = torch.ones(E, H, device=dev, dtype=torch.float32)

    def routing(R):
        scores = torch.rand(R, E, device=dev, generator=g)
        experts = scores.topk(K, dim=1).indices.flatten()
        counts = torch.bincount(experts, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return offs, int((counts > 0).sum())

    def timed(fn):
        ms = []
        for it in range(a.warmup + a.iters):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            if it >= a.warmup:
                ms.append(e0.elapsed_time(e1))
        return statistics.median(ms)

    def check(R):
        offs, _ = routing(R)
        P = R * K
        x = torch.randn(P, H, device=dev, generator=g).to(torch.bfloat16)
        out = torch._grouped_mm(x, w_gu.transpose(1, 2), offs=offs)
        start, worst = 0, 0.0
        for e in range(E):
            end = int(offs[e])
            if end > start:
                ref = x[start:end].float() @ w_gu[e].float().t()
                err = (out[start:end].float() - ref).norm() / ref.norm()
                worst = max(worst, float(err))
            start = end
        return worst

    results = []
    check_err = check(min(int(r) for r in a.rows.split(",")) * 4)
    print(f"torch._grouped_mm bf16 vs per-expert matmul: max rel-L2 {check_err:.3g}")
    if check_err > 1e-2:
        print("correctness check failed", file=sys.stderr)
        return 1
    print("\n| kind | rows | experts hit | gate_up ms | down ms | weight TB/s | expert TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for R in [int(r) for r in a.rows.split(",")]:
        offs, hit = routing(R)
        P = R * K
        x = torch.randn(P, H, device=dev, generator=g).to(torch.bfloat16)
        act = torch.randn(P, I, device=dev, generator=g).to(torch.bfloat16)
        kinds = [("bf16", 2.0)]
        if have_fp8:
            kinds.append(("fp8_rowwise", 1.0))
        for kind, elt in kinds:
            try:
                if kind == "bf16":
                    gu = timed(lambda: torch._grouped_mm(x, w_gu.transpose(1, 2), offs=offs))
                    dn = timed(lambda: torch._grouped_mm(act, w_dn.transpose(1, 2), offs=offs))
                else:
                    x8 = x.to(torch.float8_e4m3fn)
                    a8 = act.to(torch.float8_e4m3fn)
                    sx = torch.ones(P, device=dev, dtype=torch.float32)
                    gu = timed(lambda: torch._scaled_grouped_mm(
                        x8, w_gu8.transpose(1, 2), sx, s_gu, offs=offs, out_dtype=torch.bfloat16))
                    dn = timed(lambda: torch._scaled_grouped_mm(
                        a8, w_dn8.transpose(1, 2), sx, s_dn, offs=offs, out_dtype=torch.bfloat16))
            except Exception as ex:  # an unsupported kind on this build: recorded, not fatal
                print(f"| {kind} | {R} | {hit} | error: {type(ex).__name__}: {str(ex)[:80]} |")
                results.append({"kind": kind, "rows": R, "error": str(ex)[:300]})
                continue
            wbytes = hit * 3.0 * H * I * elt
            tbps = wbytes / ((gu + dn) * 1e-3) / 1e12
            tflops = 2.0 * P * 3.0 * H * I / ((gu + dn) * 1e-3) / 1e12
            print(f"| {kind} | {R} | {hit} | {gu:.3f} | {dn:.3f} | {tbps:.2f} | {tflops:.0f} |")
            results.append({"kind": kind, "rows": R, "experts_hit": hit, "gate_up_ms": gu,
                            "down_ms": dn, "weight_tbps": tbps, "expert_tflops": tflops})
    if a.json:
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": torch.cuda.get_device_name(),
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "dims": {"hidden": H, "experts": E, "top_k": K, "inter": I},
            "check_rel_l2": check_err,
            "timing": "CUDA events around each GEMM; median over iters after warmup",
        }
        with open(a.json, "w") as f:
            json.dump({"bench": "torch_grouped_moe", "meta": meta, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
