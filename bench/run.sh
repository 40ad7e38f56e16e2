#!/usr/bin/env bash
# One command for the whole benchmark: builds gpubuf (Release), runs the
# anchor programs and gpubuf's benchmarks in the same run, and prints one
# table of ratios against the anchors (bench/report.py).
#
#   bench/run.sh [--host] [--only base|vmm|batch|meta|restart[,...]] [--out DIR] [--trace]
#                [--no-journal-pairs]
#
# Journal pairs: gpubufd runs with state_journal = switchable (a key for
# measurement only: SIGUSR2 turns its journal off, and on again after a whole
# snapshot). After every other phase, in the same daemon, the phases of the
# goals that restart survival must not slow down (latency, cold, throughput
# of the base group; batch, batchmix) run 8 more times each, back to back,
# the journal off, on, on, off, off, on, on, off (bench/pairs.c); the report gives each figure's median with the
# journal on and off and the ratio (goal <= 1.1), and what the journal wrote
# in the runs with it on (OUT/pairs/journal-work.txt, from gpubufd's SIGUSR2
# messages). --no-journal-pairs skips them.
#
# --trace: the daemon and the benchmark record a timestamp at each step of
# every request (GPUBUF_TRACE_TIMING=1, files in DIR/trace), and the report
# ends with the median of each step of a warm open, an alloc and the batch
# requests (bench/trace_timing.py): for machines without perf or strace.
# With a GPU (nvcc and a driver present): cuda-ipc pools, CUDA anchors
# (ipc_bench.c), torch.multiprocessing anchor when python3 has torch.
# With --host or without a GPU: host pools and the socket anchors only.
# --only picks groups of phases (default: all of them):
#   base  the phases of the cuda-ipc (or host) pools: latency, cold,
#         throughput, bandwidth, peer, crash, scale, with their anchors
#   vmm   cuda-vmm pools, read-only opens, stream-ordered seal and hand-over,
#         asynchronous and device-to-device copies (GPU only), with their
#         anchors (vmm_bench.c, torch_event_bench.py) and the socket round trip
#   batch single warm open and alloc + seal against the socket round trip,
#         1,000 opens and releases in one call each, 16 processes doing
#         batched alloc/seal/open/release/delete (host or cuda-ipc pools)
#   restart  recovery time of gpubufd --takeover (start to serving) for 100k
#         buffers of a host pool (and of a cuda-vmm pool with a GPU), against a
#         fresh start; printed on its own (bench/restart_bench.c)
#   meta  array metadata and leases: status and daemon memory at 100k buffers
#         with a layout and a lease (works with --host)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
out=${TMPDIR:-/tmp}/gpubuf-bench
groups=""
trace=0
pairs=1
usage() { echo "usage: bench/run.sh [--host] [--only base|vmm|batch|meta|restart[,...]] [--out DIR] [--trace] [--no-journal-pairs]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --host) mode=host ;;
    --trace) trace=1 ;;
    --no-journal-pairs) pairs=0 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
    --only) [ $# -ge 2 ] || usage; groups=$2; shift ;;
    *) usage ;;
    esac
    shift
done
if [ $mode = gpu ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "bench/run.sh: no GPU found: running the host-pool benchmarks" >&2
    mode=host
fi
base=0
vmm=0
restart=0
batch=0
meta=0
for g in ${groups//,/ }; do
    case $g in
    base) base=1 ;;
    vmm) vmm=1 ;;
    restart) restart=1 ;;
    batch) batch=1 ;;
    meta) meta=1 ;;
    *) usage ;;
    esac
done
if [ -z "$groups" ]; then
    base=1
    batch=1
    meta=1
    [ $mode = gpu ] && vmm=1
fi
if [ $vmm = 1 ] && [ $mode = host ]; then
    echo "bench/run.sh: the vmm phases need a GPU" >&2
    exit 2
fi
mkdir -p "$out"
start=$(date +%s)
phase() { echo "bench/run.sh: $* ($(($(date +%s) - start)) s)" >&2; }
build=$out/build
jobs=$(nproc)
py=$(command -v python3 || true)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUBUF_BUILD_TESTS=OFF \
    ${py:+-DPython3_EXECUTABLE=$py} ${GPUBUF_CMAKE_ARGS:-} >"$out/cmake.log"
cmake --build "$build" -j"$jobs" >"$out/build.log"

{
    echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "mode $mode"
    echo "groups $(g=(); [ $base = 1 ] && g+=(base); [ $vmm = 1 ] && g+=(vmm); [ $batch = 1 ] && g+=(batch); [ $meta = 1 ] && g+=(meta); IFS=,; echo "${g[*]}")"
    echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "cores $(nproc)"
    [ $mode = gpu ] && echo "gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
} >"$out/machine.txt"

phase "built"
if [ $restart = 1 ]; then
    # Recovery time: a successor taking over 100k buffers, on host pools and,
    # with a GPU, on a cuda-vmm pool; each on its own socket.
    : >"$out/restart.txt"
    "$build/bench/gpubuf_restart_bench" --gpubufd "$build/daemon/gpubufd" \
        --socket "$out/restart-host.sock" --pool "bench=host,capacity=2G" --buffers 100000 |
        tee -a "$out/restart.txt"
    if [ $mode = gpu ]; then
        "$build/bench/gpubuf_restart_bench" --gpubufd "$build/daemon/gpubufd" \
            --socket "$out/restart-vmm.sock" --pool "bench=cuda-vmm,device=0,capacity=8G" \
            --buffers 100000 | tee -a "$out/restart.txt"
    fi
    phase "restart benchmark done"
    [ $base = 0 ] && [ $vmm = 0 ] && [ $batch = 0 ] && [ $meta = 0 ] && exit 0
fi
# Anchors, measured in this run. The single-client echo floor is the socket
# round trip of both groups.
cc -O2 -o "$out/echo_floor" bench/anchors/echo_floor.c
: >"$out/anchors.txt"
for n in 1 16; do
    [ $n = 16 ] && [ $base = 0 ] && continue
    "$out/echo_floor" $n $((n == 1 ? 20000 : 5000)) 64 | sed "s/^/echo_floor_$n /" >>"$out/anchors.txt"
done
has_torch=0
if [ $mode = gpu ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    has_torch=1
fi
if [ $mode = gpu ] && [ $base = 1 ]; then
    nvcc -O2 -o "$out/ipc_bench" bench/anchors/ipc_bench.c -lcuda
    "$out/ipc_bench" >>"$out/anchors.txt"
    phase "ipc_bench done"
    if [ $has_torch = 1 ]; then
        PYTHONUNBUFFERED=1 timeout 180 python3 bench/anchors/torch_share_bench.py >>"$out/anchors.txt" ||
            echo "torch anchor failed" >&2
        phase "torch anchor done"
    fi
fi
if [ $vmm = 1 ]; then
    nvcc -O2 -o "$out/vmm_bench" bench/anchors/vmm_bench.c -lcuda
    timeout 120 "$out/vmm_bench" >>"$out/anchors.txt" || echo "vmm_bench failed" >&2
    phase "vmm_bench done"
    if [ $has_torch = 1 ]; then
        PYTHONUNBUFFERED=1 timeout 150 python3 bench/anchors/torch_event_bench.py >>"$out/anchors.txt" ||
            echo "torch event anchor failed" >&2
        phase "torch event anchor done"
    else
        echo "bench/run.sh: python3 has no torch with CUDA: no torch event hand-over anchor" >&2
    fi
fi
kind=host
[ $mode = gpu ] && kind=cuda-ipc

if [ $trace = 1 ]; then
    rm -rf "$out/trace"
    mkdir -p "$out/trace"
    export GPUBUF_TRACE_TIMING=1 GPUBUF_TRACE_DIR=$out/trace
fi
# gpubuf, on its own socket.
sock=$out/gpubufd.sock
pools=(--pool "gpu0=$kind,capacity=32G,slab=64M" --pool "cold=$kind,capacity=2G,slab=2M")
# cuda-vmm pools on the same GPU: vmm for warm opens, hand-overs and copies;
# vmmcold and vmmcold64 for cold opens (every buffer fills one slab).
[ $vmm = 1 ] && pools+=(--pool "vmm=cuda-vmm,device=0,capacity=32G,slab=64M"
    --pool "vmmcold=cuda-vmm,device=0,capacity=2G,slab=2M"
    --pool "vmmcold64=cuda-vmm,device=0,capacity=8G,slab=64M")
daemon=
# Each gpubufd's messages go to OUT/gpubufd-N.log (printed when it stops):
# the journal pairs (bench/pairs.c) wait there for it to say it switched.
log=
n_daemons=0
printf '[daemon]\nstate_journal = switchable\n' >"$out/switchable.conf"
rm -f "$out"/gpubufd-*.log
start_daemon() { # [config file]
    rm -f "$sock"
    n_daemons=$((n_daemons + 1))
    log=$out/gpubufd-$n_daemons.log
    "$build/daemon/gpubufd" --socket "$sock" --log-level warning ${1:+--config "$1"} "${pools[@]}" 2>"$log" &
    daemon=$!
    trap 'kill $daemon 2>/dev/null || true' EXIT
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
}
stop_daemon() {
    kill $daemon
    wait $daemon || true
    trap - EXIT
    grep -v "state_journal = switchable\|SIGUSR2: the journal is" "$log" >&2 || true
}
start_daemon "$out/switchable.conf"
only=""
if [ $base = 1 ]; then
    only=latency,cold,throughput,crash,scale,async
    [ $mode = gpu ] && only=$only,bandwidth
    # Peer access needs a second GPU: a buffer of gpu0 read on GPU 1.
    [ $mode = gpu ] && [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && only=$only,peer
fi
[ $vmm = 1 ] && only=${only:+$only,}vmm
# latency gives the single-request figures the batch rows compare with.
[ $batch = 1 ] && [ $base = 0 ] && only=${only:+$only,}latency
[ $batch = 1 ] && only=${only:+$only,}batch,batchmix
[ $meta = 1 ] && only=${only:+$only,}meta
# The mixed requests' echo floor is measured again right before and right
# after them (--echo-floor; the goal compares the two: a machine's speed
# moves within a run), the one above kept for the report.
run_bench() { # phases output
    "$build/bench/gpubuf_bench" --socket "$sock" --daemon-pid $daemon --ctl "$build/client/gpubufctl" \
        --pool gpu0 --vmm-pool vmm --vmm-cold-pools vmmcold,vmmcold64 \
        --echo-floor "$out/echo_floor" --only "$1" | tee "$2"
}
# A failed phase still leaves the figures of the others for the report.
bench_rc=0
run_bench $only "$out/gpubuf.txt" || bench_rc=$?
phase "gpubuf benchmarks done"
: >"$out/python.txt"
if [ $base = 0 ]; then
    : # the Python benchmark belongs to the base group
elif ls "$build"/python/gpubuf/_gpubuf*.so >/dev/null 2>&1; then
    host_flag=()
    [ $mode = host ] && host_flag=(--host)
    PYTHONPATH=$build/python PYTHONUNBUFFERED=1 timeout 300 python3 bench/python_bench.py \
        --socket "$sock" --pool gpu0 "${host_flag[@]}" | tee "$out/python.txt" ||
        echo "python benchmark failed" >&2
    phase "python benchmarks done"
else
    echo "bench/run.sh: the Python package was not built (see $out/cmake.log)" >&2
fi
# The journal pairs, in the same daemon after every other phase: each goal
# phase 8 times back to back with the journal off and on in turn, in the
# order off on on off off on on off (a drift over the rounds weighs on both
# sides alike). Until 2026-12-03 a round was one bench process running every
# phase once: rounds seconds apart spread by up to a third, a stat round
# trip that the journal does not touch as much as a batch (docs/performance.md,
# "Journal pairs run back to back").
# Until 2026-12-02 the pairs came from a second, fresh gpubufd with
# state_journal = off going through every phase again: fresh daemons of
# one build gave batch opens anywhere from 2.3 to 4.0 M/s on the H200,
# more than the journal's cost, so a pair measured which daemon was the
# lucky one (docs/performance.md, "Journal pairs in one daemon"). Where
# each process runs moves a figure as much: the rounds pin gpubufd to one
# CPU, the one-client phases to one CPU of another core, and the phases of
# 16 processes to every CPU but the daemon's, the same in every round.
rm -rf "$out/pairs"
mkdir -p "$out/pairs"
solo="" many=""
for p in ${only//,/ }; do
    case $p in
    latency | cold | batch) solo=${solo:+$solo,}$p ;;
    throughput | batchmix) many=${many:+$many,}$p ;;
    esac
done
# CPUs, of those this script may use (Cpus_allowed_list: a container's
# cpuset, not 0..nproc-1): gpubufd on the last one, the lone client on the
# last one of another core (not the daemon's SMT sibling), the 16 processes
# on the others. Pinning is left out (with a word) where it cannot be done.
expand() { # "0-3,8" -> "0 1 2 3 8"
    local part parts
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        seq "${part%-*}" "${part#*-}"
    done | tr '\n' ' '
}
read -ra allowed <<<"$(expand "$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)")"
pin_solo=() pin_many=() dcpu="" ccpu=""
if [ ${#allowed[@]} -ge 4 ] && command -v taskset >/dev/null; then
    dcpu=${allowed[-1]}
    sib=" $(expand "$(cat /sys/devices/system/cpu/cpu$dcpu/topology/thread_siblings_list 2>/dev/null ||
        echo $dcpu)") "
    rest=()
    for c in "${allowed[@]}"; do [[ $sib == *" $c "* ]] || rest+=("$c"); done
    if [ ${#rest[@]} -ge 2 ]; then
        ccpu=${rest[-1]}
        pin_solo=(taskset -c "$ccpu")
        pin_many=(taskset -c "$(IFS=,; echo "${rest[*]}")")
    fi
fi
if [ $pairs = 1 ] && [ -n "$solo$many" ]; then
    if [ ${#pin_solo[@]} -gt 0 ] && ! taskset -a -p -c "$dcpu" $daemon >/dev/null; then
        echo "bench/run.sh: cannot pin gpubufd to CPU $dcpu: the pairs run unpinned" >&2
        pin_solo=() pin_many=()
    fi
    # One bench process for the lone-client phases and one for the 16
    # processes: the first runs every phase 8 times back to back, switching
    # the journal between runs; the second runs each phase once, switching
    # the journal every 0.5 s of it (bench/pairs.c).
    for ph in "$solo" "$many"; do
        [ -n "$ph" ] || continue
        pin=("${pin_solo[@]}")
        [ "$ph" = "$many" ] && pin=("${pin_many[@]}")
        "${pin[@]}" "$build/bench/gpubuf_bench" --socket "$sock" --daemon-pid $daemon \
            --ctl "$build/client/gpubufctl" --pool gpu0 --only "$ph" \
            --pairs "$out/pairs" --daemon-log "$log" || bench_rc=$?
    done
    phase "journal pairs done ($solo${many:+,$many}, 8 rounds${pin_solo[*]:+; gpubufd on CPU $dcpu, one client on CPU $ccpu})"
fi
stop_daemon
# The daemon's memory per waiting open, on a fresh daemon: after phases that
# freed much, its heap keeps that memory resident and RSS does not move
# (bench/async.c, waiting_memory).
if [ $base = 1 ]; then
    start_daemon
    "$build/bench/gpubuf_bench" --socket "$sock" --daemon-pid $daemon --pool gpu0 \
        --only waitmem | tee -a "$out/gpubuf.txt" || bench_rc=$?
    stop_daemon
fi
python3 bench/report.py "$out/machine.txt" "$out/anchors.txt" "$out/gpubuf.txt" "$out/python.txt" \
    "$out/pairs" | tee "$out/report.md"
if [ $trace = 1 ]; then
    for t in open alloc batch_open batch_release batch_alloc batch_delete; do
        echo
        echo "Timestamp trace, $t (bench/trace_timing.py):"
        python3 bench/trace_timing.py --type $t "$out"/trace/gpubuf-trace-*.txt || true
    done | tee -a "$out/report.md"
    # The opens that imported a slab (the cold open; a warm open's mapping
    # step is a lookup of well under 5 µs).
    { echo; echo "Timestamp trace, open of a slab not yet mapped (bench/trace_timing.py):"
      python3 bench/trace_timing.py --type open --map-over 5 "$out"/trace/gpubuf-trace-*.txt || true
    } | tee -a "$out/report.md"
fi
if [ $bench_rc != 0 ]; then
    echo "bench/run.sh: gpubuf_bench failed (exit status $bench_rc): see its messages above" >&2
    exit $bench_rc
fi
