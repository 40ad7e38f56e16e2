/* Session room, continued: the handshake. A hello agrees on the protocol
 * version and the capabilities and tells the client its limits; with
 * resume_session, it takes up the restored session of this very process
 * (after a restart), or says why it cannot. */
#include "hello.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hash.h"

#include "log.h"
#include "util.h"
#include "wire.h"

#define GPUBUF_SERVER_STRING "gpubufd " GPUBUF_VERSION_STRING

/* Why session sid cannot be resumed by s (old: the holder of that id, if
 * any), as a clause for the client's message. */
static void refusal(const gd_session *s, const gd_holder *old, uint64_t sid, char *why,
                    size_t len) {
    /* A fresh gpubufd may have given this very connection the id of the
     * session it asks for (ids start again at 1): that is no other
     * connection's. */
    if (old == s->holder)
        old = NULL;
    if (old && old->detached && s->pid == 0)
        snprintf(why, len, "gpubufd cannot see this process's pid (its PID namespace is not "
                           "gpubufd's or below it), so it cannot tell it is the session's");
    else if (old && old->detached)
        snprintf(why, len, "session %llu belongs to another process",
                 (unsigned long long)sid);
    else if (old)
        snprintf(why, len, "session %llu is in use by another connection",
                 (unsigned long long)sid);
    else if (!s->ctx->restarts)
        snprintf(why, len, "gpubufd started without saved state");
    else
        snprintf(why, len, "session %llu is not in gpubufd's saved state: it was released "
                           "after resume_timeout_ms, or ended before the restart",
                 (unsigned long long)sid);
}

/* Hello with resume_session: take up the restored (detached) session of
 * this very process (same pid and uid), keeping the references the client
 * says its views hold. *ret_lost: the held buffers the session no longer
 * has. False when there is no such session (the client starts afresh):
 * why says why. */
static bool resume(gd_session *s, const Gpubuf__Hello *h, uint64_t **ret_lost, size_t *ret_n,
                   char *why, size_t why_len) {
    gd_registry *reg = &s->ctx->reg;
    gd_holder *old;
    uint64_t sid = h->resume_session;
    size_t n = 0;
    HASH_FIND(hh, reg->holders, &sid, sizeof(sid), old);
    /* pid 0: the peer's PID namespace is not gpubufd's or a descendant of
     * it; every such peer shows pid 0, so the pid proves nothing. */
    if (!old || !old->detached || s->pid == 0 || old->pid != s->pid || old->uid != s->uid) {
        refusal(s, old, sid, why, why_len);
        LOG_INFO("pid %d: no session %llu to resume (%s)", (int)s->pid,
                 (unsigned long long)sid, why);
        return false;
    }
    gd_held *held = calloc(h->n_held + 1, sizeof(*held));
    uint64_t *lost = calloc(h->n_held + 1, sizeof(*lost));
    if (!held || !lost) {
        free(held);
        free(lost);
        snprintf(why, why_len, "gpubufd is out of memory");
        return false;
    }
    for (size_t i = 0; i < h->n_held; i++) {
        held[n].buffer_id = h->held[i]->buffer_id;
        held[n].count = h->held[i]->count;
        held[n++].ro = h->held[i]->read_only;
    }
    qsort(held, n, sizeof(*held), gd_held_cmp);
    /* An id named twice counts once, with the larger claim. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && held[k - 1].buffer_id == held[i].buffer_id) {
            if (held[i].count > held[k - 1].count)
                held[k - 1] = held[i];
        } else {
            held[k++] = held[i];
        }
    }
    gd_registry_holder_drop(reg, s->holder); /* the fresh one: empty */
    s->holder = old;
    *ret_n = gd_registry_resume(reg, old, held, k, lost);
    *ret_lost = lost;
    LOG_INFO("session %llu (pid %d) resumed: %u reference(s) kept, %zu buffer(s) lost",
             (unsigned long long)sid, (int)s->pid, old->n_refs, *ret_n);
    free(held);
    return true;
}

void gd_session_hello(gd_session *s, uint64_t id, const Gpubuf__Hello *h) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__HelloReply hr = GPUBUF__HELLO_REPLY__INIT;
    if (s->hello_done) {
        gd_session_reply_error(s, id, GPUBUF_EPROTOCOL, "hello sent twice");
        return;
    }
    if (h->min_version > GPUBUF_PROTOCOL_VERSION || h->max_version < GPUBUF_PROTOCOL_VERSION) {
        char msg[128];
        snprintf(msg, sizeof(msg), "client speaks versions %u..%u, daemon speaks %u",
                 h->min_version, h->max_version, GPUBUF_PROTOCOL_VERSION);
        gd_session_reply_error(s, id, GPUBUF_EVERSION, msg);
        gd_session_close(s, GD_END_PROTOCOL);
        return;
    }
    s->hello_done = true;
    s->io->ready(s->conn);
    /* Shown by gpubufctl and in the log: printable UTF-8, cut on a character. */
    const char *cn = h->client_name ? h->client_name : "";
    gpubuf_text_clean(s->name, sizeof(s->name), cn, strlen(cn));
    uint64_t *lost = NULL;
    char why[160] = "";
    if (h->resume_session) {
        hr.resumed = resume(s, h, &lost, &hr.n_lost, why, sizeof(why));
        hr.lost = lost;
        hr.references_kept = hr.resumed ? s->holder->n_refs : 0;
        hr.resume_refused = why;
    }
    hr.restarts = s->ctx->restarts;
    hr.version = GPUBUF_PROTOCOL_VERSION;
    hr.server = (char *)GPUBUF_SERVER_STRING;
    hr.session_id = s->holder->id;
    hr.max_request = s->ctx->limits.max_request;
    hr.max_response = GPUBUF_WIRE_MAX_RESPONSE;
    if ((h->capabilities & GPUBUF_CAP_KEEP_MAPPED) && s->ctx->reg.quota.kept_slabs_per_client) {
        s->caps |= GPUBUF_CAP_KEEP_MAPPED;
        s->holder->kept_cap = s->ctx->reg.quota.kept_slabs_per_client;
        hr.max_kept_slabs = s->holder->kept_cap;
    }
    s->caps |= h->capabilities & GPUBUF_CAP_SLAB_ONCE;
    hr.capabilities = s->caps;
    hr.max_batch_items = GD_BATCH_MAX_ITEMS;
    hr.max_batch_slabs = GD_BATCH_REPLY_FDS;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_HELLO;
    resp.hello = &hr;
    gd_session_send(s, &resp, -1);
    free(lost);
}
