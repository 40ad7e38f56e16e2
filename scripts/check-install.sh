#!/usr/bin/env bash
# Check what `cmake --install` delivers: build gpubuf (Release, -Werror: the
# -O3 build users and bench/run.sh make) in a temporary directory,
# install it into a staging prefix, check the layout, then build
# examples/out-of-tree against the installed files only, with CMake
# (find_package(gpubuf)) and with pkg-config (gpubuf-client.pc), each shared
# and static, and run every program once: without a daemon (the example exits
# 0 on -ENOENT) and against the installed gpubufd. Last, systemd-analyze
# verify on the installed units, and systemd-analyze security on the installed
# gpubufd.service (its exposure printed; above 3.0 fails), when
# systemd-analyze exists.
# With GPUBUF_PYTHON (an interpreter), the Python package is built for it and
# its installed copy imported and run against the installed daemon.
#
# GPUBUF_JOBS: parallel jobs (default: nproc). GPUBUF_CMAKE_ARGS: more
# arguments for the gpubuf configure step. GPUBUF_KEEP=1 keeps the temporary
# directory.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
jobs=${GPUBUF_JOBS:-$(nproc)}
work=$(mktemp -d /tmp/gpubuf-install-XXXXXX)
prefix=$work/prefix
daemon=
cleanup() {
    if [ -n "$daemon" ]; then
        kill "$daemon" 2>/dev/null || true
        wait "$daemon" 2>/dev/null || true
    fi
    if [ "${GPUBUF_KEEP:-0}" = 1 ]; then
        echo "check-install: kept $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
fail() { echo "check-install: FAIL: $*" >&2; exit 1; }
step() { echo "-- $*"; }

echo "== install into a staging prefix and build examples/out-of-tree against it"
step "configure, build and install into $prefix"
py_opt=()
[ -n "${GPUBUF_PYTHON:-}" ] && py_opt=(-DGPUBUF_WITH_PYTHON=ON -DPython3_EXECUTABLE="$GPUBUF_PYTHON")
cmake -S . -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUBUF_WERROR=ON \
    -DGPUBUF_BUILD_TESTS=OFF -DGPUBUF_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX="$prefix" "${py_opt[@]}" \
    ${GPUBUF_CMAKE_ARGS:-} >"$work/configure.log" || { cat "$work/configure.log"; fail configure; }
cmake --build "$work/build" -j"$jobs" >"$work/build.log" || { cat "$work/build.log"; fail build; }
cmake --install "$work/build" >"$work/install.log" || { cat "$work/install.log"; fail install; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$work/build/CMakeCache.txt"; }
libdir=$(cache CMAKE_INSTALL_LIBDIR)
datarootdir=$(cache CMAKE_INSTALL_DATAROOTDIR)
mandir=$(cache CMAKE_INSTALL_MANDIR)
mandir=${mandir:-${datarootdir:-share}/man}
docdir=$(cache CMAKE_INSTALL_DOCDIR)
docdir=${docdir:-${datarootdir:-share}/doc/gpubuf}

step "layout"
expect=(
    sbin/gpubufd bin/gpubufctl bin/gpubuf-producer bin/gpubuf-consumer
    "$libdir/libgpubuf-client.so" "$libdir/libgpubuf-client.so.0" "$libdir/libgpubuf-client.a"
    include/gpubuf/gpubuf.h "$libdir/pkgconfig/gpubuf-client.pc"
    "$libdir/cmake/gpubuf/gpubufConfig.cmake" "$libdir/cmake/gpubuf/gpubufConfigVersion.cmake"
    "$libdir/cmake/gpubuf/gpubufTargets.cmake"
    lib/systemd/system/gpubufd.service lib/systemd/system/gpubufd.socket
    lib/systemd/system/gpubuf-metrics.service lib/systemd/system/gpubuf-metrics.timer
    "${datarootdir:-share}/bash-completion/completions/gpubufctl"
    lib/sysusers.d/gpubuf.conf lib/tmpfiles.d/gpubuf.conf "$docdir/client-api.md"
)
if [ -f "$work/build/man/gpubufd.8" ]; then
    expect+=("$mandir/man8/gpubufd.8" "$mandir/man1/gpubufctl.1" "$mandir/man5/gpubuf.conf.5"
             "$mandir/man3/libgpubuf-client.3")
else
    echo "   (manual pages not built: scdoc not found)"
fi
pydir=$(cache GPUBUF_PYTHON_INSTALL_DIR)
if [ -n "${GPUBUF_PYTHON:-}" ]; then
    [ -n "$pydir" ] || fail "GPUBUF_PYTHON_INSTALL_DIR not set: the Python package was not configured"
    expect+=("$pydir/gpubuf/__init__.py")
fi
for f in "${expect[@]}"; do
    [ -e "$prefix/$f" ] || fail "not installed: $f"
done
soname=$(readelf -d "$prefix/$libdir/libgpubuf-client.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libgpubuf-client.so.0 ] || fail "soname is '$soname'"
[ -L "$prefix/$libdir/libgpubuf-client.so" ] || fail "libgpubuf-client.so is not a symbolic link"
grep -q "^ExecStart=$prefix/sbin/gpubufd" "$prefix/lib/systemd/system/gpubufd.service" ||
    fail "ExecStart of gpubufd.service does not name $prefix/sbin/gpubufd"
grep -q "^ExecStart=$prefix/bin/gpubufctl metrics --output " \
    "$prefix/lib/systemd/system/gpubuf-metrics.service" ||
    fail "ExecStart of gpubuf-metrics.service does not name $prefix/bin/gpubufctl metrics"
echo "   ${#expect[@]} files in place, soname $soname"

# Each program runs once without a daemon (exit 0, "No such file or
# directory") and later once against the installed daemon.
programs=()
no_daemon() {
    local out
    out=$(GPUBUF_SOCKET=$work/none.sock "$1") || fail "$1 exited $? without a daemon"
    case $out in *"No such file or directory"*) ;; *) fail "$1 printed: $out" ;; esac
    echo "   ${1#"$work"/}: $out"
    programs+=("$1")
}
not_needed() { # the static programs must not need libgpubuf-client.so
    ! readelf -d "$1" | grep -q 'NEEDED.*libgpubuf-client' || fail "$1 needs libgpubuf-client.so"
}

step "out-of-tree example with CMake: find_package(gpubuf)"
cmake -S examples/out-of-tree -B "$work/oot-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/oot-cmake.log" || { cat "$work/oot-cmake.log"; fail "configure examples/out-of-tree"; }
cmake --build "$work/oot-cmake" -j"$jobs" >>"$work/oot-cmake.log" ||
    { cat "$work/oot-cmake.log"; fail "build examples/out-of-tree with CMake"; }
not_needed "$work/oot-cmake/gpubuf-hello-static"
no_daemon "$work/oot-cmake/gpubuf-hello"
no_daemon "$work/oot-cmake/gpubuf-hello-static"

step "out-of-tree example with pkg-config: gpubuf-client.pc"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pkg-config --exists --print-errors gpubuf-client || fail "pkg-config gpubuf-client"
[ "$(pkg-config --modversion gpubuf-client)" = "$(cache CMAKE_PROJECT_VERSION)" ] ||
    fail "pkg-config version $(pkg-config --modversion gpubuf-client)"
echo "   cflags: $(pkg-config --cflags gpubuf-client)"
echo "   libs: $(pkg-config --libs gpubuf-client); static: $(pkg-config --static --libs gpubuf-client)"
mkdir "$work/oot-make"
cp examples/out-of-tree/hello.c examples/out-of-tree/Makefile "$work/oot-make/"
make -s -C "$work/oot-make" >"$work/oot-make.log" 2>&1 ||
    { cat "$work/oot-make.log"; fail "build examples/out-of-tree with make"; }
not_needed "$work/oot-make/gpubuf-hello-static"
no_daemon "$work/oot-make/gpubuf-hello"
no_daemon "$work/oot-make/gpubuf-hello-static"

step "installed programs against the installed daemon"
sock=$work/run/gpubufd.sock
"$prefix/sbin/gpubufd" --socket "$sock" --pool host=host,capacity=64M --log-level warning &
daemon=$!
# The socket file appears at bind(), a moment before listen(): wait for a
# connection that works, not for the file (a loaded machine widens the gap).
for _ in $(seq 200); do
    "$prefix/bin/gpubufctl" --socket "$sock" pools >/dev/null 2>&1 && break
    sleep 0.05
done
[ -S "$sock" ] || fail "installed gpubufd did not listen on $sock"
"$prefix/bin/gpubufctl" --socket "$sock" pools >/dev/null || fail "installed gpubufctl exited $?"
GPUBUF_SOCKET=$sock "$prefix/bin/gpubuf-producer" --name check --size 1M >/dev/null ||
    fail "installed gpubuf-producer exited $?"
GPUBUF_SOCKET=$sock "$prefix/bin/gpubuf-consumer" --name check --delete >/dev/null ||
    fail "installed gpubuf-consumer exited $?"
for p in "${programs[@]}"; do
    out=$(GPUBUF_SOCKET=$sock "$p") || fail "$p exited $? with a daemon"
    case $out in *"connected to gpubufd"*) ;; *) fail "$p printed: $out" ;; esac
done
echo "   gpubufctl, gpubuf-producer, gpubuf-consumer and ${#programs[@]} examples ran"
if [ -n "${GPUBUF_PYTHON:-}" ]; then
    ls "$prefix/$pydir"/gpubuf/_gpubuf*.so >/dev/null || fail "the Python extension was not installed"
    out=$(cd "$work" && PYTHONPATH=$prefix/$pydir "$GPUBUF_PYTHON" -c '
import sys, gpubuf
assert gpubuf.__file__.startswith(sys.argv[2]), gpubuf.__file__
with gpubuf.Client(sys.argv[1]) as c, c.alloc(4096, "check/py") as b:
    b.copy_from_host(b"python")
    b.seal(sync=True)
    with c.open("check/py") as o:
        print("python", gpubuf.__version__, bytes(memoryview(o)[:6]).decode())
' "$sock" "$prefix") || fail "the installed Python package did not run"
    [ "$out" = "python $(cache CMAKE_PROJECT_VERSION) python" ] || fail "python printed: $out"
    echo "   Python package in $pydir: imported and ran against the installed daemon"
fi
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=
[ "$rc" = 0 ] || fail "gpubufd exited $rc on SIGTERM"

max_exposure=3.0
if command -v systemd-analyze >/dev/null; then
    step "systemd-analyze verify"
    units=("$prefix/lib/systemd/system/gpubufd.socket" "$prefix/lib/systemd/system/gpubufd.service"
           "$prefix/lib/systemd/system/gpubuf-metrics.service"
           "$prefix/lib/systemd/system/gpubuf-metrics.timer")
    if ! SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "${units[@]}" \
        >"$work/verify.log" 2>&1; then
        cat "$work/verify.log"
        fail "systemd-analyze verify"
    fi
    # Only what concerns our units counts; other units of the host may be noisy.
    if grep -E 'gpubuf' "$work/verify.log"; then
        fail "systemd-analyze verify reported the lines above"
    fi
    echo "   gpubufd.socket, gpubufd.service, gpubuf-metrics.service, gpubuf-metrics.timer: ok"
    # Restart survival needs the fd store: the verified unit must ask for one
    # (and systemd-analyze verify above accepted the key).
    store=$(sed -n 's/^FileDescriptorStoreMax=\([0-9]*\)$/\1/p' \
        "$prefix/lib/systemd/system/gpubufd.service")
    [ -n "$store" ] && [ "$store" -gt 0 ] ||
        fail "gpubufd.service has no FileDescriptorStoreMax= above 0"
    echo "   gpubufd.service: FileDescriptorStoreMax=$store"
    step "systemd-analyze security --offline=true gpubufd.service (at most $max_exposure)"
    unit=$prefix/lib/systemd/system/gpubufd.service
    SYSTEMD_LOG_LEVEL=err systemd-analyze security --offline=true --no-pager "$unit" \
        >"$work/security.log" 2>&1 || true
    grep -E '^✗' "$work/security.log" | sed 's/  */ /g; s/^/   /' || true
    exposure=$(sed -n 's/.*Overall exposure level for gpubufd.service: \([0-9.]*\).*/\1/p' \
        "$work/security.log")
    [ -n "$exposure" ] || { cat "$work/security.log"; fail "systemd-analyze security gave no figure"; }
    echo "   exposure of gpubufd.service: $exposure (at most $max_exposure)"
    awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e <= m) }' ||
        fail "gpubufd.service is rated $exposure, above $max_exposure"
else
    step "systemd-analyze not found: units not verified"
fi
echo "check-install: ok"
