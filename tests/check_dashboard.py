#!/usr/bin/env python3
"""Every metric the Grafana dashboard (deploy/grafana/*.json) queries exists
in `gpubufctl metrics` from a running gpubufd: a renamed or dropped metric
fails here, not on an operator's empty panel. Also: the dashboard is valid
JSON with a Prometheus datasource input, unique panel ids and a query in
every panel.

    check_dashboard.py GPUBUFD GPUBUFCTL DASHBOARD...
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def metrics_from_daemon(gpubufd, ctl):
    with tempfile.TemporaryDirectory(prefix="gpubuf-dash-") as tmp:
        sock = os.path.join(tmp, "gpubufd.sock")
        d = subprocess.Popen([gpubufd, "--socket", sock, "--pool", "host=host,capacity=16M",
                              "--log-level", "warning"])
        try:
            for _ in range(2000):  # until it answers, whatever the load
                if subprocess.run([ctl, "--socket", sock, "pools"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0:
                    break
                if d.poll() is not None:
                    sys.exit(f"check_dashboard: gpubufd exited {d.returncode}")
                time.sleep(0.05)
            # An error reply, so that the error counters have a sample.
            subprocess.run([ctl, "--socket", sock, "delete", "no-such-buffer"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out = subprocess.run([ctl, "--socket", sock, "metrics"], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
        finally:
            d.terminate()
            d.wait()
    names = set()
    for line in out.splitlines():
        m = re.match(r"# TYPE (\w+) (\w+)", line)
        if m:
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][\w:]*", line).group(0))
    return names


def main(gpubufd, ctl, *dashboards):
    have = metrics_from_daemon(gpubufd, ctl)
    errors, used = [], set()
    for path in dashboards:
        d = json.load(open(path))
        if not any(i.get("pluginId") == "prometheus" for i in d.get("__inputs", [])):
            errors.append(f"{path}: no Prometheus datasource input (import asks for none)")
        ids = [p["id"] for p in d["panels"]]
        if len(ids) != len(set(ids)):
            errors.append(f"{path}: panel ids repeat")
        for p in d["panels"]:
            exprs = [t.get("expr", "") for t in p.get("targets", [])]
            if not exprs or not all(exprs):
                errors.append(f"{path}: panel '{p.get('title')}' has no query")
            for e in exprs:
                for name in re.findall(r"\bgpubuf_\w+", e):
                    used.add(name)
                    if name not in have:
                        errors.append(f"{path}: panel '{p['title']}' queries {name}, which "
                                      "gpubufctl metrics does not print")
    for e in errors:
        print("check_dashboard:", e, file=sys.stderr)
    if errors:
        return 1
    print(f"check_dashboard: {len(used)} metrics queried, all printed by gpubufctl metrics: "
          + " ".join(sorted(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
