/* libFuzzer target: what a hostile peer sends in a takeover
 * (daemon/takeover.c). The first byte picks the side:
 *  0: the successor's receiver, frame by frame: records of
 *     [fds: 1 byte][length: 2 bytes LE][HandoverFds payload], each handed to
 *     gd_handover_rx_frame() with that many fds (at most 17: one too many
 *     shows); every fd must be taken or closed, never leaked;
 *  1: the successor's receiver as a byte stream (framing included) over a
 *     socket pair, without fds;
 *  2: the running daemon reading the successor's HandoverStatus frames
 *     (its ready, or why it gave up) over a socket pair. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "takeover.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_null = -1;

/* Open fds: a leak in the target shows as a count that grows. */
static int count_fds(void) {
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

static void by_records(const uint8_t *p, size_t n) {
    gd_handover_rx rx = {0};
    while (n >= 3 && !rx.done) {
        int fds[GD_TAKEOVER_BATCH + 1], n_fds = p[0] % (GD_TAKEOVER_BATCH + 2);
        size_t len = (size_t)(p[1] | p[2] << 8);
        p += 3;
        n -= 3;
        if (len > n)
            len = n;
        for (int i = 0; i < n_fds; i++)
            fds[i] = dup(g_null);
        /* More fds than a frame may carry: the reader closes the surplus
         * and counts it (gpubuf_wire_read_frame_fds); so does this. */
        int keep = n_fds > GD_TAKEOVER_BATCH ? GD_TAKEOVER_BATCH : n_fds;
        for (int i = keep; i < n_fds; i++)
            close(fds[i]);
        int r = gd_handover_rx_frame(&rx, p, len, fds, n_fds);
        p += len;
        n -= len;
        if (r < 0)
            break;
    }
    gd_handover_rx_free(&rx);
}

/* Write all of p into sv[0] (then close it) while reading sv[1] with fn. */
static void by_stream(const uint8_t *p, size_t n, int which) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    if (n > 200000) /* what the socket buffer surely holds */
        n = 200000;
    if (n && write(sv[0], p, n) != (ssize_t)n)
        n = 0;
    close(sv[0]);
    if (which == 1) {
        gd_handover_rx rx = {0};
        for (;;) {
            uint8_t *payload = NULL;
            int fds[GD_TAKEOVER_BATCH], n_fds = 0;
            ssize_t len = gpubuf_wire_read_frame_fds(sv[1], GD_TAKEOVER_MAX_FRAME, &payload, fds,
                                                     GD_TAKEOVER_BATCH, &n_fds);
            if (len < 0)
                break;
            int r = gd_handover_rx_frame(&rx, payload, (size_t)len, fds, n_fds);
            free(payload);
            if (r != 0)
                break;
        }
        gd_handover_rx_free(&rx);
    } else {
        char why[256];
        int status;
        while (gd_takeover_read_status(sv[1], &status, why, sizeof(why)) == 0)
            if (status > 0 || strlen(why) >= sizeof(why))
                abort();
    }
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_null < 0) {
        gd_log_level = -1; /* quiet */
        g_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (g_null < 0)
            abort();
    }
    if (size < 1)
        return 0;
    int before = count_fds();
    switch (data[0] % 3) {
    case 0: by_records(data + 1, size - 1); break;
    case 1: by_stream(data + 1, size - 1, 1); break;
    default: by_stream(data + 1, size - 1, 2); break;
    }
    if (count_fds() != before) {
        fprintf(stderr, "fuzz_handover: fds leaked (%d before, %d after)\n", before,
                count_fds());
        abort();
    }
    return 0;
}
