#!/usr/bin/env bash
# The Python package on a GPU machine, in one command: build gpubuf with the
# package for the `python3` on PATH (the one with CuPy, PyTorch, Numba), run the
# package's CTest suites (python_host, python_install, python_gpu), the GPU
# tests again verbosely (each consumer's output, skips and their reasons),
# Arrow's increment_by_one across processes by hand, the gpubuf.torch examples,
# bench/run.sh (which runs bench/python_bench.py next to the anchors) and
# bench/torch_bench.py.
#
#   scripts/python-gpu.sh [OUT]      (default OUT: /tmp/gpubuf-python-gpu)
#
# GPUBUF_CMAKE_ARGS: more configure arguments. GPUBUF_NO_BENCH=1 skips the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/gpubuf-python-gpu}
build=$out/build
py=$(command -v python3)
mkdir -p "$out"
rc=0
step() { echo; echo "== $*"; }

step "configure and build for $py ($("$py" --version))"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUBUF_WERROR=ON \
    -DGPUBUF_REQUIRE_CUDA=ON -DGPUBUF_WITH_PYTHON=ON -DPython3_EXECUTABLE="$py" \
    ${GPUBUF_CMAKE_ARGS:-} | grep -E "gpubuf|Python" || exit 1
cmake --build "$build" -j"$(nproc)" >"$out/build.log" || { tail -30 "$out/build.log"; exit 1; }

step "ctest -L python"
ctest --test-dir "$build" -L python --output-on-failure || rc=1

step "GPU tests, verbose"
(cd "$build" && PYTHONPATH=$PWD/python GPUBUFD=$PWD/daemon/gpubufd GPUBUF_SOURCE_DIR=$OLDPWD \
    "$py" -m pytest -v -rA -s -p no:cacheprovider -m gpu "$OLDPWD/python/tests")
r=$?
[ $r = 77 ] && echo "(all GPU tests skipped: see the reasons above)"
[ $r = 0 ] || [ $r = 77 ] || rc=1

step "examples/python/increment_by_one.py across processes"
sock=$out/gpubufd.sock
rm -f "$sock"
"$build/daemon/gpubufd" --socket "$sock" --log-level warning &
daemon=$!
for _ in $(seq 600); do "$build/client/gpubufctl" --socket "$sock" pools >/dev/null 2>&1 && break; sleep 0.05; done
for engine in auto cupy; do
    GPUBUF_SOCKET=$sock PYTHONPATH=$build/python "$py" examples/python/increment_by_one.py \
        --engine $engine || rc=1
done
GPUBUF_SOCKET=$sock PYTHONPATH=$build/python "$py" examples/python/producer.py --name py/frame \
    --size 256M || rc=1
GPUBUF_SOCKET=$sock PYTHONPATH=$build/python "$py" examples/python/consumer.py --name py/frame \
    --delete || rc=1
if "$py" -c 'import torch' 2>/dev/null; then
    step "gpubuf.torch examples (docs/torch.md)"
    GPUBUF_SOCKET=$sock PYTHONPATH=$build/python "$py" examples/python/torch_queue.py || rc=1
    GPUBUF_SOCKET=$sock PYTHONPATH=$build/python "$py" examples/python/torch_weight_sync.py \
        --consumers 3 || rc=1
fi
kill "$daemon"
wait "$daemon" 2>/dev/null

if [ "${GPUBUF_NO_BENCH:-0}" != 1 ]; then
    step "bench/run.sh --out $out/bench"
    bench/run.sh --out "$out/bench" || rc=1
    if "$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        step "bench/torch_bench.py (docs/performance.md, gpubuf.torch)"
        PYTHONPATH=$build/python "$py" bench/torch_bench.py --gpubufd "$build/daemon/gpubufd" |
            tee "$out/torch_bench.txt" || rc=1
    fi
fi
echo
[ $rc = 0 ] && echo "python-gpu: all passed" || echo "python-gpu: FAILURES above"
exit $rc
