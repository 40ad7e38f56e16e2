#!/usr/bin/env bash
# shellcheck disable=SC2317 # build, aio and stages are run through step
# Everything that needs a GPU, in two phases that each fit in 10 minutes on
# one H200, with every step under its own deadline (a hang costs that step,
# not the run) and the output in a few files of OUTDIR:
#
#   scripts/gpu-check.sh tests [OUTDIR]   build (Release with CUDA and Python),
#       ctest -L gpu, the asyncio example on a cuda-ipc and a cuda-vmm pool
#   scripts/gpu-check.sh bench [OUTDIR]   bench/run.sh (every default group,
#       anchors and journal pairs in the same run), bench/torch_bench.py,
#       bench/torch_handover_stages.py
#
# OUTDIR defaults to $OUT, else ./gpu-check-out. The build is in
# ${GPUBUF_BUILD:-/tmp/b}; "bench" builds it first if it is not there.
# Exit status: the number of steps that failed (0: all passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
phase=${1:-}
out=${2:-${OUT:-gpu-check-out}}
B=${GPUBUF_BUILD:-/tmp/b}
case "$phase" in
tests | bench) ;;
*) echo "usage: $0 tests|bench [OUTDIR]" >&2; exit 2 ;;
esac
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/$phase.txt"
: >"$log"
t0=$(date +%s)
failed=0
say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$log"; }
# step NAME SECONDS CMD...: run CMD under a deadline (a function of this
# script keeps its own deadlines); its output goes to the log.
step() {
    local name=$1 secs=$2 rc
    shift 2
    say "== $name (deadline $secs s)"
    if declare -F "$1" >/dev/null; then
        "$@" >>"$log" 2>&1
    else
        timeout -k 5 "$secs" "$@" >>"$log" 2>&1
    fi
    rc=$?
    [ "$rc" = 124 ] && say "$name: ran past $secs s"
    [ "$rc" = 0 ] || failed=$((failed + 1))
    say "$name: rc $rc"
    return "$rc"
}

build() {
    [ -x "$B/daemon/gpubufd" ] && [ "$phase" = bench ] && return 0
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUBUF_WERROR=ON \
        -DGPUBUF_REQUIRE_CUDA=ON -DGPUBUF_WITH_PYTHON=ON \
        -DPython3_EXECUTABLE="$(command -v python3)" >"$out/cmake.log" 2>&1 &&
        cmake --build "$B" -j"$(nproc)" >"$out/build.log" 2>&1
}

# with_daemon NAME POOL SECONDS CMD...: CMD (under its own deadline) against
# a gpubufd of its own with one pool, GPUBUF_SOCKET and the build's Python
# package set; the daemon's log in OUTDIR/NAME.daemon.log, its tail printed
# when CMD fails.
with_daemon() {
    local name=$1 pool=$2 secs=$3 sock=/tmp/gpubuf-check-$1.sock rc
    shift 3
    rm -f "$sock"
    "$B/daemon/gpubufd" --socket "$sock" --log-level info --pool "$pool" \
        >"$out/$name.daemon.log" 2>&1 &
    local dp=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    GPUBUF_SOCKET=$sock PYTHONPATH=$B/python timeout -k 5 "$secs" "$@"
    rc=$?
    kill "$dp" 2>/dev/null
    wait "$dp" 2>/dev/null
    [ "$rc" = 0 ] || tail -5 "$out/$name.daemon.log"
    return "$rc"
}

# The asyncio example on one pool kind: 1,000 frames sealed on streams.
aio() {
    with_daemon "aio-$1" "p=$1,device=0,capacity=4G" 60 \
        python3 -X faulthandler examples/python/aio_server.py --demo 1000 --cuda --pool p
}

# Where a gpubuf.torch hand-over of a fresh CUDA tensor spends its time,
# step by step (no goals; docs/performance.md "gpubuf.torch").
stages() {
    with_daemon stages "gpu0=cuda-ipc,device=0,capacity=4G,slab=64M" 80 \
        python3 bench/torch_handover_stages.py --pool gpu0 --n 300
}

step build 420 build || { tail -40 "$out/build.log" "$out/cmake.log" >>"$log" 2>/dev/null; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$log" 2>&1
if [ "$phase" = tests ]; then
    # The examples first (a minute each at most), then the tests with what
    # is left of a 10-minute device call, three at a time: one after another
    # they take about 6 minutes on an H200, the two halves of gpubuf.torch's
    # about 2 and 2.5 (test_gpu, which fills the GPU's memory, runs alone).
    step "aio_server cuda-ipc" 70 aio cuda-ipc
    step "aio_server cuda-vmm" 70 aio cuda-vmm
    step "ctest -L gpu" 440 ctest --test-dir "$B" -L gpu -j3 --timeout 300 --output-on-failure
else
    # bench/run.sh's folder holds its own build: only its figures come back,
    # in one archive (a device call returns at most 8 files).
    step "bench/run.sh" 420 bench/run.sh --out /tmp/gpu-check-bench
    (cd /tmp/gpu-check-bench && tar czf "$out/bench-figures.tar.gz" --ignore-failed-read \
        machine.txt anchors.txt gpubuf.txt python.txt report.md gpubufd-*.log pairs) 2>>"$log"
    step "bench/torch_bench.py" 150 env PYTHONPATH="$B/python" python3 bench/torch_bench.py \
        --gpubufd "$B/daemon/gpubufd"
    step "bench/torch_handover_stages.py" 90 stages
fi
say "done: $failed step(s) failed"
exit "$failed"
