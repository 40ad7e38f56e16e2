#!/usr/bin/env bash
# The journal pairs' own account (bench/run.sh, docs/performance.md): with
# state_journal = switchable, gpubufd's SIGUSR2 message that turns the
# journal off says what the journal wrote while it was on (groups, bytes,
# the big groups of batches and their time, snapshots); gpubuf_bench --pairs
# sums those messages per phase into DIR/journal-work.txt; traced
# (GPUBUF_TRACE_TIMING=1), it marks each run's side in DIR/switches.txt,
# and bench/trace_timing.py --windows splits the traced batch requests by
# side. One quick batch phase, host pool.
# Usage: journal_pairs.sh GPUBUFD GPUBUF_BENCH SOURCE_DIR
set -uo pipefail
gpubufd=$1 bench=$2 src=$3
work=$(mktemp -d /tmp/gpubuf-pairs-XXXXXX)
# shellcheck source=tests/daemon_lib.sh
. "$(dirname "$0")/daemon_lib.sh"
sock=$work/s.sock
mkdir -p "$work/pairs" "$work/trace"
printf '[daemon]\nstate_journal = switchable\n' >"$work/conf"
export GPUBUF_TRACE_TIMING=1 GPUBUF_TRACE_DIR=$work/trace
"$gpubufd" --socket "$sock" --log-level warning --config "$work/conf" \
    --pool gpu0=host,capacity=1G,slab=64M 2>"$work/log" &
daemon=$!
wait_listening 400 "$sock"
rc=0
"$bench" --socket "$sock" --pool gpu0 --only batch --quick --pairs "$work/pairs" \
    --daemon-pid "$daemon" --daemon-log "$work/log" >"$work/out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat "$work/out"; fail "gpubuf_bench --pairs exited $rc"; }
grep "batch: with the journal on (" "$work/out" || fail "gpubuf_bench did not say the journal's work"

echo "-- the daemon's message when the journal goes off"
line=$(grep "SIGUSR2: the journal is off" "$work/log" | tail -1)
echo "   $line"
[[ $line =~ while\ it\ was\ on\ \(([0-9.]+)\ s\):\ ([0-9]+)\ groups,\ ([0-9]+)\ bytes\;\ ([0-9]+)\ of\ 4096\ bytes\ or\ more,\ ([0-9]+)\ bytes,\ in\ ([0-9]+)\ ns\;\ ([0-9]+)\ snapshot ]] ||
    fail "the message does not say what the journal did while on"
# Runs 6 and 7 (on) each release 1,000 buffers 24 times (23 rounds, then the
# producer's own), each release one request of 16 KiB of entries.
[ "${BASH_REMATCH[2]}" -gt 46 ] || fail "${BASH_REMATCH[2]} groups while on"
[ "${BASH_REMATCH[4]}" -ge 46 ] || fail "${BASH_REMATCH[4]} big groups while on"
[ "${BASH_REMATCH[5]}" -ge $((BASH_REMATCH[4] * 4096)) ] || fail "big groups under 4 KiB each"
[ "${BASH_REMATCH[6]}" -gt 0 ] || fail "big groups took no time"

echo "-- journal-work.txt: the batch phase, two windows of its own"
cat "$work/pairs/journal-work.txt"
read -r phase windows _ groups _ big _ big_ns _ \
    <"$work/pairs/journal-work.txt"
if ! { [ "$phase" = batch ] && [ "$windows" = 2 ]; }; then
    fail "not the batch phase's two windows"
fi
if ! { [ "$big" -ge 92 ] && [ "$groups" -gt "$big" ] && [ "$big_ns" -gt 0 ]; }; then
    fail "the sums do not cover both windows"
fi
[ "$(wc -l <"$work/pairs/journal-work.txt")" = 1 ] || fail "more than one line"

echo "-- switches.txt and trace_timing.py --windows"
cat "$work/pairs/switches.txt"
sides=$(awk '{print $2}' "$work/pairs/switches.txt" | tr '\n' ' ')
[ "$sides" = "off on on off off on on off end " ] || fail "sides '$sides'"
stop_daemon
for side in on off; do
    python3 "$src/bench/trace_timing.py" --type batch_release --windows "$work/pairs/switches.txt" \
        --side "$side" "$work"/trace/* >"$work/tt" 2>&1 || { cat "$work/tt"; fail "trace_timing.py"; }
    head -1 "$work/tt"
    # 4 runs of 24 releases of 1,000, one request each (an open is split into
    # requests of 256; a release is not).
    n=$(awk 'NR == 1 {print $1}' "$work/tt")
    if ! { [ "$n" -ge 92 ] && [ "$n" -le 368 ]; }; then
        fail "$n batch_release requests on the $side side"
    fi
done
echo "ok"
