"""What the MLA peer harnesses (flashinfer_mla.py, flashmla_mla.py) share with each other and
with bench/verify_attention_bench.cc: the 16 reference shapes, the input-set rotation, the
timing method and the floors, so that every implementation of a run is timed the same way.

  - input sets rotated so that their KV spans >= rotate_bytes (L2 never holds it): sets =
    clamp(ceil(rotate_bytes / (B * (ctx + q) * key_bytes)), 2, 64), key_bytes = 576 * 2 for
    the bf16 cache, FP8_KEY_BYTES (656) for the FP8 one;
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
BF16_KEY_BYTES = QK * 2
# The FP8 latent cache (kernels/kv_fp8.h; FlashMLA's "V3.2" FP8 format, byte for byte): per key
# 512 e4m3 codes, 4 float32 scales (one per 128 columns: max(amax, 1e-10) / 448; value = e4m3 *
# scale), 64 bf16 rope values.
FP8_GROUP = 128
FP8_KEY_BYTES = CKV + 4 * (CKV // FP8_GROUP) + 2 * KPE  # 656
TIMING = ("inputs rotated over >= rotate_bytes of KV; one CUDA graph runs every input set "
          "once; per-call = graph time / sets; median of iters replays")


def add_timing_args(ap):
    """--iters, --warmup, --rotate-bytes: how every peer of a run is timed (time_sets)."""
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rotate-bytes", type=int, default=512 << 20)


def add_run_args(ap, peer_revision=None):
    """--shapes, what the JSON records of the run (--commit, the peer's own source revision
    when peer_revision = (flag, help) names one, --nvidia-driver) and the floors' rates
    (--copy-gbps, --mma-tflops)."""
    ap.add_argument("--shapes", default="", help="B:H:q:ctx[,...] instead of the 16 shapes")
    ap.add_argument("--commit", default="unknown", help="verifyd commit of the same run")
    if peer_revision:
        flag, help_text = peer_revision
        ap.add_argument(flag, default="unknown", help=help_text)
    ap.add_argument("--nvidia-driver", default="", help="driver version (nvidia-smi) to record")
    ap.add_argument("--copy-gbps", type=float, default=4242.0)
    ap.add_argument("--mma-tflops", type=float, default=790.0)


def parse_shapes(text):
    out = []
    for item in filter(None, text.split(",")):
        f = item.split(":")
        if len(f) != 4:
            sys.exit(f"--shapes: '{item}' is not B:H:q:ctx")
        out.append(tuple(int(x) for x in f))
    return out


def num_sets(B, q, ctx, rotate_bytes, key_bytes=BF16_KEY_BYTES):
    set_bytes = B * (ctx + q) * key_bytes
    return int(min(max(-(-rotate_bytes // set_bytes), 2), 64))


def floors(B, H, q, ctx, copy_gbps, mma_tflops, key_bytes=BF16_KEY_BYTES):
    """(memory floor ms, compute floor ms) of a shape, as verify_attention_bench defines them
    (key_bytes: bytes of one cached key, BF16_KEY_BYTES or FP8_KEY_BYTES)."""
    kv_bytes = B * (ctx + q) * key_bytes
    flops = 2.0 * B * q * H * (ctx + q) * (QK + CKV)
    return kv_bytes / (copy_gbps * 1e9) * 1e3, flops / (mma_tflops * 1e12) * 1e3


def fp8_encode(rows):
    """Latent rows (N, 576), float32 on the GPU, stored in the FP8 format: (N, 656) uint8, as
    kernels/kv_fp8.h KvFp8EncodeRow writes them (group scales max(amax, 1e-10) / 448; codes the
    nearest e4m3, ties to even, saturating at +-448; rope rounded to bf16)."""
    n = rows.shape[0]
    c = rows[:, :CKV].float().reshape(n, CKV // FP8_GROUP, FP8_GROUP)
    scale = c.abs().amax(-1).clamp_min(1e-10) / 448.0                    # (N, 4) float32
    codes = (c / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    out = torch.empty(n, FP8_KEY_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, :CKV] = codes.reshape(n, CKV).view(torch.uint8)
    out[:, CKV:CKV + 16] = scale.contiguous().view(torch.uint8)
    out[:, CKV + 16:] = rows[:, CKV:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def fp8_decode(stored):
    """The dequantized rows (N, 576) float32 of FP8-format rows (N, 656) uint8 (what
    kernels/kv_fp8.h KvFp8DecodeRow returns: e4m3 * scale, rope as bf16)."""
    n = stored.shape[0]
    codes = stored[:, :CKV].contiguous().view(torch.float8_e4m3fn).float()
    scale = stored[:, CKV:CKV + 16].contiguous().view(torch.float32)     # (N, 4)
    rope = stored[:, CKV + 16:].contiguous().view(torch.bfloat16).float()
    c = (codes.reshape(n, CKV // FP8_GROUP, FP8_GROUP) * scale[..., None]).reshape(n, CKV)
    return torch.cat([c, rope], 1)


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
