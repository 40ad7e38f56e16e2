#!/bin/sh
# gpubufd in a container (deploy/kubernetes/gpubufd.yaml): takes the buffers
# over from the gpubufd serving on the socket when there is one (a rolling
# update of the DaemonSet with maxSurge: the new pod starts beside the old),
# else starts afresh. Arguments go to gpubufd.
#
# After handing over, the old gpubufd exits 0; this script then waits for
# SIGTERM instead of exiting, so that the kubelet does not restart the old
# container (which would take the buffers back). /tmp/gpubuf-restarts holds
# the daemon's restart count before the takeover, for gpubufd-ready.
set -eu
sock=${GPUBUF_SOCKET:-/run/gpubuf/gpubufd.sock}
before=-1
takeover=
if gpubufctl --socket "$sock" pools >/dev/null 2>&1; then
    before=$(gpubufctl --socket "$sock" --json status |
        sed -n 's/.*"restarts":\([0-9]*\).*/\1/p')
    takeover=--takeover
    echo "gpubufd-entrypoint: a gpubufd serves on $sock (restart $before): taking it over"
fi
echo "$before" >/tmp/gpubuf-restarts
term() { [ -n "${pid:-}" ] && kill -TERM "$pid" 2>/dev/null; exit 0; }
trap term TERM INT
gpubufd --socket "$sock" $takeover "$@" &
pid=$!
rc=0
wait "$pid" || rc=$?
pid=
if [ "$rc" = 0 ] && gpubufctl --socket "$sock" pools >/dev/null 2>&1; then
    echo "gpubufd-entrypoint: gpubufd handed over to its successor; waiting for SIGTERM"
    while :; do sleep 3600 & wait $! || true; done
fi
exit "$rc"
