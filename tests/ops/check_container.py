#!/usr/bin/env python3
"""Structural checks of deploy/container/Dockerfile (no Docker engine here to build it).

Parses the Dockerfile (continuation lines joined, comments dropped) and asserts: a multi-stage
build with named stages; a CUDA *devel* build stage that installs with `cmake --install` and a
CUDA *runtime* final stage; the final stage copies only the install tree and the build stage's
list of runtime packages (which it installs with apt: no shared library copied between stages); runs as a numeric non-root user; exposes the
gRPC and metrics ports; has exec-form ENTRYPOINT verifyd and a HEALTHCHECK; no inline comment
inside a continued RUN (Docker joins the lines, so '#' would swallow the rest of the command);
and every flag in CMD/HEALTHCHECK is one the deploy files use consistently. Then says plainly
that the image itself was not built.
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opslib  # noqa: E402

DOCKERFILE = os.path.join(opslib.REPO, "deploy", "container", "Dockerfile")

failures = []
check = opslib.checker(failures)


def parse(path):
    """Returns [(instruction, args, first_line_no)] and raw continued-RUN lines for linting."""
    instrs, cur, start, run_lines = [], "", 0, []
    with open(path) as f:
        lines = f.read().split("\n")
    for no, line in enumerate(lines, 1):
        stripped = line.strip()
        if not cur and (not stripped or stripped.startswith("#")):
            continue
        if cur and stripped.startswith("#"):
            continue  # Docker drops comment lines inside continuations
        if not cur:
            start = no
        if cur.upper().startswith("RUN") or (not cur and stripped.upper().startswith("RUN")):
            run_lines.append((no, line))
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        instrs.append((word.upper(), rest.strip(), start))
        cur = ""
    return instrs, run_lines


def main():
    instrs, run_lines = parse(DOCKERFILE)
    froms = [(a, n) for i, a, n in instrs if i == "FROM"]
    check(len(froms) >= 2, "Dockerfile must be multi-stage (>= 2 FROM)")
    stages = []
    for args, n in froms:
        m = re.match(r"(\S+)\s+AS\s+(\S+)", args, re.I)
        check(m is not None, f"line {n}: FROM without a stage name (FROM image AS name)")
        if m:
            stages.append((m.group(1), m.group(2)))
    if len(stages) >= 2:
        check("cuda" in stages[0][0] and "devel" in stages[0][0],
              f"build stage should be a CUDA devel image, is {stages[0][0]}")
        check("cuda" in stages[-1][0] and "runtime" in stages[-1][0],
              f"final stage should be a CUDA runtime image, is {stages[-1][0]}")
    # Instructions of the final stage.
    last_from = max(i for i, (ins, _, _) in enumerate(instrs) if ins == "FROM")
    final = instrs[last_from + 1:]
    copies = [a for i, a, _ in final if i == "COPY"]
    check(any(f"--from={stages[0][1]}" in c for c in copies) if stages else False,
          "final stage must COPY --from the build stage")
    # The install tree comes from `cmake --install`, the libraries from the distribution's
    # packages (named by the build stage): no shared library is copied between the stages.
    build = instrs[:last_from]
    check(any(i == "RUN" and "cmake --install" in a for i, a, _ in build),
          "the build stage must install with cmake --install")
    for c in copies:
        if f"--from={stages[0][1] if stages else ''}" in c:
            check(re.search(r"/out/(install|runtime-packages)\b", c) is not None,
                  f"final stage copies something else than the install tree or the package list: {c}")
    check(any(i == "RUN" and "apt-get install" in a and "runtime-packages" in a for i, a, _ in final),
          "final stage must apt-get install the build stage's runtime packages")
    users = [a for i, a, _ in final if i == "USER"]
    if check(users, "final stage has no USER (would run as root)"):
        uid = users[-1].split(":")[0]
        check(uid.isdigit() and int(uid) != 0,
              f"final USER must be a numeric non-root uid (Kubernetes runAsNonRoot), got {uid}")
    exposed = " ".join(a for i, a, _ in final if i == "EXPOSE").split()
    check("50051" in exposed and "9400" in exposed, f"EXPOSE 50051 and 9400 needed, got {exposed}")
    ep = [a for i, a, _ in final if i == "ENTRYPOINT"]
    check(ep and ep[-1].startswith("[") and "verifyd" in ep[-1], "ENTRYPOINT must be exec-form verifyd")
    check(any(i == "HEALTHCHECK" for i, _, _ in final), "final stage has no HEALTHCHECK")
    check(not any(i == "ADD" and re.search(r"https?://", a) for i, a, _ in instrs),
          "ADD of a URL: fetch in a RUN with checksums instead")
    for no, line in run_lines:
        code = line.split("#", 1)
        if len(code) == 2 and line.rstrip().endswith("\\") and not line.strip().startswith("#"):
            failures.append(f"line {no}: '#' inside a continued RUN swallows the rest of the command")
    cmd = " ".join(a for i, a, _ in final if i in ("CMD", "HEALTHCHECK"))
    for flag in ("--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9400", "--target=127.0.0.1:50051"):
        check(flag in cmd, f"CMD/HEALTHCHECK should contain {flag}")

    if opslib.report_failures(failures):
        return 1
    engine = shutil.which("docker") and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0
    print(f"Dockerfile: {len(stages)} stages ({', '.join(s[1] for s in stages)}), "
          f"{len(instrs)} instructions checked")
    if not engine:
        print("note: the image was NOT built: no Docker engine on this machine")
    else:
        print("note: a Docker engine is present, but this test does not build the image (slow);"
              " build it with: docker build -f deploy/container/Dockerfile .")
    print("PASS: Dockerfile structure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
