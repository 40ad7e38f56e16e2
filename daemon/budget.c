/* Reply memory and the uids' shares of it: what each connection, each uid
 * and the whole daemon have queued (max_reply_memory, GD_UID_REPLY_SHARE),
 * and the connections waiting for room (server.c wakes them). Part of the
 * server room. */
#include "server_internal.h"

#include <assert.h>
#include <stdlib.h>
#include <utlist.h>

#include "util.h"

/* The queued replies of c's uid leave room for bytes more: within the uid's
 * share of max_reply_memory, or nothing of the uid's is queued. */
bool gd_budget_uid_room(const gd_conn *c, size_t bytes) {
    return !c->uu || c->uu->out_bytes == 0 ||
           c->uu->out_bytes + bytes <= GD_UID_REPLY_SHARE(c->srv->limits->max_reply_memory);
}

/* The uid's queued replies fill its share: its connections with replies
 * queued are held back (backlogged()). */
bool gd_budget_uid_full(const gd_conn *c) {
    return c->uu && c->uu->out_bytes >= GD_UID_REPLY_SHARE(c->srv->limits->max_reply_memory);
}

void gd_budget_out_add(gd_conn *c, size_t len) {
    c->out_bytes += len;
    c->srv->out_bytes += len;
    if (c->uu)
        c->uu->out_bytes += len;
}

void gd_budget_out_sub(gd_conn *c, size_t len) {
    assert(c->out_bytes >= len && c->srv->out_bytes >= len);
    c->out_bytes -= len;
    c->srv->out_bytes -= len;
    if (c->uu) {
        assert(c->uu->out_bytes >= len);
        c->uu->out_bytes -= len;
    }
}

/* Count an accepted connection under its uid. False when out of memory. */
bool gd_conn_uid_attach(gd_conn *c) {
    gd_server *srv = c->srv;
    gd_uid_use *u;
    GPUBUF_HASH_GET(srv->uids, uid, c->uid, u);
    if (!u)
        return false;
    u->n_conns++;
    c->uu = u;
    return true;
}

/* The connection is freed (its queue was dropped before). */
void gd_budget_uid_detach(gd_conn *c) {
    gd_uid_use *u = c->uu;
    if (!u)
        return;
    c->uu = NULL;
    assert(u->n_conns > 0);
    if (--u->n_conns == 0) {
        assert(u->out_bytes == 0);
        HASH_DEL(c->srv->uids, u);
        free(u);
    }
}

bool gd_conn_reply_room(gd_conn *c, size_t bound) {
    gd_server *srv = c->srv;
    if (c->closing || c->peer_gone || c->draining)
        return true; /* its replies are dropped */
    if ((srv->out_bytes == 0 || srv->out_bytes + bound <= srv->limits->max_reply_memory) &&
        gd_budget_uid_room(c, bound))
        return true;
    if (!c->mem_wait) {
        c->mem_wait = bound ? bound : 1;
        DL_APPEND2(srv->mem_waiters, c, mw_prev, mw_next);
    }
    return false;
}

void gd_budget_mem_unwait(gd_conn *c) {
    if (c->mem_wait) {
        DL_DELETE2(c->srv->mem_waiters, c, mw_prev, mw_next);
        c->mem_wait = 0;
    }
}

