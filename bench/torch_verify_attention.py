#!/usr/bin/env python3
"""Plain PyTorch gather + matmul verify attention: the baseline for verify_attention_bench.

The same computation and shapes as bench/verify_attention_bench.cc (docs/PERF.md):
latent cache [slots, 576] bf16 with each request's slots scattered at random (page size 1),
queries [B*q, H, 576], one chain tree per request (node t sees context + nodes 0..t),
V = first 512 latent columns. Per shape, batched over requests (all requests of a shape have
the same length):  K = kv[idx] -> [B, L, 576];  S = (Q K^T) * scale in fp32 (bf16 matmul,
fp32 out); tail mask; softmax in fp32; O = P.bf16 @ K[:, :, :512].

Timing: CUDA events around each call, median of --iters after --warmup, rotating over input
sets whose KV spans >= --rotate-bytes so that L2 does not hold it. Prints a table, writes JSON.
Also checks the torch result against a float64 computation on one small shape (sanity).
"""
import argparse
import json
import math

import torch

SHAPES = [  # B, H, q, ctx
    (1, 8, 16, 4096), (1, 8, 16, 16384), (1, 8, 16, 65536), (1, 8, 16, 185000),
    (1, 16, 16, 65536), (1, 16, 16, 185000), (8, 16, 16, 16384), (8, 16, 16, 65536),
    (1, 16, 64, 65536), (32, 16, 16, 8192),
    (1, 8, 1, 65536), (1, 8, 1, 185000), (1, 16, 1, 185000), (8, 16, 1, 65536),
    (32, 16, 1, 16384), (64, 128, 1, 4096),
]


def verify_attention_torch(q, kv, idx, B, H, nq, L, scale):
    """q [B*nq, H, 576] bf16, kv [slots, 576] bf16, idx [B, L] int64 -> out [B*nq, H, 512]."""
    k = kv[idx]                                        # [B, L, 576] gather
    qb = q.view(B, nq * H, 576)                        # rows = node * H + head
    s = torch.matmul(qb, k.transpose(1, 2)).float() * scale   # [B, nq*H, L]
    ctx = L - nq
    node = torch.arange(nq * H, device=q.device) // H  # node of each folded row
    tail = torch.arange(nq, device=q.device)
    hide = tail[None, :] > node[:, None]               # chain: node t sees tail 0..t
    s[:, :, ctx:].masked_fill_(hide[None], float("-inf"))
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    o = torch.matmul(p, k[:, :, :512])                 # [B, nq*H, 512]
    return o.view(B * nq, H, 512)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="torch_verify_attention.json")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rotate-bytes", type=int, default=512 << 20)
    ap.add_argument("--copy-gbps", type=float, default=4242.0)
    ap.add_argument("--mma-tflops", type=float, default=790.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    scale = 1.0 / math.sqrt(192.0)

    # Sanity: torch path vs float64 on a small tree-free chain shape.
    B, H, nq, L = 2, 8, 4, 300
    kv = torch.rand(B * L + 50, 576, device=dev, generator=g).mul(2).sub(1).bfloat16()
    idx = torch.randperm(B * L + 50, device=dev, generator=g)[: B * L].view(B, L)
    q = torch.rand(B * nq, H, 576, device=dev, generator=g).mul(4).sub(2).bfloat16()
    got = verify_attention_torch(q, kv, idx, B, H, nq, L, scale).double()
    k = kv[idx].double()
    s = torch.matmul(q.double().view(B, nq * H, 576), k.transpose(1, 2)) * scale
    node = torch.arange(nq * H, device=dev) // H
    hide = torch.arange(nq, device=dev)[None, :] > node[:, None]
    s[:, :, L - nq:].masked_fill_(hide[None], float("-inf"))
    want = torch.matmul(torch.softmax(s, -1), k[:, :, :512]).view(B * nq, H, 512)
    rel = ((got - want).norm() / want.norm()).item()
    print(f"torch baseline sanity vs float64: rel L2 {rel:.2e}")
    assert rel < 1e-2, rel

    rows = []
    for (B, H, nq, ctx) in SHAPES:
        L = ctx + nq
        set_bytes = B * L * 576 * 2
        sets = max(2, min(16, -(-args.rotate_bytes // set_bytes)))
        slots = B * L * sets
        kv = torch.empty(slots, 576, device=dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
        perm = torch.randperm(slots, device=dev, generator=g).view(sets, B, L)
        qs = torch.empty(sets, B * nq, H, 576, device=dev, dtype=torch.bfloat16).uniform_(
            -2, 2, generator=g)
        try:
            for i in range(args.warmup):
                verify_attention_torch(qs[i % sets], kv, perm[i % sets], B, H, nq, L, scale)
            torch.cuda.synchronize()
            times = []
            for i in range(args.iters):
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.record()
                verify_attention_torch(qs[i % sets], kv, perm[i % sets], B, H, nq, L, scale)
                en.record()
                en.synchronize()
                times.append(st.elapsed_time(en))
            times.sort()
            ms = times[len(times) // 2]
        except torch.OutOfMemoryError:
            ms = float("nan")
        del kv, perm, qs
        torch.cuda.empty_cache()
        bytes_ = B * ctx * 1152.0
        flops = B * ctx * nq * H * 1088.0 * 2
        mem_floor = bytes_ / (args.copy_gbps * 1e9) * 1e3
        comp_floor = flops / (args.mma_tflops * 1e12) * 1e3
        rows.append(dict(B=B, H=H, q=nq, ctx=ctx, ms=ms, kv_gbps=bytes_ / (ms * 1e-3) / 1e9,
                         tflops=flops / (ms * 1e-3) / 1e12, mem_floor_ms=mem_floor,
                         compute_floor_ms=comp_floor,
                         pct_of_larger_floor=100 * max(mem_floor, comp_floor) / ms))
        print(f"torch B={B} H={H} q={nq} ctx={ctx}: {ms:.4f} ms", flush=True)
    print("\n| B | H | q | ctx | torch ms | KV GB/s | TFLOP/s | % of larger floor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['B']} | {r['H']} | {r['q']} | {r['ctx']} | {r['ms']:.4f} | "
              f"{r['kv_gbps']:.0f} | {r['tflops']:.1f} | {r['pct_of_larger_floor']:.0f} % |")
    with open(args.json, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       shapes=rows), f, indent=2)


if __name__ == "__main__":
    main()
