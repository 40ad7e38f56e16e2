/* Timestamp trace of requests (GPUBUF_TRACE_TIMING=1): the client library
 * and gpubufd record CLOCK_MONOTONIC at each step of a request, keyed by
 * session id and request id, so that the two sides' records of one request
 * can be joined (the clock is the same for all processes of a machine).
 * bench/trace_timing.py prints the median of each step. For machines
 * without perf or strace; off (one branch per step) unless the variable is
 * set when the process first records. */
#ifndef GPUBUF_TRACE_H
#define GPUBUF_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The steps, in the order a request passes them. */
typedef enum gpubuf_trace_step {
    GPUBUF_TRACE_C_ENCODE,  /* client: the request is about to be packed */
    GPUBUF_TRACE_C_SENT,    /* client: sendmsg returned */
    GPUBUF_TRACE_D_WAKE,    /* daemon: the poll said readable (epoll_wait returned) */
    GPUBUF_TRACE_D_READ,    /* daemon: recvmsg returned */
    GPUBUF_TRACE_D_DECODED, /* daemon: the request is unpacked */
    GPUBUF_TRACE_D_HANDLED, /* daemon: the registry work is done, the reply is to be packed */
    GPUBUF_TRACE_D_ENCODED, /* daemon: the reply frame is packed and queued */
    GPUBUF_TRACE_D_WRITTEN, /* daemon: sendmsg wrote the reply */
    GPUBUF_TRACE_C_WAKE,    /* client: recvmsg returned the whole reply */
    GPUBUF_TRACE_C_DECODED, /* client: the reply is unpacked */
    GPUBUF_TRACE_C_MAPPED,  /* client: the view exists (mapping cache looked up) */
    GPUBUF_TRACE_STEPS
} gpubuf_trace_step;

/* True when GPUBUF_TRACE_TIMING is 1 in this process's environment. Inline:
 * the daemon asks four times a request (a call through pthread_once was
 * about 40 instructions of the 3,200 an operation of the mixed throughput
 * phase, callgrind). */
extern _Atomic int gpubuf_trace_state_; /* -1: not read yet, 0: off, 1: on */
bool gpubuf_trace_on_first(void);
static inline bool gpubuf_trace_on(void) {
    int s = atomic_load_explicit(&gpubuf_trace_state_, memory_order_acquire);
    return s < 0 ? gpubuf_trace_on_first() : s == 1;
}
/* Record step of request (session, request), of type (the daemon's request
 * type number; -1 when unknown) at ns (0: now). At most 1 << 20 records
 * are kept; thread-safe. */
void gpubuf_trace(uint64_t session, uint64_t request, int type, gpubuf_trace_step step,
                  uint64_t ns);
/* For the single-threaded daemon (the server hands when it woke and when
 * recvmsg returned up with each frame): the session tags the reply it
 * queues (request 0: no tag) so that the server records when it packed and
 * wrote it. */
void gpubuf_trace_set_tag(uint64_t session, uint64_t request, int type);
/* The tag set; false when none is. */
bool gpubuf_trace_tag(uint64_t *ret_session, uint64_t *ret_request, int *ret_type);
/* Append the records to $GPUBUF_TRACE_DIR (default /tmp)/gpubuf-trace-<pid>.txt,
 * one line each ("session request type step ns"), and forget them. */
void gpubuf_trace_dump(void);

#endif
