/* libgpubuf-client: the array layouts, user bytes and leases that views and
 * status snapshots carry, decoded from the daemon's messages (below
 * the verbs, which make views and snapshots; the requests are meta.c's). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "layout.h"

/* ---- views ----------------------------------------------------------------- */

int gpubuf__view_meta(gpubuf_buffer *b, const Gpubuf__Buffer *m) {
    char msg[256];
    if (m->layout) {
        gpubuf_layout l;
        if (gpubuf_layout_from_wire(m->layout, &l, msg, sizeof(msg)) < 0 ||
            gpubuf_layout_validate(&l, m->size, msg, sizeof(msg)) < 0) {
            gpubuf__set_error("gpubufd sent a malformed layout: %s", msg);
            return GPUBUF_EPROTOCOL;
        }
        if (!(b->layout = malloc(sizeof(*b->layout))))
            return -ENOMEM;
        *b->layout = l;
    }
    if (m->user_data.len) {
        if (m->user_data.len > GPUBUF_USER_DATA_MAX) {
            gpubuf__set_error("gpubufd sent %zu user bytes, more than %d", m->user_data.len,
                              GPUBUF_USER_DATA_MAX);
            return GPUBUF_EPROTOCOL;
        }
        if (!(b->user = malloc(m->user_data.len)))
            return -ENOMEM;
        memcpy(b->user, m->user_data.data, m->user_data.len);
        b->user_len = m->user_data.len;
    }
    return 0;
}

void gpubuf__view_meta_free(gpubuf_buffer *b) {
    free(b->layout);
    free(b->user);
    b->layout = NULL;
    b->user = NULL;
    b->user_len = 0;
}

GPUBUF_EXTERN const gpubuf_layout *gpubuf_buffer_layout(const gpubuf_buffer *b) {
    return b && !b->parent ? b->layout : NULL;
}

GPUBUF_EXTERN const void *gpubuf_buffer_user_data(const gpubuf_buffer *b, size_t *ret_size) {
    const void *p = b && !b->parent ? b->user : NULL;
    if (ret_size)
        *ret_size = p ? b->user_len : 0;
    return p;
}

GPUBUF_EXTERN uint64_t gpubuf_dtype_size(gpubuf_dtype dtype) {
    return gpubuf_layout_item_size(dtype);
}

/* ---- status ------------------------------------------------------------------ */

bool gpubuf__meta_columns_ok(const Gpubuf__BufferColumns *c, size_t n) {
    size_t dims = 0;
    if ((c->n_dtype && c->n_dtype != n) || c->n_ndim != c->n_dtype ||
        (c->n_user_bytes && c->n_user_bytes != n) ||
        (c->n_lease_left_ms && c->n_lease_left_ms != n))
        return false;
    for (size_t i = 0; i < c->n_ndim; i++) {
        if (c->ndim[i] > GPUBUF_LAYOUT_MAX_NDIM + 1)
            return false;
        dims += c->ndim[i] ? c->ndim[i] - 1 : 0;
    }
    for (size_t i = 0; i < c->n_user_bytes; i++)
        if (c->user_bytes[i] > GPUBUF_USER_DATA_MAX)
            return false;
    return dims == c->n_shape;
}

static gpubuf_dtype dtype_of(uint32_t packed) {
    return (gpubuf_dtype){.code = packed & 0xff, .bits = (packed >> 8) & 0xff,
                          .lanes = (uint16_t)(packed >> 16)};
}

int gpubuf__status_meta(gpubuf_status *s, const Gpubuf__StatusReply *st,
                        const Gpubuf__BufferColumns *col) {
    size_t n = s->n_buffers, d = 0;
    gpubuf_status_meta *o = calloc(n + 1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    s->buffer_meta = o;
    for (size_t i = 0; col && i < n; i++) {
        if (i < col->n_ndim && col->ndim[i]) {
            o[i].has_layout = 1;
            o[i].dtype = dtype_of(col->dtype[i]);
            o[i].ndim = col->ndim[i] - 1;
            o[i].shape = col->shape + d;
            d += o[i].ndim;
        }
        if (i < col->n_user_bytes)
            o[i].user_size = col->user_bytes[i];
        if (i < col->n_lease_left_ms)
            o[i].lease_left_ms = col->lease_left_ms[i];
    }
    for (size_t i = 0; !col && i < n; i++) {
        const Gpubuf__Buffer *m = st->buffers[i];
        const Gpubuf__ArrayLayout *l = m->layout;
        if (l && l->n_shape <= GPUBUF_LAYOUT_MAX_NDIM) {
            o[i].has_layout = 1;
            o[i].dtype = (gpubuf_dtype){.code = (uint8_t)l->dtype_code,
                                        .bits = (uint8_t)l->dtype_bits,
                                        .lanes = (uint16_t)l->dtype_lanes};
            o[i].ndim = (uint32_t)l->n_shape;
            o[i].shape = l->shape;
        }
        o[i].user_size = (uint32_t)(m->user_data.len > GPUBUF_USER_DATA_MAX
                                        ? GPUBUF_USER_DATA_MAX
                                        : m->user_data.len);
        o[i].lease_left_ms = m->lease_left_ms;
    }
    if (st->leases) {
        s->leases_active = st->leases->active;
        s->leases_expired = st->leases->expired;
        s->leases_renewed = st->leases->renewed;
        s->max_lease_ms = st->leases->max_ttl_ms;
    }
    return 0;
}
