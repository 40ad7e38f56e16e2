/* libFuzzer target: the client's decoder of common replies
 * (client/reply_fast.c) on what a hostile or broken daemon could send. It
 * must not crash, must stay inside its arena, and whatever it accepts
 * protobuf-c must accept with the same fields (abort otherwise); what it
 * declines leaves the arena as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SAME(x)                                                                                    \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_reply: the decoders differ: %s\n", #x);                         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int bytes_eq(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static void same(const Gpubuf__Response *f, const Gpubuf__Response *p) {
    SAME(f->id == p->id && f->status == p->status && f->fds == p->fds);
    SAME(strcmp(f->message, p->message) == 0);
    SAME(f->body_case == p->body_case);
    if (f->body_case != GPUBUF__RESPONSE__BODY_BUFFER)
        return;
    const Gpubuf__Buffer *a = f->buffer, *b = p->buffer;
    SAME(a->buffer_id == b->buffer_id && a->size == b->size && a->offset == b->offset);
    SAME(strcmp(a->name, b->name) == 0 && strcmp(a->pool, b->pool) == 0);
    SAME(a->state == b->state && a->refs == b->refs && a->owner_uid == b->owner_uid);
    SAME(a->slab_id == b->slab_id && a->read_only == b->read_only && a->restored == b->restored);
    SAME(bytes_eq(a->event_handle, b->event_handle) && bytes_eq(a->user_data, b->user_data));
    SAME(a->lease_left_ms == b->lease_left_ms && a->lease_ttl_ms == b->lease_ttl_ms);
    SAME(!a->layout && !b->layout);
    SAME((a->slab == NULL) == (b->slab == NULL));
    if (!a->slab)
        return;
    const Gpubuf__Slab *s = a->slab, *t = b->slab;
    SAME(s->slab_id == t->slab_id && s->kind == t->kind && s->device == t->device);
    SAME(s->size == t->size && s->keepable == t->keepable && s->read_only == t->read_only);
    SAME(bytes_eq(s->device_uuid, t->device_uuid) && bytes_eq(s->ipc_handle, t->ipc_handle));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static gpubuf__arena a;
    gpubuf_arena_init(&a.a, a.block, sizeof(a.block));
    a.live = NULL;
    Gpubuf__Response *f = gpubuf__reply_fast(&a, data, size);
    Gpubuf__Response *p = gpubuf__response__unpack(NULL, size, data);
    SAME(f || a.a.used == 0);
    SAME(a.a.used <= sizeof(a.block));
    if (f) {
        SAME(p != NULL);
        same(f, p);
    }
    if (p)
        gpubuf__response__free_unpacked(p, NULL);
    return 0;
}
