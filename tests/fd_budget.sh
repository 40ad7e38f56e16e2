#!/usr/bin/env bash
# The limits fit the fd budget (docs/security.md, "The fd budget"): under a
# low `ulimit -n` (soft and hard) with a large max_clients, --check-config
# and start-up lower max_clients to what the fds carry, and
# max_clients_per_uid to at most half of it, say so (a warning only for a
# key the configuration set), and the daemon raises its soft limit to the
# hard one, logs the budget, enforces the lowered limits, lets another uid
# in while one uid holds all it may, and keeps serving; a limit with no room
# for one client is refused. SIGHUP fits a reloaded configuration the same
# way.
# Usage: fd_budget.sh GPUBUFD GPUBUFCTL EXAMPLES_DIR
set -uo pipefail
gpubufd=$1 gpubufctl=$2 examples=$3
work=$(mktemp -d /tmp/gpubuf-fdbudget-XXXXXX)
# shellcheck source=tests/daemon_lib.sh
. "$(dirname "$0")/daemon_lib.sh"
expect() { # expect FILE TEXT: TEXT is in FILE
    grep -qF -- "$2" "$1" || { sed 's/^/   | /' "$1"; fail "expected '$2' in $(basename "$1")"; }
}
conf=$work/gpubuf.conf
printf '[daemon]\nmax_clients = 100000\nmax_clients_per_uid = 5000\nsocket_mode = 0666\n' >"$conf"

echo "-- --check-config under ulimit -n 512 (soft and hard), max_clients 100000"
(ulimit -n 512 && "$gpubufd" --config "$conf" --check-config >"$work/out" 2>"$work/err")
rc=$?
cat "$work/out" "$work/err"
[ "$rc" = 0 ] || fail "--check-config exited $rc"
# The default host pool: 4 GiB of 64 MiB slabs, two fds per slab, + 32.
expect "$work/out" "fd budget: RLIMIT_NOFILE 512, 160 reserved, 129 per client: max_clients 2, max_clients_per_uid 1"
expect "$work/err" "warning: the configured max_clients 100000 needs more fds than RLIMIT_NOFILE 512 carries"
expect "$work/err" "max_clients_per_uid 5000 as set lowered with it"

echo "-- --check-config under ulimit -n 1024, nothing set: the defaults lowered, no warning"
(ulimit -n 1024 && "$gpubufd" --pool host=host,capacity=64M --check-config >"$work/out" 2>&1) ||
    fail "--check-config exited $?"
cat "$work/out"
expect "$work/out" "fd budget: RLIMIT_NOFILE 1024, 34 reserved, 129 per client: max_clients 7, max_clients_per_uid 3"
expect "$work/out" "info: the default max_clients 4096 needs more fds than RLIMIT_NOFILE 1024 carries"
! grep -q warning "$work/out" || fail "a warning about limits nobody set"

echo "-- --check-config under ulimit -n 1024, max_clients_per_uid set: a warning naming it"
printf '[daemon]\nmax_clients_per_uid = 5\n' >"$work/pu.conf"
(ulimit -n 1024 && "$gpubufd" --config "$work/pu.conf" --pool host=host,capacity=64M \
    --check-config >"$work/out" 2>&1) || fail "--check-config exited $?"
cat "$work/out"
expect "$work/out" "warning: the default max_clients 4096 needs more fds"
expect "$work/out" "max_clients_per_uid 5 as set lowered with it"

echo "-- --check-config under soft 256, hard 4096: the budget is the hard limit"
if (ulimit -Sn 256 && ulimit -Hn 4096) 2>/dev/null; then
    (ulimit -Sn 256 && ulimit -Hn 4096 && "$gpubufd" --config "$conf" --check-config >"$work/out" 2>&1) ||
        fail "--check-config exited $?"
    cat "$work/out"
    expect "$work/out" "fd budget: RLIMIT_NOFILE 4096, 160 reserved, 129 per client: max_clients 30, max_clients_per_uid 15"
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
wait_listening 600 "$sock"
cat "$work/log"
# 32 + 2 fds of the one 64 MiB slab reserved; (1024 - 34) / 129 = 7 clients.
expect "$work/log" "fd budget: RLIMIT_NOFILE 1024, raised from 512; 34 reserved, 129 per client"
expect "$work/log" "serving at most max_clients 7, max_clients_per_uid 3"
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

echo "-- one uid holds all it may (max_clients_per_uid 3): another uid still connects"
chmod 755 "$work" # the socket is 0666: let another uid reach it
# Another uid runs a copy of gpubufctl and its library in a folder it may
# enter (the build tree may sit under a 0700 folder).
mkdir -m 755 "$work/stage"
cp "$gpubufctl" "$(dirname "$gpubufctl")"/libgpubuf-client.so* "$work/stage/"
chmod -R a+rX "$work/stage"
python3 - "$sock" "$gpubufctl" "$work/stage" <<'PY' || fail "one uid locked the others out"
import os, subprocess, sys, time
path, ctl, stage = sys.argv[1], sys.argv[2], sys.argv[3]

def hold(other=False, **kw):
    """A connection kept open (gpubufctl --watch): the process once served,
    or (None, why) once refused."""
    exe = os.path.join(stage, os.path.basename(ctl)) if other else ctl
    env = dict(os.environ, LD_LIBRARY_PATH=stage) if other else None
    p = subprocess.Popen([exe, "--socket", path, "--watch=3600", "clients"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kw)
    if p.stdout.readline():
        return p, ""
    p.wait(timeout=30)
    return None, p.stderr.read().strip()

held, why, deadline = [], "", time.monotonic() + 30
try:
    # This uid connects until refused for max_clients_per_uid, or for
    # max_clients once its connections fill every slot. A slot a closed
    # connection still holds (the start-up probe's) comes free once the
    # daemon reaps it: retry then.
    while len(held) < 16:
        p, why = hold()
        if p:
            held.append(p)
            continue
        if ("max_clients_per_uid" in why or "max_clients = %d " % len(held) in why or
                time.monotonic() > deadline):
            break
        time.sleep(0.05)
    print("   uid %d holds %d connection(s), the next refused: %s" % (os.getuid(), len(held), why))
    assert "max_clients_per_uid = 3 " in why, why
    if os.getuid() != 0:
        print("   (not root: another uid cannot be tried; skipped)")
        sys.exit(0)
    p, why = hold(other=True, user=65534, group=65534, extra_groups=[])
    print("   uid 65534 meanwhile:", "served" if p else "refused: " + why)
    assert p, why
    p.kill()
    p.wait()
finally:
    for p in held:
        p.kill()
        p.wait()
PY
echo "-- SIGHUP: the reloaded limits are fitted again"
printf '[daemon]\nmax_clients = 200000\n' >"$conf"
kill -HUP "$daemon"
wait_until 600 grep -q "SIGHUP: reloaded" "$work/log"
expect "$work/log" "warning: the configured max_clients 200000 needs more fds than RLIMIT_NOFILE 1024"
expect "$work/log" "SIGHUP: reloaded"
"$gpubufctl" --socket "$sock" status >/dev/null || fail "gpubufctl status after SIGHUP exited $?"

stop_daemon
echo "fd_budget: ok"
