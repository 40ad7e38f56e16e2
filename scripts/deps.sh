#!/usr/bin/env bash
# Install the Debian packages gpubuf builds and tests with, if any is missing.
# Set GPUBUF_NO_INSTALL=1 to only check.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libuv1-dev libprotobuf-c-dev
      protobuf-c-compiler check libinih-dev libjson-c-dev libsystemd-dev uthash-dev scdoc
      man-db clang libclang-rt-dev python3-dev python3-numpy python3-pytest python3-venv
      libdlpack-dev systemd strace libbsd-dev util-linux libxxhash-dev
      debhelper dh-python lintian python3-yaml)
# Optional: the gpubuf.torch tests (python/tests/test_torch.py) skip, saying
# why, where PyTorch cannot be imported.
optional=(python3-torch)
have_all() {
    command -v cmake >/dev/null && command -v ninja >/dev/null && command -v protoc-c >/dev/null &&
        command -v scdoc >/dev/null && command -v systemd-analyze >/dev/null &&
        command -v strace >/dev/null && command -v unshare >/dev/null &&
        command -v dh >/dev/null && command -v dh_python3 >/dev/null &&
        command -v lintian >/dev/null &&
        { [ "${GPUBUF_NO_FUZZ:-0}" = 1 ] || command -v clang >/dev/null; } &&
        pkg-config --exists libuv libprotobuf-c check inih json-c || return 1
    # The Python package: Debian's interpreter with its headers, NumPy, pytest, venv.
    /usr/bin/python3 -c 'import numpy, pytest, ensurepip, sysconfig, os, sys
sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' 2>/dev/null ||
        return 1
    /usr/bin/python3 -c 'import yaml' 2>/dev/null || return 1
    [ -e /usr/include/dlpack/dlpack.h ] || return 1
    [ -e /usr/include/bsd/sys/tree.h ] || return 1
    [ -e /usr/include/xxhash.h ] || return 1
    for d in /usr/include ${CMAKE_PREFIX_PATH:+${CMAKE_PREFIX_PATH//:/\/include }/include}; do
        [ -e "$d/uthash.h" ] && return 0
    done
    return 1
}
# PyTorch where Debian has it; else its tests skip.
have_optional() {
    /usr/bin/python3 -c 'import torch' 2>/dev/null || ! apt-cache show python3-torch >/dev/null 2>&1
}
if have_all && { have_optional || [ "${GPUBUF_NO_INSTALL:-0}" = 1 ]; }; then
    exit 0
fi
if [ "${GPUBUF_NO_INSTALL:-0}" = 1 ]; then
    echo "deps.sh: missing build dependencies: ${pkgs[*]}" >&2
    exit 1
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
for p in "${optional[@]}"; do
    if ! $sudo apt-get install -y -qq --no-install-recommends "$p" >/dev/null; then
        echo "deps.sh: $p could not be installed: its tests will be skipped" >&2
    fi
done
