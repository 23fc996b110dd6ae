#!/usr/bin/env python3
"""FlashMLA's dense bf16 decode kernel, timed exactly as verify_attention_bench times verifyd.

A same-run peer for bench/verify_attention_bench.cc, like bench/peers/flashinfer_mla.py: the
same 16 reference shapes (B requests, H heads on one rank, q query rows per request, ctx
context tokens), the same inputs (bf16 latent cache 512 + 64 as one 1152-byte row per token,
each request's pages scattered at random over a pool) and the same timing method:
  - input sets rotated so that their KV spans >= --rotate-bytes (L2 never holds it): sets =
    clamp(ceil(rotate_bytes / (B * (ctx + q) * 576 * 2)), 2, 64), as verifyd's bench;
  - one CUDA graph runs every input set once; per-call time = graph time / sets; the median
    of --iters graph replays after --warmup.
FlashMLA (deepseek-ai/FlashMLA, flash_mla_with_kvcache, sm_90a) supports page size 64 only
and a causal chain only (no tree mask): the q rows of a request are a chain, which is what
verifyd's bench runs too; its H query heads share the one latent KV head. Each call includes
FlashMLA's split combine; its tile-scheduler metadata is made once per input set, on the
first (untimed) call, as its interface intends. The output of each timed shape is checked
against a float32 torch computation ("rel_l2" in the JSON).

--kv-dtype fp8 times FlashMLA's FP8 latent cache instead, which it has only in its sparse decode
(flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...), sm_90a kernel
sparse_fp8/v32_persistent_h64/h128): the cache in the 656-byte format of kernels/kv_fp8.h
(FlashMLA's "V3.2" FP8 format, byte for byte), quantized from the same random values, as
(pages, 64, 1, 656) uint8. Each shape is mapped onto that interface: the q * H rows of a
request become s_q = ceil(q * H / h_q) query tokens of h_q heads (h_q = 128 when q * H >= 128,
its CTA pair sharing the dequantization through a cluster, else 64; the rows past q * H are
zeros), and each of them gets as its sparse indices every one of the request's L = ctx + q keys
(page index * 64 + offset; -1 pads the list to FlashMLA's multiple of 64). The sparse path has
no mask: every row sees all L keys (verifyd's chain mask hides at most q - 1 of them). FlashMLA
reads the keys once per query token (s_q times). Sets are rotated over 656 bytes a key; the
memory floor counts 656 bytes a key; the check is against a float32 computation over the
dequantized values (FlashMLA rounds each float32 scale to bf16 and dequantizes into bf16 for
its bf16 MMAs: expect rel_l2 ~5e-3).

FlashMLA is not a PyPI package: bench/peers/build_flashmla.sh builds its dense decode (and the
sparse FP8 decode) from a FlashMLA checkout into a folder to put on PYTHONPATH. Writes JSON
(--json) in the schema of verify_attention_bench ("impl": "flashmla", or "flashmla-sparse-fp8"
with --kv-dtype fp8), prints a table. A program, not a test: it asserts nothing about speed.
"""
import argparse
import datetime
import json
import math
import sys

import torch

from same_run import (BF16_KEY_BYTES, CKV, FP8_KEY_BYTES, QK, SHAPES, TIMING, add_run_args,
                      add_timing_args, floors, fp8_decode, fp8_encode, num_sets, parse_shapes,
                      time_sets)

PAGE = 64            # the only page size FlashMLA's dense decode takes
SCALE = 1.0 / math.sqrt(192.0)


def time_shape(fm, B, H, q, ctx, args, dev):
    """Median per-call ms of the graph-timed run, and the eager median."""
    L = ctx + q                              # keys per request: context + its own q rows
    per = -(-L // PAGE)
    sets = num_sets(B, q, ctx, args.rotate_bytes)
    total_pages = B * per * sets
    g = torch.Generator(device=dev).manual_seed(12345)
    kv = torch.empty(total_pages, PAGE, 1, QK, dtype=torch.bfloat16,
                     device=dev).uniform_(-1, 1, generator=g)
    perm = torch.randperm(total_pages, device=dev, generator=g).int()
    seqlens = torch.full((B,), L, dtype=torch.int32, device=dev)
    causal = q > 1
    calls = []
    for s in range(sets):
        table = perm[s * B * per:(s + 1) * B * per].reshape(B, per).contiguous()
        qt = torch.empty(B, q, H, QK, dtype=torch.bfloat16, device=dev).uniform_(-2, 2, generator=g)
        meta, _ = fm.get_mla_metadata()
        calls.append((qt, table, meta))

    def run_set(i):
        qt, table, meta = calls[i]
        fm.flash_mla_with_kvcache(qt, kv, table, seqlens, CKV, meta, softmax_scale=SCALE,
                                  causal=causal)

    # The first call of each set makes FlashMLA's tile-scheduler metadata from cache_seqlens
    # on the GPU: time_sets finishes the inputs before it (otherwise it may read the lengths
    # unwritten, and every later call of that set runs a wrong schedule).
    ms, eager_ms = time_sets(run_set, sets, args.iters, args.warmup)
    qt, table, meta = calls[0]               # the timed call's output, checked at this shape
    out, _ = fm.flash_mla_with_kvcache(qt, kv, table, seqlens, CKV, meta, softmax_scale=SCALE,
                                       causal=causal)
    err = rel_l2(out, qt, kv, table, ctx, q)
    return ms, eager_ms, sets, err  # the inputs are freed here; the caller empties the cache


def rel_l2(out, qt, kv, table, ctx, q):
    """Relative L2 error of FlashMLA's output against a float32 torch computation of causal-
    chain MLA over the same bf16 inputs (B, q, H, 512)."""
    L = ctx + q
    num = den = 0.0
    for b in range(qt.shape[0]):
        k = kv[table[b].long()].reshape(-1, QK)[:L].float()
        s = torch.einsum("thd,kd->thk", qt[b].float(), k) * SCALE
        t = torch.arange(q, device=k.device)[:, None, None]
        j = torch.arange(L, device=k.device)[None, None, :]
        s = s.masked_fill(j > ctx + t, float("-inf"))      # causal chain
        ref = torch.einsum("thk,kd->thd", torch.softmax(s, -1), k[:, :CKV])
        num += float(((out[b].float() - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return math.sqrt(num / den)


def sanity_check(fm, dev):
    """FlashMLA vs a float32 torch computation on small chain and decode shapes: the relative
    L2 error of the output, so the timed calls are known to compute MLA."""
    errs = {}
    g = torch.Generator(device=dev).manual_seed(7)
    for B, H, q, ctx in [(2, 8, 4, 300), (3, 16, 1, 1000), (1, 128, 2, 130)]:
        L = ctx + q
        per = -(-L // PAGE)
        kv = torch.empty(B * per + 3, PAGE, 1, QK, device=dev).uniform_(-1, 1, generator=g).bfloat16()
        table = torch.randperm(B * per + 3, device=dev, generator=g)[:B * per].int().reshape(B, per)
        qt = torch.empty(B, q, H, QK, device=dev).uniform_(-2, 2, generator=g).bfloat16()
        meta, _ = fm.get_mla_metadata()
        torch.cuda.synchronize()
        out, _ = fm.flash_mla_with_kvcache(qt, kv, table, torch.full((B,), L, dtype=torch.int32,
                                           device=dev), CKV, meta, softmax_scale=SCALE,
                                           causal=q > 1)
        errs[f"{B}/{H}/{q}/{ctx}"] = rel_l2(out, qt, kv, table, ctx, q)
    return errs


FP8_MASK = "none (sparse indices = all keys)"


def sparse_geometry(H, q, ctx):
    """(h_q, s_q, topk) of the sparse FP8 call for one request of q * H rows over L keys."""
    rows = q * H
    h_q = 128 if rows >= 128 else 64
    return h_q, -(-rows // h_q), -(-(ctx + q) // PAGE) * PAGE


def fp8_pool(pages, dev, g):
    """(pages, 64, 1, 656) uint8: random latent rows (uniform(-1, 1) rounded to bf16, as
    verify_attention_bench makes them) stored in the FP8 format."""
    kv = torch.empty(pages * PAGE, FP8_KEY_BYTES, dtype=torch.uint8, device=dev)
    step = 1 << 16
    for r0 in range(0, pages * PAGE, step):
        n = min(step, pages * PAGE - r0)
        rows = torch.empty(n, QK, device=dev).uniform_(-1, 1, generator=g).bfloat16().float()
        kv[r0:r0 + n] = fp8_encode(rows)
    return kv.reshape(pages, PAGE, 1, FP8_KEY_BYTES)


def sparse_inputs(table, H, q, ctx, dev, g):
    """(q as (B, s_q, h_q, 576) bf16 with zero padding rows, the q * H rows as (B, q, H, 576),
    indices (B, s_q, topk) int32) for requests whose pages are `table` (B, pages)."""
    B = table.shape[0]
    h_q, s_q, topk = sparse_geometry(H, q, ctx)
    L = ctx + q
    rows = torch.empty(B, q, H, QK, dtype=torch.bfloat16, device=dev).uniform_(-2, 2, generator=g)
    qt = torch.zeros(B, s_q * h_q, QK, dtype=torch.bfloat16, device=dev)
    qt[:, :q * H] = rows.reshape(B, q * H, QK)
    j = torch.arange(topk, device=dev)
    idx = table.long()[:, j // PAGE] * PAGE + j % PAGE                 # (B, topk)
    idx = idx.masked_fill(j >= L, -1).int()
    idx = idx[:, None, :].expand(B, s_q, topk).contiguous()
    return qt.reshape(B, s_q, h_q, QK), rows, idx


def sparse_out_rows(out, H, q):
    """FlashMLA's sparse output (B, s_q, h_q, 512) as the q * H real rows (B, q, H, 512)."""
    B = out.shape[0]
    return out.reshape(B, -1, CKV)[:, :q * H].reshape(B, q, H, CKV)


def time_shape_fp8(fm, B, H, q, ctx, args, dev):
    """time_shape for the sparse FP8 decode: median per-call ms of the graph-timed run, the
    eager median, the number of sets, the rel L2 error of the timed shape."""
    L = ctx + q
    per = -(-L // PAGE)
    sets = num_sets(B, q, ctx, args.rotate_bytes, FP8_KEY_BYTES)
    total_pages = B * per * sets
    g = torch.Generator(device=dev).manual_seed(12345)
    kv = fp8_pool(total_pages, dev, g)
    perm = torch.randperm(total_pages, device=dev, generator=g).int()
    calls = []
    for s in range(sets):
        table = perm[s * B * per:(s + 1) * B * per].reshape(B, per).contiguous()
        qt, rows, idx = sparse_inputs(table, H, q, ctx, dev, g)
        meta, _ = fm.get_mla_metadata()
        calls.append((qt, rows, idx, table, meta))

    def run_set(i):
        qt, _, idx, _, meta = calls[i]
        fm.flash_mla_with_kvcache(qt, kv, None, None, CKV, meta, softmax_scale=SCALE,
                                  is_fp8_kvcache=True, indices=idx)

    # As for bf16: the first call of each set makes its tile-scheduler metadata (from topk).
    ms, eager_ms = time_sets(run_set, sets, args.iters, args.warmup)
    qt, rows, idx, table, meta = calls[0]
    out, _ = fm.flash_mla_with_kvcache(qt, kv, None, None, CKV, meta, softmax_scale=SCALE,
                                       is_fp8_kvcache=True, indices=idx)
    err = rel_l2_fp8(sparse_out_rows(out, H, q), rows, kv, table, L)
    return ms, eager_ms, sets, err


def rel_l2_fp8(out, rows, kv, table, L):
    """Relative L2 error of FlashMLA's output (B, q, H, 512) against a float32 torch
    computation of MLA without a mask (every row sees all L keys) over the dequantized FP8
    keys."""
    num = den = 0.0
    for b in range(rows.shape[0]):
        k = fp8_decode(kv[table[b].long()].reshape(-1, FP8_KEY_BYTES)[:L])
        s = torch.einsum("thd,kd->thk", rows[b].float(), k) * SCALE
        ref = torch.einsum("thk,kd->thd", torch.softmax(s, -1), k[:, :CKV])
        num += float(((out[b].float() - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return math.sqrt(num / den)


def sanity_check_fp8(fm, dev):
    """sanity_check for the sparse FP8 decode (h_q 64 and 128, s_q 1 and 2)."""
    errs = {}
    g = torch.Generator(device=dev).manual_seed(7)
    for B, H, q, ctx in [(2, 8, 4, 300), (3, 16, 1, 1000), (1, 128, 2, 130)]:
        L = ctx + q
        per = -(-L // PAGE)
        kv = fp8_pool(B * per + 3, dev, g)
        table = torch.randperm(B * per + 3, device=dev, generator=g)[:B * per].int().reshape(B, per)
        qt, rows, idx = sparse_inputs(table, H, q, ctx, dev, g)
        meta, _ = fm.get_mla_metadata()
        torch.cuda.synchronize()
        out, _ = fm.flash_mla_with_kvcache(qt, kv, None, None, CKV, meta, softmax_scale=SCALE,
                                           is_fp8_kvcache=True, indices=idx)
        errs[f"{B}/{H}/{q}/{ctx}"] = rel_l2_fp8(sparse_out_rows(out, H, q), rows, kv, table, L)
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None,
                    help="output; default flashmla_mla.json (bf16), flashmla_mla_fp8.json (fp8)")
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                    help="bf16: the dense decode (causal chain); fp8: the sparse FP8 decode")
    add_timing_args(ap)
    add_run_args(ap, peer_revision=("--flashmla-commit", "FlashMLA source revision"))
    args = ap.parse_args()
    import flash_mla as fm  # noqa: E402  (built by bench/peers/build_flashmla.sh)

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    if args.kv_dtype == "fp8":
        run(fm, args, dev, props, shapes, impl="flashmla-sparse-fp8",
            json_default="flashmla_mla_fp8.json", sanity=sanity_check_fp8,
            sanity_what="FlashMLA sparse FP8 vs float32 torch over the dequantized keys",
            time_fn=time_shape_fp8, key_bytes=FP8_KEY_BYTES, row_fields=fp8_row_fields,
            print_fields=("h_q", "s_q"), meta_fields=FP8_META)
    else:
        run(fm, args, dev, props, shapes, impl="flashmla", json_default="flashmla_mla.json",
            sanity=sanity_check, sanity_what="FlashMLA vs float32 torch", time_fn=time_shape,
            key_bytes=BF16_KEY_BYTES,
            row_fields=lambda H, q, ctx: {"mask": "causal-chain", "page_size": PAGE},
            print_fields=(), meta_fields={})


# The FP8 mode's extra JSON fields: per shape (after B, H, q, ctx) and in meta.
def fp8_row_fields(H, q, ctx):
    h_q, s_q, topk = sparse_geometry(H, q, ctx)
    return {"mask": FP8_MASK, "page_size": PAGE, "kv_dtype": "fp8", "h_q": h_q, "s_q": s_q,
            "topk": topk, "padded_rows": s_q * h_q, "kv_passes": s_q}


FP8_META = {
    "kv_dtype": "fp8", "kv_key_bytes": FP8_KEY_BYTES,
    "kernel": "flash_mla_with_kvcache(is_fp8_kvcache=True, indices=...): sparse FP8 decode "
              "(sm90 sparse_fp8, V3.2 format), then its split combine",
    "mapping": "q*H rows of a request -> s_q = ceil(q*H/h_q) query tokens of h_q heads "
               "(h_q 128 if q*H >= 128 else 64; padding rows zero); indices = all L = ctx+q "
               "keys of the request for each token (-1 pads to a multiple of 64); no mask",
    "mask": FP8_MASK,
    "floors": "memory floor over 656 bytes a key; compute floor over the q*H real rows",
}


def run(fm, args, dev, props, shapes, *, impl, json_default, sanity, sanity_what, time_fn,
        key_bytes, row_fields, print_fields, meta_fields):
    """Sanity check, time every shape, print the table, write the JSON: the same for both
    modes but for the callables and extra fields passed in."""
    args.json = args.json or json_default
    errs = sanity(fm, dev)
    print(f"sanity: {sanity_what}, rel L2 by B/H/q/ctx:", errs, flush=True)
    if any(not (e <= 2e-2) for e in errs.values()):
        sys.exit("flashmla_mla: the sanity check failed: not timing it")
    results = []
    print(f"{'B':>3} {'H':>4} {'q':>3} {'ctx':>7} " + "".join(f"{k:>4} " for k in print_fields)
          + f"{'ms':>10} {'eager ms':>10} {'sets':>5} {'rel L2':>9}")
    for B, H, q, ctx in shapes:
        extra = row_fields(H, q, ctx)
        ms, eager_ms, sets, err = time_fn(fm, B, H, q, ctx, args, dev)
        torch.cuda.empty_cache()
        mem_floor, compute_floor = floors(B, H, q, ctx, args.copy_gbps, args.mma_tflops,
                                          key_bytes)
        results.append({"B": B, "H": H, "q": q, "ctx": ctx, **extra, "ms": ms,
                        "eager_ms": eager_ms, "sets": sets, "rel_l2": err,
                        "mem_floor_ms": mem_floor, "compute_floor_ms": compute_floor})
        print(f"{B:>3} {H:>4} {q:>3} {ctx:>7} " + "".join(f"{extra[k]:>4} " for k in print_fields)
              + f"{ms:>10.4f} {eager_ms:>10.4f} {sets:>5} {err:>9.2e}", flush=True)
    meta = {
        "commit": args.commit, "flashmla_commit": args.flashmla_commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name, "cc": f"{props.major}.{props.minor}",
        "num_sms": props.multi_processor_count, "driver_version": args.nvidia_driver or None,
        "runtime_version": torch.version.cuda, "torch": torch.__version__,
        "page_size": PAGE, **meta_fields,
        "timing": TIMING,
        "rotate_bytes": args.rotate_bytes, "iters": args.iters, "warmup": args.warmup,
        "copy_gbps": args.copy_gbps, "mma_tflops": args.mma_tflops,
        "sanity_rel_l2": errs,
    }
    with open(args.json, "w") as f:
        json.dump({"bench": "verify_attention", "impl": impl, "meta": meta,
                   "results": results}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
