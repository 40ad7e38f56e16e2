/* Session room, ground floor: packing and queuing replies, error replies,
 * the Buffer and Slab messages. See reply.h. */
#include "reply.h"

#include <errno.h>
#include <stdint.h>

#include "gpubuf.pb-c.h"
#include "layout.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

/* The public enums travel as their wire twins by a plain cast. */
_Static_assert((int)GPUBUF_STATE_ALLOCATED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_ALLOCATED &&
                   (int)GPUBUF_STATE_SEALED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_SEALED &&
                   (int)GPUBUF_STATE_DELETED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_DELETED,
               "gpubuf_state and gpubuf.BufferState differ");
_Static_assert((int)GPUBUF_POOL_HOST == (int)GPUBUF__POOL_KIND__POOL_KIND_HOST &&
                   (int)GPUBUF_POOL_CUDA_IPC == (int)GPUBUF__POOL_KIND__POOL_KIND_CUDA_IPC &&
                   (int)GPUBUF_POOL_CUDA_VMM == (int)GPUBUF__POOL_KIND__POOL_KIND_CUDA_VMM,
               "gpubuf_pool_kind and gpubuf.PoolKind differ");

void gd_session_pack(const void *msg, uint8_t *dst) {
    gpubuf__response__pack(msg, dst);
}

/* Queue a reply; the transport dup's fd. Error replies are counted by code
 * and by the type of the request being answered. A large reply the
 * daemon's reply memory has no room for (-EAGAIN from the transport: nothing
 * was queued) is answered with a small EAGAIN error instead. */
void gd_session_send(gd_session *s, const Gpubuf__Response *resp, int fd) {
    if (resp->status < 0)
        gd_metrics_error(&s->ctx->metrics, s->cur_type, resp->status);
    bool trace = gpubuf_trace_on() && resp->id;
    if (trace) {
        gpubuf_trace(s->holder->id, resp->id, s->cur_type, GPUBUF_TRACE_D_HANDLED, 0);
        gpubuf_trace_set_tag(s->holder->id, resp->id, s->cur_type);
    }
    gd_reply_plan plan;
    size_t len = gd_reply_size(resp, &plan);
    int r = s->io->send(s->conn, len, plan.pack, plan.msg, fd);
    if (trace)
        gpubuf_trace_set_tag(0, 0, -1);
    if (r == -EAGAIN && resp->status >= 0) {
        Gpubuf__Response e = GPUBUF__RESPONSE__INIT;
        e.id = resp->id;
        e.status = -EAGAIN;
        e.message = "the daemon's reply memory is full (max_reply_memory); retry later";
        gd_session_send(s, &e, -1);
    }
}

void gd_session_close(gd_session *s, gd_end_reason why) {
    if (s->end == GD_END_NONE)
        s->end = why;
    s->io->close(s->conn);
}

void gd_session_reply_error(gd_session *s, uint64_t id, int status, const char *msg) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    resp.id = id;
    resp.status = status;
    resp.message = (char *)(msg ? msg : gpubuf_strerror(status));
    gd_session_send(s, &resp, -1);
}

/* b's layout, user bytes and lease into m (pointing into b). */
bool gd_session_fill_layout(Gpubuf__ArrayLayout *l, const gd_buf *b) {
    const gd_meta *me = b->meta;
    if (!me || !me->has_layout)
        return false;
    gpubuf_layout_wire(me->dtype, me->ndim, me->dims, me->has_strides ? me->dims + me->ndim : NULL,
                       me->byte_offset, l);
    return true;
}

static void fill_meta(buffer_msg *m, const gd_buf *b, uint64_t now_ns) {
    if (gd_session_fill_layout(&m->layout, b))
        m->buf.layout = &m->layout;
    size_t len;
    const uint8_t *user = gd_meta_user(b, &len);
    m->buf.user_data.data = (uint8_t *)user;
    m->buf.user_data.len = len;
    m->buf.lease_left_ms = gd_registry_lease_left_ms(b, now_ns);
    m->buf.lease_ttl_ms = b->lease_slot ? b->lease_ttl_ms : 0;
}

/* How to map b's slab: its description, with the IPC handle if it has one. */
void gd_session_fill_slab(Gpubuf__Slab *m, const gd_buf *b) {
    gd_slab *sl = b->blk.slab;
    gd_backend *be = b->pool->be;
    gpubuf__slab__init(m);
    m->slab_id = sl->id;
    m->kind = (Gpubuf__PoolKind)be->kind;
    m->device = be->device;
    m->size = sl->size;
    if (be->has_uuid) {
        m->device_uuid.data = be->uuid;
        m->device_uuid.len = 16;
    }
    if (sl->exp.has_ipc_handle) {
        m->ipc_handle.data = sl->exp.ipc_handle;
        m->ipc_handle.len = GPUBUF_IPC_HANDLE_SIZE;
    }
}

/* May this session keep b's slab mapped after its last view (not for
 * read-only mappings: the daemon pins slabs, not modes)? */
bool gd_session_slab_keepable(const gd_session *s, const gd_buf *b, bool ro) {
    return !ro && (s->caps & GPUBUF_CAP_KEEP_MAPPED) && !b->blk.slab->dedicated;
}

void gd_session_fill_buffer(buffer_msg *m, const gd_buf *b) {
    gd_slab *sl = b->blk.slab;
    gpubuf__buffer__init(&m->buf);
    gd_session_fill_slab(&m->slab, b);
    m->buf.buffer_id = b->id;
    m->buf.name = b->name ? b->name : (char *)"";
    m->buf.pool = b->pool->name;
    m->buf.size = b->size;
    m->buf.offset = b->blk.offset;
    m->buf.state = (Gpubuf__BufferState)b->state;
    m->buf.refs = b->refs;
    m->buf.owner_uid = b->owner_uid;
    m->buf.slab_id = sl->id;
    m->buf.restored = b->restored;
    m->buf.slab = &m->slab;
    if (b->meta || b->lease_slot)
        fill_meta(m, b, gpubuf_now_ns());
}
