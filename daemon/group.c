/* State room, basement: the growable byte buffer of a saved state's groups
 * and the runs of references. See group.h. */
#include "group.h"

#include <stdlib.h>

__attribute__((cold)) uint8_t *gd_obuf_grow(gd_obuf *o, size_t n) {
    if (o->oom)
        return NULL;
    if (o->cap - o->len < n) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->len < n)
            cap *= 2;
        uint8_t *p = realloc(o->p, cap);
        if (!p) {
            o->oom = true;
            return NULL;
        }
        o->p = p;
        o->cap = cap;
    }
    return o->p + o->len;
}

void gd_se_ref_run(gd_obuf *o, uint64_t session, uint64_t buffer, uint32_t count, uint32_t ro) {
    uint8_t *p = gd_obuf_room(o, GD_SE_RUN_HEAD + GD_SE_RUN_ITEM);
    if (!p)
        return;
    o->run_at = o->len;
    o->run_session = session;
    *p = GD_SE_REFS;
    p = gd_state_put32(gd_state_put64(p + 1, session), 1);
    gd_state_put32(gd_state_put32(gd_state_put64(p, buffer), count), ro);
    o->len += GD_SE_RUN_HEAD + GD_SE_RUN_ITEM;
    o->run_end = o->len;
}
