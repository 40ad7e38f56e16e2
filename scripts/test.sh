#!/usr/bin/env bash
# Build gpubuf with warnings as errors and run the whole test suite, check
# the installed tree, run the same suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer, and fuzz the daemon core for a minute.
# Tests labelled "gpu" skip (exit 77) on machines without a GPU.
#
#   --under-load[=N]   keep N CPU-bound processes running beside the whole
#                      run (default: one per core), to show that no test
#                      depends on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
load=0
for arg in "$@"; do
    case $arg in
    --under-load) load=$(nproc) ;;
    --under-load=*) load=${arg#--under-load=} ;;
    *) echo "test.sh: unknown argument '$arg' (known: --under-load[=N])" >&2; exit 2 ;;
    esac
done
if [ "$load" -gt 0 ]; then
    echo "== under load: $load busy processes beside the suite"
    loaders=()
    for _ in $(seq "$load"); do
        # Busy work of the shell's own: no package needed.
        (while :; do :; done) &
        loaders+=($!)
    done
    trap 'kill "${loaders[@]}" 2>/dev/null || true' EXIT
fi
./scripts/deps.sh
jobs=${GPUBUF_JOBS:-$(nproc)}
cuda_opt=()
[ "${GPUBUF_REQUIRE_CUDA:-OFF}" = ON ] && cuda_opt=(-DGPUBUF_REQUIRE_CUDA=ON)
# The Python package with Debian's interpreter (python3 on PATH may be another).
py_opt=(-DGPUBUF_WITH_PYTHON=ON -DPython3_EXECUTABLE="${GPUBUF_PYTHON:-/usr/bin/python3}")
run_suite() {
    local dir=$1 rc=0; shift
    cmake -S . -B "$dir" -G Ninja -DGPUBUF_WERROR=ON "${cuda_opt[@]}" "$@" ${GPUBUF_CMAKE_ARGS:-} >/dev/null
    cmake --build "$dir" -j"$jobs"
    # The tests add what they measure (bounds, bystander latencies, fds, RSS)
    # to figures.txt; printed after the suite, passed or not.
    rm -f "$dir/figures.txt"
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" || rc=$?
    echo "== figures ($dir)"
    if [ -s "$dir/figures.txt" ]; then sort "$dir/figures.txt"; else echo "(none)"; fi
    return "$rc"
}
echo "== build and test (RelWithDebInfo, -Werror)"
run_suite build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo "${py_opt[@]}"
GPUBUF_PYTHON=${GPUBUF_PYTHON:-/usr/bin/python3} \
    ./scripts/check-install.sh  # install into a staging prefix, build examples/out-of-tree against it
if [ "${GPUBUF_NO_DEBIAN:-0}" != 1 ]; then
    # Build the Debian packages, lintian, install, smoke-test, purge (root).
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env GPUBUF_JOBS="$jobs" ./scripts/check-debian.sh
fi
if [ "${GPUBUF_SKIP_SANITIZERS:-0}" != 1 ]; then
    echo "== build and test with address,undefined sanitizers"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DGPUBUF_SANITIZER=address,undefined
fi
if [ "${GPUBUF_NO_FUZZ:-0}" != 1 ]; then
    # Each target in tests/fuzz/targets.txt runs GPUBUF_FUZZ_SECONDS (60 by
    # default) with its seeds: tests/fuzz/corpus/ for "daemon",
    # tests/fuzz/corpus/NAME/ for the others.
    targets=$(grep -v '^#' tests/fuzz/targets.txt)
    echo "== fuzz ($(echo $targets), libFuzzer, address+undefined), ${GPUBUF_FUZZ_SECONDS:-60} s each"
    CC=clang cmake -S . -B build-fuzz -G Ninja -DGPUBUF_WERROR=ON -DGPUBUF_FUZZ=ON \
        -DGPUBUF_SANITIZER=address,undefined -DCMAKE_BUILD_TYPE=Debug -DGPUBUF_BUILD_BENCH=OFF \
        -DGPUBUF_BUILD_MAN=OFF "${cuda_opt[@]}" ${GPUBUF_CMAKE_ARGS:-} >/dev/null
    for t in $targets; do
        cmake --build build-fuzz -j"$jobs" --target "fuzz_$t"
        if [ "$t" = daemon ]; then seeds=tests/fuzz/corpus; regs=tests/fuzz/regressions
        else seeds=tests/fuzz/corpus/$t; regs=tests/fuzz/regressions/$t; fi
        mkdir -p "$regs"
        corpus=$(mktemp -d /tmp/gpubuf-fuzz-XXXXXX)
        find "$seeds" -maxdepth 1 -type f -exec cp {} "$corpus"/ \;
        # A crash leaves crash-* in the target's regressions folder (to be
        # committed) and fails the run.
        rc=0
        "build-fuzz/tests/fuzz/fuzz_$t" -max_total_time="${GPUBUF_FUZZ_SECONDS:-60}" -max_len=4096 \
            -timeout=10 -print_final_stats=1 -artifact_prefix="$regs/" "$corpus" \
            >"$corpus.log" 2>&1 || rc=$?
        echo "-- fuzz_$t"
        grep -E "DONE|number_of_executed_units|ERROR|SUMMARY" "$corpus.log" || true
        rm -rf "$corpus" "$corpus.log"
        [ "$rc" = 0 ] || { echo "fuzzing fuzz_$t found a crash: see $regs/"; exit 1; }
    done
fi
