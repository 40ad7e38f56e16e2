/* libgpubuf-client: what every batch call shares. Its bookkeeping (a
 * result per item, the first failure's message), the split of long batches
 * to fit the daemon's limits, and the request whose reply carries a result
 * per item (docs/protocol.md, "Batches"). batch.c (views) and batch_state.c
 * (seals, deletes, releases) are built on it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Request bytes kept free for the fixed fields of a batch request. */
#define BATCH_OVERHEAD 256u

int gpubuf__batch_init(gpubuf_batch_call *bc, gpubuf_client *c, size_t n, int *ret_status) {
    memset(bc, 0, sizeof(*bc));
    bc->c = c;
    bc->n = n;
    bc->status = ret_status ? ret_status : calloc(n + 1, sizeof(int));
    if (!bc->status)
        return -ENOMEM;
    memset(bc->status, 0, n * sizeof(int));
    return 0;
}

/* Start a batch call on c: the daemon must take batches (0, or an error). */
int gpubuf__batch_start(gpubuf_batch_call *bc, gpubuf_client *c, size_t n, int *ret_status) {
    if (c->max_batch_items == 0)
        return gpubuf__fail(-EOPNOTSUPP, "this gpubufd takes no batches (it is older)");
    return gpubuf__batch_init(bc, c, n, ret_status);
}

/* Item i failed with r (msg: the daemon's sentence, or NULL). */
void gpubuf__batch_fail(gpubuf_batch_call *bc, size_t i, int r, const char *msg) {
    if (bc->status[i] < 0)
        return; /* refused here already (seal: sent as buffer 0) */
    bc->status[i] = r;
    if (bc->failed++ == 0)
        snprintf(bc->first, sizeof(bc->first), "item %zu: %s", i,
                 msg && *msg ? msg : gpubuf_strerror(r));
}

/* The end of the batch call: the number of failed items, or err. */
int gpubuf__batch_end(gpubuf_batch_call *bc, int *ret_status, int err) {
    if (bc->status != ret_status)
        free(bc->status);
    if (err < 0)
        return err;
    if (bc->failed)
        gpubuf__set_error("%d of %zu items failed; the first: %s", bc->failed, bc->n, bc->first);
    return bc->failed;
}

/* The daemon's sentence for item i of br, or NULL. */
const char *gpubuf__batch_message(const Gpubuf__BatchReply *br, size_t i) {
    for (size_t k = 0; k < br->n_errors; k++)
        if (br->errors[k]->item == i)
            return br->errors[k]->message;
    return NULL;
}

/* How many of the items idx[0..n) (or 0..n without idx) fit one request
 * from the start: at most the daemon's item limit and its request bytes,
 * reserve bytes taken by other fields. At least one. */
size_t gpubuf__batch_chunk_len(const gpubuf_client *c, const size_t *idx, size_t n,
                               const char *const *names, size_t reserve) {
    size_t k = 0, bytes = BATCH_OVERHEAD + reserve;
    while (k < n && k < c->max_batch_items) {
        size_t i = idx ? idx[k] : k;
        size_t b = (names && names[i] ? strlen(names[i]) + 3 : 0) + 12;
        if (k > 0 && bytes + b > c->max_request)
            break;
        bytes += b;
        k++;
    }
    return k;
}

/* A batch reply must carry n results (else the stream is out of step). */
static int batch_reply_check(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds,
                             size_t n) {
    /* Counted before the reply goes (another body: no results). */
    size_t got = (*ret)->body_case == GPUBUF__RESPONSE__BODY_BATCH && (*ret)->batch
                     ? (*ret)->batch->n_status
                     : 0;
    if ((*ret)->body_case != GPUBUF__RESPONSE__BODY_BATCH || got != n) {
        for (int i = 0; i < *n_fds; i++)
            close(fds[i]);
        gpubuf__resp_free(c, *ret);
        c->broken = true;
        return gpubuf__fail(GPUBUF_EPROTOCOL,
                            "gpubufd answered a batch of %zu items with %zu "
                            "results",
                            n, got);
    }
    return 0;
}

int gpubuf__batch_rpc(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret, int *fds,
                      int *n_fds, size_t n) {
    int r = gpubuf__rpc_fds_locked(c, req, ret, fds, n_fds);
    return r < 0 ? r : batch_reply_check(c, ret, fds, n_fds, n);
}

int gpubuf__batch_finish(gpubuf_client *c, Gpubuf__Request *req, uint32_t conn,
                         Gpubuf__Response **ret, int *fds, int *n_fds, size_t n) {
    int r = gpubuf__rpc_finish_locked(c, req, conn, ret, fds, n_fds);
    return r < 0 ? r : batch_reply_check(c, ret, fds, n_fds, n);
}
