/* Session room: the status request, a snapshot of the pools, the buffers
 * (as messages or as columns), the clients and the counters. */
#ifndef GPUBUFD_STATUS_H
#define GPUBUFD_STATUS_H

#include <stdint.h>

#include "reply.h"

/* Answer a status request (q NULL: the default, one message per buffer). */
void gd_session_status(gd_session *s, uint64_t id, const Gpubuf__StatusRequest *q);

#endif
