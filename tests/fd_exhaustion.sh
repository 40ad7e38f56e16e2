#!/usr/bin/env bash
# Running out of fds degrades gracefully (docs/security.md, "Out of file
# descriptors"): gpubufd's fd limit is lowered under it (prlimit) to a few
# fds above what it holds, then a flood of connections fills it until accept
# fails with EMFILE. The daemon must stay idle (CPU well under one core),
# keep its log small (rate-limited lines), refuse each further connection
# with a reason ("out of file descriptors") instead of leaving it hanging,
# keep answering status on a connection it already serves, and serve a fresh
# gpubufctl status once the extra connections are gone.
# Usage: fd_exhaustion.sh GPUBUFD GPUBUFCTL
set -uo pipefail
gpubufd=$1 gpubufctl=$2
work=$(mktemp -d /tmp/gpubuf-fdexh-XXXXXX)
# shellcheck source=tests/daemon_lib.sh
. "$(dirname "$0")/daemon_lib.sh"

sock=$work/gpubufd.sock
# A hard limit of 4096: room for 31 clients, 15 per uid, so that the flood
# of one uid's connections below runs into the fd limit, not into
# max_clients_per_uid (at 1024 it would be 3 per uid).
(ulimit -Sn 1024 && ulimit -Hn 4096 &&
    exec "$gpubufd" --socket "$sock" --pool host=host,capacity=64M) >"$work/log" 2>&1 &
daemon=$!
wait_listening 1200 "$sock"

echo "-- a client already connected: gpubufctl status --watch=0.2 on one connection"
"$gpubufctl" --socket "$sock" status --watch=0.2 >"$work/watch" 2>&1 &
watcher=$!
wait_until 1200 grep -q '^--- ' "$work/watch" || fail "gpubufctl --watch printed no status"

python3 - "$daemon" "$sock" "$gpubufctl" "$work/log" "$work/watch" <<'PY' || fail "see above"
import os, resource, socket, subprocess, sys, time
pid, path, ctl, log, watch = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]

def figure(line):
    """A measured figure: printed, and added to $GPUBUF_FIGURES (scripts/test.sh)."""
    print("   " + line)
    figures = os.environ.get("GPUBUF_FIGURES")
    if figures:
        with open(figures, "a") as f:
            f.write("fd_exhaustion: " + line + "\n")

def fds():
    return len(os.listdir(f"/proc/{pid}/fd"))

def cpu_ticks():
    with open(f"/proc/{pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    return int(st[11]) + int(st[12])  # utime + stime

def snapshots():
    with open(watch, errors="replace") as f:
        return sum(1 for line in f if line.startswith("--- "))

held = fds()
soft = held + 3
resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, 1024))
print(f"   gpubufd holds {held} fds; its fd limit is now {soft}")

log0 = os.path.getsize(log)
t0 = time.monotonic()
extra = []
for _ in range(40):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    extra.append(s)
def emfile():
    with open(log, errors="replace") as f:
        f.seek(log0)
        return "Too many open files" in f.read()
for _ in range(3000):
    if emfile():
        break
    time.sleep(0.02)
print(f"   40 connections opened; gpubufd holds {fds()} fds, limit {soft}")
assert emfile(), "accept never failed with EMFILE"
time.sleep(0.2)  # the flood's own work passes before the CPU is measured: a duration

tick = os.sysconf("SC_CLK_TCK")
snap0, c0, w0 = snapshots(), cpu_ticks(), time.monotonic()
time.sleep(1.0)  # the CPU is measured over it: a duration
c1, w1 = cpu_ticks(), time.monotonic()
cpu = (c1 - c0) / tick / (w1 - w0) * 100
figure(f"CPU of gpubufd over {w1 - w0:.2f} s out of fds: {cpu:.1f} % of one core (bound 25 %)")

# A fresh client while the fds are all taken: an answer, not a hang (60 s:
# the sanitizer build of gpubufctl on a loaded machine takes seconds to start).
t = time.monotonic()
try:
    r = subprocess.run([ctl, "--socket", path, "status"], capture_output=True, text=True,
                       timeout=60)
    fresh = (r.returncode, r.stderr.strip()[:200])
except subprocess.TimeoutExpired:
    fresh = (None, "no answer in 60 s (hangs)")
figure(f"fresh gpubufctl status out of fds: rc {fresh[0]} in {time.monotonic() - t:.2f} s: {fresh[1]}")

time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))  # the log is measured over 2 s: a duration
log_bytes = os.path.getsize(log) - log0
figure(f"log written over {time.monotonic() - t0:.2f} s out of fds: {log_bytes} bytes "
       "(bound 20000)")
snap1 = snapshots()
# It asks every 0.2 s: the next snapshot comes at once on a quiet machine; a
# busy one may take longer to schedule it (30 s at most).
t1 = time.monotonic()
snap2 = snapshots()
while snap2 <= snap1 and time.monotonic() - t1 < 30:
    time.sleep(0.05)
    snap2 = snapshots()
figure(f"the connected client's status snapshots: {snap1 - snap0} while out of fds, "
      f"{snap2 - snap1} in the next {time.monotonic() - t1:.1f} s")

told = 0
for s in extra:
    s.settimeout(0.05)
    try:
        told += b"out of file descriptors" in s.recv(4096)
    except OSError:
        pass
figure(f"{told} of 40 extra connections were told 'out of file descriptors'")

ok = True
def check(cond, what):
    global ok
    if not cond:
        print("FAIL:", what)
        ok = False
check(cpu < 25, f"gpubufd spins out of fds: {cpu:.1f} % CPU")
check(log_bytes < 20000, f"gpubufd wrote {log_bytes} bytes of log in 2 s out of fds")
check(fresh[0] not in (None, 0) and "out of file descriptors" in fresh[1],
      "a fresh client got no refusal with the reason while out of fds")
check(told > 0, "no extra connection was told why it was refused")
check(snap1 > snap0 and snap2 > snap1, "the connected client got no status while out of fds")

for s in extra:
    s.close()
# The daemon closes its ends of them (30 s at most on a loaded machine).
t = time.monotonic()
while fds() > held and time.monotonic() - t < 30:
    time.sleep(0.05)
try:
    r = subprocess.run([ctl, "--socket", path, "status"], capture_output=True, text=True,
                       timeout=60)
    print(f"   after closing the extra connections: gpubufctl status rc {r.returncode}")
    check(r.returncode == 0, f"gpubufctl status after the flood: {r.stderr.strip()[:200]}")
except subprocess.TimeoutExpired:
    check(False, "gpubufctl status after the flood hangs")
sys.exit(0 if ok else 1)
PY

kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
watcher=
stop_daemon
echo "fd_exhaustion: ok"
