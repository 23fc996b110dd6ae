#!/usr/bin/env python3
"""Generates the benchmark tables of docs/PERF.md from the raw JSON under bench/results/.

Every table in docs/PERF.md that quotes a benchmark sits between two markers

    <!-- perf_report: NAME -->
    ...generated...
    <!-- /perf_report: NAME -->

and NAME is a table of bench/results/tables.json, which names the JSON files of one GPU run
(verifyd's bench, the same-run peers, an optional labelled reference). This script rewrites
those blocks (default) or checks that they match (--check, run by CTest on every CI build), so
prose and numbers cannot drift apart: to change a number, add a run's JSON and regenerate.

Table kinds:
  verify_attention  verifyd (bench/verify_attention_bench --json) against FlashMLA
                    (bench/peers/flashmla_mla.py --json) and FlashInfer
                    (bench/peers/flashinfer_mla.py --json) of the SAME run, plus optional
                    reference columns (measured elsewhere, labelled as such).
  engine            the CUDA engine step (bench/engine/engine_bench --json).
  engine_extras     engine_bench --extras: plain steps vs the same steps with sampling,
                    logprobs and hidden states.
  engine_slice      engine_bench of one tensor-parallel rank run alone (the other ranks
                    absent): its measured step, the modeled time of the collectives it recorded
                    (tp/comm_model.h) and the step with them; rows that do not fit one GPU say so.
  moe_layer         one MoE layer at Kimi-K2's dimensions (bench/moe_layer_bench --json), with
                    PyTorch's grouped GEMMs of the same run (bench/peers/torch_grouped_moe.py).
  verify_attention_change, engine_change, moe_layer_change
                    the same benchmark of two builds in one GPU run (before / after a change).
  kv_fp8_accuracy   bench/kv_fp8_accuracy (CPU): the FP8 latent KV format's attention error
                    for two scale layouts, and the CPU engine's greedy tokens with it.
  fp8_numerics      bench/fp8_attention_numerics (CPU): the error that kernel arithmetic adds
                    to the FP8 cache (shipped kernels and an e4m3 tensor-core design).
  bf16_floor        bench/transformers_bf16_floor.py: transformers in bfloat16 against its own
                    float32 logits on the reference checkpoints.
Only the Python standard library: runs on the CI machine.
"""
import argparse
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return json.load(f)


def key(r):
    return (r["B"], r["H"], r["q"], r["ctx"])


def fmt_ms(x):
    return "–" if x is None else f"{x:.4f}"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}x"


def pct(floor_ms, ms):
    return "–" if not ms else f"{100.0 * floor_ms / ms:.0f} %"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def meta_line(name, d, path):
    m = d.get("meta", {})
    parts = [f"**{name}**: `{path}`", m.get("device", "?"), m.get("date", "?"),
             f"commit `{m.get('commit', '?')}`"]
    drv = m.get("driver_version")
    if isinstance(drv, int) and drv:
        parts.append(f"CUDA driver API {drv // 1000}.{drv % 1000 // 10}")
    elif drv:
        parts.append(f"driver {drv}")
    if m.get("sm_clock_mhz"):
        parts.append(f"SM clock {m['sm_clock_mhz']} MHz")
    for k in ("flashinfer", "flashmla_commit", "backend", "source"):
        if m.get(k):
            parts.append(f"{k} {m[k]}")
    return "- " + ", ".join(str(p) for p in parts)


def verify_attention_table(spec):
    vd = load(spec["verifyd"])
    fi = load(spec["flashinfer"]) if spec.get("flashinfer") else None
    fm = load(spec["flashmla"]) if spec.get("flashmla") else None
    refs = [(r["label"], load(r["file"]), r["file"]) for r in spec.get("references", [])]
    fi_rows = {key(r): r for r in fi["results"]} if fi else {}
    fm_rows = {key(r): r for r in fm["results"]} if fm else {}
    ref_rows = [{key(r): r for r in d["results"]} for _, d, _ in refs]
    peers = fi or fm
    # The FP8 latent cache (verify_attention_bench --kv_dtype=fp8): FlashMLA's FP8 peer is its
    # sparse decode over every key (bench/peers/flashmla_mla.py --kv-dtype fp8); an optional
    # same-run column of verifyd with the bf16 cache ("verifyd_bf16").
    fp8 = vd.get("meta", {}).get("kv_dtype") == "fp8"
    vb = load(spec["verifyd_bf16"]) if spec.get("verifyd_bf16") else None
    vb_rows = {key(r): r for r in vb["results"]} if vb else {}
    out = []
    head = ["B", "H", "q", "ctx", "verifyd FP8 ms (page 1, tree)" if fp8 else
            "verifyd ms (page 1, tree)"]
    if vb:
        head += ["verifyd bf16 ms", "FP8 speed vs bf16"]
    if fm:
        head += ["FlashMLA FP8 ms (sparse, all keys, page 64)" if fp8 else "FlashMLA ms (page 64)"]
    if fi:
        head += ["FlashInfer ms (page 1)", "FlashInfer best ms (page, layout)"]
    head += [f"{label} ms" for label, _, _ in refs]
    if peers:
        head += ["verifyd vs best same-run peer"]
    if refs:
        head += ["verifyd vs best ref. peer"]
    head += ["verifyd % of floor"]
    if peers:
        head += ["best same-run peer % of floor"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    ratios, ref_ratios, ahead, ahead_ref = [], [], 0, 0
    for r in vd["results"]:
        k = key(r)
        floor = max(r["mem_floor_ms"], r["compute_floor_ms"])
        cells = [str(r["B"]), str(r["H"]), str(r["q"]), f"{r['ctx']:,}", fmt_ms(r["ms"])]
        if vb:
            b = vb_rows.get(k)
            cells += [fmt_ms(b["ms"]) if b else "–",
                      fmt_ratio(b["ms"] / r["ms"]) if b else "–"]
        same_run = []
        if fm:
            m = fm_rows.get(k)
            cells.append(fmt_ms(m["ms"]) if m else "–")
            if m:
                same_run.append(m["ms"])
        if fi:
            f = fi_rows.get(k)
            if f:
                same_run.append(min(f["ms"], f.get("best_ms", f["ms"])))
                where = f"page {f.get('best_page_size')}"
                if f.get("best_layout"):
                    where += f", {f['best_layout']}"
                cells += [fmt_ms(f["ms"]), f"{fmt_ms(f.get('best_ms'))} ({where})"]
            else:
                cells += ["–", "–"]
        peer_ms = min(same_run) if same_run else None
        ref_ms = [rows.get(k, {}).get("ms") for rows in ref_rows]
        cells += [fmt_ms(x) for x in ref_ms]
        if peers:
            ratio = peer_ms / r["ms"] if peer_ms else None
            if ratio:
                ratios.append(ratio)
                ahead += ratio >= 1.0
            cells.append(fmt_ratio(ratio))
        if refs:
            known = [x for x in ref_ms if x]
            rr = min(known) / r["ms"] if known else None
            if rr:
                ref_ratios.append(rr)
                ahead_ref += rr >= 1.0
            cells.append(fmt_ratio(rr))
        cells.append(pct(floor, r["ms"]))
        if peers:
            cells.append(pct(floor, peer_ms))
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if ratios:
        out.append(f"Same run: verifyd is at or ahead of the faster peer on {ahead} of "
                   f"{len(ratios)} shapes (geomean {fmt_ratio(geomean(ratios))}).")
    if ref_ratios:
        out.append(f"Against the faster reference peer ({', '.join(l for l, _, _ in refs)}): at "
                   f"or ahead on {ahead_ref} of {len(ref_ratios)} shapes (geomean "
                   f"{fmt_ratio(geomean(ref_ratios))}).")
    if spec.get("references_note"):
        out.append(spec["references_note"] + ".")
    out.append("")
    out.append("Sources (raw JSON):")
    out.append(meta_line("verifyd", vd, spec["verifyd"]))
    if vb:
        out.append(meta_line("verifyd, bf16 cache (same run)", vb, spec["verifyd_bf16"]))
    if fm:
        out.append(meta_line("FlashMLA (same run)", fm, spec["flashmla"]))
        errs = [x.get("rel_l2") for x in fm["results"] if x.get("rel_l2") is not None]
        if errs:
            out.append(f"  - FlashMLA's output at every timed shape against float32 torch: rel "
                       f"L2 <= {max(errs):.1e}")
    if fi:
        out.append(meta_line("FlashInfer (same run)", fi, spec["flashinfer"]))
    for label, d, path in refs:
        out.append(meta_line(label, d, path))
    m = vd.get("meta", {})
    if m.get("timing"):
        out.append(f"- timing: {m['timing']}")
    if m.get("copy_gbps"):
        out.append(f"- floors: memory = ctx x {656 if fp8 else 1152} B / "
                   f"{m['copy_gbps']:.0f} GB/s, compute = "
                   f"ctx x q x H x 1088 x 2 FLOP / {m.get('mma_tflops', 790):.0f} TFLOP/s; "
                   "% of floor = larger floor / time")
    return "\n".join(out)


def engine_table(spec):
    d = load(spec["engine"])
    out = []
    head = ["context", "nodes", "batch", "step ms", "tokens/s", "GPU ms", "attention ms",
            "GEMM ms", "comm ms", "other ms", "host ms", "in-engine / standalone attention"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in d["rows"]:
        per_layer = r.get("attention_per_layer_us")
        alone = r.get("standalone_kernel_us")
        ratio = per_layer / alone if per_layer and alone else None
        out.append("| " + " | ".join([
            f"{r['context']:,}", str(r["nodes"]), str(r["batch"]), f"{r['step_ms']:.2f}",
            f"{r['tokens_per_s']:.0f}", f"{r['gpu_ms']:.2f}", f"{r['attention_ms']:.2f}",
            f"{r['gemm_ms']:.2f}", f"{r['comm_ms']:.2f}", f"{r['other_ms']:.2f}",
            f"{r['host_ms']:.2f}", fmt_ratio(ratio)]) + " |")
    out.append("")
    m = d.get("meta", {})
    out.append(f"Model `{d.get('model')}`, {d.get('layers')} layers, TP {d.get('tp', 1)}. "
               "Source (raw JSON):")
    out.append(meta_line("engine_bench", d, spec["engine"]))
    return "\n".join(out)


def engine_extras_table(spec):
    """engine_bench --extras: the same steps plain and with seeded sampling, top-5 logprobs and
    three hidden layers, same process."""
    d = load(spec["engine"])
    out = ["| context | nodes | batch | plain step ms | with sampling + logprobs + hidden ms | "
           "added |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if not r.get("extras_step_ms"):
            continue
        out.append(f"| {r['context']:,} | {r['nodes']} | {r['batch']} | {r['step_ms']:.2f} | "
                   f"{r['extras_step_ms']:.2f} | "
                   f"{100.0 * (r['extras_step_ms'] / r['step_ms'] - 1):+.1f} % |")
    out += ["", f"Model `{d.get('model')}`, {d.get('layers')} layers, TP {d.get('tp', 1)}. "
            "Source (raw JSON):", meta_line("engine_bench --extras", d, spec["engine"])]
    return "\n".join(out)


ENGINE_SLICE_FIELDS = (
    "step_ms", "modeled_comm_ms", "step_with_comm_ms", "tokens_per_s_gpu", "tokens_per_s_host",
    "attention_ms", "gemm_ms", "router_ms", "dispatch_ms", "experts_ms", "sampling_ms",
    "other_ms", "distinct_experts", "floor_ms", "host_ms")


def engine_slice_table(spec):
    """engine_bench of one rank of a TP group run alone: the rank's measured step, the modeled
    time of its recorded collectives (comm_model) and the step with them. Throughputs are the
    JSON's own fields (not recomputed here). Rows with "fits": false print "does not fit"."""
    path = spec["engine"]
    d = load(path)
    for k in ("slice", "comm_model", "rows"):
        if k not in d:
            sys.exit(f"perf_report: {path}: engine_slice JSON lacks '{k}'")
    head = ["context", "nodes", "batch", "step ms", "modeled comm ms", "step + comm ms",
            "tokens/s per GPU", "tokens/s per 8-GPU host", "attention ms", "dense GEMM ms",
            "router ms", "dispatch ms", "experts ms", "sampling ms", "other ms",
            "distinct experts", "floor ms", "% of floor", "host ms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(d["rows"]):
        for k in ("context", "nodes", "batch", "fits"):
            if k not in r:
                sys.exit(f"perf_report: {path}: rows[{i}] lacks '{k}'")
        cells = [f"{r['context']:,}", str(r["nodes"]), str(r["batch"])]
        if not r["fits"]:
            cells += ["does not fit"] + ["–"] * (len(head) - 4)
            out.append("| " + " | ".join(cells) + " |")
            continue
        for k in ENGINE_SLICE_FIELDS:
            if r.get(k) is None:
                sys.exit(f"perf_report: {path}: rows[{i}] lacks '{k}'")
        cells += [f"{r['step_ms']:.2f}", f"{r['modeled_comm_ms']:.2f}",
                  f"{r['step_with_comm_ms']:.2f}", f"{r['tokens_per_s_gpu']:.0f}",
                  f"{r['tokens_per_s_host']:.0f}"]
        cells += [f"{r[k]:.2f}" for k in ("attention_ms", "gemm_ms", "router_ms", "dispatch_ms",
                                           "experts_ms", "sampling_ms", "other_ms")]
        cells += [str(r["distinct_experts"]), f"{r['floor_ms']:.2f}",
                  pct(r["floor_ms"], r["step_ms"]), f"{r['host_ms']:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    sl, cm = d["slice"], d["comm_model"]
    out += ["", f"Model `{d.get('model')}`, {d.get('layers')} layers: rank {sl.get('rank')} of "
            f"{sl.get('world')} run alone on one GPU (the other ranks absent); its collectives "
            f"are recorded, not run, and modeled by `{cm.get('name')}` (tp/comm_model.h): "
            f"{cm.get('source')}. % of floor = floor ms / step ms. Source (raw JSON):",
            meta_line("engine_bench (one rank)", d, path)]
    return "\n".join(out)


def results_of(d):
    """Result rows of a verify-attention JSON (older builds wrote them under "shapes")."""
    return d["results"] if "results" in d else d["shapes"]


def change_line(ratios):
    lo, hi = min(ratios), max(ratios)
    return (f"after / before: geomean {geomean(ratios):.3f}, range {lo:.3f}-{hi:.3f} "
            f"over {len(ratios)} rows.")


def change_table(spec, rows_of, key_of, header, cells, ratio_of):
    """One benchmark of two builds or modes in one GPU call: a row per key the after run shares
    with the before run (cells(before_row, after_row, ratio)), then the ratio summary and the
    two runs' provenance."""
    before, after = load(spec["before"]), load(spec["after"])
    b_rows = {key_of(r): r for r in rows_of(before)}
    out = list(header)
    ratios = []
    for r in rows_of(after):
        b = b_rows.get(key_of(r))
        if not b:
            continue
        ratios.append(ratio_of(b, r))
        out.append(cells(b, r, ratios[-1]))
    out += ["", change_line(ratios), "",
            f"- **before**: `{spec['before']}` ({spec.get('before_label', '')})",
            meta_line("after", after, spec["after"])]
    return "\n".join(out)


def verify_attention_change_table(spec):
    return change_table(
        spec, results_of, key,
        ["| B | H | q | ctx | before ms | after ms | after / before |", "|---|---|---|---|---|---|---|"],
        lambda b, r, x: (f"| {r['B']} | {r['H']} | {r['q']} | {r['ctx']:,} | {fmt_ms(b['ms'])} | "
                         f"{fmt_ms(r['ms'])} | {x:.3f} |"),
        lambda b, r: r["ms"] / b["ms"])


def engine_change_table(spec):
    return change_table(
        spec, lambda d: d["rows"], lambda r: (r["context"], r["nodes"], r["batch"]),
        ["| context | nodes | batch | before step ms | after step ms | after / before |",
         "|---|---|---|---|---|---|"],
        lambda b, r, x: (f"| {r['context']:,} | {r['nodes']} | {r['batch']} | {b['step_ms']:.2f} | "
                         f"{r['step_ms']:.2f} | {x:.3f} |"),
        lambda b, r: r["step_ms"] / b["step_ms"])


def moe_layer_change_table(spec):
    """moe_layer_bench of two builds or modes in one GPU call: total and routing time per
    (mode, rows), after over before."""
    return change_table(
        spec, lambda d: d["results"], lambda r: (r["mode"], r["rows"]),
        ["| mode | rows | before ms | after ms | after / before | before route ms | "
         "after route ms |", "|---|---|---|---|---|---|---|"],
        lambda b, r, x: (f"| {r['mode']} | {r['rows']:,} | {b['total_ms']:.3f} | "
                         f"{r['total_ms']:.3f} | {x:.3f} | {b['phase_ms']['route']:.3f} | "
                         f"{r['phase_ms']['route']:.3f} |"),
        lambda b, r: r["total_ms"] / b["total_ms"])


def engine_modes_table(spec):
    """engine_bench runs of one model in several modes (same GPU call): step and GEMM time per
    mode, and each mode's step time over the baseline mode's."""
    runs = [(m["label"], load(m["file"])) for m in spec["modes"]]
    base_label, base = runs[spec.get("baseline", len(runs) - 1)]
    k = lambda r: (r["context"], r["nodes"], r["batch"])
    by = [{k(r): r for r in d["rows"]} for _, d in runs]
    cols = spec.get("columns", ["step_ms", "gemm_ms"])
    names = {"step_ms": "step ms", "gemm_ms": "GEMM ms", "attention_ms": "attention ms",
             "shared_prefix_packs": "packs"}
    head = ["context", "nodes", "batch"]
    for label, _ in runs:
        head += [f"{label} {names[c]}" for c in cols]
    head += [f"{label} / {base_label}" for label, _ in runs if label != base_label]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {label: [] for label, _ in runs if label != base_label}
    b_rows = {k(r): r for r in base["rows"]}
    for r0 in runs[0][1]["rows"]:
        key_ = k(r0)
        if any(key_ not in rows for rows in by):
            continue
        cells = [f"{r0['context']:,}", str(r0["nodes"]), str(r0["batch"])]
        for rows in by:
            for c in cols:
                v = rows[key_].get(c, 0)
                cells.append(f"{v:.2f}" if isinstance(v, float) else str(v))
        for (label, _), rows in zip(runs, by):
            if label == base_label:
                continue
            ratios[label].append(rows[key_]["step_ms"] / b_rows[key_]["step_ms"])
            cells.append(f"{ratios[label][-1]:.3f}")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for label, rs in ratios.items():
        out.append(f"- step time {label} / {base_label}: geomean {geomean(rs):.3f}, range "
                   f"{min(rs):.3f}-{max(rs):.3f} over {len(rs)} rows")
    d0 = runs[0][1]
    out += ["", f"Model `{d0.get('model')}` ({d0.get('weights', '')}), {d0.get('layers')} layers, "
            f"TP {d0.get('tp', 1)}. Sources (raw JSON):"]
    for (label, d), m in zip(runs, spec["modes"]):
        kv = f", KV cache: {d['kv_cache_dtype']}" if "kv_cache_dtype" in d else ""
        out.append(meta_line(f"{label} (fp8 attention: {d.get('fp8_attention')}, fp8 MLPs: "
                             f"{d.get('fp8_mlps') or 'none'}, fp8 GEMM: "
                             f"{d.get('fp8_gemm') or 'none'}{kv})", d, m["file"]))
    return "\n".join(out)


def moe_layer_table(spec):
    """bench/moe_layer_bench (verifyd's expert modes) and, when given, the same run's PyTorch
    grouped GEMMs (bench/peers/torch_grouped_moe.py): per rows, the phase split, the expert
    weight streaming rate and FLOP rate; then the EP vs TP table."""
    d = load(spec["verifyd"])
    peer = load(spec["torch"]) if spec.get("torch") else None
    head = ["mode", "rows", "experts hit", "layer ms", "route", "permute", "gate_up", "swiglu",
            "down", "shared", "combine", "expert GEMMs ms", "weights TB/s", "expert TFLOP/s",
            "% of tensor peak"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    peer_rows = {}
    if peer:
        for r in peer["results"]:
            if "error" not in r:
                peer_rows.setdefault(r["rows"], []).append(r)
    modes = spec.get("modes")
    for r in d["results"]:
        if modes and r["mode"] not in modes:
            continue
        ph = r["phase_ms"]
        gemm = ph["gate_up"] + ph["swiglu"] + ph["down"] if r["mode"] == "bf16_per_expert" \
            else ph["gate_up"] + ph["down"]
        out.append("| " + " | ".join([
            r["mode"], f"{r['rows']:,}", str(r["experts_hit"]), f"{r['total_ms']:.3f}",
            f"{ph['route']:.3f}", f"{ph['permute']:.3f}", f"{ph['gate_up']:.3f}",
            f"{ph['swiglu']:.3f}", f"{ph['down']:.3f}", f"{ph['shared']:.3f}",
            f"{ph['combine']:.3f}", f"{gemm:.3f}", f"{r['weight_tbps']:.2f}",
            f"{r['expert_tflops']:.0f}", f"{100.0 * r['expert_tflops'] / r['peak_tflops']:.0f} %"])
            + " |")
    if peer:
        out += ["", "PyTorch's grouped GEMMs, same GPU run (expert GEMMs only: gate_up + down):", "",
                "| kind | rows | experts hit | gate_up ms | down ms | expert GEMMs ms | weights TB/s | "
                "expert TFLOP/s |", "|---|---|---|---|---|---|---|---|"]
        for rows in sorted(peer_rows):
            for r in peer_rows[rows]:
                out.append(f"| torch {r['kind']} | {rows:,} | {r['experts_hit']} | "
                           f"{r['gate_up_ms']:.3f} | {r['down_ms']:.3f} | "
                           f"{r['gate_up_ms'] + r['down_ms']:.3f} | {r['weight_tbps']:.2f} | "
                           f"{r['expert_tflops']:.0f} |")
    ep = d.get("ep_vs_tp") or []
    if ep:
        w = ep[0]["world"]
        out += ["", f"Expert parallelism vs tensor-parallel experts at world {w}: one rank's "
                "routed FP8 GEMMs for the same routing (EP: the slowest rank):", "",
                f"| rows | TP{w} rank ms | EP{w} slowest rank ms | EP{w} mean rank ms | EP / TP | "
                "TP all-reduce MB/rank | EP all-to-all MB/rank |", "|---|---|---|---|---|---|---|"]
        for r in ep:
            out.append(f"| {r['rows']:,} | {r['tp_rank_ms']:.3f} | {r['ep_worst_rank_ms']:.3f} | "
                       f"{r['ep_mean_rank_ms']:.3f} | "
                       f"{r['ep_worst_rank_ms'] / r['tp_rank_ms']:.2f} | "
                       f"{r['tp_allreduce_bytes_per_rank'] / 1e6:.2f} | "
                       f"{r['ep_a2a_bytes_per_rank'] / 1e6:.2f} |")
    dims = d.get("meta", {}).get("dims", {})
    out += ["", "Dimensions: " + ", ".join(f"{k} {v}" for k, v in dims.items()) +
            ". Source (raw JSON):", meta_line("moe_layer_bench", d, spec["verifyd"])]
    if peer:
        pm = peer.get("meta", {})
        out.append(f"- **torch_grouped_moe**: `{spec['torch']}`, {pm.get('device', '?')}, "
                   f"{pm.get('date', '?')}, torch {pm.get('torch_version', '?')}, "
                   f"CUDA {pm.get('cuda_version', '?')}")
    return "\n".join(out)


def kv_fp8_accuracy_table(spec):
    """bench/kv_fp8_accuracy: attention output / LSE error against float32 keys for scales per
    128 columns (the format) and per token; then the engine's greedy tokens."""
    d = load(spec["json"])
    out = ["| context | channels | scales | out rel-L2 mean | out rel-L2 max | LSE abs mean | "
           "LSE abs max |", "|---|---|---|---|---|---|---|"]
    for a in d["attention"]:
        for k, label in (("scale_per_128", "per 128 columns"), ("scale_per_token", "per token")):
            r = a[k]
            out.append(f"| {a['context']:,} | {a['channels']} | {label} | "
                       f"{r['out_rel_l2_mean']:.2e} | {r['out_rel_l2_max']:.2e} | "
                       f"{r['lse_abs_mean']:.2e} | {r['lse_abs_max']:.2e} |")
    out += ["", "| seed | layers | prompt | decode positions | greedy tokens differ | of them "
            "not at a near-tie | logit rel-L2 mean | logit rel-L2 max |",
            "|---|---|---|---|---|---|---|---|"]
    for e in d["engine"]:
        out.append(f"| {e['seed']} | {e['layers']} | {e['prompt']} | {e['positions']} | "
                   f"{e['greedy_differ']} | {e['greedy_differ_not_near_tie']} | "
                   f"{e['logit_rel_l2_mean']:.2e} | {e['logit_rel_l2_max']:.2e} |")
    m = d.get("meta", {})
    out += ["", f"- `{spec['json']}`, {m.get('machine', '?')}, {m.get('date', '?')}, commit "
            f"`{m.get('commit', '?')}`: `{m.get('command', '')}`"]
    return "\n".join(out)


def fp8_numerics_table(spec):
    """bench/fp8_attention_numerics: per case, each variant's mean (max) output rel-L2 against
    float64 attention over the same FP8 bytes; then each variant's worst LSE error."""
    d = load(spec["json"])
    variants = []
    for r in d["results"]:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    cases = {}
    for r in d["results"]:
        cases.setdefault((r["context"], r["channels"], r["q_sigma"]), {})[r["variant"]] = r
    out = ["| context | channels | Q sigma | " + " | ".join(variants) + " |",
           "|" + "---|" * (3 + len(variants))]
    for (ctx, ch, sig), by in cases.items():
        cells = [f"{by[v]['out_rel_l2_mean']:.1e} ({by[v]['out_rel_l2_max']:.1e})"
                 if v in by else "–" for v in variants]
        out.append(f"| {ctx:,} | {ch} | {sig:g} | " + " | ".join(cells) + " |")
    worst = {v: max(r["lse_abs_max"] for r in d["results"] if r["variant"] == v)
             for v in variants}
    out.append("| worst LSE abs error | | | " +
               " | ".join(f"{worst[v]:.1e}" for v in variants) + " |")
    m = d.get("meta", {})
    out += ["", f"Cells: output rel-L2 mean (max) over {m.get('rows', '?')} rows x "
            f"{m.get('heads', '?')} heads.",
            "", f"- `{spec['json']}`, {m.get('machine', '?')}, {m.get('date', '?')}, commit "
            f"`{m.get('commit', '?')}`: `{m.get('command', '')}`"]
    return "\n".join(out)


def bf16_floor_table(spec):
    d = load(spec["json"])
    out = ["| checkpoint | transformers dtype | max rel logit error | max rel-L2 | argmax changes |",
           "|---|---|---|---|---|"]
    for r in d["results"]:
        for dt in ("float32", "bfloat16"):
            m = r[dt]
            out.append(f"| {r['checkpoint']} | {dt} | {m['max_rel']:.3g} | {m['max_rel_l2']:.3g} | "
                       f"{m['argmax_changes']} of {m['rows']} |")
    m = d.get("meta", {})
    out += ["", f"- `{spec['json']}`: {m.get('device', '?')}, {m.get('date', '?')}, torch "
            f"{m.get('torch', '?')}, transformers {m.get('transformers', '?')}"]
    return "\n".join(out)


KINDS = {"verify_attention": verify_attention_table, "engine": engine_table,
         "engine_slice": engine_slice_table,
         "moe_layer": moe_layer_table, "engine_extras": engine_extras_table,
         "verify_attention_change": verify_attention_change_table,
         "engine_change": engine_change_table, "kv_fp8_accuracy": kv_fp8_accuracy_table,
         "bf16_floor": bf16_floor_table, "fp8_numerics": fp8_numerics_table,
         "engine_modes": engine_modes_table, "moe_layer_change": moe_layer_change_table}


def render(name, spec):
    return KINDS[spec["kind"]](spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/PERF.md is stale")
    ap.add_argument("--tables", default="bench/results/tables.json")
    ap.add_argument("--doc", default="docs/PERF.md")
    ap.add_argument("--print-run", nargs="+", metavar="JSON",
                    help="print the same-run kernel table of a GPU run instead: verifyd's "
                         "JSON, then the same run's peers (FlashInfer, FlashMLA; optional)")
    args = ap.parse_args()
    if args.print_run:
        spec = {"kind": "verify_attention", "verifyd": os.path.abspath(args.print_run[0])}
        for path in args.print_run[1:]:  # the peers, told apart by their "impl"
            impl = load(os.path.abspath(path)).get("impl")
            if impl not in ("flashinfer", "flashmla", "flashmla-sparse-fp8"):
                sys.exit(f"perf_report: {path} is not a peer's JSON (impl {impl!r})")
            spec["flashmla" if impl.startswith("flashmla") else impl] = os.path.abspath(path)
        print(render("run", spec))
        return
    tables = load(args.tables)["tables"]
    doc_path = os.path.join(ROOT, args.doc)
    with open(doc_path) as f:
        doc = f.read()
    new = doc
    for name, spec in tables.items():
        pat = re.compile(r"(<!-- perf_report: %s -->\n)(.*?)(<!-- /perf_report: %s -->)"
                         % (re.escape(name), re.escape(name)), re.S)
        if not pat.search(new):
            sys.exit(f"perf_report: {args.doc} has no block for table '{name}'")
        body = render(name, spec)
        new = pat.sub(lambda m: m.group(1) + body + "\n" + m.group(3), new)
    for name in re.findall(r"<!-- perf_report: ([\w.-]+) -->", new):
        if name not in tables:
            sys.exit(f"perf_report: {args.doc} names table '{name}', which {args.tables} lacks")
    if args.check:
        if new != doc:
            sys.exit(f"perf_report: {args.doc} is stale: run bench/perf_report.py")
        print(f"perf_report: {len(tables)} tables of {args.doc} match their JSON")
        return
    if new != doc:
        with open(doc_path, "w") as f:
            f.write(new)
    print(f"perf_report: wrote {len(tables)} tables into {args.doc}")


if __name__ == "__main__":
    main()
