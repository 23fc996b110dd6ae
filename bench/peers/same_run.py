"""What the MLA peer harnesses (flashinfer_mla.py, flashmla_mla.py) share with each other and
with bench/verify_attention_bench.cc: the 16 reference shapes, the input-set rotation, the
timing method and the floors, so that every implementation of a run is timed the same way.

  - input sets rotated so that their KV spans >= rotate_bytes (L2 never holds it): sets =
    clamp(ceil(rotate_bytes / (B * (ctx + q) * 576 * 2)), 2, 64);
  - one CUDA graph runs every input set once; per-call time = graph time / sets; the median
    of `iters` graph replays after `warmup`; plus the eager median of single calls.
"""
import statistics
import sys

import torch

SHAPES = [  # B, H, q, ctx: the 16 reference shapes (docs/PERF.md)
    (1, 8, 16, 4096), (1, 8, 16, 16384), (1, 8, 16, 65536), (1, 8, 16, 185000),
    (1, 16, 16, 65536), (1, 16, 16, 185000), (8, 16, 16, 16384), (8, 16, 16, 65536),
    (1, 16, 64, 65536), (32, 16, 16, 8192),
    (1, 8, 1, 65536), (1, 8, 1, 185000), (1, 16, 1, 185000), (8, 16, 1, 65536),
    (32, 16, 1, 16384), (64, 128, 1, 4096),
]
QK, CKV, KPE = 576, 512, 64
TIMING = ("inputs rotated over >= rotate_bytes of KV; one CUDA graph runs every input set "
          "once; per-call = graph time / sets; median of iters replays")


def parse_shapes(text):
    out = []
    for item in filter(None, text.split(",")):
        f = item.split(":")
        if len(f) != 4:
            sys.exit(f"--shapes: '{item}' is not B:H:q:ctx")
        out.append(tuple(int(x) for x in f))
    return out


def num_sets(B, q, ctx, rotate_bytes):
    set_bytes = B * (ctx + q) * QK * 2
    return int(min(max(-(-rotate_bytes // set_bytes), 2), 64))


def floors(B, H, q, ctx, copy_gbps, mma_tflops):
    """(memory floor ms, compute floor ms) of a shape, as verify_attention_bench defines them."""
    kv_bytes = B * (ctx + q) * QK * 2
    flops = 2.0 * B * q * H * (ctx + q) * (QK + CKV)
    return kv_bytes / (copy_gbps * 1e9) * 1e3, flops / (mma_tflops * 1e12) * 1e3


def time_sets(run_set, sets, iters, warmup):
    """Median per-call ms over graph replays that run run_set(0..sets-1) once each, and the
    eager median of single calls (set i % sets). The inputs, made on the default stream, are
    finished before the side stream's first call (a peer that reads them on the GPU at its
    first call, e.g. to make a schedule, would otherwise read them unwritten)."""
    def run_all():
        for s in range(sets):
            run_set(s)

    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):                     # warm-up outside capture (JIT, lazy init)
            run_all()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run_all()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / sets)
    eager = []
    for i in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run_set(i % sets)
        b.record()
        b.synchronize()
        eager.append(a.elapsed_time(b))
    del graph
    return statistics.median(times), statistics.median(eager)
