/* Wait for many named buffers from one libuv loop (docs/client-api.md,
 * "Event loops"): one connection, one uv_poll_t on gpubuf_client_fd(), one
 * gpubuf_open_start() per name; no thread per wait.
 *
 *   gpubuf-uv-wait [-n COUNT] [-t TIMEOUT_MS] [--produce] PREFIX
 *
 * waits for PREFIX.0 .. PREFIX.COUNT-1 (1,000 by default) and prints each as
 * it comes. --produce also allocates and seals them, in reverse order, from
 * a second connection on a timer of the same loop (a self-contained demo). */
#define _GNU_SOURCE /* uv.h needs POSIX threads' types */
#include <gpubuf/gpubuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct app {
    gpubuf_client *c, *producer;
    uv_poll_t poll;
    uv_timer_t timer;
    const char *prefix;
    int count, done, failed, next_seal;
} app;

static void on_open(gpubuf_client *c, const gpubuf_completion *d) {
    app *a = d->user;
    (void)c;
    a->done++;
    if (d->result < 0) {
        a->failed++;
        fprintf(stderr, "open %llu: %s\n", (unsigned long long)d->handle, d->message);
        return;
    }
    printf("%s: %llu bytes\n", gpubuf_buffer_name(d->view),
           (unsigned long long)gpubuf_buffer_size(d->view));
    gpubuf_release(d->view);
}

static void on_readable(uv_poll_t *p, int status, int events) {
    app *a = p->data;
    (void)events;
    if (status < 0 || gpubuf_dispatch(a->c) < 0) {
        fprintf(stderr, "dispatch: %s\n", gpubuf_last_error_message());
        a->failed = a->count - a->done;
        a->done = a->count;
    }
    if (a->done == a->count) {
        uv_close((uv_handle_t *)&a->poll, NULL);
        if (a->producer)
            uv_close((uv_handle_t *)&a->timer, NULL);
    }
}

/* --produce: allocate and seal 50 names per tick, the last first. */
static void on_tick(uv_timer_t *t) {
    app *a = t->data;
    for (int k = 0; k < 50 && a->next_seal >= 0; k++, a->next_seal--) {
        char name[256];
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "%s.%d", a->prefix, a->next_seal);
        if (gpubuf_alloc(a->producer, NULL, 4096, name, &b) < 0 || gpubuf_seal(b) < 0) {
            fprintf(stderr, "produce %s: %s\n", name, gpubuf_last_error_message());
            exit(1);
        }
        gpubuf_release(b); /* the buffer stays, sealed, for its opener */
    }
    gpubuf_flush(a->producer);
    if (a->next_seal < 0)
        uv_timer_stop(t);
}

int main(int argc, char **argv) {
    app a = {.count = 1000};
    int timeout_ms = -1, produce = 0, r;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            a.count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            timeout_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--produce"))
            produce = 1;
        else
            a.prefix = argv[i];
    }
    if (!a.prefix || a.count <= 0) {
        fprintf(stderr, "usage: %s [-n COUNT] [-t TIMEOUT_MS] [--produce] PREFIX\n", argv[0]);
        return 2;
    }
    if ((r = gpubuf_connect(NULL, &a.c)) < 0 || (produce && gpubuf_connect(NULL, &a.producer) < 0)) {
        fprintf(stderr, "connect: %s\n", gpubuf_last_error_message());
        return 1;
    }
    for (int i = 0; i < a.count; i++) {
        char name[256];
        uint64_t h;
        gpubuf_lookup o = {.timeout_ms = timeout_ms};
        snprintf(name, sizeof(name), "%s.%d", a.prefix, i);
        if (gpubuf_open_start(a.c, name, 0, &o, on_open, &a, &h) < 0) {
            fprintf(stderr, "open %s: %s\n", name, gpubuf_last_error_message());
            return 1;
        }
    }
    uv_loop_t *loop = uv_default_loop();
    uv_poll_init(loop, &a.poll, gpubuf_client_fd(a.c));
    a.poll.data = &a;
    uv_poll_start(&a.poll, UV_READABLE, on_readable);
    if (produce) {
        a.next_seal = a.count - 1;
        uv_timer_init(loop, &a.timer);
        a.timer.data = &a;
        uv_timer_start(&a.timer, on_tick, 1, 1);
    }
    uv_run(loop, UV_RUN_DEFAULT);
    fprintf(stderr, "%d of %d buffers came, %d failed\n", a.done - a.failed, a.count, a.failed);
    uv_loop_close(loop);
    gpubuf_disconnect(a.producer);
    gpubuf_disconnect(a.c);
    return a.failed ? 1 : 0;
}
