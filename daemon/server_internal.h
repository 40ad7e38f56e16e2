/* Server room, private: what server.c (connections: reading, writing,
 * deadlines, teardown) shares with listener.c (the listening socket:
 * binding, accepting, refusing). Nothing outside the server room includes
 * it. */
#ifndef GPUBUFD_SERVER_INTERNAL_H
#define GPUBUFD_SERVER_INTERNAL_H

#include <stdbool.h>

#include "server.h"

/* Set up the handles of an accepted connection. On failure c is freed and
 * its fd closed (through close callbacks when a handle was initialised). */
int gd_conn_start(gd_server *srv, gd_conn *c);
/* Count an accepted connection under its uid. False when out of memory. */
bool gd_conn_uid_attach(gd_conn *c);
/* Start, keep or stop c's deadline (handshake, or half a frame). */
void gd_conn_arm_timer(gd_conn *c);

#endif
