#!/usr/bin/env bash
# The limits fit the fd budget (docs/security.md, "The fd budget"): under a
# low `ulimit -n` (soft and hard) with a large max_clients, --check-config
# and start-up lower max_clients to what the fds carry, say so, and the
# daemon raises its soft limit to the hard one, logs the budget, enforces the
# lowered limit and keeps serving; a limit with no room for one client is
# refused. SIGHUP fits a reloaded configuration the same way.
# Usage: fd_budget.sh GPUBUFD GPUBUFCTL EXAMPLES_DIR
set -uo pipefail
gpubufd=$1 gpubufctl=$2 examples=$3
work=$(mktemp -d /tmp/gpubuf-fdbudget-XXXXXX)
daemon=
cleanup() {
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && sed 's/^/   log: /' "$work/log"; exit 1; }
# A measured figure: printed, and added to $GPUBUF_FIGURES (scripts/test.sh).
figure() { echo "   $*"; [ -z "${GPUBUF_FIGURES:-}" ] || echo "fd_budget: $*" >>"$GPUBUF_FIGURES"; }
expect() { # expect FILE TEXT: TEXT is in FILE
    grep -qF -- "$2" "$1" || { sed 's/^/   | /' "$1"; fail "expected '$2' in $(basename "$1")"; }
}
conf=$work/gpubuf.conf
printf '[daemon]\nmax_clients = 100000\nmax_clients_per_uid = 5000\n' >"$conf"

echo "-- --check-config under ulimit -n 512 (soft and hard), max_clients 100000"
(ulimit -n 512 && "$gpubufd" --config "$conf" --check-config >"$work/out" 2>"$work/err")
rc=$?
cat "$work/out" "$work/err"
[ "$rc" = 0 ] || fail "--check-config exited $rc"
# The default host pool: 4 GiB of 64 MiB slabs, two fds per slab, + 32.
expect "$work/out" "fd budget: RLIMIT_NOFILE 512, 160 reserved, 129 per client: max_clients 2, max_clients_per_uid 2"
expect "$work/err" "warning: max_clients 100000 and max_clients_per_uid 5000 need more fds than RLIMIT_NOFILE 512 carries"

echo "-- --check-config under soft 256, hard 4096: the budget is the hard limit"
if (ulimit -Sn 256 && ulimit -Hn 4096) 2>/dev/null; then
    (ulimit -Sn 256 && ulimit -Hn 4096 && "$gpubufd" --config "$conf" --check-config >"$work/out" 2>&1) ||
        fail "--check-config exited $?"
    cat "$work/out"
    expect "$work/out" "fd budget: RLIMIT_NOFILE 4096, 160 reserved, 129 per client: max_clients 30, max_clients_per_uid 30"
else
    echo "   (the hard fd limit here is below 4096: skipped)"
fi

echo "-- --check-config under ulimit -n 100: no room for one client, refused"
(ulimit -n 100 && "$gpubufd" --config "$conf" --check-config >"$work/out" 2>&1)
rc=$?
cat "$work/out"
[ "$rc" = 2 ] || fail "--check-config exited $rc under ulimit -n 100, expected 2"
expect "$work/out" "leaves no room for a client"

echo "-- the defaults fit a systemd service's LimitNOFILE=1048576"
if (ulimit -Sn 1024 && ulimit -Hn 1048576) 2>/dev/null; then
    (ulimit -Sn 1024 && ulimit -Hn 1048576 && "$gpubufd" --check-config >"$work/out" 2>&1) ||
        fail "--check-config exited $?"
    cat "$work/out"
    expect "$work/out" "max_clients 4096, max_clients_per_uid 1024"
    ! grep -q warning "$work/out" || fail "the defaults were lowered under 1048576 fds"
else
    echo "   (cannot raise the hard fd limit to 1048576 here: skipped)"
fi

echo "-- gpubufd under soft 512, hard 1024, max_clients 100000"
sock=$work/gpubufd.sock
(ulimit -Sn 512 && ulimit -Hn 1024 &&
    exec "$gpubufd" --socket "$sock" --config "$conf" --pool host=host,capacity=64M) \
    >"$work/log" 2>&1 &
daemon=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "gpubufd did not listen"
cat "$work/log"
# 32 + 2 fds of the one 64 MiB slab reserved; (1024 - 34) / 129 = 7 clients.
expect "$work/log" "fd budget: RLIMIT_NOFILE 1024, raised from 512; 34 reserved, 129 per client"
expect "$work/log" "serving at most max_clients 7, max_clients_per_uid 7"
soft=$(awk '/Max open files/ {print $4}' "/proc/$daemon/limits")
[ "$soft" = 1024 ] || fail "the soft fd limit of gpubufd is $soft, expected 1024"
figure "under soft 512, hard 1024: $(grep -m1 -o 'fd budget: .*' "$work/log"); soft fd limit \
now $soft"

echo "-- it serves: status, a producer and a consumer"
"$gpubufctl" --socket "$sock" status >/dev/null || fail "gpubufctl status exited $?"
GPUBUF_SOCKET=$sock "$examples/gpubuf-producer" --name fdb --size 1M >/dev/null ||
    fail "gpubuf-producer exited $?"
GPUBUF_SOCKET=$sock "$examples/gpubuf-consumer" --name fdb --delete >/dev/null ||
    fail "gpubuf-consumer exited $?"

echo "-- the lowered max_clients is enforced: 7 connections held, the 8th refused"
python3 - "$sock" "$gpubufctl" <<'PY' || fail "the lowered max_clients was not enforced"
import socket, subprocess, sys, time
held = []
for _ in range(7):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(0.3)
r = subprocess.run([sys.argv[2], "--socket", sys.argv[1], "status"], capture_output=True, text=True)
print("   8th connection:", r.returncode, r.stderr.strip()[:160])
assert r.returncode != 0 and "max_clients = 7" in r.stderr, r
for s in held:
    s.close()
time.sleep(0.3)
r = subprocess.run([sys.argv[2], "--socket", sys.argv[1], "status"], capture_output=True, text=True)
assert r.returncode == 0, r
print("   after closing them: status ok")
PY

echo "-- SIGHUP: the reloaded limits are fitted again"
printf '[daemon]\nmax_clients = 200000\n' >"$conf"
kill -HUP "$daemon"
for _ in $(seq 100); do grep -q "SIGHUP: reloaded" "$work/log" && break; sleep 0.05; done
expect "$work/log" "max_clients 200000 and max_clients_per_uid 1024 need more fds than RLIMIT_NOFILE 1024"
expect "$work/log" "SIGHUP: reloaded"
"$gpubufctl" --socket "$sock" status >/dev/null || fail "gpubufctl status after SIGHUP exited $?"

kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=
[ "$rc" = 0 ] || fail "gpubufd exited $rc on SIGTERM"
echo "fd_budget: ok"
