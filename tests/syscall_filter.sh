#!/usr/bin/env bash
# Every system call gpubufd makes is allowed by the unit's filter
# (systemd/gpubufd.service.in: SystemCallFilter=@system-service minus
# @privileged): gpubufd runs under strace while a producer, a consumer,
# gpubufctl and a SIGHUP exercise it, and each call strace saw must be in the
# set systemd-analyze resolves for that filter. Exit 77 (skip) without strace
# or systemd-analyze.
# Usage: syscall_filter.sh GPUBUFD GPUBUFCTL EXAMPLES_DIR [GPUBUFD OPTIONS...]
# (default options: one 64 MiB host pool; on a GPU machine pass none to use
# the default CUDA pools).
set -uo pipefail
gpubufd=$1 gpubufctl=$2 examples=$3
shift 3
opts=("$@")
[ $# -gt 0 ] || opts=(--pool host=host,capacity=64M)
for t in strace systemd-analyze python3; do
    command -v "$t" >/dev/null || { echo "$t not found: skipped"; exit 77; }
done
work=$(mktemp -d /tmp/gpubuf-syscalls-XXXXXX)
daemon= tracer=
cleanup() {
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null; fi
    if [ -n "$tracer" ]; then wait "$tracer" 2>/dev/null; fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
sock=$work/gpubufd.sock
conf=$work/gpubuf.conf
printf '[daemon]\nlog_level = info\n' >"$conf"
strace -f -qq -o "$work/trace" "$gpubufd" --socket "$sock" --config "$conf" "${opts[@]}" \
    >"$work/log" 2>&1 &
tracer=$!
for _ in $(seq 600); do [ -S "$sock" ] && break; sleep 0.05; done
# Signals go to gpubufd itself, not to strace.
daemon=$(cat "/proc/$tracer/task/$tracer/children" 2>/dev/null | awk '{print $1}')
[ -n "$daemon" ] || { cat "$work/log"; fail "no gpubufd under strace"; }
[ -S "$sock" ] || { cat "$work/log"; fail "gpubufd did not listen"; }
GPUBUF_SOCKET=$sock "$examples/gpubuf-producer" --name sc --size 1M >/dev/null ||
    fail "gpubuf-producer exited $?"
GPUBUF_SOCKET=$sock "$examples/gpubuf-consumer" --name sc --delete >/dev/null ||
    fail "gpubuf-consumer exited $?"
"$gpubufctl" --socket "$sock" status >/dev/null || fail "gpubufctl status exited $?"
"$gpubufctl" --socket "$sock" metrics >/dev/null || fail "gpubufctl metrics exited $?"
kill -HUP "$daemon"
for _ in $(seq 1200); do grep -q "SIGHUP: reloaded" "$work/log" && break; sleep 0.05; done
kill -TERM "$daemon"
daemon=
wait "$tracer" || { cat "$work/log"; fail "gpubufd exited $? on SIGTERM"; }
tracer=
systemd-analyze syscall-filter >"$work/groups" 2>/dev/null || fail "systemd-analyze syscall-filter"
python3 - "$work/trace" "$work/groups" <<'PY'
import re, sys
groups, cur = {}, None
for line in open(sys.argv[2]):
    s = line.strip()
    if not s or s.startswith("#"):
        continue
    if not line.startswith(" "):
        cur = s; groups[cur] = []
    elif cur:
        groups[cur].append(s)
def expand(g, seen=None):
    seen = seen or set()
    out = set()
    for x in groups.get(g, []):
        if x.startswith("@"):
            if x not in seen:
                seen.add(x); out |= expand(x, seen)
        else:
            out.add(x)
    return out
allowed = expand("@system-service") - expand("@privileged")
used = set()
for line in open(sys.argv[1]):
    m = re.match(r"\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]", line)
    if m and m.group(1) not in ("exit", "killed", "resumed", "SIGHUP", "SIGTERM"):
        used.add(m.group(1))
outside = sorted(used - allowed)
print("gpubufd made %d distinct system calls; allowed by SystemCallFilter=@system-service ~@privileged: %d; outside: %s"
      % (len(used), len(used & allowed), " ".join(outside) or "none"))
sys.exit(1 if outside else 0)
PY
rc=$?
[ "$rc" = 0 ] || fail "system calls outside the unit's filter (above)"
echo "syscall_filter: ok"
