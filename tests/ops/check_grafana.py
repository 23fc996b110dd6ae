#!/usr/bin/env python3
"""Checks deploy/grafana/verifyd-dashboard.json.

  - valid JSON with the structure Grafana needs (uid, title, unique panel ids, gridPos, every
    query panel on the ${datasource} variable, refIds unique per panel);
  - every PromQL expression (panel targets and query variables, Grafana variables substituted)
    parses: they are written as recording rules into a temporary rules file and checked with
    the real `promtool check rules`;
  - every metric name an expression uses is one verifyd exports: the families documented in
    docs/METRICS.md (which the live integration test compares with a real /metrics), or, with
    --metrics-text FILE, the families in that exposition; plus Prometheus's own `up`;
  - the panels operators need are there (tokens/s, Verify and prefill latency percentiles,
    mean acceptance length, acceptance per depth, batch size, queue, KV usage, per-rank step
    time);
  - acceptance is shown with one definition only, vLLM's mean acceptance length
    (1 + accepted / drafts): no panel divides by the per-round histogram's count;
  - a model filter (ad hoc filter on the `model_name` label) is there, and aggregations that
    keep `instance` keep `model_name` too.
Exit 77 (CTest skip) when promtool is missing.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opslib  # noqa: E402

REQUIRED_METRICS = {
    "tokens/s": "verifyd_emitted_tokens_total",
    "Verify latency percentiles": "verifyd_verify_latency_seconds_bucket",
    "mean acceptance length": "verifyd_drafts_total",
    "prefill latency": "verifyd_prefill_latency_seconds_bucket",
    "acceptance per depth": "verifyd_accepted_tokens_by_depth_total",
    "batch size": "verifyd_batch_size_sum",
    "queue": "verifyd_queue_depth",
    "KV usage": "verifyd_kv_slots_used",
    "per-rank step time": "verifyd_engine_rank_step_seconds_bucket",
}


def promtool_parse(exprs):
    """Returns a list of (where, error) for expressions promtool rejects."""
    def run(items):
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
            rules = [{"record": f"dashboard:expr_{i}", "expr": e} for i, (_, e) in enumerate(items)]
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)  # JSON is YAML
            path = f.name
        try:
            r = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
            return r.returncode, r.stdout + r.stderr
        finally:
            os.unlink(path)

    code, out = run(exprs)
    if code == 0:
        return []
    errors = []
    for item in exprs:  # pinpoint the bad ones
        c, o = run([item])
        if c != 0:
            errors.append((item[0], o.strip().splitlines()[-1] if o.strip() else "promtool failed"))
    return errors or [("(all)", out.strip())]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metrics-text", help="a /metrics exposition to take the metric list from")
    args = ap.parse_args()
    if not shutil.which("promtool"):
        print("SKIP: 'promtool' not found (Debian package 'prometheus')")
        return 77

    failures = []
    dash, exprs = opslib.dashboard_expressions()
    check = opslib.checker(failures)

    # Structure.
    check(dash.get("uid") and dash.get("title"), "dashboard needs uid and title")
    ids, titles = [], []

    def walk(panels):
        for p in panels:
            ids.append(p.get("id"))
            check("gridPos" in p, f"panel '{p.get('title')}' has no gridPos")
            if p.get("type") != "row":
                titles.append(p.get("title"))
                check(p.get("datasource", {}).get("uid") == "${datasource}",
                      f"panel '{p.get('title')}' does not use the ${{datasource}} variable")
                refs = [t.get("refId") for t in p.get("targets", [])]
                check(refs and len(refs) == len(set(refs)), f"panel '{p.get('title')}': bad refIds")
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    check(len(ids) == len(set(ids)), "panel ids are not unique")
    check(len(titles) == len(set(titles)), "panel titles are not unique")
    var_list = dash.get("templating", {}).get("list", [])
    var_names = {v["name"] for v in var_list}
    check({"datasource", "job", "instance", "model"} <= var_names, f"variables missing, have {var_names}")
    model = [v for v in var_list if v["name"] == "model"]
    check(model and model[0].get("type") == "adhoc" and
          any(f.get("key") == "model_name" for f in model[0].get("filters", [])),
          "the 'model' variable must be an ad hoc filter on model_name")

    # One acceptance definition: 1 + accepted / drafts, never the histogram's mean.
    raw = [t.get("expr", "") for p in dash.get("panels", []) for t in p.get("targets", [])]
    for e in raw:
        check("verifyd_accept_length" not in e,
              f"'{e}': acceptance must be vLLM's 1 + accepted / drafts, not verifyd_accept_length")
        for m in re.finditer(r"\bby \(([^)]*)\)", e):
            keys = {k.strip() for k in m.group(1).split(",")}
            check("instance" not in keys or "model_name" in keys,
                  f"'{e}': 'by ({m.group(1)})' drops model_name")

    # PromQL parses.
    for where, err in promtool_parse(exprs):
        failures.append(f"{where}: promtool rejects the expression: {err}")

    # Names exported.
    if args.metrics_text:
        with open(args.metrics_text) as f:
            families = opslib.exposition_families(f.read())
        source = args.metrics_text
    else:
        families = opslib.documented_metrics()
        source = "docs/METRICS.md"
    check(families, f"no metrics found in {source}")
    allowed = opslib.series_names(families) | {"up"}
    used = set()
    for where, e in exprs:
        names = opslib.promql_metric_names(e)
        check(names, f"{where}: no metric name found in '{e}'")
        for n in sorted(names - allowed):
            failures.append(f"{where}: metric '{n}' is not exported by verifyd ({source})")
        used |= names
    for topic, metric in REQUIRED_METRICS.items():
        check(metric in used, f"no panel for {topic} (uses {metric})")

    if opslib.report_failures(failures):
        return 1
    print(f"PASS: {len(exprs)} expressions in {len(titles)} panels parse with promtool and use "
          f"{len(used)} metric names, all exported ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
