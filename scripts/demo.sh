#!/usr/bin/env bash
# Build gpubuf and show it working on its default configuration: a cuda-ipc
# pool per GPU when a GPU is present, else one host pool. A producer writes a
# 256 MiB buffer and exits; three consumers open it by name, check the data
# where it lives and release it; gpubufctl shows every step.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
build=${GPUBUF_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUBUF_BUILD_TESTS=OFF ${GPUBUF_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
run=$(mktemp -d /tmp/gpubuf-demo-XXXXXX)
sock=$run/gpubufd.sock
"$build/daemon/gpubufd" --socket "$sock" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
ctl() { "$build/client/gpubufctl" --socket "$sock" "$@"; }
step() { printf '\n== %s\n' "$*"; }
step "daemon started"
ctl pools
step "producer: allocate 256 MiB, write a pattern, seal as 'demo', exit"
"$build/examples/gpubuf-producer" --socket "$sock" --name demo --size 256M
ctl buffers
step "three consumers open 'demo' by name and check every word"
for i in 1 2 3; do
    "$build/examples/gpubuf-consumer" --socket "$sock" --name demo --hold 1 &
done
sleep 0.5
ctl status
wait %2 %3 %4 2>/dev/null || true
step "consumers released their references"
ctl buffers
step "delete 'demo': its bytes return to the pool"
"$build/examples/gpubuf-consumer" --socket "$sock" --name demo --delete >/dev/null
ctl pools
