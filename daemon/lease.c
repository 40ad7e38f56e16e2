/* Registry room, continued: the lease heap, a binary min-heap by expiry of
 * the buffers with a lease (gd_registry.leases). The leases themselves (set,
 * renewed, expired) are meta.c's; freeing a buffer takes it out here. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "registry.h"

static void heap_set(gd_registry *r, uint32_t i, gd_buf *b) {
    r->leases[i] = b;
    b->lease_slot = i + 1;
}

static void sift_up(gd_registry *r, uint32_t i) {
    gd_buf *b = r->leases[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (r->leases[p]->lease_expires_ns <= b->lease_expires_ns)
            break;
        heap_set(r, i, r->leases[p]);
        i = p;
    }
    heap_set(r, i, b);
}

static void sift_down(gd_registry *r, uint32_t i) {
    gd_buf *b = r->leases[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= r->n_leases)
            break;
        if (c + 1 < r->n_leases &&
            r->leases[c + 1]->lease_expires_ns < r->leases[c]->lease_expires_ns)
            c++;
        if (r->leases[c]->lease_expires_ns >= b->lease_expires_ns)
            break;
        heap_set(r, i, r->leases[c]);
        i = c;
    }
    heap_set(r, i, b);
}

void gd_lease_remove(gd_registry *r, gd_buf *b) {
    if (!b->lease_slot)
        return;
    uint32_t i = b->lease_slot - 1;
    gd_buf *last = r->leases[--r->n_leases];
    b->lease_slot = 0;
    b->lease_expires_ns = 0;
    if (last == b)
        return;
    heap_set(r, i, last);
    sift_up(r, i);
    sift_down(r, last->lease_slot - 1);
}

int gd_lease_reserve(gd_registry *r) {
    if (r->n_leases < r->cap_leases)
        return 0;
    uint32_t cap = r->cap_leases ? r->cap_leases * 2 : 64;
    gd_buf **n = realloc(r->leases, cap * sizeof(*n));
    if (!n)
        return -ENOMEM;
    r->leases = n;
    r->cap_leases = cap;
    return 0;
}

/* Give b a lease of ttl_ms that expires at expires_ns (replacing one it has). */
int gd_lease_set_at(gd_registry *r, gd_buf *b, uint64_t ttl_ms, uint64_t expires_ns) {
    if (!b->lease_slot) {
        if (gd_lease_reserve(r) < 0)
            return -ENOMEM;
        heap_set(r, r->n_leases++, b);
    }
    b->lease_ttl_ms = (uint32_t)ttl_ms;
    b->lease_expires_ns = expires_ns;
    sift_up(r, b->lease_slot - 1);
    sift_down(r, b->lease_slot - 1);
    return 0;
}
