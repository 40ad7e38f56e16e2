#!/usr/bin/env bash
# Build gpubuf with warnings as errors and run the whole test suite, then the
# same suite built with AddressSanitizer and UndefinedBehaviorSanitizer.
# Tests labelled "gpu" skip (exit 77) on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=${GPUBUF_JOBS:-$(nproc)}
cuda_opt=()
[ "${GPUBUF_REQUIRE_CUDA:-OFF}" = ON ] && cuda_opt=(-DGPUBUF_REQUIRE_CUDA=ON)
run_suite() {
    local dir=$1; shift
    cmake -S . -B "$dir" -G Ninja -DGPUBUF_WERROR=ON "${cuda_opt[@]}" "$@" ${GPUBUF_CMAKE_ARGS:-} >/dev/null
    cmake --build "$dir" -j"$jobs"
    ctest --test-dir "$dir" --output-on-failure -j"$jobs"
}
echo "== build and test (RelWithDebInfo, -Werror)"
run_suite build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "${GPUBUF_SKIP_SANITIZERS:-0}" != 1 ]; then
    echo "== build and test with address,undefined sanitizers"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DGPUBUF_SANITIZER=address,undefined
fi
