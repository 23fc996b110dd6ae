#!/usr/bin/env python3
"""FlashInfer's MLA decode/verify kernel, timed exactly as verify_attention_bench times verifyd.

A same-run peer for bench/verify_attention_bench.cc: the same 16 reference shapes (B requests,
H heads on one rank, q query rows per request, ctx context tokens), the same inputs (bf16
latent cache 512 + 64, each request's pages scattered at random over a pool), and the same
timing method:
  - input sets rotated so that their KV spans >= --rotate-bytes (L2 never holds it): sets =
    clamp(ceil(rotate_bytes / (B * (ctx + q) * 576 * 2)), 2, 64), as verifyd's bench;
  - one CUDA graph runs every input set once; per-call time = graph time / sets; the median
    of --iters graph replays after --warmup.
FlashInfer (BatchMLAPagedAttentionWrapper, backend fa3 on sm_90) supports only a causal
chain (no tree mask): q rows per request are a chain, which is what verifyd's bench runs
too. It is timed at page size 1 (what page-size-1 verify needs) and at each of --page-sizes,
with the latent cache in each of --layouts: "joint" (one [pages, page, 576] buffer, ckv and
kpe strided views of it: the layout serving systems and verifyd use, one 1152-byte row per
token) and "separate" (two buffers, [pages, page, 512] and [pages, page, 64]). "ms" is its
best at page size 1, "best_ms" its best over every page size and layout.

FlashInfer is a PyPI package (flashinfer-python); its sdist JIT-compiles on the GPU machine.
Writes JSON (--json) in the schema of verify_attention_bench ("impl": "flashinfer"), prints a
table. A program, not a test: it asserts nothing about speed.
"""
import argparse
import datetime
import json
import math
import sys

import torch

from same_run import (CKV, KPE, QK, SHAPES, TIMING, add_run_args, add_timing_args, floors, num_sets,
                      parse_shapes, time_sets)


def make_cache(pages, page, layout, dev, g):
    """(ckv, kpe) of `pages` pages: views of one joint buffer, or two separate buffers."""
    if layout == "joint":
        kv = torch.empty(pages, page, QK, dtype=torch.bfloat16, device=dev).uniform_(-1, 1, generator=g)
        return kv[..., :CKV], kv[..., CKV:]
    ckv = torch.empty(pages, page, CKV, dtype=torch.bfloat16, device=dev).uniform_(-1, 1, generator=g)
    kpe = torch.empty(pages, page, KPE, dtype=torch.bfloat16, device=dev).uniform_(-1, 1, generator=g)
    return ckv, kpe


def time_shape(flashinfer, B, H, q, ctx, page, layout, args, dev):
    """Median per-call ms of the graph-timed run, and the eager median, for one page size."""
    L = ctx + q                              # keys per request: context + its own q rows
    pages_per_req = -(-L // page)
    sets = num_sets(B, q, ctx, args.rotate_bytes)
    total_pages = B * pages_per_req * sets
    g = torch.Generator(device=dev).manual_seed(12345)
    ckv, kpe = make_cache(total_pages, page, layout, dev, g)
    perm = torch.randperm(total_pages, device=dev, generator=g).int()
    rows = B * q
    float_ws = torch.empty(args.workspace_mb << 20, dtype=torch.int8, device=dev)
    wrappers, qs, outs = [], [], []
    qo_indptr = torch.arange(0, B + 1, dtype=torch.int32, device=dev) * q
    kv_indptr = torch.arange(0, B + 1, dtype=torch.int32, device=dev) * pages_per_req
    kv_len = torch.full((B,), L, dtype=torch.int32, device=dev)
    for s in range(sets):
        idx = perm[s * B * pages_per_req:(s + 1) * B * pages_per_req].contiguous()
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(
            float_ws, use_cuda_graph=True, qo_indptr=torch.empty_like(qo_indptr),
            kv_indptr=torch.empty_like(kv_indptr), kv_indices=torch.empty_like(idx),
            kv_len_arr=torch.empty_like(kv_len), backend=args.backend)
        w.plan(qo_indptr, kv_indptr, idx, kv_len, H, CKV, KPE, page, True,
               1.0 / math.sqrt(192.0), torch.bfloat16, torch.bfloat16)
        qn = torch.empty(rows, H, CKV, dtype=torch.bfloat16, device=dev).uniform_(-2, 2, generator=g)
        qp = torch.empty(rows, H, KPE, dtype=torch.bfloat16, device=dev).uniform_(-2, 2, generator=g)
        wrappers.append(w)
        qs.append((qn, qp))
        outs.append(torch.empty(rows, H, CKV, dtype=torch.bfloat16, device=dev))

    def run_set(i):
        qn, qp = qs[i]
        wrappers[i].run(qn, qp, ckv, kpe, out=outs[i])

    ms, eager_ms = time_sets(run_set, sets, args.iters, args.warmup)
    return ms, eager_ms, sets  # the inputs are freed here; the caller empties the cache


def sanity_check(flashinfer, args, dev):
    """FlashInfer vs a float32 torch computation on a small chain shape (each page size):
    the relative L2 error of the output, so the timed calls are known to compute MLA."""
    B, H, q, ctx = 2, 8, 4, 300
    L = ctx + q
    g = torch.Generator(device=dev).manual_seed(7)
    errs = {}
    for page, layout in configs(args):
        per = -(-L // page)
        ckv, kpe = make_cache(B * per + 3, page, layout, dev, g)
        idx = torch.randperm(B * per + 3, device=dev, generator=g)[:B * per].int()
        qn = torch.empty(B * q, H, CKV, device=dev).uniform_(-2, 2, generator=g).bfloat16()
        qp = torch.empty(B * q, H, KPE, device=dev).uniform_(-2, 2, generator=g).bfloat16()
        scale = 1.0 / math.sqrt(192.0)
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(
            torch.empty(64 << 20, dtype=torch.int8, device=dev), backend=args.backend)
        w.plan(torch.arange(0, B + 1, dtype=torch.int32, device=dev) * q,
               torch.arange(0, B + 1, dtype=torch.int32, device=dev) * per, idx,
               torch.full((B,), L, dtype=torch.int32, device=dev), H, CKV, KPE, page, True,
               scale, torch.bfloat16, torch.bfloat16)
        out = w.run(qn, qp, ckv, kpe).float()
        num = den = 0.0
        for b in range(B):
            pages = idx[b * per:(b + 1) * per].long()
            k_c = ckv[pages].reshape(-1, CKV)[:L].float()
            k_p = kpe[pages].reshape(-1, KPE)[:L].float()
            qb_n = qn[b * q:(b + 1) * q].float()
            qb_p = qp[b * q:(b + 1) * q].float()
            s = (torch.einsum("thd,kd->thk", qb_n, k_c) +
                 torch.einsum("thd,kd->thk", qb_p, k_p)) * scale
            t = torch.arange(q, device=dev)[:, None, None]
            k = torch.arange(L, device=dev)[None, None, :]
            s = s.masked_fill(k > ctx + t, float("-inf"))      # causal chain
            ref = torch.einsum("thk,kd->thd", torch.softmax(s, -1), k_c)
            num += float(((out[b * q:(b + 1) * q] - ref) ** 2).sum())
            den += float((ref ** 2).sum())
        errs[f"{layout}/{page}"] = math.sqrt(num / den)
    return errs


def configs(args):
    pages = sorted({1, *(int(p) for p in args.page_sizes.split(",") if p)})
    return [(p, lay) for lay in args.layouts.split(",") if lay for p in pages]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="flashinfer_mla.json")
    add_timing_args(ap)
    ap.add_argument("--page-sizes", default="1,16,64",
                    help="page sizes to time; page size 1 is always included")
    # "joint" hit an illegal memory access inside FlashInfer 0.3.1 at 8/16/1/65536 on an H200
    # (and was within a few % of "separate" on the 13 shapes before it): not the default.
    ap.add_argument("--layouts", default="separate", help="latent cache layouts to time")
    ap.add_argument("--backend", default="fa3")
    ap.add_argument("--workspace-mb", type=int, default=256)
    add_run_args(ap)
    args = ap.parse_args()
    import flashinfer  # noqa: E402  (JIT-compiles its MLA module on first use)

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    if not set(args.layouts.split(",")) <= {"joint", "separate"}:
        sys.exit("--layouts: joint and/or separate")
    cfgs = configs(args)
    names = [f"{lay}/{p}" for p, lay in cfgs]
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    sanity = sanity_check(flashinfer, args, dev)
    print("sanity: FlashInfer vs float32 torch, rel L2 by layout/page size:", sanity, flush=True)
    if any(e > 2e-2 for e in sanity.values()):
        sys.exit("flashinfer_mla: the sanity check failed: not timing it")
    results = []
    print(f"{'B':>3} {'H':>4} {'q':>3} {'ctx':>7} " + " ".join(f"{n:>12}" for n in names) +
          f" {'best':>12}")
    for B, H, q, ctx in shapes:
        row = {"B": B, "H": H, "q": q, "ctx": ctx, "mask": "causal-chain", "by_config": {}}
        for (p, lay), name in zip(cfgs, names):
            ms, eager_ms, sets = time_shape(flashinfer, B, H, q, ctx, p, lay, args, dev)
            torch.cuda.empty_cache()
            row["by_config"][name] = {"ms": ms, "eager_ms": eager_ms, "sets": sets,
                                      "page_size": p, "layout": lay}
        by = row["by_config"]
        p1 = min((n for n in names if by[n]["page_size"] == 1), key=lambda n: by[n]["ms"])
        best = min(names, key=lambda n: by[n]["ms"])
        row.update(page_size=1, layout=by[p1]["layout"], ms=by[p1]["ms"],
                   eager_ms=by[p1]["eager_ms"], sets=by[p1]["sets"],
                   best_page_size=by[best]["page_size"], best_layout=by[best]["layout"],
                   best_ms=by[best]["ms"])
        print(f"{B:>3} {H:>4} {q:>3} {ctx:>7} " + " ".join(f"{by[n]['ms']:>12.4f}" for n in names) +
              f" {best:>12}", flush=True)
        row["mem_floor_ms"], row["compute_floor_ms"] = floors(B, H, q, ctx, args.copy_gbps,
                                                              args.mma_tflops)
        results.append(row)
    drv = args.nvidia_driver or None
    meta = {
        "commit": args.commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name, "cc": f"{props.major}.{props.minor}",
        "num_sms": props.multi_processor_count, "driver_version": drv,
        "runtime_version": torch.version.cuda, "torch": torch.__version__,
        "flashinfer": getattr(flashinfer, "__version__", "unknown"), "backend": args.backend,
        "layouts": args.layouts, "page_sizes": [p for p in sorted({p for p, _ in cfgs})],
        "timing": TIMING,
        "rotate_bytes": args.rotate_bytes, "iters": args.iters, "warmup": args.warmup,
        "copy_gbps": args.copy_gbps, "mma_tflops": args.mma_tflops,
        "sanity_rel_l2_by_layout_page_size": sanity,
    }
    with open(args.json, "w") as f:
        json.dump({"bench": "verify_attention", "impl": "flashinfer", "meta": meta,
                   "results": results}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
