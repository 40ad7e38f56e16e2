/* Server room, private: what server.c (connections: reading, writing,
 * deadlines, teardown) shares with listener.c (the listening socket:
 * binding, accepting, refusing) and conn_send.c (a reply queued). Nothing
 * outside the server room includes it. */
#ifndef GPUBUFD_SERVER_INTERNAL_H
#define GPUBUFD_SERVER_INTERNAL_H

#include <stdbool.h>

#include "server.h"

/* Set up the handles of an accepted connection. On failure c is freed and
 * its fd closed (through close callbacks when a handle was initialised). */
int gd_conn_start(gd_server *srv, gd_conn *c);
/* budget.c: count an accepted connection under its uid (false when out of
 * memory), and let it go when the connection is freed (its queue was
 * dropped before). */
bool gd_conn_uid_attach(gd_conn *c);
void gd_budget_uid_detach(gd_conn *c);
/* The queued replies of c's uid leave room for bytes more: within the uid's
 * share of max_reply_memory, or nothing of the uid's is queued. */
bool gd_budget_uid_room(const gd_conn *c, size_t bytes);
/* The uid's queued replies fill its share: its connections with replies
 * queued are held back. */
bool gd_budget_uid_full(const gd_conn *c);
/* len bytes of replies queued on c, or written or dropped. */
void gd_budget_out_add(gd_conn *c, size_t len);
void gd_budget_out_sub(gd_conn *c, size_t len);
/* c no longer waits for reply memory. */
void gd_budget_mem_unwait(gd_conn *c);
/* Close c, remembering the first reason given. */
void gd_conn_end(gd_conn *c, gd_close_reason why);
/* The peer closed or broke the connection. */
void gd_conn_peer_left(gd_conn *c);
/* Watch what c needs now (readable unless backlogged, writable while
 * replies wait). */
void gd_conn_update_poll(gd_conn *c);
/* Write c's queued replies, as many as the socket takes (0), or the error
 * that ends the connection. */
int gd_conn_flush(gd_conn *c);
/* Start, keep or stop c's deadline (handshake, or half a frame). */
void gd_conn_arm_timer(gd_conn *c);

#endif
