/* libFuzzer target: bytes from a hostile client, end to end through the
 * daemon core: frame decoding, protobuf unpacking, dispatch into registry
 * and pools (host backend), replies. Each input is one connection's byte
 * stream; the session is torn down afterwards, so its references go too. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "pool.h"
#include "core_helpers.h"
#include "daemon.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uv_loop_t loop;
static gd_daemon d;
static char sock_path[108];

static void remove_socket(void) { unlink(sock_path); }

static void setup(void) {
    static int done;
    if (done)
        return;
    done = 1;
    gd_log_level = -1; /* quiet */
    uv_loop_init(&loop);
    if (gd_daemon_init(&d, &loop) < 0)
        abort();
    d.ctx.limits.max_waiters_per_client = 8;
    /* Deadlines do not fire inside one input's short run. */
    if (!ch_host_pool(&d.ctx, "host", 64u << 20, 1u << 20))
        abort();
    snprintf(sock_path, sizeof(sock_path), "/tmp/gpubuf-fuzz-%d.sock", (int)getpid());
    if (gd_server_listen_path(&d.srv, sock_path, 0600, (gid_t)-1) < 0)
        abort();
    atexit(remove_socket); /* no socket file left in /tmp after a run */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char sink[65536];
    size_t off = 0;
    int fd, idle = 0;
    setup();
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        abort();
    fcntl(fd, F_SETFL, O_NONBLOCK);
    /* Feed the bytes, drain the replies, until nothing moves any more. */
    while (idle < 8) {
        int progress = 0;
        if (off < size) {
            ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
            if (n > 0) {
                off += (size_t)n;
                progress = 1;
            } else if (n < 0 && errno != EAGAIN) {
                off = size; /* the daemon hung up */
            }
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        for (;;) {
            ssize_t n = recv(fd, sink, sizeof(sink), 0);
            if (n <= 0)
                break;
            progress = 1;
        }
        idle = progress ? 0 : idle + 1;
    }
    close(fd);
    /* Let the daemon notice the hang-up and reap the session. */
    for (int i = 0; i < 100 && d.srv.n_conns > 0; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    if (d.srv.n_conns != 0)
        abort(); /* a session outlived its connection */
    return 0;
}
