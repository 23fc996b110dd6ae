"""Shared helpers of the operations tests: the failure list a check script fills and prints,
the documented metric list (docs/METRICS.md), the Prometheus text format, PromQL metric-name
extraction and Grafana dashboard expressions. Standard library only."""
import json
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
METRICS_MD = os.path.join(REPO, "docs", "METRICS.md")
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "verifyd-dashboard.json")

# Grafana variables -> values that make a valid PromQL expression for checking.
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${job}": "verifyd",
    "$job": "verifyd",
    "${instance}": ".*",
    "$instance": ".*",
}

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}


def checker(failures):
    """check(cond, msg): appends msg to `failures` when cond is false; returns cond."""

    def check(cond, msg):
        if not cond:
            failures.append(msg)
        return cond

    return check


def report_failures(failures):
    """Prints each failure as 'FAIL: <msg>'; True when there was any."""
    for f in failures:
        print("FAIL:", f)
    return bool(failures)


def documented_metrics(path=METRICS_MD):
    """{name: type} from the table rows of docs/METRICS.md: | `name` | type | ..."""
    out = {}
    row = re.compile(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|")
    with open(path) as f:
        for line in f:
            m = row.match(line)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def exposition_families(text):
    """{family: type} from the '# TYPE' lines of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            out[name] = typ.strip()
    return out


def exposition_samples(text):
    """[(name, {label: value}, float)] from a Prometheus text exposition."""
    samples = []
    pat = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    lab = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = pat.match(line)
        if m:
            labels = dict(lab.findall(m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return samples


def series_names(families):
    """Every series name a set of families exposes (histogram _bucket/_sum/_count)."""
    names = set()
    for name, typ in families.items():
        if typ == "histogram":
            names.update(name + s for s in HISTOGRAM_SUFFIXES)
        elif typ == "summary":
            names.update([name, name + "_sum", name + "_count"])
        else:
            names.add(name)
    return names


def promql_metric_names(expr):
    """Metric names referenced by a PromQL expression (a small lexer, not a full parser:
    strings, label matchers, ranges and grouping clauses are removed first; identifiers
    followed by '(' are functions or aggregations)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"`[^`]*`", "``", s)
    names = set()
    # {__name__="x"} selectors name metrics too.
    for m in re.finditer(r'__name__\s*=\s*"([^"]*)"', expr):
        names.add(m.group(1))
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        tok = m.group(0)
        before = s[m.start() - 1] if m.start() > 0 else " "
        if before.isdigit() or before == ".":
            continue  # a duration or number suffix: 5m, 1e3
        if tok.lower() in PROMQL_KEYWORDS:
            continue
        if s[m.end():].lstrip().startswith("("):
            continue  # function or aggregation
        names.add(tok)
    return names


def substitute_grafana_vars(expr):
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    return expr


def dashboard_expressions(path=DASHBOARD):
    """[(where, expr)] for every panel target and query variable of the dashboard, with the
    Grafana variables substituted. label_values(m, l) becomes the selector m."""
    with open(path) as f:
        dash = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((f"panel '{p.get('title')}' {t.get('refId')}",
                                substitute_grafana_vars(t["expr"])))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", q)
        if m:
            q = m.group(1)
        out.append((f"variable '{v['name']}'", substitute_grafana_vars(q)))
    return dash, out
