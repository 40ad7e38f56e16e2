#!/usr/bin/env bash
# Build the Debian packages (debian/) with dpkg-buildpackage from a copy of
# the tree, run lintian on them (errors fail; warnings are listed), check the
# package version against the CMake project version, install them on this
# machine, smoke-test the installed gpubufd (started by hand where systemd is
# not PID 1) with gpubufctl, gpubuf-producer/-consumer, a C program built
# against libgpubuf-client-dev and python3-gpubuf, purge them and check that
# nothing of them is left (files, unit links, runtime directory; the system
# user gpubuf stays, as Debian keeps system users on purge).
#
# Needs root (it installs packages). GPUBUF_JOBS: parallel jobs (default:
# nproc). GPUBUF_DEB_CHECK=1 runs the unit tests inside the package build
# (nocheck by default: scripts/test.sh ran the suite already).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
jobs=${GPUBUF_JOBS:-$(nproc)}
pkgs=(gpubufd gpubuf-tools libgpubuf-client0 libgpubuf-client-dev python3-gpubuf)
fail() { echo "check-debian: FAIL: $*" >&2; exit 1; }
step() { echo "-- $*"; }
[ "$(id -u)" = 0 ] || fail "run as root: it installs and purges the packages"
for p in "${pkgs[@]}"; do
    if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^[ir]'; then
        fail "$p is installed already; purge it first (apt-get purge ${pkgs[*]})"
    fi
done
work=$(mktemp -d /tmp/gpubuf-deb-XXXXXX)
daemon=
cleanup() {
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
echo "== Debian packages: build, lintian, install, smoke test, purge"

step "version: debian/changelog against the CMake project version"
cmake_version=$(sed -n 's/^project(gpubuf VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
deb_version=$(dpkg-parsechangelog -l debian/changelog -S Version)
[ "${deb_version%%-*}" = "$cmake_version" ] ||
    fail "debian/changelog is at $deb_version, CMakeLists.txt at $cmake_version: add a changelog entry (dch -v $cmake_version)"
echo "   $deb_version (CMake $cmake_version)"

step "dpkg-buildpackage -us -uc -b (parallel=$jobs${GPUBUF_DEB_CHECK:+, with unit tests})"
# A copy without build trees: the packages land next to it, not next to the checkout.
mkdir "$work/src"
tar -C "$src" -c --exclude=./.git --exclude='./build*' --exclude='./obj-*' --exclude=./debian/.debhelper . |
    tar -x -C "$work/src"
opts="parallel=$jobs"
[ "${GPUBUF_DEB_CHECK:-0}" = 1 ] || opts="nocheck $opts"
t0=$(date +%s)
profiles=
[ "${GPUBUF_DEB_CHECK:-0}" = 1 ] || profiles=nocheck
(cd "$work/src" && DEB_BUILD_PROFILES="$profiles" DEB_BUILD_OPTIONS="$opts" dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 ||
    { tail -60 "$work/build.log"; fail "dpkg-buildpackage"; }
debs=()
for p in "${pkgs[@]}"; do
    f=$(ls "$work/${p}_${deb_version}_"*.deb 2>/dev/null) || fail "no package $p was built"
    debs+=("$f")
done
echo "   ${#debs[@]} packages in $(($(date +%s) - t0)) s: $(cd "$work" && ls ./*.deb | grep -v dbgsym | xargs -n1 basename | tr '\n' ' ')"

step "lintian (errors fail; warnings listed)"
lintian --no-tag-display-limit --display-info "$work"/gpubuf_*.changes >"$work/lintian.log" 2>&1 || true
if grep -q '^E:' "$work/lintian.log"; then
    cat "$work/lintian.log"
    fail "lintian reported errors"
fi
grep -E '^[WI]:' "$work/lintian.log" | sed 's/^/   /' || true
echo "   errors: 0, warnings: $(grep -c '^W:' "$work/lintian.log" || true)," \
     "notes: $(grep -c '^I:' "$work/lintian.log" || true)"

step "install"
user_before=$(getent passwd gpubuf || true)
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${debs[@]}" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; fail "apt-get install"; }
for p in "${pkgs[@]}"; do dpkg -L "$p" >>"$work/files"; done
getent passwd gpubuf >/dev/null || fail "installing gpubufd made no user gpubuf"
[ "$(stat -c %U:%G /run/gpubuf)" = gpubuf:gpubuf ] || fail "/run/gpubuf is $(stat -c %U:%G /run/gpubuf)"
[ -L /etc/systemd/system/sockets.target.wants/gpubufd.socket ] ||
    fail "gpubufd.socket was not enabled"
[ "$(/usr/sbin/gpubufd --version | grep -o '[0-9][0-9.]*' | head -1)" = "$cmake_version" ] ||
    fail "gpubufd --version: $(/usr/sbin/gpubufd --version)"
[ "$(pkg-config --modversion gpubuf-client)" = "$cmake_version" ] || fail "pkg-config gpubuf-client"
echo "   user $(getent passwd gpubuf | cut -d: -f1,3,4,6,7), /run/gpubuf, gpubufd.socket enabled," \
     "$(wc -l <"$work/files") paths"

step "smoke test of the installed packages"
sock=/run/gpubuf/gpubufd.sock
if [ -d /run/systemd/system ]; then
    systemctl start gpubufd.socket
else
    # No systemd as PID 1: the daemon as the unit runs it, by hand.
    setpriv --reuid=gpubuf --regid=gpubuf --init-groups /usr/sbin/gpubufd --pool smoke=host,capacity=64M --log-level warning &
    daemon=$!
fi
for _ in $(seq 400); do gpubufctl pools >/dev/null 2>&1 && break; sleep 0.05; done
gpubufctl pools >/dev/null || fail "the installed gpubufd does not answer on $sock"
gpubuf-producer --pool smoke --name deb/check --size 1M >/dev/null || fail "gpubuf-producer"
gpubuf-consumer --name /smoke/deb/check --delete | grep -q " 0 mismatches" || fail "gpubuf-consumer"
cc -o "$work/hello" examples/out-of-tree/hello.c $(pkg-config --cflags --libs gpubuf-client) ||
    fail "a program against libgpubuf-client-dev"
"$work/hello" | grep -q "connected to gpubufd" || fail "hello: $("$work/hello")"
out=$(cd "$work" && /usr/bin/python3 -c '
import gpubuf
with gpubuf.Client() as c, c.alloc(4096, "deb/py", pool="smoke") as b:
    b.copy_from_host(b"python")
    b.seal(sync=True)
    with c.open("/smoke/deb/py") as o:
        print(gpubuf.__version__, o.to_pybytes()[:6].decode())
') || fail "python3-gpubuf"
[ "$out" = "$cmake_version python" ] || fail "python3-gpubuf printed '$out'"
echo "   gpubufctl, gpubuf-producer/-consumer, a program built with pkg-config, python3-gpubuf $out"
if [ -n "$daemon" ]; then
    kill -TERM "$daemon"
    rc=0; wait "$daemon" || rc=$?
    daemon=
    [ "$rc" = 0 ] || fail "gpubufd exited $rc on SIGTERM"
else
    systemctl stop gpubufd.socket gpubufd.service
fi

step "purge, and nothing left"
apt-get purge -y -qq "${pkgs[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "apt-get purge"; }
left=()
while read -r f; do
    case $f in /. | /usr | /usr/* | /lib | /lib/* | /etc | /etc/*) ;; *) continue ;; esac
    [ -e "$f" ] || [ -L "$f" ] || continue
    # Directories others share (/usr/bin, ...) stay; ours (.../gpubuf*) go.
    if [ -d "$f" ]; then
        case ${f##*/} in *gpubuf*) ;; *) continue ;; esac
    fi
    left+=("$f")
done <"$work/files"
left+=($(ls -d /etc/systemd/system/*/gpubuf* /var/lib/systemd/deb-systemd-helper-enabled/*gpubuf* \
             /var/lib/systemd/deb-systemd-helper-enabled/*/gpubuf* /run/gpubuf 2>/dev/null || true))
dpkg -l "${pkgs[@]}" 2>/dev/null | grep -E '^(ii|rc)' && fail "packages still known to dpkg"
[ ${#left[@]} = 0 ] || fail "left after purge: ${left[*]}"
if [ -z "$user_before" ]; then
    getent passwd gpubuf >/dev/null &&
        echo "   nothing left; the system user gpubuf stays (Debian does not remove system users)"
else
    echo "   nothing left; the user gpubuf existed before"
fi
echo "check-debian: ok"
