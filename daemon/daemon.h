/* The daemon assembled: a server whose connections each get a session, all
 * working on one daemon context. The only place that knows both the server
 * and the sessions; main() and the fuzz target build on it. */
#ifndef GPUBUFD_DAEMON_H
#define GPUBUFD_DAEMON_H

#include <uv.h>

#include "context.h"
#include "server.h"

typedef struct gd_daemon {
    gd_context ctx;
    gd_server srv;
} gd_daemon;

/* Default limits and quotas, no pools (add them to d->ctx), not listening yet. */
int gd_daemon_init(gd_daemon *d, uv_loop_t *loop);
/* Tell every client the daemon stops, close the connections and the
 * listener; the loop then runs out. */
void gd_daemon_stop(gd_daemon *d);
/* After the loop ran out: free the registry, the pools and the rest. */
void gd_daemon_destroy(gd_daemon *d);

#endif
