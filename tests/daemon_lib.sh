# Shared by the shell tests that run gpubufd themselves (fd_budget.sh,
# fd_exhaustion.sh): source it after setting $work (the test's folder, its
# daemon log in $work/log). It sets $daemon (the daemon's pid, empty when
# none) and $watcher (a helper process's pid, empty when none), and a trap
# that ends both and removes $work on exit.
# shellcheck shell=bash
# shellcheck disable=SC2154 # $work is set by the test that sources this
daemon="" watcher=""
cleanup() {
    local p
    for p in "$watcher" "$daemon"; do
        if [ -n "$p" ]; then kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; fi
    done
    rm -rf "$work"
}
trap cleanup EXIT

# The test's name, for its messages and figures.
test_name=$(basename "$0" .sh)

# fail WHY...: say why, show the daemon's log (its first 4000 bytes), exit 1.
fail() {
    echo "FAIL: $*"
    [ -f "$work/log" ] && head -c 4000 "$work/log" | sed 's/^/   log: /'
    exit 1
}

# A measured figure: printed, and added to $GPUBUF_FIGURES (scripts/test.sh).
figure() { echo "   $*"; [ -z "${GPUBUF_FIGURES:-}" ] || echo "$test_name: $*" >>"$GPUBUF_FIGURES"; }

# wait_until TRIES COMMAND...: run COMMAND every 0.05 s until it succeeds, at
# most TRIES times; its last status.
wait_until() {
    local tries=$1 i
    shift
    for ((i = 0; i < tries; i++)); do
        "$@" && return 0
        sleep 0.05
    done
    "$@"
}

# wait_listening TRIES SOCKET: wait until gpubufd listens on SOCKET, or fail.
wait_listening() {
    wait_until "$1" test -S "$2" || fail "gpubufd did not listen"
}

# stop_daemon: SIGTERM $daemon and fail unless it exits 0.
stop_daemon() {
    local rc=0
    kill -TERM "$daemon"
    wait "$daemon" || rc=$?
    daemon=
    [ "$rc" = 0 ] || fail "gpubufd exited $rc on SIGTERM"
}
