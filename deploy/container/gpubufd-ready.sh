#!/bin/sh
# Readiness of a gpubufd container: the socket answers, and (after a
# takeover) it is this container's gpubufd that answers: the restart count
# is above the one the entrypoint saw before taking over.
set -eu
sock=${GPUBUF_SOCKET:-/run/gpubuf/gpubufd.sock}
now=$(gpubufctl --socket "$sock" --json status | sed -n 's/.*"restarts":\([0-9]*\).*/\1/p')
[ -n "$now" ] && [ "$now" -gt "$(cat /tmp/gpubuf-restarts 2>/dev/null || echo -1)" ]
