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
  - the panels the operations issue asks for are there (tokens/s, latency percentiles,
    acceptance per depth, accept length, batch size, queue, KV usage, per-rank step time).
Exit 77 (CTest skip) when promtool is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opslib  # noqa: E402

REQUIRED_METRICS = {
    "tokens/s": "verifyd_emitted_tokens_total",
    "Verify latency percentiles": "verifyd_verify_latency_seconds_bucket",
    "accept length": "verifyd_accept_length_sum",
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
    check = lambda cond, msg: cond or failures.append(msg)  # noqa: E731

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
    var_names = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    check({"datasource", "job", "instance"} <= var_names, f"variables missing, have {var_names}")

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

    if failures:
        for f in failures:
            print("FAIL:", f)
        return 1
    print(f"PASS: {len(exprs)} expressions in {len(titles)} panels parse with promtool and use "
          f"{len(used)} metric names, all exported ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
