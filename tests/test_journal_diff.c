/* The journal against the registry, at random: random registry changes
 * (allocs with and without names and user bytes, seals, opens read-write
 * and read-only, releases, deletes, waiting opens, holders coming and
 * going, lease-like unpublishes outside any request), most of them grouped
 * into requests (gd_state_begin/end), snapshots written step by step as the
 * loop turns, the journal switched off and on in some cases. After every
 * request the state memfds are copied as a SIGKILL would leave them,
 * restored into a fresh context, and compared with the live registry:
 * every buffer with its state, name, size and reference count, every
 * holder's count and read-only count of each reference; the restored
 * registry's invariants hold (fuzz/state_check.h). One restore in 50 goes
 * on as the daemon, its holders resumed with random claims (in a request)
 * or gone. Without arguments: the cases of `plan` below, each in a child
 * process; test_journal_diff SEED ROUNDS COMPACT SWITCH runs one (COMPACT:
 * a snapshot once the journal passes that many bytes; SWITCH 1: the
 * journal is switched off and on now and then). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "context.h"
#include "fuzz/state_check.h"
#include "registry_internal.h"
#include "saved_state.h"
#include "state.h"

/* A check that stays in a release build (its calls have effects). */
#define MUST(x)                                                                                    \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #x);                         \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#define SLAB (1u << 20)
#define KB4 4096u

typedef struct fx {
    uv_loop_t loop;
    uv_idle_t keep; /* a ref'd handle so that uv_run(NOWAIT) runs the idle snapshot steps */
    gd_context ctx;
    gd_pool *pool;
} fx;

static void noop_idle(uv_idle_t *h) {
    (void)h;
}

static void fx_init(fx *f, bool with_keep) {
    gd_backend *be;
    memset(f, 0, sizeof(*f));
    MUST(uv_loop_init(&f->loop) == 0);
    gd_context_init(&f->ctx, &f->loop);
    f->ctx.limits.resume_timeout_ms = 600000;
    MUST(gd_backend_host_new(&be, NULL) == 0);
    MUST(gd_pool_new("host", be, 256u << 20, SLAB, &f->ctx.slab_ids, &f->pool, NULL) == 0);
    MUST(gd_context_add_pool(&f->ctx, f->pool) == 0);
    if (with_keep) {
        uv_idle_init(&f->loop, &f->keep);
    }
}

static void fx_free(fx *f, bool with_keep) {
    gd_state_freeze(f->ctx.state);
    gd_state_free(f->ctx.state);
    gd_context_destroy(&f->ctx);
    if (with_keep)
        uv_close((uv_handle_t *)&f->keep, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    uv_loop_close(&f->loop);
}

/* ---- waiters ---- */
typedef struct tw {
    gd_waiter w;
    char name[32];
} tw;
static int n_tw;
static void tw_done(gd_waiter *w) {
    n_tw--;
    free(w);
}
static void tw_wake(gd_waiter *w, gd_buf *b) {
    (void)b;
    tw_done(w);
}
static void tw_cancel(gd_waiter *w) {
    tw_done(w);
}
static void tw_fail(gd_waiter *w, const gd_err *e) {
    (void)e;
    tw_done(w);
}

static uint64_t rnd_state = 1;
static uint32_t rnd(void) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return (uint32_t)(rnd_state >> 16);
}

#define MAXH 6
static gd_holder *H[MAXH];
static int nH;

static gd_buf *random_buf(gd_registry *r) {
    uint32_t n = r->n_buffers;
    if (!n)
        return NULL;
    uint32_t k = rnd() % n;
    gd_buf *b = r->by_id;
    while (k-- && b)
        b = b->hh_id.next;
    return b;
}

static gd_ref *random_ref(gd_holder *h) {
    uint32_t n = HASH_COUNT(h->refs);
    if (!n)
        return NULL;
    uint32_t k = rnd() % n;
    gd_ref *ref = h->refs;
    while (k-- && ref)
        ref = ref->hh.next;
    return ref;
}

static const char *names[] = {"a", "b", "c", "d", "e", "f"};

static bool journal_on = true;

static void one_op(fx *f, bool in_request, gd_holder *h) {
    gd_registry *r = &f->ctx.reg;
    gd_err err = {0};
    gd_buf *b = NULL;
    uint32_t op = rnd() % 100;
    if (op < 18) { /* alloc, maybe named, maybe with user bytes */
        const char *name = rnd() % 2 ? names[rnd() % 6] : NULL;
        if (rnd() % 4 == 0) {
            uint8_t user[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            gd_meta_args m = {.user = user, .user_len = 8};
            gd_registry_alloc_meta(r, h, f->pool, KB4 * (1 + rnd() % 4), 0, name, &m, &b, &err);
        } else {
            gd_registry_alloc(r, h, f->pool, KB4 * (1 + rnd() % 4), 0, name, &b, &err);
        }
        if (b && rnd() % 2)
            gd_registry_seal(r, h, b->id, &b, &err);
    } else if (op < 30) { /* seal something of h's */
        b = random_buf(r);
        if (b)
            gd_registry_seal(r, h, b->id, &b, &err);
    } else if (op < 45) { /* open */
        bool ro = rnd() % 3 == 0;
        if (rnd() % 2)
            gd_registry_open_mode(r, h, names[rnd() % 6], 0, ro, &b, NULL, &err);
        else if ((b = random_buf(r)))
            gd_registry_open_mode(r, h, NULL, b->id, ro, &b, NULL, &err);
    } else if (op < 62) { /* release */
        gd_ref *ref = random_ref(h);
        if (ref)
            gd_registry_release(r, h, ref->buffer_id, &err);
    } else if (op < 70) { /* delete */
        if (rnd() % 2)
            gd_registry_delete(r, h, names[rnd() % 6], 0, &err);
        else if ((b = random_buf(r)))
            gd_registry_delete(r, h, NULL, b->id, &err);
    } else if (op < 80) { /* wait */
        if (n_tw < 50) {
            tw *t = calloc(1, sizeof(*t));
            t->w.holder = h;
            if (rnd() % 2) {
                snprintf(t->name, sizeof(t->name), "%s", names[rnd() % 6]);
                t->w.name = t->name;
            } else if ((b = random_buf(r))) {
                t->w.buffer_id = b->id;
            } else {
                free(t);
                return;
            }
            t->w.read_only = rnd() % 3 == 0; /* its reference marked when woken */
            t->w.wake = tw_wake;
            t->w.cancel = tw_cancel;
            t->w.fail = tw_fail;
            n_tw++;
            gd_registry_wait(r, &t->w);
        }
    } else if (op < 84) { /* a renewal-like change: the buffer's record again */
        if ((b = random_buf(r)))
            gd_registry_changed(r, b);
    } else if (op < 88) { /* seal with user bytes */
        if ((b = random_buf(r))) {
            uint8_t user[4] = {9, 9, 9, 9};
            gd_meta_args m = {.user = user, .user_len = 4};
            gd_registry_seal_meta(r, h, b->id, NULL, &m, &b, &err);
        }
    } else {
        /* nothing */
    }
    (void)in_request;
}

/* Copy a memfd's bytes into a new memfd. */
static int copy_fd(int fd) {
    struct stat sb;
    MUST(fstat(fd, &sb) == 0);
    int n = memfd_create("copy", MFD_CLOEXEC);
    MUST(n >= 0);
    if (sb.st_size) {
        uint8_t *p = malloc((size_t)sb.st_size);
        MUST(pread(fd, p, (size_t)sb.st_size, 0) == sb.st_size);
        MUST(pwrite(n, p, (size_t)sb.st_size, 0) == sb.st_size);
        free(p);
    }
    return n;
}

static long checks, fails, restarts;
static unsigned case_seed; /* the seed of the case running, for the messages */

/* Restore a copy of the live state into a fresh context and compare. */
static bool check_restore(fx *f, const char *when, fx **keep_it) {
    gd_kept_fd *fds = NULL;
    size_t n = 0;
    gd_state *st = f->ctx.state;
    /* gd_state_fds would switch a switchable journal on: build by hand. */
    n = 2;
    for (gd_slab *s = f->pool->slabs; s; s = s->next)
        n++;
    fds = calloc(n, sizeof(*fds));
    size_t i = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(fds[i].name, sizeof(fds[i].name), "state-%d", k);
        fds[i++].fd = copy_fd(st->slots[k].fd);
    }
    for (gd_slab *s = f->pool->slabs; s; s = s->next) {
        snprintf(fds[i].name, sizeof(fds[i].name), "slab-%llu", (unsigned long long)s->id);
        fds[i++].fd = dup(s->exp.fd);
    }
    fx *gp = malloc(sizeof(*gp));
    fx_init(gp, keep_it != NULL);
#define g (*gp)
    gd_err err = {0};
    MUST(gd_state_open(&g.ctx, fds, i, false, &err) == 0);
    for (size_t k = 0; k < i; k++)
        if (fds[k].fd >= 0)
            close(fds[k].fd);
    free(fds);
    checks++;
    bool ok = true;
    char msg[512];
    gd_registry *L = &f->ctx.reg, *R = &g.ctx.reg;
    /* buffers */
    for (gd_buf *b = L->by_id; b; b = b->hh_id.next) {
        gd_buf *c = gd_registry_find_id(R, b->id);
        if (!c) {
            snprintf(msg, sizeof(msg), "buffer %llu (state %d, refs %u, name %s) lost",
                     (unsigned long long)b->id, b->state, b->refs, b->name ? b->name : "-");
            ok = false;
            break;
        }
        if (c->state != b->state || c->refs != b->refs || !!c->name != !!b->name ||
            (b->name && strcmp(b->name, c->name)) || c->size != b->size) {
            snprintf(msg, sizeof(msg),
                     "buffer %llu: live state %d refs %u name %s; restored state %d refs %u "
                     "name %s",
                     (unsigned long long)b->id, b->state, b->refs, b->name ? b->name : "-",
                     c->state, c->refs, c->name ? c->name : "-");
            ok = false;
            break;
        }
    }
    if (ok && R->n_buffers != L->n_buffers) {
        for (gd_buf *c = R->by_id; c; c = c->hh_id.next)
            if (!gd_registry_find_id(L, c->id)) {
                snprintf(msg, sizeof(msg), "buffer %llu (state %d refs %u name %s) resurrected",
                         (unsigned long long)c->id, c->state, c->refs, c->name ? c->name : "-");
                break;
            }
        ok = false;
    }
    /* references per holder */
    for (gd_holder *h = L->holders; ok && h; h = h->hh.next) {
        gd_holder *k;
        HASH_FIND(hh, R->holders, &h->id, sizeof(h->id), k);
        for (gd_ref *ref = h->refs; ref; ref = ref->hh.next) {
            uint32_t rc = k ? gd_registry_holder_count(k, ref->buffer_id) : 0;
            gd_ref *kr = k ? gd_registry_ref_find(k, ref->buffer_id) : NULL;
            if (rc == ref->count && kr && kr->ro != ref->ro) {
                snprintf(msg, sizeof(msg), "holder %llu buffer %llu: live ro %u restored ro %u",
                         (unsigned long long)h->id, (unsigned long long)ref->buffer_id, ref->ro,
                         kr->ro);
                ok = false;
                break;
            }
            if (rc != ref->count) {
                snprintf(msg, sizeof(msg), "holder %llu buffer %llu: live %u restored %u",
                         (unsigned long long)h->id, (unsigned long long)ref->buffer_id, ref->count,
                         rc);
                ok = false;
                break;
            }
        }
        if (ok && k && k->n_refs != h->n_refs) {
            snprintf(msg, sizeof(msg), "holder %llu: live %u refs restored %u",
                     (unsigned long long)h->id, h->n_refs, k->n_refs);
            ok = false;
        }
    }
    if (!ok) {
        fails++;
        fprintf(stderr, "MISMATCH after %s (seed %u): %s\n", when, case_seed, msg);
    }
    const char *bad = state_check(&g.ctx, msg, sizeof(msg));
    if (bad) {
        fails++;
        fprintf(stderr, "state_check after %s (seed %u): %s\n", when, case_seed, bad);
        ok = false;
    }
    if (keep_it) {
        *keep_it = gp;
    } else {
        fx_free(&g, false);
        free(gp);
    }
#undef g
    return ok;
}

static int run_case(unsigned seed, int rounds, int compact, bool do_switch) {
    case_seed = seed;
    rnd_state = seed * 2654435761u + 1;
    fx *f = malloc(sizeof(*f));
    fx_init(f, true);
    gd_err err = {0};
    MUST(gd_state_open(&f->ctx, NULL, 0, false, &err) == 0);
    gd_state *st = f->ctx.state;
    st->switchable = do_switch;
    gd_registry *r = &f->ctx.reg;
    uv_idle_start(&f->keep, noop_idle);
    for (int round = 0; round < rounds && fails == 0; round++) {
        if (compact)
            st->compact_at =
                st->compact_at > (uint64_t)compact ? (uint64_t)compact : st->compact_at;
        uint32_t what = rnd() % 100;
        if (nH < 2 || (what < 4 && nH < MAXH)) {
            bool inreq = rnd() % 2;
            if (inreq)
                gd_state_begin(st);
            H[nH++] = gd_registry_holder_new(r, 100, 1000, 1000);
            if (inreq)
                gd_state_end(st);
        } else if (what < 7) { /* a holder leaves, reaped at once */
            int k = (int)(rnd() % (uint32_t)nH);
            gd_holder *h = H[k];
            H[k] = H[--nH];
            bool inreq = rnd() % 2;
            if (inreq)
                gd_state_begin(st);
            gd_registry_holder_leave(r, h);
            if (inreq)
                gd_state_end(st);
            while (gd_registry_reap(r, 1 + rnd() % 8))
                ;
        } else if (what < 9) { /* lease-like expiry, outside: unpublish a random buffer */
            gd_buf *b = random_buf(r);
            if (b && b->state != GPUBUF_STATE_DELETED)
                gd_registry_unpublish(r, b);
        } else if (what < 10 && do_switch) {
            gd_state_switch(st);
            journal_on = !st->no_journal;
        } else {
            gd_holder *h = H[rnd() % (uint32_t)nH];
            int nops = 1 + (int)(rnd() % (rnd() % 4 == 0 ? 40 : 4));
            bool inreq = rnd() % 8 != 0;
            if (inreq)
                gd_state_begin(st);
            for (int i = 0; i < nops; i++)
                one_op(f, inreq, h);
            if (inreq)
                gd_state_end(st);
        }
        if (journal_on) {
            char when[64];
            snprintf(when, sizeof(when), "round %d", round);
            fx *nf = NULL;
            bool restart = rnd() % 50 == 0;
            check_restore(f, when, restart ? &nf : NULL);
            if (restart && fails == 0) {
                /* The kill happened: go on with the restored daemon, each
                 * holder resumed (in a request) with a random claim, or left. */
                uint64_t hid[MAXH];
                for (int k = 0; k < nH; k++)
                    hid[k] = H[k]->id;
                fx_free(f, true);
                free(f);
                f = nf;
                st = f->ctx.state;
                st->switchable = do_switch;
                r = &f->ctx.reg;
                uv_idle_start(&f->keep, noop_idle);
                int m = 0;
                for (int k = 0; k < nH; k++) {
                    gd_holder *h;
                    uint64_t id = hid[k];
                    HASH_FIND(hh, r->holders, &id, sizeof(id), h);
                    if (!h)
                        continue;
                    size_t nref = HASH_COUNT(h->refs), n = 0;
                    gd_held *held = calloc(nref + 1, sizeof(*held));
                    uint64_t *lost = calloc(nref + 2, sizeof(*lost));
                    for (gd_ref *ref = h->refs; ref; ref = ref->hh.next) {
                        uint32_t c = ref->count;
                        uint32_t x = rnd() % 4;
                        held[n].buffer_id = ref->buffer_id;
                        held[n].count = x == 0 ? 0 : x == 1 && c > 1 ? c - 1 : c;
                        held[n].ro = rnd() % (held[n].count + 1);
                        n++;
                    }
                    qsort(held, n, sizeof(*held), gd_held_cmp);
                    gd_state_begin(st);
                    if (rnd() % 5 == 0) {
                        gd_registry_holder_leave(r, h);
                        gd_state_end(st);
                        while (gd_registry_reap(r, 7))
                            ;
                    } else {
                        gd_registry_resume(r, h, held, n, lost);
                        gd_state_end(st);
                        H[m++] = h;
                    }
                    free(held);
                    free(lost);
                    snprintf(when, sizeof(when), "resume in round %d", round);
                    check_restore(f, when, NULL);
                }
                nH = m;
                restarts++;
                journal_on = true;
            }
        }
        /* the loop turns: snapshot steps */
        int turns = (int)(rnd() % 3);
        for (int t = 0; t < turns; t++)
            uv_run(&f->loop, UV_RUN_NOWAIT);
    }
    fprintf(stderr, "seed %u: %ld checks, %ld mismatches, %llu snapshots, %ld restarts\n", seed,
            checks, fails, (unsigned long long)st->snapshots, restarts);
    uv_idle_stop(&f->keep);
    fx_free(f, true);
    free(f);
    return fails ? 1 : 0;
}

int main(int argc, char **argv) {
    /* seed, rounds, compact (bytes), switch */
    static const int plan[][4] = {
        {1, 500, 300, 0}, {2, 500, 20000, 0}, {3, 400, 300, 1}, {4, 400, 2000, 1}};
    (void)state_check_fresh;
    if (argc > 1)
        return run_case((unsigned)atoi(argv[1]), argc > 2 ? atoi(argv[2]) : 2000,
                        argc > 3 ? atoi(argv[3]) : 20000, argc > 4 && atoi(argv[4]));
    int failed = 0;
    for (size_t i = 0; i < sizeof(plan) / sizeof(plan[0]); i++) {
        fflush(NULL);
        pid_t pid = fork();
        MUST(pid >= 0);
        if (pid == 0)
            _exit(run_case((unsigned)plan[i][0], plan[i][1], plan[i][2], plan[i][3] != 0));
        int status = 0;
        MUST(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr,
                    "case %zu (seed %d, %d rounds, compact %d, switch %d) failed: "
                    "status %#x\n",
                    i, plan[i][0], plan[i][1], plan[i][2], plan[i][3], (unsigned)status);
            failed = 1;
        }
    }
    return failed;
}
