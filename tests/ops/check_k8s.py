#!/usr/bin/env python3
"""Asserts the operations contract on deploy/k8s's manifests.

Renders deploy/k8s/base and every overlay with `kubectl kustomize` when kubectl is installed;
without it, the base is loaded straight from the files its kustomization.yaml lists (it has no
patches) and the overlays are skipped with a message. Then checks, on each rendered set:
  - a Deployment whose nvidia.com/gpu request == limit == the --tp argument;
  - native gRPC readiness/liveness/startup probes on a container port, the startup probe
    allowing >= 10 minutes of model load;
  - /dev/shm mounted from a memory-backed emptyDir;
  - a preStop hook and terminationGracePeriodSeconds > preStop sleep + verifyd's drain budget;
  - non-root, no privilege escalation, all capabilities dropped, read-only root filesystem;
  - a Service exposing the grpc and metrics ports, a PodDisruptionBudget and a ServiceMonitor
    selecting the pods / Service; a PrometheusRule equal to deploy/prometheus/verifyd-rules.yml;
  - the Envoy session-affinity example hashes on the session-key header with RING_HASH over the
    headless Service.
With `--verifyd PATH`, every argument passed to verifyd must be a flag it knows.
Exit 77 (CTest skip) when PyYAML is missing.
"""
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML not found (Debian package python3-yaml)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opslib  # noqa: E402

K8S = os.path.join(opslib.REPO, "deploy", "k8s")
DRAIN_BUDGET_S = 30  # verifyd's drain on SIGTERM (docs/OPERATIONS.md)
SESSION_HEADER = "x-verifyd-session-key"

failures = []
check = opslib.checker(failures)


def render(kdir):
    """Returns the list of manifests of kustomization dir `kdir`, or None if not renderable."""
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", kdir], capture_output=True, text=True)
        if out.returncode != 0:
            failures.append(f"kubectl kustomize {kdir} failed: {out.stderr.strip()}")
            return []
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    with open(os.path.join(kdir, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    if set(kust) - {"apiVersion", "kind", "resources", "images"}:
        return None  # patches etc. need real kustomize
    docs = []
    for res in kust.get("resources", []):
        with open(os.path.join(kdir, res)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def labels_match(selector, labels):
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "DoesNotExist":
            ok &= e["key"] not in labels
        elif e["operator"] == "Exists":
            ok &= e["key"] in labels
        elif e["operator"] == "In":
            ok &= labels.get(e["key"]) in e["values"]
        elif e["operator"] == "NotIn":
            ok &= labels.get(e["key"]) not in e["values"]
    return ok


def arg_value(args, name):
    for a in args:
        m = re.fullmatch(rf"--{name}=(.*)", a)
        if m:
            return m.group(1)
    return None


def check_set(name, docs):
    deps = by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")
    if not check(len(deps) == 1, f"{name}: expected one Deployment/StatefulSet, got {len(deps)}"):
        return
    dep = deps[0]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    check(labels_match(spec["selector"], pod_labels), f"{name}: selector does not match pod labels")
    containers = [c for c in pod["containers"] if c["name"] == "verifyd"]
    if not check(len(containers) == 1, f"{name}: no container named verifyd"):
        return
    c = containers[0]
    args = c.get("args", [])
    check_flags(name, args)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check("grpc" in ports and "metrics" in ports, f"{name}: container ports grpc and metrics needed")

    # GPUs == tp.
    tp = arg_value(args, "tp")
    res = c.get("resources", {})
    gpu_lim = res.get("limits", {}).get("nvidia.com/gpu")
    gpu_req = res.get("requests", {}).get("nvidia.com/gpu", gpu_lim)
    check(tp is not None, f"{name}: verifyd args lack --tp")
    check(tp is not None and str(gpu_lim) == tp and str(gpu_req) == tp,
          f"{name}: nvidia.com/gpu request/limit {gpu_req}/{gpu_lim} != --tp={tp}")
    listen = arg_value(args, "listen") or "0.0.0.0:50051"
    metrics = arg_value(args, "metrics_listen") or "0.0.0.0:9400"
    check(int(listen.rsplit(":", 1)[1]) == ports.get("grpc"), f"{name}: --listen port != grpc port")
    check(int(metrics.rsplit(":", 1)[1]) == ports.get("metrics"),
          f"{name}: --metrics_listen port != metrics port")

    # Probes: native gRPC health on a declared port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        if check(p is not None and "grpc" in p, f"{name}: {probe} must be a native grpc probe"):
            check(p["grpc"]["port"] in ports.values(), f"{name}: {probe} port not a container port")
    sp = c.get("startupProbe", {})
    load_s = sp.get("failureThreshold", 3) * sp.get("periodSeconds", 10)
    check(load_s >= 600, f"{name}: startupProbe allows only {load_s}s for model load (< 600)")

    # /dev/shm as a memory emptyDir.
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    check(len(shm) == 1 and vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
          f"{name}: /dev/shm must be an emptyDir with medium: Memory")
    for m in c.get("volumeMounts", []):
        check(m["name"] in vols, f"{name}: volumeMount {m['name']} has no volume")

    # preStop + grace period.
    pre = c.get("lifecycle", {}).get("preStop")
    pre_s = 0
    if check(pre is not None, f"{name}: no preStop hook"):
        cmd = pre.get("exec", {}).get("command", [])
        if "sleep" in pre:
            pre_s = int(pre["sleep"]["seconds"])
        elif cmd and os.path.basename(cmd[0]) == "sleep":
            pre_s = int(cmd[1])
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace > pre_s + DRAIN_BUDGET_S,
          f"{name}: terminationGracePeriodSeconds {grace} <= preStop {pre_s}s + drain {DRAIN_BUDGET_S}s")

    # Security.
    psc = pod.get("securityContext", {})
    csc = c.get("securityContext", {})
    check(psc.get("runAsNonRoot") or csc.get("runAsNonRoot"), f"{name}: runAsNonRoot not set")
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    check(uid is not None and uid != 0, f"{name}: runAsUser must be a non-zero uid")
    check(csc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem must be true")
    check(csc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation must be false")
    check("ALL" in csc.get("capabilities", {}).get("drop", []), f"{name}: capabilities must drop ALL")
    check(not csc.get("privileged", False), f"{name}: must not be privileged")
    check(pod.get("automountServiceAccountToken") is False, f"{name}: automountServiceAccountToken")

    # Service(s), PDB, ServiceMonitor.
    svcs = by_kind(docs, "Service")
    main = [s for s in svcs if s["spec"].get("clusterIP") != "None"]
    if check(len(main) == 1, f"{name}: expected one ClusterIP Service"):
        s = main[0]
        check(labels_match({"matchLabels": s["spec"]["selector"]}, pod_labels),
              f"{name}: Service selector does not match the pods")
        sports = {p["name"]: p for p in s["spec"]["ports"]}
        check({"grpc", "metrics"} <= set(sports), f"{name}: Service needs ports grpc and metrics")
        for pn, p in sports.items():
            tgt = p.get("targetPort", p["port"])
            check(tgt in ports or tgt in ports.values(), f"{name}: Service port {pn} targets nothing")
    check(any(s["spec"].get("clusterIP") == "None" for s in svcs),
          f"{name}: no headless Service for session-affine routing")
    pdbs = by_kind(docs, "PodDisruptionBudget")
    if check(len(pdbs) == 1, f"{name}: expected one PodDisruptionBudget"):
        check(labels_match(pdbs[0]["spec"]["selector"], pod_labels), f"{name}: PDB selects no pod")
        check("maxUnavailable" in pdbs[0]["spec"] or "minAvailable" in pdbs[0]["spec"],
              f"{name}: PDB without a budget")
    sms = by_kind(docs, "ServiceMonitor")
    if check(len(sms) == 1, f"{name}: expected one ServiceMonitor"):
        sm = sms[0]["spec"]
        selected = [s for s in svcs if labels_match(sm["selector"], s["metadata"].get("labels", {}))]
        check(len(selected) == 1 and selected[0] in main,
              f"{name}: ServiceMonitor must select exactly the ClusterIP Service, got "
              f"{[s['metadata']['name'] for s in selected]}")
        check(any(e.get("port") == "metrics" for e in sm["endpoints"]),
              f"{name}: ServiceMonitor does not scrape the metrics port")
        check(selected and selected[0]["metadata"]["name"] == "verifyd" and "jobLabel" not in sm,
              f"{name}: the job label must come out as 'verifyd' (the alert rules select it)")
    rules = by_kind(docs, "PrometheusRule")
    if check(len(rules) == 1, f"{name}: expected one PrometheusRule"):
        with open(os.path.join(opslib.REPO, "deploy", "prometheus", "verifyd-rules.yml")) as f:
            want = yaml.safe_load(f)
        check(rules[0]["spec"] == want,
              f"{name}: PrometheusRule spec differs from deploy/prometheus/verifyd-rules.yml")
    print(f"{name}: {len(docs)} manifests checked (tp={tp}, replicas={spec.get('replicas', 1)})")


def check_envoy():
    with open(os.path.join(K8S, "session-affinity", "envoy.yaml")) as f:
        env = yaml.safe_load(f)
    clusters = env["static_resources"]["clusters"]
    check(len(clusters) == 1 and clusters[0]["lb_policy"] == "RING_HASH", "envoy: lb_policy must be RING_HASH")
    addr = clusters[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    check(addr["socket_address"]["address"] == "verifyd-headless", "envoy: must resolve the headless Service")
    text = yaml.safe_dump(env)
    check(SESSION_HEADER in text, f"envoy: no hash_policy on header {SESSION_HEADER}")
    print("session-affinity/envoy.yaml checked")


KNOWN_FLAGS = None  # flags the built verifyd accepts (--verifyd given), else None


def check_flags(name, args):
    if KNOWN_FLAGS is None:
        return
    for a in args:
        flag = a.split("=", 1)[0].lstrip("-")
        check(flag in KNOWN_FLAGS, f"{name}: verifyd does not know --{flag}")


def main():
    global KNOWN_FLAGS
    if len(sys.argv) > 2 and sys.argv[1] == "--verifyd":
        out = subprocess.run([sys.argv[2], "--helpfull"], capture_output=True, text=True)
        KNOWN_FLAGS = set(re.findall(r"^\s+-{1,2}([a-z_]+) ", out.stdout + out.stderr, re.M))
        check(len(KNOWN_FLAGS) > 5, f"could not read verifyd's flags from {sys.argv[2]} --helpfull")
    base = render(os.path.join(K8S, "base"))
    if base is None:
        failures.append("base kustomization uses features that need kubectl kustomize")
    else:
        check_set("base", base)
    overlays_dir = os.path.join(K8S, "overlays")
    for ov in sorted(os.listdir(overlays_dir)) if os.path.isdir(overlays_dir) else []:
        docs = render(os.path.join(overlays_dir, ov))
        if docs is None:
            print(f"note: overlays/{ov} not rendered: kubectl (kustomize) is not installed")
            continue
        check_set(f"overlays/{ov}", docs)
    check_envoy()
    if opslib.report_failures(failures):
        return 1
    print("PASS: kubernetes manifests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
