/* libgpubuf-client: what async.c and async_many.c share (requests for
 * event loops; docs/client-api.md, "Event loops"). */
#ifndef GPUBUF_ASYNC_INTERNAL_H
#define GPUBUF_ASYNC_INTERNAL_H

#include "internal.h"

enum op_kind { OP_OPEN, OP_ALLOC, OP_SEAL, OP_DELETE, OP_STAT, OP_MANY, OP_PART };

typedef struct gpubuf_many gpubuf_many;

struct gpubuf_op {
    uint64_t id;
    enum op_kind kind;
    bool cancelled;
    bool waits;              /* an open that may wait in the daemon (cancel sends cancel) */
    gpubuf_done_fn cb;
    void *user;
    int result;
    gpubuf_buffer *view;
    gpubuf_buffer_info info;
    char *message;           /* NULL: "" or the code's sentence */
    gpubuf_many *many;       /* OP_MANY: the batch; OP_PART: the batch it is a request of */
    size_t *items;           /* OP_PART: the batch's items it asks for (n_items of them) */
    size_t n_items;
    UT_hash_handle hh;       /* c->ops, by id: sent, not answered */
    struct gpubuf_op *next;  /* c->ready (utlist LL, newest first): answered, not delivered */
};

/* async.c */
/* Make the epoll fd and the eventfd if not made yet (lock held). */
int gpubuf__async_init(gpubuf_client *c);
/* Send req as a part of the batch m (lock held): its reply goes to
 * gpubuf__many_part_reply(). items (malloc'ed, n of them) become the op's. */
int gpubuf__async_part(gpubuf_client *c, Gpubuf__Request *req, gpubuf_many *m, bool waits,
                       size_t *items, size_t n);
/* op is answered (lock held): onto the ready list. */
void gpubuf__async_ready(gpubuf_client *c, gpubuf_op *op);
/* Send a cancel of the waiting open id (lock held). */
void gpubuf__async_send_cancel(gpubuf_client *c, uint64_t id);

/* async_many.c: what async.c calls for a batch (OP_MANY) and its parts
 * (OP_PART), through c->many_hooks, which async_many.c sets (lock held)
 * when a connection starts its first batch: async.c, the layer below, does
 * not call async_many.c by name. */
struct gpubuf__many_hooks {
    /* A part's reply (lock held): consumed, fds and resp too; op freed. */
    void (*part_reply)(gpubuf_client *c, gpubuf_op *op, Gpubuf__Response *resp, int *fds,
                       int n_fds);
    /* A part ends with r without a reply (the connection went; lock held); op freed. */
    void (*part_fail)(gpubuf_client *c, gpubuf_op *op, int r, const char *why);
    /* The batch's completion fields; cancelled: its views go back first. */
    void (*complete)(gpubuf_client *c, gpubuf_op *op, gpubuf_completion *done);
    /* Free what the batch op holds (after its delivery). */
    void (*free)(gpubuf_op *op);
    /* Cancel the batch named handle (lock held): 0, or -ENOENT if none. */
    int (*cancel)(gpubuf_client *c, uint64_t handle);
};

#endif
