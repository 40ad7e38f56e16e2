#!/usr/bin/env bash
# One command for the whole benchmark: builds gpubuf (Release), runs the
# anchor programs and gpubuf's benchmarks in the same run, and prints one
# table of ratios against the anchors (bench/report.py).
#
#   bench/run.sh [--host] [--out DIR]
#
# With a GPU (nvcc and a driver present): cuda-ipc pools, CUDA anchors
# (ipc_bench.c), torch.multiprocessing anchor when python3 has torch.
# With --host or without a GPU: host pools and the socket anchors only.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
out=${TMPDIR:-/tmp}/gpubuf-bench
while [ $# -gt 0 ]; do
    case $1 in
    --host) mode=host ;;
    --out) out=$2; shift ;;
    *) echo "usage: bench/run.sh [--host] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
if [ $mode = gpu ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "bench/run.sh: no GPU found: running the host-pool benchmarks" >&2
    mode=host
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
    echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    echo "cores $(nproc)"
    [ $mode = gpu ] && echo "gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
} >"$out/machine.txt"

phase "built"
# Anchors, measured in this run.
cc -O2 -o "$out/echo_floor" bench/anchors/echo_floor.c
: >"$out/anchors.txt"
for n in 1 16; do
    "$out/echo_floor" $n $((n == 1 ? 20000 : 5000)) 64 | sed "s/^/echo_floor_$n /" >>"$out/anchors.txt"
done
if [ $mode = gpu ]; then
    nvcc -O2 -o "$out/ipc_bench" bench/anchors/ipc_bench.c -lcuda
    "$out/ipc_bench" >>"$out/anchors.txt"
    phase "ipc_bench done"
    if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        PYTHONUNBUFFERED=1 timeout 180 python3 bench/anchors/torch_share_bench.py >>"$out/anchors.txt" ||
            echo "torch anchor failed" >&2
        phase "torch anchor done"
    fi
    kind=cuda-ipc
else
    kind=host
fi

# gpubuf, on its own socket.
sock=$out/gpubufd.sock
rm -f "$sock"
"$build/daemon/gpubufd" --socket "$sock" --log-level warning \
    --pool "gpu0=$kind,capacity=32G,slab=64M" --pool "cold=$kind,capacity=2G,slab=2M" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
only=latency,cold,throughput,crash,scale
[ $mode = gpu ] && only=$only,bandwidth
# Peer access needs a second GPU: a buffer of gpu0 read on GPU 1.
[ $mode = gpu ] && [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && only=$only,peer
"$build/bench/gpubuf_bench" --socket "$sock" --daemon-pid $daemon --ctl "$build/client/gpubufctl" \
    --only $only | tee "$out/gpubuf.txt"
phase "gpubuf benchmarks done"
: >"$out/python.txt"
if ls "$build"/python/gpubuf/_gpubuf*.so >/dev/null 2>&1; then
    host_flag=()
    [ $mode = host ] && host_flag=(--host)
    PYTHONPATH=$build/python PYTHONUNBUFFERED=1 timeout 300 python3 bench/python_bench.py \
        --socket "$sock" --pool gpu0 "${host_flag[@]}" | tee "$out/python.txt" ||
        echo "python benchmark failed" >&2
    phase "python benchmarks done"
else
    echo "bench/run.sh: the Python package was not built (see $out/cmake.log)" >&2
fi
kill $daemon
wait $daemon || true
trap - EXIT
python3 bench/report.py "$out/machine.txt" "$out/anchors.txt" "$out/gpubuf.txt" "$out/python.txt" |
    tee "$out/report.md"
