#!/usr/bin/env bash
# One version for everything: the CMake project version (CMakeLists.txt) is
# the library's, gpubufd's (--version), the Python package's (its build
# backend and gpubuf.__version__) and the Debian packages' (debian/changelog).
#   check_versions.sh SOURCE_DIR GPUBUFD
set -euo pipefail
src=$1 gpubufd=$2
fail() { echo "check_versions: FAIL: $*" >&2; exit 1; }
v=$(sed -n 's/^project(gpubuf VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$v" ] || fail "no project(gpubuf VERSION ...) in CMakeLists.txt"
deb=$(sed -n '1s/^gpubuf (\([^)]*\)).*/\1/p' "$src/debian/changelog")
[ "${deb%%-*}" = "$v" ] ||
    fail "debian/changelog is at '$deb', CMakeLists.txt at $v: add an entry (dch -v $v)"
py=$(cd "$src/python/build_backend" && python3 -c 'import gpubuf_build; print(gpubuf_build._version())')
[ "$py" = "$v" ] || fail "the Python build backend says $py, CMakeLists.txt $v"
"$gpubufd" --version | grep -qw "$v" || fail "gpubufd --version: $("$gpubufd" --version)"
echo "check_versions: $v everywhere (CMake, debian/changelog $deb, Python backend, gpubufd)"
