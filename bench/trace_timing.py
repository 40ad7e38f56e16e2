#!/usr/bin/env python3
"""Per-step medians of a timestamp trace (GPUBUF_TRACE_TIMING=1).

The client library and gpubufd each append "session request type step ns"
lines to $GPUBUF_TRACE_DIR/gpubuf-trace-<pid>.txt (common/trace.h). This
joins the two sides' records of each request (same session and request id;
CLOCK_MONOTONIC is one clock for the machine), keeps the requests of one type
that passed every step, and prints the median time of each step since the one
before it, and of the whole request.

    bench/trace_timing.py [--type open] [--map-over US] TRACE_FILE...

--map-over US keeps only the requests whose last step (the client's mapping
cache and view) took more than US microseconds: the opens that imported a
slab (the cold opens), apart from the warm ones.

--windows FILE --side on|off keeps only the requests that began while the
journal was on (off) in a traced run of the journal pairs: FILE is their
switches.txt (bench/pairs.c: a line "ns on|off" when each run's side was in
place, "ns end" when the pairs were done; a window without an end runs to
the end of the trace).

Use one daemon per trace directory (session ids restart with each daemon).
"""
import argparse
import bisect
import collections
import statistics
import sys

STEPS = [
    ("c_encode", "client: pack the request"),
    ("c_sent", "client: sendmsg"),
    ("d_wake", "daemon: epoll_wait returns"),
    ("d_read", "daemon: recvmsg"),
    ("d_decoded", "daemon: unpack"),
    ("d_handled", "daemon: registry work"),
    ("d_encoded", "daemon: pack and queue the reply"),
    ("d_written", "daemon: sendmsg"),
    ("c_wake", "client: recvmsg returns the reply"),
    ("c_decoded", "client: unpack"),
    ("c_mapped", "client: mapping cache, view"),
]
# The daemon's request types (daemon/metrics.h, gd_req_type).
TYPES = ["hello", "alloc", "seal", "open", "release", "unmap", "delete", "stat", "status", "renew",
         "other", "batch_open", "batch_release", "batch_alloc", "batch_seal", "batch_delete"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="open", help="request type (default: open)")
    ap.add_argument("--map-over", type=float, default=None, metavar="US",
                    help="only requests whose mapping step took longer (cold opens)")
    ap.add_argument("--windows", metavar="FILE", help="switches.txt of a traced pairs run")
    ap.add_argument("--side", choices=("on", "off"), help="with --windows: which side's requests")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    if bool(a.windows) != bool(a.side):
        sys.exit("--windows and --side go together")
    if a.type not in TYPES:
        sys.exit(f"unknown type {a.type}; one of {', '.join(TYPES)}")
    want = TYPES.index(a.type)
    reqs = collections.defaultdict(dict)
    types = {}
    for path in a.files:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) != 5:
                    continue
                key = (int(p[0]), int(p[1]))
                typ, step, ns = int(p[2]), int(p[3]), int(p[4])
                if typ >= 0:
                    types[key] = typ
                # The first record of a step wins (a reply read twice is not).
                reqs[key].setdefault(step, ns)
    n_steps = len(STEPS)
    rows = [k for k, v in reqs.items() if types.get(k) == want and len(v) == n_steps]
    if a.windows:
        marks = []
        with open(a.windows) as f:
            for line in f:
                p = line.split()
                if len(p) == 2 and p[1] in ("on", "off", "end"):
                    marks.append((int(float(p[0])), p[1]))
        marks.sort()
        starts = [t for t, _ in marks]

        def side_of(ns):
            i = bisect.bisect_right(starts, ns) - 1
            return marks[i][1] if i >= 0 else None

        rows = [k for k in rows if side_of(reqs[k][0]) == a.side]
    if a.map_over is not None and rows:
        rows = [k for k in rows if reqs[k][n_steps - 1] - reqs[k][n_steps - 2] > a.map_over * 1e3]
        if not rows:
            sys.exit(f"no {a.type} request's mapping step took over {a.map_over:g} µs "
                     "(no open imported a slab)")
    if not rows:
        sys.exit(f"no {a.type} request with all {n_steps} steps in the trace "
                 "(was GPUBUF_TRACE_TIMING=1 set for both the daemon and the client?)")
    which = f" whose mapping took over {a.map_over:g} µs" if a.map_over is not None else ""
    print(f"{len(rows)} {a.type} requests{which}; median per step, microseconds\n")
    print(f"| step | what | median µs | share |")
    print(f"|---|---|---|---|")
    total = statistics.median((reqs[k][n_steps - 1] - reqs[k][0]) / 1e3 for k in rows)
    for i in range(1, n_steps):
        med = statistics.median((reqs[k][i] - reqs[k][i - 1]) / 1e3 for k in rows)
        print(f"| {STEPS[i - 1][0]} -> {STEPS[i][0]} | {STEPS[i][1]} | {med:.2f} | "
              f"{100 * med / total:.0f} % |")
    print(f"| total | {STEPS[0][0]} -> {STEPS[-1][0]} | {total:.2f} | 100 % |")


if __name__ == "__main__":
    main()
