#!/usr/bin/env python3
"""Live operations test: verifyd (tiny preset, CPU) + a real Prometheus server scraping it.

All on loopback, in a temporary directory, on free ports (verifyd binds port 0 and logs the
ports it got; Prometheus gets a port found free just before, retried if taken). Steps:
  1. start verifyd with $NOTIFY_SOCKET pointing at a datagram socket this test owns; expect
     READY=1 once it serves (and WATCHDOG=1 pings, since $WATCHDOG_USEC is set);
  2. `promtool check metrics` on the live /metrics; its families must equal docs/METRICS.md;
  3. start Prometheus with deploy/prometheus/prometheus.yml (targets and intervals rewritten)
     and the real alerting rules;
  4. drive Verify rounds with verifyctl whose outcome is known in advance: session A decodes
     greedily with empty trees and so learns the target's continuation; session B, opened
     with the same prompt, verifies trees built from it (full, partial and zero acceptance);
  5. query Prometheus's HTTP API until every counter equals what the client observed
     (drafted, accepted, emitted tokens, acceptance per depth, requests by method and code,
     latency and step counts, KV slots, sessions), the recording rules compute the expected
     acceptance ratio and every rule evaluates without error;
  6. run every Grafana dashboard expression against Prometheus (must succeed, with data);
  7. check the log lines are structured (timestamp, level) and carry request ids;
  8. SIGTERM: verifyd sends STOPPING=1, drains and exits 0.
Exit 77 (CTest skip) when prometheus/promtool are missing.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opslib  # noqa: E402

try:
    import yaml
except ImportError:
    yaml = None

PROMPT = [11, 22, 33, 44, 55, 66, 77]
KV_SLOTS = 4096
MAX_SESSIONS = 2  # the test opens two sessions; a third is refused with RESOURCE_EXHAUSTED
# Watchdog pings are required: deploy/systemd/verifyd.service sets WatchdogSec=, and a verifyd
# that never pings would be killed by systemd.
REQUIRE_WATCHDOG = True
# promtool lint findings on agreed metric names, accepted until they are renamed (each one is
# explained in docs/METRICS.md, "Review against Prometheus conventions"). Anything else fails.
KNOWN_LINT = set()
# Dashboard targets allowed to return no series in this test.
MAY_BE_EMPTY = set()


class Failure(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout):
    """Calls fn() until it returns a truthy value or `timeout` seconds pass."""
    deadline = time.time() + timeout
    last_err = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Failure:
            raise
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_err = e
        time.sleep(0.2)
    raise Failure(f"timed out after {timeout}s waiting for {what}" +
                  (f" (last error: {last_err})" if last_err else ""))


class NotifySocket:
    """The test's stand-in for systemd's notify socket."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)
        self.messages = []

    def poll(self):
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return self.messages

    def has(self, prefix):
        return any(line.startswith(prefix) for m in self.poll() for line in m.split("\n"))


class Verifyctl:
    def __init__(self, binary, port):
        self.binary, self.port = binary, port

    def run(self, *args, check=True):
        r = subprocess.run([self.binary, f"--target=127.0.0.1:{self.port}", *args],
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise Failure(f"verifyctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    @staticmethod
    def fields(out):
        """'key: value' lines -> dict; '[1,2]' lists -> [int]."""
        d = {}
        for line in out.splitlines():
            k, sep, v = line.partition(":")
            if not sep:
                continue
            v = v.strip()
            if v.startswith("[") and v.endswith("]"):
                d[k.strip()] = [int(x) for x in v[1:-1].split(",") if x.strip()]
            else:
                d[k.strip()] = v
        return d

    def open(self, prompt):
        f = self.fields(self.run("open", "--prompt=" + ",".join(map(str, prompt))).stdout)
        return f["session_id"], int(f["next_token"]), int(f["committed_len"])

    def verify(self, session, tokens, parents):
        args = ["verify", f"--session={session}"]
        if tokens:
            args += ["--tokens=" + ",".join(map(str, tokens)), "--parents=" + ",".join(map(str, parents))]
        f = self.fields(self.run(*args).stdout)
        return f["accepted_nodes"], f["accepted_tokens"], int(f["bonus_token"]), int(f["committed_len"])


class Prometheus:
    def __init__(self, workdir, metrics_port):
        self.workdir = workdir
        self.metrics_port = metrics_port
        self.proc = None
        self.port = None

    def config(self):
        """deploy/prometheus/prometheus.yml with the target and intervals rewritten for a test."""
        src = os.path.join(opslib.REPO, "deploy", "prometheus", "prometheus.yml")
        with open(src) as f:
            cfg = yaml.safe_load(f)
        cfg["global"]["scrape_interval"] = "1s"
        cfg["global"]["scrape_timeout"] = "1s"
        cfg["global"]["evaluation_interval"] = "1s"
        cfg["rule_files"] = [os.path.join(os.path.dirname(src), r) for r in cfg["rule_files"]]
        jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "verifyd"]
        if len(jobs) != 1:
            raise Failure("deploy/prometheus/prometheus.yml has no job_name: verifyd")
        jobs[0]["static_configs"][0]["targets"] = [f"127.0.0.1:{self.metrics_port}"]
        path = os.path.join(self.workdir, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        return path

    def start(self):
        cfg = self.config()
        for attempt in range(3):
            self.port = free_port()
            logf = open(os.path.join(self.workdir, f"prometheus{attempt}.log"), "w")
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={cfg}",
                 f"--storage.tsdb.path={os.path.join(self.workdir, f'tsdb{attempt}')}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=logf, stderr=subprocess.STDOUT)
            try:
                wait_for("Prometheus /-/ready", lambda: self.proc.poll() is None and
                         http_get(f"{self.url}/-/ready").strip() != "", 30)
                return
            except Failure:
                self.stop()
                log(f"prometheus did not start on port {self.port} (attempt {attempt + 1}), "
                    f"log: {open(logf.name).read()[-500:]}")
        raise Failure("Prometheus did not start")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def api(self, path, **params):
        q = urllib.parse.urlencode(params)
        try:
            body = json.loads(http_get(f"{self.url}/api/v1/{path}?{q}"))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read().decode())
        if body.get("status") != "success":
            raise Failure(f"Prometheus API {path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def value(self, expr):
        """Single-sample instant query -> float, or None when there is no sample."""
        r = self.query(expr)
        if len(r) > 1:
            raise Failure(f"{expr}: expected one series, got {len(r)}")
        return float(r[0]["value"][1]) if r else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def check_live_metrics(text, failures):
    """promtool lint of verifyd's families, and the family list against docs/METRICS.md."""
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    problems = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    known = [p for p in problems if p in KNOWN_LINT]
    own = [p for p in problems if p.startswith("verifyd_") and p not in known]
    for p in problems:
        kind = "FAIL" if p in own else "known issue" if p in known else "note (library metric)"
        log(f"{kind}: promtool check metrics: {p}")
    if own:
        failures.append(f"promtool check metrics: {len(own)} problems in verifyd_ metrics")
    live = opslib.exposition_families(text)
    documented = opslib.documented_metrics()
    for name in sorted(set(live) - set(documented)):
        failures.append(f"/metrics exports '{name}' ({live[name]}), not documented in docs/METRICS.md")
    for name in sorted(set(documented) - set(live)):
        failures.append(f"docs/METRICS.md documents '{name}', which /metrics does not export")
    for name in sorted(set(live) & set(documented)):
        if live[name] != documented[name]:
            failures.append(f"'{name}' is a {live[name]} on /metrics, a {documented[name]} in docs/METRICS.md")
    helps = {l.split()[2] for l in text.splitlines() if l.startswith("# HELP ") and len(l.split()) > 3}
    for name in sorted(n for n in live if n.startswith("verifyd_") and n not in helps):
        failures.append(f"'{name}' has no HELP text")
    log(f"live /metrics: {len(live)} families, {len(problems)} promtool remarks")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verifyd", required=True)
    ap.add_argument("--verifyctl", required=True)
    ap.add_argument("--backend", default="cpu", help="verifyd --backend (cpu; toy for debugging)")
    ap.add_argument("--tp", type=int, default=2, help="verifyd --tp (rank labels 0..tp-1)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            print(f"SKIP: '{tool}' not found (Debian package 'prometheus')")
            return 77
    if yaml is None:
        print("SKIP: PyYAML not found (Debian package python3-yaml)")
        return 77

    work = tempfile.mkdtemp(prefix="verifyd_ops_")
    failures = []
    verifyd = prom = None
    vlog_path = os.path.join(work, "verifyd.log")
    try:
        # --- 1. verifyd under a fake systemd notify socket ------------------------------------
        notify = NotifySocket(os.path.join(work, "notify.sock"))
        env = dict(os.environ, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="1500000")
        env.pop("WATCHDOG_PID", None)
        vlog = open(vlog_path, "w")
        t0 = time.time()
        verifyd = subprocess.Popen(
            [args.verifyd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--model=tiny",
             f"--backend={args.backend}", f"--tp={args.tp}", f"--kv_slots={KV_SLOTS}",
             f"--max_sessions={MAX_SESSIONS}", "--log_level=debug"],
            stdout=vlog, stderr=subprocess.STDOUT, env=env)

        def serving():
            if verifyd.poll() is not None:
                raise Failure(f"verifyd exited {verifyd.returncode}: {open(vlog_path).read()[-2000:]}")
            m = re.search(r"serving .*\bport=(\d+) metrics_port=(\d+)", open(vlog_path).read())
            return m and (int(m.group(1)), int(m.group(2)))

        port, mport = wait_for("verifyd to log 'serving ... port= metrics_port='", serving, 90)
        log(f"verifyd serving: grpc 127.0.0.1:{port}, metrics 127.0.0.1:{mport} "
            f"({time.time() - t0:.1f}s)")
        wait_for("READY=1 on the notify socket", lambda: notify.has("READY=1"), 10)
        ctl = Verifyctl(args.verifyctl, port)
        info = ctl.run("info").stdout
        vocab = int(re.search(r"vocab_size=(\d+)", info).group(1))
        log("info: " + " | ".join(l.strip() for l in info.splitlines()))
        m = re.search(r"\btp: (\d+)", info)
        if not m or int(m.group(1)) != args.tp:
            failures.append(f"verifyctl info reports tp {m and m.group(1)}, started with {args.tp}")

        # --- 2. live /metrics ----------------------------------------------------------------
        text = http_get(f"http://127.0.0.1:{mport}/metrics")
        check_live_metrics(text, failures)
        with open(os.path.join(work, "metrics.txt"), "w") as f:
            f.write(text)
        g = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "check_grafana.py"),
                            "--metrics-text", os.path.join(work, "metrics.txt")],
                           capture_output=True, text=True)
        log("dashboard vs live /metrics: " + (g.stdout + g.stderr).strip().splitlines()[-1])
        if g.returncode != 0:
            failures.append("dashboard uses metrics the live server does not export:\n" + g.stdout)

        # --- 3. Prometheus -------------------------------------------------------------------
        prom = Prometheus(work, mport)
        prom.start()
        log(f"prometheus ready on 127.0.0.1:{prom.port}")
        wait_for("Prometheus to scrape verifyd (up == 1)",
                 lambda: prom.value('up{job="verifyd"}') == 1.0, 30)

        # --- 4. Verify rounds with known outcomes ------------------------------------------
        bad = lambda t: (t + 1) % vocab  # noqa: E731 - a token the target did not predict
        sa, pa, _ = ctl.open(PROMPT)
        greedy = []  # target continuation after the pending token pa
        commits = {}
        for _ in range(10):
            _, _, bonus, commits[sa] = ctl.verify(sa, [], [])
            greedy.append(bonus)
        sb, pb, _ = ctl.open(PROMPT)
        if pb != pa:
            failures.append(f"same prompt, different next_token: {pa} vs {pb}")
        g1, g2, g3, g4, g5, g6, g7, g8, g9, g10 = greedy
        # (tokens, parents, expected accepted node indices, expected bonus)
        rounds = [
            ([g1, g2, bad(g3)], [-1, 0, 1], [0, 1], g3),          # chain, 2 of 3 accepted
            ([bad(g4), g4, g5], [-1, -1, 1], [1, 2], g6),         # branch: second root wins
            ([g7, bad(g8)], [-1, 0], [0], g8),                    # 1 accepted
            ([bad(g9)], [-1], [], g9),                            # none accepted
            ([], [], [], g10),                                    # plain decode step
        ]
        n_verify = 10
        drafted = accepted = emitted = 0
        depth_reached, acc_by_depth = {}, {}
        emitted += 10  # session A: 10 empty trees, one bonus each
        for tokens, parents, exp_nodes, exp_bonus in rounds:
            nodes, toks, bonus, commits[sb] = ctl.verify(sb, tokens, parents)
            n_verify += 1
            if nodes != exp_nodes or bonus != exp_bonus:
                failures.append(f"tree {tokens}/{parents}: accepted {nodes} + bonus {bonus}, "
                                f"greedy decoding says {exp_nodes} + {exp_bonus}")
            drafted += len(tokens)
            accepted += len(nodes)
            emitted += len(nodes) + 1
            depths = []
            for p in parents:
                depths.append(1 if p < 0 else depths[p] + 1)
            for d in range(1, max(depths, default=0) + 1):
                depth_reached[d] = depth_reached.get(d, 0) + 1
            for k in range(1, len(nodes) + 1):
                acc_by_depth[k] = acc_by_depth.get(k, 0) + 1
        # Two failing calls: an unknown session, and a session over --max_sessions (the code
        # label the VerifydQueueRejecting rule selects).
        r = ctl.run("verify", "--session=no-such-session", check=False)
        if r.returncode == 0:
            failures.append("verify on an unknown session succeeded")
        def open_refused():
            r = ctl.run("open", "--prompt=1,2,3", check=False)
            if r.returncode == 0 or "RESOURCE_EXHAUSTED" not in r.stderr:
                failures.append(f"a session over --max_sessions={MAX_SESSIONS} was not refused "
                                f"with RESOURCE_EXHAUSTED: rc={r.returncode} {r.stderr.strip()}")

        # Refuse once, let Prometheus see the count, refuse again: two increments of a series
        # that exists from start-up (docs/METRICS.md, "Review").
        open_refused()
        wait_for("the RESOURCE_EXHAUSTED series in Prometheus", lambda: prom.value(
            'verifyd_requests_total{method="OpenSession", code="RESOURCE_EXHAUSTED"}') == 1, 15)
        open_refused()
        log(f"drove {n_verify} Verify calls: drafted={drafted} accepted={accepted} emitted={emitted}")

        # --- 5. Prometheus sees exactly that -------------------------------------------------
        expected = {
            "verifyd_draft_tokens_total": drafted,
            "verifyd_accepted_tokens_total": accepted,
            "verifyd_emitted_tokens_total": emitted,
            "verifyd_accept_length_count": n_verify,
            "verifyd_accept_length_sum": accepted,
            'verifyd_requests_total{method="Verify", code="OK"}': n_verify,
            'verifyd_requests_total{method="Verify", code="NOT_FOUND"}': 1,
            'verifyd_requests_total{method="OpenSession", code="OK"}': 2,
            'verifyd_requests_total{method="OpenSession", code="RESOURCE_EXHAUSTED"}': 2,
            'verifyd_verify_latency_seconds_count{stage="total"}': n_verify,
            'verifyd_verify_latency_seconds_count{stage="queue"}': n_verify,
            'verifyd_verify_latency_seconds_count{stage="engine"}': n_verify,
            "verifyd_active_sessions": 2,
            "verifyd_kv_slots_capacity": KV_SLOTS,
            "verifyd_kv_slots_used": sum(commits.values()),
            f'verifyd_build_info{{backend="{args.backend}"}}': 1,
        }
        for d in range(1, 5):
            expected[f'verifyd_draft_depth_reached_total{{depth="{d}"}}'] = depth_reached.get(d, 0)
            expected[f'verifyd_accepted_tokens_by_depth_total{{depth="{d}"}}'] = acc_by_depth.get(d, 0)
        # Relations that hold whatever the number of prefill steps.
        relations = {
            "verifyd_engine_step_seconds_count >= bool %d" % n_verify: 1,
            "verifyd_batch_size_count - verifyd_engine_step_seconds_count": 0,
            "count(verifyd_engine_rank_step_seconds_count)": args.tp,
        }
        for rank in range(args.tp):  # every rank takes part in every step
            relations[f'sum(verifyd_engine_rank_step_seconds_count{{rank="{rank}"}}) - '
                      f'sum(verifyd_engine_step_seconds_count)'] = 0

        def all_match():
            got = {e: prom.value(e) for e in list(expected) + list(relations)}
            want = dict(expected, **relations)
            bad_ = {e: (got[e], want[e]) for e in want if got[e] is None or abs(got[e] - want[e]) > 1e-9}
            all_match.last = bad_
            return not bad_

        try:
            wait_for("Prometheus values to match the client's counts", all_match, 20)
            log(f"prometheus: {len(expected) + len(relations)} series match the client's counts")
        except Failure:
            for e, (got, want) in all_match.last.items():
                failures.append(f"Prometheus {e} = {got}, expected {want}")

        try:
            wait_for("recording rule verifyd:requests_rejected:rate5m > 0",
                     lambda: (prom.value('verifyd:requests_rejected:rate5m{job="verifyd"}') or 0) > 0, 15)
        except Failure as e:
            failures.append(str(e))
        # The rule is evaluated every second, possibly before the last scrape landed: poll.
        ratio = [None]

        def ratio_ok():
            ratio[0] = prom.value('verifyd:acceptance_ratio:rate5m{job="verifyd"}')
            return ratio[0] is not None and abs(ratio[0] - accepted / drafted) < 1e-6

        try:
            wait_for("recording rule verifyd:acceptance_ratio:rate5m", ratio_ok, 15)
        except Failure:
            failures.append(f"verifyd:acceptance_ratio:rate5m = {ratio[0]}, expected {accepted}/{drafted}")

        def rules_ok():
            groups = prom.api("rules")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return len(groups) >= 2 and rules and all(r.get("health") == "ok" for r in rules) and rules

        try:
            rules = wait_for("every rule to evaluate with health ok", rules_ok, 15)
            log(f"prometheus: {len(rules)} rules loaded and healthy")
        except Failure as e:
            for g in prom.api("rules")["groups"]:
                for r in g["rules"]:
                    if r.get("health") != "ok":
                        failures.append(f"rule {r['name']}: health {r.get('health')} {r.get('lastError', '')}")
            failures.append(str(e))
        firing = [a["labels"]["alertname"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
        if firing:
            failures.append(f"alerts firing on a healthy server: {firing}")

        # --- 6. Grafana expressions against the real server ----------------------------------
        _, exprs = opslib.dashboard_expressions()
        empty = []
        for where, e in exprs:
            try:
                if not prom.query(e) and where not in MAY_BE_EMPTY:
                    empty.append(where)
            except Failure as err:
                failures.append(f"dashboard {where}: {err}")
        for where in empty:
            failures.append(f"dashboard {where} returns no data after the Verify rounds")
        log(f"dashboard: {len(exprs)} expressions evaluated by Prometheus, {len(empty)} empty")

        # Sessions closed -> gauges back to zero.
        ctl.run("close", f"--session={sa}")
        ctl.run("close", f"--session={sb}")
        try:
            wait_for("active sessions and KV slots back to 0 after CloseSession",
                     lambda: prom.value("verifyd_active_sessions") == 0 and
                     prom.value("verifyd_kv_slots_used") == 0, 15)
        except Failure as e:
            failures.append(f"{e}: active={prom.value('verifyd_active_sessions')} "
                            f"kv_used={prom.value('verifyd_kv_slots_used')}")

        # --- 8. watchdog pings, then SIGTERM drain -------------------------------------------
        pings = sum(m.count("WATCHDOG=1") for m in notify.poll())
        if pings == 0 and REQUIRE_WATCHDOG:
            failures.append("no WATCHDOG=1 ping although $WATCHDOG_USEC was set "
                            "(verifyd.service has WatchdogSec=: systemd would kill it)")
        log(f"notify socket: READY=1 and {pings} watchdog pings")
        verifyd.send_signal(signal.SIGTERM)
        try:
            code = verifyd.wait(40)
            if code != 0:
                failures.append(f"verifyd exited {code} after SIGTERM (expected a drain and 0)")
        except subprocess.TimeoutExpired:
            failures.append("verifyd did not exit within 40 s of SIGTERM")
        if not notify.has("STOPPING=1"):
            failures.append("no STOPPING=1 on the notify socket after SIGTERM")

        # --- 7. logs ---------------------------------------------------------------------------
        lines = [l for l in open(vlog_path).read().splitlines() if l.strip()]
        structured = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z level=(trace|debug|info|warning|error|critical) \S")
        unstructured = [l for l in lines if not structured.match(l)]
        for l in unstructured[:5]:
            failures.append(f"log line not structured (timestamp level=...): {l[:200]}")
        rpc_lines = [l for l in lines if "rpc=" in l]
        if not rpc_lines:
            failures.append("no per-RPC log lines (rpc=... req=...) at --log_level=debug")
        for l in rpc_lines:
            if not re.search(r"\breq=\d+", l):
                failures.append(f"RPC log line without a request id: {l[:200]}")
        if not any("code=NOT_FOUND" in l for l in rpc_lines):
            failures.append("the NOT_FOUND Verify left no log line")
        log(f"logs: {len(lines)} lines, {len(rpc_lines)} per-RPC lines with request ids")
    except Failure as e:
        failures.append(str(e))
    finally:
        if prom:
            prom.stop()
        if verifyd and verifyd.poll() is None:
            verifyd.kill()
            verifyd.wait()
        if failures or args.keep:
            log(f"kept {work} (verifyd.log, prometheus*.log, metrics.txt)")
            try:
                log("--- verifyd.log (tail) ---\n" + open(vlog_path).read()[-3000:])
            except OSError:
                pass
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        for f in failures:
            log("FAIL: " + f)
        return 1
    log("PASS: live verifyd + Prometheus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
