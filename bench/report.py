#!/usr/bin/env python3
"""Turn the raw "name value" lines of one bench/run.sh run into the table of
docs/performance.md: every figure next to the anchor measured in the same run,
as a ratio, and its goal."""
import os
import re
import statistics
import sys


def parse(path):
    vals = {}
    for line in open(path):
        parts = line.split()
        if len(parts) < 2:
            continue
        # "key value [key2 value2 ...]" and "prefix key value key value" forms
        if parts[0].startswith("echo_floor_"):
            prefix = parts[0]
            rest = parts[1:]
            for i in range(0, len(rest) - 1, 2):
                try:
                    vals[f"{prefix}_{rest[i]}"] = float(rest[i + 1])
                except ValueError:
                    pass
            continue
        try:
            vals[parts[0]] = float(parts[1])
        except ValueError:
            vals[parts[0]] = parts[1]
        for i in range(2, len(parts) - 1, 2):
            try:
                vals[f"{parts[0]}_{parts[i]}"] = float(parts[i + 1])
            except ValueError:
                pass
    return vals


machine = open(sys.argv[1]).read()
a = parse(sys.argv[2])
g = parse(sys.argv[3])
py = parse(sys.argv[4]) if len(sys.argv) > 4 else {}
# The journal pairs (bench/run.sh): the goal phases run in turn with the
# journal off and on in the same gpubufd, one file per round (on-K.txt,
# off-K.txt).
pairs = {"on": [], "off": []}
if len(sys.argv) > 5 and os.path.isdir(sys.argv[5]):
    for name in sorted(os.listdir(sys.argv[5]), key=lambda n: int(re.sub(r"\D", "", n) or 0)):
        m = re.fullmatch(r"(on|off)-\d+\.txt", name)
        if m:
            pairs[m.group(1)].append(parse(os.path.join(sys.argv[5], name)))
gpu = "mode gpu" in machine

# The socket round trip anchor: ipc_bench's 64 B ping-pong on the GPU machine,
# echo_floor's single client otherwise.
rtt = a.get("unix_socket_roundtrip_64B_median_us") or a.get("echo_floor_1_client_median_us")
rows = []


def row(figure, value, unit, ratio_text, goal, ok):
    mark = "" if ok is None else ("met" if ok else "MISSED")
    rows.append((figure, value, unit, ratio_text, goal, mark))


def f(v, d=1):
    return "n/a" if v is None else f"{v:.{d}f}"


warm = g.get("gpubuf_open_warm_median_us")
if warm and rtt:
    row("warm open (name -> device address, slab mapped)", warm, "µs",
        f"{warm / rtt:.2f} × round trip ({rtt:.1f} µs)", "≤ 1.5 ×", warm / rtt <= 1.5)
torch = a.get("torch_mp_share_1MiB_fresh_tensor_each_median_us")
if warm and torch:
    row("warm open vs torch.mp 1 MiB hand-over", warm, "µs",
        f"torch {torch:.0f} µs = {torch / warm:.1f} × gpubuf", "≥ 20 × faster", torch / warm >= 20)
cold = g.get("gpubuf_open_cold_2MiB_slab_median_us")
# The cold open is a request whose answer names a 2 MiB slab, then its
# import, in a fresh process that imports slab after slab and keeps each.
# The anchor (ipc_bench.c, fresh_consumer) makes the same two steps with no
# gpubuf in such a process (after its first 200 opens, kept): a 64-byte
# message answered with an IPC handle, then cuIpcOpenMemHandle of that
# 2 MiB allocation, timed together (since 2026-12-03; the IPC open's
# time moved from 35 to 88 µs between runs on the H200, so its sum with a
# round trip measured apart is no steady floor). Beside it: the run's
# round trip plus the anchor's first 2 MiB opens in a fresh process, and
# plus its 1 MiB opens. An anchor without the joint figure: the next one
# it has.
ipc_open1 = a.get("cuIpcOpenMemHandle_first_median_us")
ipc_open2 = a.get("cuIpcOpenMemHandle_2MiB_first_median_us")
ipc_open3 = a.get("cuIpcOpenMemHandle_2MiB_fresh_process_median_us")
joint = a.get("ipc_request_then_open_2MiB_median_us")
ipc_open = ipc_open3 or ipc_open2 or ipc_open1
if cold and rtt:
    if joint:
        base = joint
        what = (f"a 64-byte request answered with a handle + cuIpcOpenMemHandle of 2 MiB, timed "
                f"together ({joint:.1f} µs: request "
                f"{f(a.get('ipc_request_then_open_2MiB_roundtrip_median_us'))}, open "
                f"{f(a.get('ipc_request_then_open_2MiB_open_median_us'))})")
    else:
        base = rtt + (ipc_open or 0)
        if ipc_open3:
            what = f"round trip + cuIpcOpenMemHandle of 2 MiB in a fresh process ({ipc_open3:.1f} µs)"
        elif ipc_open2:
            what = f"round trip + cuIpcOpenMemHandle of 2 MiB ({ipc_open2:.1f} µs)"
        elif ipc_open:
            what = f"round trip + cuIpcOpenMemHandle ({ipc_open:.1f} µs)"
        else:
            what = "round trip (host pool: no IPC open)"
    if joint and ipc_open3:
        what += f"; {cold / (rtt + ipc_open3):.3f} × round trip + 2 MiB open apart ({ipc_open3:.1f} µs)"
    elif ipc_open3 and ipc_open2:
        what += (f"; {cold / (rtt + ipc_open2):.3f} × with 2 MiB's after 1 MiB opens and closes "
                 f"({ipc_open2:.1f} µs)")
    if ipc_open2 and ipc_open1:
        what += f"; {cold / (rtt + ipc_open1):.3f} × with 1 MiB's ({ipc_open1:.1f} µs)"
    # Three decimals: run AC's 1.2000 read as 1.20 and MISSED.
    row("cold open (first buffer of a new slab)", cold, "µs",
        f"{cold / base:.3f} × {what}", "≤ 1.2 ×", cold / base <= 1.2)
alloc = g.get("gpubuf_alloc_seal_1MiB_median_us")
if alloc and rtt:
    extra = ""
    cma = a.get("cuMemAlloc_1MiB_median_us")
    if cma:
        extra = f"; local cuMemAlloc 1 MiB {cma:.1f} µs"
    row("alloc + seal, 1 MiB, pool with free space", alloc, "µs",
        f"{alloc / rtt:.2f} × round trip{extra}", "≤ 1.5 ×", alloc / rtt <= 1.5 and (not cma or alloc < cma))
rel = g.get("gpubuf_release_median_us")
if rel and rtt:
    row("release (asynchronous, see docs/client-api.md)", rel, "µs",
        f"{rel / rtt:.2f} × round trip", "≤ 1.2 ×", rel / rtt <= 1.2)
thr = next((v for k, v in g.items() if k.startswith("gpubuf_mixed_ops_per_s")), None)
# The echo floor measured right before and after the mixed requests (their
# mean; gpubuf_bench --echo-floor) where the run has it, else the one of the
# run's start. Both are shown.
floor_start = a.get("echo_floor_16_aggregate_roundtrips_per_s")
floor_beside = g.get("mixed_echo_floor_16_beside_per_s")
floor16 = floor_beside or floor_start
if thr:
    if floor_beside:
        what = (f"{thr / floor16:.3f} × echo floor, 16 clients, right before and after it "
                f"({f(g.get('mixed_echo_floor_16_before_per_s'), 0)} and "
                f"{f(g.get('mixed_echo_floor_16_after_per_s'), 0)} round trips/s); "
                f"{thr / floor_start:.3f} × the run's first ({f(floor_start, 0)})" if floor_start
                else f"{thr / floor16:.3f} × echo floor, 16 clients, beside it")
    elif floor16:
        what = f"{thr / floor16:.3f} × echo floor, 16 clients ({f(floor16, 0)} round trips/s)"
    else:
        what = "no echo floor"
    row("throughput, 16 processes, mixed alloc/seal/open/release/delete", thr, "ops/s",
        what, "≥ 1.0 × echo floor", thr >= floor16 if floor16 else None)
bv, bl = g.get("dtod_GBps_gpubuf_view_median"), g.get("dtod_GBps_local_median")
if bv and bl:
    row("device-to-device copy 1 GiB, gpubuf view vs local", bv, "GB/s",
        f"{bv / bl:.3f} × local ({bl:.0f} GB/s)", "≥ 0.98", bv / bl >= 0.98)
pv, pl = (g.get("peer_copy_GBps_gpu1_reads_gpubuf_view_on_gpu0_median"),
          g.get("peer_copy_GBps_gpu1_local_median"))
if pv and pl:
    row("GPU 1 copies 1 GiB out of a gpubuf buffer on GPU 0 (peer view)", pv, "GB/s",
        f"{pv / pl:.3f} × a copy local to GPU 1 ({pl:.0f} GB/s, bytes copied per s)",
        "reported", None)
s10, s100k = g.get("scale_op_at_10_buffers_median_us"), g.get("scale_op_at_100k_buffers_median_us")
if s10 and s100k:
    row(f"op latency at 100k live buffers, {int(g.get('scale_clients_connected', 1000)):,} clients", s100k, "µs",
        f"{s100k / s10:.2f} × latency at 10 buffers ({s10:.1f} µs)", "≤ 1.2 ×", s100k / s10 <= 1.2)
st = g.get("scale_status_json_ms_median")
if st is not None:
    row("gpubufctl status --json at 100k buffers", st, "ms", "wall time incl. exec", "≤ 100 ms", st <= 100)
rss = g.get("scale_daemon_rss_per_live_buffer_bytes")
if rss is not None:
    row("daemon RSS per live buffer", rss, "B", "RSS growth over 100k buffers / 100k", "≤ 1 KiB", rss <= 1024)
mst, mpl = g.get("meta_status_100k_layout_lease_ms_median"), g.get("meta_status_100k_plain_ms_median")
if mst is not None:
    row("status (library) at 100k buffers with layout + lease", mst, "ms",
        f"{mst / mpl:.2f} × the same without metadata ({mpl:.1f} ms)" if mpl else "request to snapshot",
        "≤ 100 ms", mst <= 100)
mjs, mjp = (g.get("meta_status_json_100k_layout_lease_ms_median"),
            g.get("meta_status_json_100k_plain_ms_median"))
if mjs is not None:
    row("gpubufctl status --json at 100k buffers with layout + lease", mjs, "ms",
        f"{mjs / mjp:.2f} × without metadata ({mjp:.1f} ms); wall time incl. exec" if mjp
        else "wall time incl. exec", "≤ 100 ms", mjs <= 100)
mrss = g.get("meta_daemon_rss_per_buffer_layout_lease_bytes")
if mrss is not None:
    row("daemon RSS per buffer with a 2-D layout and a lease (no user bytes)", mrss, "B",
        "RSS growth over 100k buffers / 100k", "≤ 1 KiB", mrss <= 1024)
cr = g.get("crash_cleanup_after_close_median_us")
if cr is not None:
    row("crash cleanup: SIGKILL -> references released", cr / 1000, "ms",
        "from socket closed to status showing it", "≤ 5 ms", cr / 1000 <= 5)
# Python package: open + from_dlpack against the C warm open, and a
# Python-to-Python hand-over against torch.multiprocessing.
pw = py.get("py_open_warm_median_us")
if pw and warm:
    row("Python open (name -> Buffer.address), warm", pw, "µs",
        f"C warm open {warm:.1f} µs + {pw - warm:.1f} µs", "reported", None)
for fw in ("torch", "cupy", "numpy"):
    v = py.get(f"py_open_from_dlpack_{fw}_median_us")
    only = py.get(f"py_from_dlpack_only_{fw}_median_us")
    if v and warm:
        # The goal (#21): the C warm open plus the framework's own
        # from_dlpack, plus 3 µs for the package's part.
        share = f"; {fw}.from_dlpack alone {only:.1f} µs" if only else ""
        fresh = py.get(f"py_from_dlpack_fresh_{fw}_median_us")
        trip = py.get(f"py_from_dlpack_after_trip_{fw}_median_us")
        if fresh and trip:
            # python_bench.py: the same call on a Buffer just opened, and on
            # the old one right after a round trip through gpubufd.
            share += f" (on a Buffer just opened {fresh:.1f}, after a round trip {trip:.1f})"
        goal = "≤ C + from_dlpack alone + 3 µs" if only else "≤ C + 3 µs"
        row(f"Python open + {fw}.from_dlpack, warm", v, "µs",
            f"C warm open {warm:.1f} µs + {v - warm:.1f} µs{share}", goal,
            v - warm - (only or 0) <= 3)
# The consumer makes its tensor with torch.from_dlpack (any DLPack
# consumer's way), then with gpubuf.torch.as_tensor (the package's PyTorch
# way: torch's capsule import with the raw current stream).
for tag, how in (("", "torch.from_dlpack"), ("_gpubuf_torch", "gpubuf.torch.as_tensor")):
    ho = py.get(f"py_handover_1MiB_fresh_tensor{tag}_median_us")
    if ho:
        ratio = f"torch.mp {torch:.0f} µs = {torch / ho:.1f} × gpubuf" if torch else "no torch anchor"
        row(f"Python-to-Python hand-over, fresh 1 MiB CUDA tensor (seal -> consumer {how}, "
            "read t[0] -> ack)", ho, "µs", ratio, "≥ 10 × faster", torch / ho >= 10 if torch else None)
# What any hand-over of this shape pays (python_bench.py: a pipe's wake-up
# instead of seal + open, the same tensor, read and ack): torch.mp over it
# says how far the ≥ 10 × above can go on this machine (measured after the
# hand-overs: a comparison of the same minute, not a strict bound).
fl = py.get("py_handover_floor_1MiB_median_us")
if fl:
    ratio = f"torch.mp {torch:.0f} µs = {torch / fl:.1f} × floor" if torch else "no torch anchor"
    row("hand-over floor: the same processes, tensor, t[0] and ack, woken by a pipe "
        "(no gpubuf in the span)", fl, "µs", ratio, "reported", None)
hi = py.get("py_handover_1MiB_incl_alloc_median_us")
if hi:
    ratio = f"torch.mp {torch:.0f} µs = {torch / hi:.1f} × gpubuf" if torch else "no torch anchor"
    row("the same hand-over including alloc + fill + synchronize", hi, "µs", ratio, "reported", None)


# cuda-vmm pools, read-only opens, stream order and copies (bench/run.sh --only vmm).
# Cold opens are against the single-client echo floor (the socket round trip)
# plus vmm_bench's import-and-map of an allocation of the slab's size.
echo_rtt = a.get("echo_floor_1_client_median_us") or rtt
for mib in (2, 64):
    cold = g.get(f"vmm_open_cold_{mib}MiB_slab_median_us")
    anc = a.get(f"vmm_import_map_{mib}MiB_median_us")
    if cold and anc and echo_rtt:
        base = echo_rtt + anc
        row(f"cold open, cuda-vmm, {mib} MiB slab", cold, "µs",
            f"{cold / base:.2f} × round trip ({echo_rtt:.1f} µs) + VMM import and map ({anc:.1f} µs)",
            "≤ 1.2 ×", cold / base <= 1.2)
wi, wv, wr = (g.get("warm_open_ipc_median_us"), g.get("warm_open_vmm_median_us"),
              g.get("warm_open_vmm_ro_median_us"))
if wi and wv:
    row("warm open, cuda-vmm vs cuda-ipc", wv, "µs", f"{wv / wi:.2f} × cuda-ipc ({wi:.1f} µs)",
        "≤ 1.05 ×", wv / wi <= 1.05)
if wv and wr:
    row("warm open read-only, cuda-vmm", wr, "µs", f"{wr / wv:.2f} × read-write ({wv:.1f} µs)",
        "≤ 1.05 ×", wr / wv <= 1.05)
for mib in (2, 64):
    rw, ro = g.get(f"vmm_open_cold_{mib}MiB_slab_median_us"), g.get(f"vmm_open_cold_ro_{mib}MiB_slab_median_us")
    arw, aro = a.get(f"vmm_import_map_{mib}MiB_median_us"), a.get(f"vmm_import_map_ro_{mib}MiB_median_us")
    if rw and ro:
        extra = f"; anchor read-only {aro / arw:.2f} × read-write" if arw and aro else ""
        row(f"cold open read-only, cuda-vmm, {mib} MiB slab", ro, "µs",
            f"{ro / rw:.2f} × read-write ({rw:.1f} µs){extra}", "≤ 1.05 ×", ro / rw <= 1.05)
spin = g.get("seal_stream_kernel_spin_us")
for kind in ("vmm", "ipc"):
    ss, sq = g.get(f"seal_stream_{kind}_host_median_us"), g.get(f"seal_after_sync_{kind}_host_median_us")
    running, its = g.get(f"seal_stream_{kind}_kernel_still_running"), g.get(f"seal_stream_{kind}_iterations")
    if ss and sq and its:
        row(f"seal on a stream, cuda-{kind}, producer kernel of {f(spin / 1000 if spin else None)} ms running",
            ss, "µs",
            f"seal after cuStreamSynchronize: {sq:.0f} µs; the producer gets {sq - ss:.0f} µs back; "
            f"returned before its kernel ended {running:.0f}/{its:.0f}",
            "returns before the kernel ends, every time", running == its)
tho, thp = a.get("torch_event_handover_median_us"), a.get("torch_event_handover_p99_us")
tbad = a.get("torch_event_handover_order_violations")
torch_note = f", {tbad:.0f} out of order" if tbad else ""
for kind in ("vmm", "ipc"):
    ho, hp = g.get(f"handover_{kind}_median_us"), g.get(f"handover_{kind}_p99_us")
    bad, n = g.get(f"handover_{kind}_order_violations"), g.get(f"handover_{kind}_count")
    if ho is None:
        continue
    what = f"p99 {f(hp)} µs, {f(n, 0)} hand-overs, {f(bad, 0)} out of order"
    if tho:
        row(f"producer kernel end -> consumer kernel start, cuda-{kind}", ho, "µs",
            f"{ho / tho:.2f} × torch.multiprocessing ({tho:.1f} µs, p99 {f(thp)} µs{torch_note}); {what}",
            "≤ 1.0 × torch", ho / tho <= 1.0 and bad == 0)
    else:
        row(f"producer kernel end -> consumer kernel start, cuda-{kind}", ho, "µs",
            f"no torch anchor in this run; {what}", "≤ 1.0 × torch", None)
for key, label in (("h2d_vmm", "async copy host -> cuda-vmm view, 256 MiB pinned"),
                   ("d2h_vmm", "async copy cuda-vmm view -> host, 256 MiB pinned"),
                   ("h2d_ipc", "async copy host -> cuda-ipc view, 256 MiB pinned"),
                   ("d2h_ipc", "async copy cuda-ipc view -> host, 256 MiB pinned"),
                   ("d2d_vmm_to_vmm", "device-to-device copy 1 GiB, cuda-vmm view -> cuda-vmm view"),
                   ("d2d_vmm_to_ipc", "device-to-device copy 1 GiB, cuda-vmm view -> cuda-ipc view")):
    v, l = g.get(f"copy_{key}_gpubuf_GBps"), g.get(f"copy_{key}_local_GBps")
    if v and l:
        row(label, v, "GB/s", f"{v / l:.3f} × the same copy between local allocations ({l:.1f} GB/s)",
            "≥ 0.98 ×", v / l >= 0.98)
mism = g.get("copy_d2d_verify_mismatches")
if mism is not None:
    row("device-to-device copies checked word by word", mism, "mismatches", "both destinations",
        "0", mism == 0)

# Batches (bench/run.sh --only batch): 1,000 opens and releases in one call
# each, against single warm opens of the same buffers in the same phase.
# The latency phase's warm open, or the batch phase's own single opens.
single = g.get("gpubuf_open_warm_median_us") or g.get("batch_single_open_median_us")
for way in ("open", "release"):
    per_s = g.get(f"batch_{way}_buffers_per_s")
    if per_s and single:
        x = per_s / (1e6 / single)
        goal, ok = ("≥ 2 M/s and ≥ 20 ×", per_s >= 2e6 and x >= 20) if way == "open" else \
            ("≥ 2 M/s", per_s >= 2e6)
        row(f"batch {way}, 1,000 sealed buffers of mapped slabs in one call", per_s / 1e6,
            "M buffers/s", f"{x:.1f} × single warm opens ({single:.1f} µs each)", goal, ok)
for k, v in g.items():
    if k.startswith("batch_mixed_ops_per_s_"):
        procs = k.rsplit("_", 1)[1]
        mixed = g.get(f"gpubuf_mixed_ops_per_s_{procs}")
        ratio = f"{v / mixed:.1f} × single requests ({mixed / 1e6:.2f} M/s)" if mixed else "-"
        row(f"batched alloc+seal/open/delete/release, {procs.replace('proc', '')} processes",
            v / 1e6, "M ops/s", ratio, "≥ 5 M/s", v >= 5e6)

# The asynchronous API (bench/async.c, phase async): an open started and
# completed through the client fd against the synchronous open of the same
# buffers in the same phase; 10,000 waiting opens on one connection
# completed after their seals (sealed by a second connection, timed from the
# last seal applied to the last completion delivered); the daemon's memory
# per waiting open (its RSS growth over the 10,000).
# The synchronous open compared is one that sleeps until its reply, as the
# event loop's poll() does (GPUBUF_SPIN_US=0); the default one, which polls
# for its reply first, is given beside it.
a_sync, a_async = g.get("async_sync_open_median_us"), g.get("async_open_median_us")
a_poll = g.get("async_sync_open_polling_median_us")
if a_sync and a_async:
    polling = f"; polling for the reply {a_poll:.1f} µs" if a_poll else ""
    row("asynchronous open (gpubuf_open_start + dispatch), warm", a_async, "µs",
        f"synchronous open + {a_async - a_sync:.2f} µs ({a_sync:.1f} µs, sleeping{polling})",
        "≤ sync + 2 µs", a_async <= a_sync + 2)
done = g.get("async_completions_after_seals_per_s")
if done:
    row("10,000 waiting opens on one connection, completed after their seals", done / 1e3,
        "k completions/s", "from the last seal to the last completion", "≥ 1,000 k/s (1 M/s)",
        done >= 1e6)
per_wait = g.get("async_daemon_bytes_per_waiting_open")
if per_wait is not None:
    row("daemon memory per waiting open", per_wait, "B",
        "a fresh gpubufd's RSS growth over 40,000 waiting opens (4 connections) / 40,000",
        "reported", None)

print("```")
print(machine.strip())
print("```")
print()
print("| figure | gpubuf | against the anchor (same run) | goal | |")
print("|---|---|---|---|---|")
for fig, v, unit, ratio, goal, mark in rows:
    print(f"| {fig} | {v:.1f} {unit} | {ratio} | {goal} | {mark} |")

# Journal pairs: each goal figure that restart survival must not slow down,
# its median over the rounds with the journal on and over those with it off.
def pair_figures(v):
    out = []
    for key, label, unit, lower in (
            ("gpubuf_open_warm_median_us", "warm open", "µs", True),
            ("gpubuf_alloc_seal_1MiB_median_us", "alloc + seal, 1 MiB", "µs", True),
            ("gpubuf_open_cold_2MiB_slab_median_us", "cold open, new slab", "µs", True),
            ("batch_open_buffers_per_s", "batch open of 1,000", "buffers/s", False),
            ("batch_release_buffers_per_s", "batch release of 1,000", "buffers/s", False)):
        out.append((label, v.get(key), unit, lower))
    out.append(("mixed single requests, 16 processes", next(
        (x for k, x in v.items() if k.startswith("gpubuf_mixed_ops_per_s")), None), "ops/s", False))
    out.append(("batched alloc+seal/open/delete/release, 16 processes", next(
        (x for k, x in v.items() if k.startswith("batch_mixed_ops_per_s_")), None), "ops/s", False))
    return out


if pairs["on"] and pairs["off"]:
    print()
    print(f"Journal on/off pairs (one gpubufd with state_journal = switchable, after every other "
          f"phase: the goal phases {len(pairs['off'])} times with the journal off and "
          f"{len(pairs['on'])} times on, in turn; medians; cost = how much slower with the "
          f"journal):")
    print()
    print("| figure | journal on | journal off | cost of the journal | rounds' range on / off | goal | |")
    print("|---|---|---|---|---|---|---|")
    on_rounds = [pair_figures(v) for v in pairs["on"]]
    off_rounds = [pair_figures(v) for v in pairs["off"]]
    for i, (label, _, unit, lower) in enumerate(pair_figures({})):
        ons = [r[i][1] for r in on_rounds if r[i][1]]  # None or 0: the phase failed
        offs = [r[i][1] for r in off_rounds if r[i][1]]
        if not ons or not offs:
            continue
        on, off = statistics.median(ons), statistics.median(offs)
        cost = on / off if lower else off / on
        big = unit.endswith("/s") and on > 1e4
        fmt = (lambda x: f"{x / 1e6:.2f} M {unit}") if big else (lambda x: f"{x:.1f} {unit}")
        span = (lambda xs: f"{min(xs) / 1e6:.2f}–{max(xs) / 1e6:.2f}") if big else \
            (lambda xs: f"{min(xs):.1f}–{max(xs):.1f}")
        print(f"| {label} | {fmt(on)} | {fmt(off)} | {cost:.3f} × | {span(ons)} / {span(offs)} | "
              f"≤ 1.1 × | {'met' if cost <= 1.1 else 'MISSED'} |")
    # What the journal's writing itself took in the runs with it on
    # (bench/pairs.c, journal-work.txt: gpubufd's SIGUSR2 messages summed per
    # phase). The entries are appended during the registry's work, which
    # this does not time.
    work = os.path.join(sys.argv[5], "journal-work.txt")
    if os.path.exists(work):
        print()
        print("The journal's writes in those runs with it on (gpubufd's clock; groups of 4 KiB or "
              "more, a batch's, are each timed from framing to copy; the entries appended during "
              "the registry's work are not in this):")
        print()
        print("| phase | time on | groups | of 4 KiB or more | each | their share of the time on "
              "| snapshots |")
        print("|---|---|---|---|---|---|---|")
        for line in open(work):
            f = line.split()
            if len(f) != 10:
                continue
            secs = float(f[2])
            groups, nbytes, big, big_bytes, big_ns, snaps, snap_ns = map(int, f[3:])
            each = f"{big_ns / big / 1e3:.1f} µs, {big_bytes / big / 1024:.1f} KiB" if big else "-"
            share = f"{big_ns / 1e9 / secs * 100:.2f} %" if secs > 0 else "-"
            print(f"| {f[0]} | {secs:.1f} s | {groups} ({nbytes / 1048576:.1f} MiB) | {big} | "
                  f"{each} | {share} | {snaps}, {snap_ns / 1e6:.1f} ms |")
print()
print("Anchors measured in this run:")
for k in ("unix_socket_roundtrip_64B_median_us", "cuIpcOpenMemHandle_first_median_us",
          "cuIpcOpenMemHandle_2MiB_first_median_us", "cuIpcOpenMemHandle_2MiB_fresh_process_median_us",
          "ipc_request_then_open_2MiB_median_us",
          "cuMemAlloc_1MiB_median_us", "torch_mp_share_1MiB_fresh_tensor_each_median_us",
          "torch_mp_share_1MiB_same_tensor_again_median_us", "dtod_copy_GBps_ipc_src_median",
          "echo_floor_1_client_median_us", "echo_floor_16_aggregate_roundtrips_per_s",
          "vmm_import_map_2MiB_median_us", "vmm_import_map_ro_2MiB_median_us",
          "vmm_import_map_64MiB_median_us", "vmm_import_map_ro_64MiB_median_us",
          "vmm_import_only_64MiB_median_us", "vmm_reserve_map_access_64MiB_median_us",
          "vmm_anchor_socket_roundtrip_64B_median_us", "torch_event_handover_median_us",
          "torch_event_handover_p99_us", "torch_event_handover_order_violations"):
    if k in a:
        print(f"- {k}: {a[k]:g}")
print()
print("gpubuf p99s:", ", ".join(f"{k} {v:g}" for k, v in g.items() if k.endswith("p99_us")))
if py:
    print()
    print("Python p99s:", ", ".join(f"{k} {v:g}" for k, v in py.items() if k.endswith("p99_us")))
host_path = [(k, v) for k, v in g.items() if k.endswith("_consumer_wait_and_launch_median_us")]
if host_path:
    print()
    print(f"Hand-over, consumer's wait + launch on the host (the producer's kernel spins "
          f"{f(g.get('handover_spin_us'), 0)} µs):",
          ", ".join(f"{k} {v:g}" for k, v in host_path))
for tag, how in (("", "torch.from_dlpack"), ("_gpubuf_torch", "gpubuf.torch.as_tensor")):
    pre = f"py_handover{tag}_step_"
    ho_steps = [(k[len(pre):-len("_median_us")], v) for k, v in py.items()
                if k.startswith(pre) and k.endswith("_median_us")]
    if ho_steps:
        print()
        print(f"Python hand-over ({how}), where the time goes (medians, µs; to_open counts from "
              "the seal call, the seal included; tensor: the consumer making its tensor):",
              ", ".join(f"{k} {v:g}" for k, v in ho_steps))
pre = "py_handover_floor_step_"
fl_steps = [(k[len(pre):-len("_median_us")], v) for k, v in py.items()
            if k.startswith(pre) and k.endswith("_median_us")]
if fl_steps:
    print()
    print("Hand-over floor (no gpubuf in the span), where the time goes (medians, µs; wake: the "
          "producer's byte -> the consumer's recv returned):",
          ", ".join(f"{k} {v:g}" for k, v in fl_steps))
