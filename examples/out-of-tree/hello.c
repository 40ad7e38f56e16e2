/*
 * gpubuf-hello: the smallest program built against an installed gpubuf.
 *
 * Connects to the daemon at $GPUBUF_SOCKET (or /run/gpubuf/gpubufd.sock) and
 * prints what happened. Exit status: 0 when connected, and also when no daemon
 * listens (-ENOENT, -ECONNREFUSED: the program still built, linked and ran);
 * 1 on any other error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <gpubuf/gpubuf.h>

int main(void) {
    const char *env = getenv("GPUBUF_SOCKET");
    const char *path = env && *env ? env : GPUBUF_DEFAULT_SOCKET;
    gpubuf_client *c = NULL;
    gpubuf_status *s = NULL;

    int r = gpubuf_connect(NULL, &c);
    if (r < 0) {
        printf("gpubuf-hello: %s: %s (%s)\n", path, gpubuf_strerror(r), gpubuf_err_name(r));
        return r == -ENOENT || r == -ECONNREFUSED ? 0 : 1;
    }
    r = gpubuf_status_get(c, &s);
    if (r < 0) {
        printf("gpubuf-hello: %s: status: %s\n", path, gpubuf_strerror(r));
        gpubuf_disconnect(c);
        return 1;
    }
    printf("gpubuf-hello: %s: connected to gpubufd %s, %zu pool(s), %zu buffer(s)\n", path,
           s->version, s->n_pools, s->n_buffers);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    return 0;
}
