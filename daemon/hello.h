/* Session room: the hello request (hello.c), the first a connection sends:
 * version and capabilities agreed, a restored session resumed. */
#ifndef GPUBUFD_HELLO_H
#define GPUBUFD_HELLO_H

#include <stdint.h>

#include "gpubuf.pb-c.h"
#include "reply.h"

/* Answer hello h (request id): a second hello or a version the daemon does
 * not speak is refused (the latter closes the connection). */
void gd_session_hello(gd_session *s, uint64_t id, const Gpubuf__Hello *h);

#endif
