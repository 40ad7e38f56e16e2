/* libgpubuf-client: batches of results without buffers (gpubuf_seal_many,
 * gpubuf_delete_many, gpubuf_release_many): one result per item. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"
#include "util.h"

/* An array of one element per item (one more: n may be 0). */
static void *per_item(size_t n, size_t size) {
    return malloc((n + 1) * size);
}

/* Send a request built for items [from, from + n) and record their results. */
static int results_rpc(gpubuf_batch_call *bc, Gpubuf__Request *req, size_t from, size_t n) {
    Gpubuf__Response *resp;
    int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
    int r = gpubuf__batch_rpc(bc->c, req, &resp, fds, &n_fds, n);
    if (r < 0)
        return r;
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    for (size_t k = 0; k < n; k++)
        if (resp->batch->status[k] < 0)
            gpubuf__batch_fail(bc, from + k, resp->batch->status[k],
                               gpubuf__batch_message(resp->batch, k));
    gpubuf__resp_free(bc->c, resp);
    gpubuf_trace(bc->c->session_id, req->id, -1, GPUBUF_TRACE_C_MAPPED, 0);
    return 0;
}

static int seal_many_call(gpubuf_buffer *const *bufs, size_t n, int *ret_status) {
    gpubuf_client *c = NULL;
    gpubuf_batch_call bc;
    uint64_t *ids;
    gpubuf_buffer **roots;
    int r;
    for (size_t i = 0; i < n && !c; i++)
        c = bufs && bufs[i] ? bufs[i]->c : NULL;
    if (!c) /* none, or no buffer among them */
        return n ? gpubuf__fail(-EINVAL, "gpubuf_seal_many needs buffers") : 0;
    if ((r = gpubuf__batch_start(&bc, c, n, ret_status)) < 0)
        return r;
    ids = per_item(n, sizeof(*ids));
    roots = per_item(n, sizeof(*roots));
    if (!ids || !roots)
        r = -ENOMEM;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; r == 0 && i < n; i++) {
        roots[i] = bufs[i];
        ids[i] = 0; /* no buffer 0: an item refused here fails at the daemon too */
        int e = bufs[i] ? (bufs[i]->c == c ? gpubuf__seal_check(&roots[i]) : -EINVAL) : -EINVAL;
        if (e < 0)
            gpubuf__batch_fail(&bc, i, e,
                               bufs[i] && bufs[i]->c == c ? gpubuf_last_error_message()
                                                          : "not a buffer of this connection");
        else
            ids[i] = roots[i]->id;
    }
    for (size_t from = 0, k; r == 0 && from < n; from += k) {
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__BatchStateRequest q = GPUBUF__BATCH_STATE_REQUEST__INIT;
        k = gpubuf__batch_chunk_len(c, NULL, n - from, NULL, 0);
        q.op = GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL;
        q.n_buffer_ids = k;
        q.buffer_ids = ids + from;
        req.body_case = GPUBUF__REQUEST__BODY_BATCH_STATE;
        req.batch_state = &q;
        r = results_rpc(&bc, &req, from, k);
    }
    for (size_t i = 0; r == 0 && i < n; i++)
        if (bc.status[i] == 0)
            roots[i]->sealable = false;
    pthread_mutex_unlock(&c->lock);
    free(ids);
    free(roots);
    return gpubuf__batch_end(&bc, ret_status, r);
}

static int delete_many_call(gpubuf_client *c, size_t n, const char *const *names,
                            const uint64_t *ids, int *ret_status) {
    gpubuf_batch_call bc;
    int r = gpubuf__batch_start(&bc, c, n, ret_status);
    if (r < 0)
        return r;
    pthread_mutex_lock(&c->lock);
    for (size_t from = 0, k; r == 0 && from < n; from += k) {
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__BatchStateRequest q = GPUBUF__BATCH_STATE_REQUEST__INIT;
        k = gpubuf__batch_chunk_len(c, NULL, n - from, names ? names + from : NULL, 0);
        q.op = GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_DELETE;
        if (names) {
            q.n_names = k;
            q.names = (char **)(names + from);
        } else {
            q.n_buffer_ids = k;
            q.buffer_ids = (uint64_t *)(ids + from);
        }
        req.body_case = GPUBUF__REQUEST__BODY_BATCH_STATE;
        req.batch_state = &q;
        r = results_rpc(&bc, &req, from, k);
    }
    pthread_mutex_unlock(&c->lock);
    return gpubuf__batch_end(&bc, ret_status, r);
}

/* A view gpubuf_release_many releases in its batch: a root view without a
 * CUDA seal event (those take gpubuf_release's path, which waits for it). */
static bool batchable(const gpubuf_buffer *b) {
#ifdef GPUBUF_HAVE_CUDA
    if (b->event || b->own_event)
        return false;
#endif
    return !b->parent && b->owns_ref && b->map;
}

static int release_many_call(gpubuf_buffer *const *bufs, size_t n, int *ret_status) {
    gpubuf_client *c = NULL;
    gpubuf_batch_call bc;
    gpubuf_buffer **last;
    uint64_t *ids;
    protobuf_c_boolean *keep, *ro;
    size_t n_last = 0, *item;
    int r;
    for (size_t i = 0; bufs && i < n; i++) {
        if (!bufs[i])
            continue;
        if (!c)
            c = bufs[i]->c;
        else if (bufs[i]->c != c)
            return gpubuf__fail(-EINVAL,
                                "gpubuf_release_many: item %zu is a view of another "
                                "connection than item 0's",
                                i);
    }
    if (!c)
        return 0;
    if ((r = gpubuf__batch_init(&bc, c, n, ret_status)) < 0)
        return r;
    last = per_item(n, sizeof(*last));
    ids = per_item(n, sizeof(*ids));
    item = per_item(n, sizeof(*item));
    keep = per_item(n, sizeof(*keep));
    ro = per_item(n, sizeof(*ro));
    if (!last || !ids || !item || !keep || !ro) {
        /* Still release every view, one by one. */
        for (size_t i = 0; i < n; i++)
            if (bufs[i])
                gpubuf_release(bufs[i]);
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        gpubuf_buffer *b = bufs[i];
        if (!b)
            continue;
        if (!batchable(b)) {
            int e = gpubuf_release(b);
            if (e < 0)
                gpubuf__batch_fail(&bc, i, e, gpubuf_last_error_message());
        } else if (atomic_fetch_sub(&b->refs, 1) == 1) {
            item[n_last] = i;
            last[n_last++] = b;
        }
    }
    pthread_mutex_lock(&c->lock);
    /* Unmap (or keep) first, as gpubuf_release does, then release. Views
     * gpubufd restarted without hold nothing to release (gpubuf_release). */
    size_t n_rel = 0;
    for (size_t k = 0; k < n_last; k++) {
        if (!gpubuf__view_live(last[k])) {
            gpubuf__mapping_put_ex(c, last[k]->map, false);
            continue;
        }
        item[n_rel] = item[k];
        ids[n_rel] = last[k]->id;
        ro[n_rel] = last[k]->read_only;
        keep[n_rel] = gpubuf__mapping_put_ex(c, last[k]->map, false);
        gpubuf__held(c, ids[n_rel], ro[n_rel], false); /* a resume no longer claims it */
        n_rel++;
    }
    for (size_t from = 0, k; !c->broken && r == 0 && from < n_rel; from += k) {
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__BatchReleaseRequest q = GPUBUF__BATCH_RELEASE_REQUEST__INIT;
        Gpubuf__Response *resp;
        int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
        k = gpubuf__batch_chunk_len(c, NULL, n_rel - from, NULL, 0);
        q.n_buffer_ids = q.n_keep_mapped = q.n_read_only = k;
        q.buffer_ids = ids + from;
        q.keep_mapped = keep + from;
        q.read_only = ro + from;
        req.body_case = GPUBUF__REQUEST__BODY_BATCH_RELEASE;
        req.batch_release = &q;
        r = gpubuf__batch_rpc(c, &req, &resp, fds, &n_fds, k);
        if (r < 0)
            break;
        for (int f = 0; f < n_fds; f++)
            close(fds[f]);
        for (size_t j = 0; j < k; j++)
            if (resp->batch->status[j] < 0)
                gpubuf__batch_fail(&bc, item[from + j], resp->batch->status[j],
                                   gpubuf__batch_message(resp->batch, j));
        gpubuf__resp_free(c, resp);
        gpubuf_trace(c->session_id, req.id, -1, GPUBUF_TRACE_C_MAPPED, 0);
    }
    /* Lost with the connection, reconnected: the resume released every
     * reference no view claims, these too (as gpubuf_release()). */
    if (r == -ECONNRESET)
        r = 0;
    for (size_t k = 0; k < n_last; k++) {
        gpubuf__view_meta_free(last[k]); /* its layout and user bytes, as gpubuf_release */
        gpubuf__view_recycle(c, last[k]);
    }
    pthread_mutex_unlock(&c->lock);
    for (size_t k = 0; k < n_last; k++)
        gpubuf__client_unref(c);
out:
    free(last);
    free(ids);
    free(item);
    free(keep);
    free(ro);
    return gpubuf__batch_end(&bc, ret_status, r);
}

/* ---- public entry points ------------------------------------------------- */

GPUBUF_EXTERN int gpubuf_seal_many(gpubuf_buffer *const *bufs, size_t n, int *ret_status) {
    gpubuf__clear_error();
    GPUBUF_CHECK(bufs || !n, -EINVAL, "gpubuf_seal_many needs buffers");
    int r = seal_many_call(bufs, n, ret_status);
    return r > 0 ? r : gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_release_many(gpubuf_buffer *const *bufs, size_t n, int *ret_status) {
    gpubuf__clear_error();
    int r = release_many_call(bufs, n, ret_status);
    return r > 0 ? r : gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_many(gpubuf_client *c, size_t n, const char *const *names,
                                     const uint64_t *ids, int *ret_status) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && (names || ids || !n), -EINVAL,
                 "gpubuf_delete_many needs a connection and its items");
    int r = delete_many_call(c, n, names, ids, ret_status);
    return r > 0 ? r : gpubuf__result(r);
}
