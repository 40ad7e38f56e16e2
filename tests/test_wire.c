/* Unit tests of the frame layer and shared helpers: header encoding and
 * validation, truncated/oversized/garbage frames, fd passing, protobuf
 * round trips, sizes, names and error strings. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpubuf.pb-c.h"
#include "rawproto.h"
#include "gpubuf/gpubuf.h"
#include "util.h"
#include "wire.h"
#include "check_main.h"

static void pair(int sv[2]) {
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* Send the n bytes at bytes (with pass_fd attached when >= 0) on one end
 * of a new socket pair, hang that end up first when hang_up, and read a
 * frame of at most 1024 bytes from the other: gpubuf_wire_read_frame's
 * result, its payload and fd in *payload and *fd. Closes both ends. */
static int send_then_read(const void *bytes, size_t n, int pass_fd, bool hang_up, uint8_t **payload,
                          int *fd) {
    int sv[2];
    pair(sv);
    ck_assert_int_eq(gpubuf_wire_send_all(sv[0], bytes, n, pass_fd), 0);
    if (hang_up)
        close(sv[0]);
    int r = gpubuf_wire_read_frame(sv[1], 1024, payload, fd);
    if (!hang_up)
        close(sv[0]);
    close(sv[1]);
    return r;
}

START_TEST(header_roundtrip) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_frame_header fh;
    gpubuf_wire_header_encode(h, 1234);
    ck_assert_int_eq(h[0], 'G');
    ck_assert_int_eq(h[1], 'P');
    ck_assert_int_eq(h[2], 'B');
    ck_assert_int_eq(h[3], 'F');
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), 0);
    ck_assert_uint_eq(fh.length, 1234);
    ck_assert_uint_eq(fh.version, GPUBUF_WIRE_VERSION);
    ck_assert_uint_eq(fh.magic, GPUBUF_WIRE_MAGIC);
}
END_TEST

START_TEST(header_bad_magic) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_frame_header fh = {0};
    gpubuf_wire_header_encode(h, 10);
    h[0] = 'X';
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), GPUBUF_EPROTOCOL);
    ck_assert_uint_eq(fh.length, 0); /* not written on failure */
}
END_TEST

START_TEST(header_bad_version_and_flags) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_frame_header fh;
    gpubuf_wire_header_encode(h, 10);
    h[4] = 2;
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), GPUBUF_EVERSION);
    gpubuf_wire_header_encode(h, 10);
    h[6] = 1;
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), GPUBUF_EPROTOCOL);
}
END_TEST

START_TEST(header_oversized) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_frame_header fh;
    gpubuf_wire_header_encode(h, 4097);
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), -EMSGSIZE);
    gpubuf_wire_header_encode(h, 4096);
    ck_assert_int_eq(gpubuf_wire_header_decode(h, 4096, &fh), 0);
    gpubuf_wire_header_encode(h, UINT32_MAX);
    ck_assert_int_eq(gpubuf_wire_header_decode(h, GPUBUF_WIRE_MAX_RESPONSE, &fh), -EMSGSIZE);
}
END_TEST

START_TEST(read_frame_whole) {
    int fd;
    uint8_t buf[GPUBUF_WIRE_HEADER_SIZE + 5], *payload = NULL;
    gpubuf_wire_header_encode(buf, 5);
    memcpy(buf + GPUBUF_WIRE_HEADER_SIZE, "hello", 5);
    ck_assert_int_eq(send_then_read(buf, sizeof(buf), -1, false, &payload, &fd), 5);
    ck_assert_int_eq(fd, -1);
    ck_assert_mem_eq(payload, "hello", 5);
    free(payload);
}
END_TEST

START_TEST(read_frame_truncated) {
    int fd;
    uint8_t buf[GPUBUF_WIRE_HEADER_SIZE + 100], *payload = NULL;
    gpubuf_wire_header_encode(buf, 100);
    /* Header and 10 of 100 payload bytes, then the peer goes away. */
    ck_assert_int_eq(send_then_read(buf, GPUBUF_WIRE_HEADER_SIZE + 10, -1, true, &payload, &fd),
                     GPUBUF_EDISCONNECTED);
    ck_assert_ptr_null(payload);
}
END_TEST

START_TEST(read_frame_truncated_header) {
    int fd;
    uint8_t *payload = NULL;
    ck_assert_int_eq(send_then_read("GPB", 3, -1, true, &payload, &fd), GPUBUF_EDISCONNECTED);
}
END_TEST

START_TEST(read_frame_oversized_no_alloc) {
    int fd;
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE], *payload = NULL;
    gpubuf_wire_header_encode(h, 0x7fffffff);
    /* Rejected from the header alone: no 2 GiB allocation, no read of it. */
    ck_assert_int_eq(send_then_read(h, sizeof(h), -1, false, &payload, &fd), -EMSGSIZE);
    ck_assert_ptr_null(payload);
}
END_TEST

START_TEST(read_frame_garbage) {
    int fd;
    uint8_t junk[64], *payload = NULL;
    srand(7);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)rand();
    junk[0] = 0; /* never the magic */
    ck_assert_int_eq(send_then_read(junk, sizeof(junk), -1, false, &payload, &fd),
                     GPUBUF_EPROTOCOL);
}
END_TEST

START_TEST(fd_passing) {
    int fd, mfd = memfd_create("t", MFD_CLOEXEC);
    uint8_t buf[GPUBUF_WIRE_HEADER_SIZE + 1] = {0}, *payload;
    struct stat a, b;
    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(ftruncate(mfd, 12345), 0);
    gpubuf_wire_header_encode(buf, 1);
    ck_assert_int_eq(send_then_read(buf, sizeof(buf), mfd, false, &payload, &fd), 1);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ne(fd, mfd);
    ck_assert_int_eq(fstat(mfd, &a), 0);
    ck_assert_int_eq(fstat(fd, &b), 0);
    ck_assert(a.st_ino == b.st_ino);
    ck_assert_int_eq(b.st_size, 12345);
    ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    free(payload);
    close(fd);
    close(mfd);
}
END_TEST

START_TEST(recv_surplus_fds_closed) {
    int sv[2], fds[3];
    pair(sv);
    for (int i = 0; i < 3; i++)
        fds[i] = memfd_create("t", MFD_CLOEXEC);
    /* Three fds on one message: the receiver keeps one, closes two. */
    char cbuf[CMSG_SPACE(sizeof(fds))];
    char byte = 'x';
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    ck_assert_int_eq(sendmsg(sv[0], &msg, 0), 1);
    int got[1], n = 0;
    bool trunc = false;
    char rb;
    ck_assert_int_eq(gpubuf_wire_recv(sv[1], &rb, 1, 0, got, 1, &n, &trunc), 1);
    ck_assert_int_eq(n, 1);
    ck_assert(trunc);
    close(got[0]);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

START_TEST(protobuf_roundtrip) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT, *out;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    uint8_t buf[256];
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = (char *)"tensor/a";
    o.timeout_ms = -1;
    req.id = 77;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
    size_t n = gpubuf__request__pack(&req, buf);
    out = gpubuf__request__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(out);
    ck_assert_uint_eq(out->id, 77);
    ck_assert_int_eq(out->body_case, GPUBUF__REQUEST__BODY_OPEN);
    ck_assert_str_eq(out->open->name, "tensor/a");
    ck_assert_int_eq(out->open->timeout_ms, -1);
    gpubuf__request__free_unpacked(out, NULL);
    /* Truncated protobuf fails to decode instead of crashing. */
    ck_assert_ptr_null(gpubuf__request__unpack(NULL, n - 3, buf));
}
END_TEST

START_TEST(parse_size) {
    uint64_t v;
    ck_assert_int_eq(gpubuf_parse_size("123", &v), 0);
    ck_assert_uint_eq(v, 123);
    ck_assert_int_eq(gpubuf_parse_size("64K", &v), 0);
    ck_assert_uint_eq(v, 65536);
    ck_assert_int_eq(gpubuf_parse_size("256MiB", &v), 0);
    ck_assert_uint_eq(v, 256ull << 20);
    ck_assert_int_eq(gpubuf_parse_size("8g", &v), 0);
    ck_assert_uint_eq(v, 8ull << 30);
    ck_assert_int_eq(gpubuf_parse_size("", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("-1", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("12X", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("99999999999T", &v), -EINVAL);
    /* The largest value parses; one more, in any unit, overflows. */
    ck_assert_int_eq(gpubuf_parse_size("18446744073709551615", &v), 0);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(gpubuf_parse_size("18446744073709551616", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("16777215T", &v), 0);
    ck_assert_uint_eq(v, 16777215ull << 40);
    ck_assert_int_eq(gpubuf_parse_size("16777216T", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("17179869184G", &v), -EINVAL);
    /* No sign and no spaces: strtoull would wrap " -1" to 2^64 - 1. */
    v = 7;
    ck_assert_int_eq(gpubuf_parse_size(" -1", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("\t-1M", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("+1", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size(" 1", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size("K", &v), -EINVAL);
    ck_assert_int_eq(gpubuf_parse_size(NULL, &v), -EINVAL);
    ck_assert_uint_eq(v, 7);
}
END_TEST

START_TEST(text_clean) {
    char out[64];
    static const struct {
        const char *in;
        size_t len;
        const char *out;
    } cases[] = {
        {"plain name", 10, "plain name"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\x1b[2J\x07", 5, "\\x1b[2J\\x07"},
        {"a\nb\r\t", 5, "a\\x0ab\\x0d\\x09"},
        {"nul\0x", 5, "nul\\x00x"},
        {"del\x7f", 4, "del\\x7f"},
        {"c1\xc2\x9b", 4, "c1\\xc2\\x9b"},           /* U+009B, CSI */
        {"bidi\xe2\x80\xae", 7, "bidi\\xe2\\x80\\xae"},  /* U+202E */
        {"\xff\xfe", 2, "\\xff\\xfe"},
        {"over\xc0\xaf", 6, "over\\xc0\\xaf"},         /* overlong '/' */
        {"sur\xed\xa0\x80", 6, "sur\\xed\\xa0\\x80"},  /* U+D800 */
        {"big\xf4\x90\x80\x80", 7, "big\\xf4\\x90\\x80\\x80"},
        {"cut\xe2\x82", 5, "cut\\xe2\\x82"},          /* a character cut short */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = gpubuf_text_clean(out, sizeof(out), cases[i].in, cases[i].len);
        ck_assert_msg(strcmp(out, cases[i].out) == 0, "case %zu: got '%s'", i, out);
        ck_assert_uint_eq(n, strlen(out));
    }
    /* The cut falls before a character or an escape that does not fit. */
    ck_assert_uint_eq(gpubuf_text_clean(out, 5, "abc\xc3\xa9", 5), 3);
    ck_assert_str_eq(out, "abc");
    ck_assert_uint_eq(gpubuf_text_clean(out, 6, "abc\xc3\xa9", 5), 5);
    ck_assert_str_eq(out, "abc\xc3\xa9");
    ck_assert_uint_eq(gpubuf_text_clean(out, 6, "ab\x1b", 3), 2);
    ck_assert_str_eq(out, "ab");
    ck_assert_uint_eq(gpubuf_text_clean(out, 1, "abc", 3), 0);
    ck_assert_str_eq(out, "");
    /* Every 2-byte input comes out valid and printable, within bounds. */
    for (unsigned a = 0; a < 256; a++)
        for (unsigned b = 0; b < 256; b++) {
            char in[2] = {(char)a, (char)b};
            size_t n = gpubuf_text_clean(out, 9, in, 2);
            ck_assert_uint_le(n, 8);
            for (size_t k = 0; k < n; k++)
                ck_assert((unsigned char)out[k] >= 0x20 && (unsigned char)out[k] != 0x7f);
            char again[64];
            gpubuf_text_clean(again, sizeof(again), out, n); /* clean text stays as it is */
            ck_assert_str_eq(again, out);
        }
}
END_TEST

/* A NUL inside any string field, at any depth, is found; bytes of other
 * fields (a size whose varint holds 0x00) are not strings. */
START_TEST(wire_nul_strings) {
    uint8_t buf[512];
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = 1ull << 35; /* varint with 0x80 0x80 ... bytes */
    a.name = "frames@evil";
    a.pool = "pool";
    Gpubuf__Request req = rp_request(256, GPUBUF__REQUEST__BODY_ALLOC, &a);
    size_t n = gpubuf__request__pack(&req, buf);
    ck_assert_ptr_null(gpubuf_wire_nul_string(&gpubuf__request__descriptor, buf, n));
    uint8_t *at = memmem(buf, n, "frames@evil", 11);
    ck_assert_ptr_nonnull(at);
    at[6] = 0;
    const char *f = gpubuf_wire_nul_string(&gpubuf__request__descriptor, buf, n);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f, "name");
    /* It still unpacks: protobuf-c would have handed out "frames". */
    Gpubuf__Request *u = gpubuf__request__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(u);
    ck_assert_str_eq(u->alloc->name, "frames");
    gpubuf__request__free_unpacked(u, NULL);
    at[6] = '@';
    at = memmem(buf, n, "pool", 4);
    at[0] = 0;
    ck_assert_str_eq(gpubuf_wire_nul_string(&gpubuf__request__descriptor, buf, n), "pool");
    /* Truncated input is not read past its end. */
    for (size_t k = 0; k < n; k++)
        (void)gpubuf_wire_nul_string(&gpubuf__request__descriptor, buf, k);
}
END_TEST

START_TEST(names) {
    char longname[300];
    ck_assert(gpubuf_name_valid("a", 1));
    ck_assert(gpubuf_name_valid("job-7/tensor.weights:v2@gpu0+x_y", 32));
    ck_assert(!gpubuf_name_valid("", 0));
    ck_assert(!gpubuf_name_valid("/abs", 4));
    ck_assert(!gpubuf_name_valid("sp ace", 6));
    ck_assert(!gpubuf_name_valid("nul\0x", 5));
    ck_assert(!gpubuf_name_valid("new\nline", 8));
    memset(longname, 'a', sizeof(longname));
    ck_assert(gpubuf_name_valid(longname, GPUBUF_NAME_MAX));
    ck_assert(!gpubuf_name_valid(longname, GPUBUF_NAME_MAX + 1));
}
END_TEST

START_TEST(error_strings) {
    for (int e = GPUBUF_ERANGE; e <= GPUBUF_EPROTOCOL; e++) {
        ck_assert_str_ne(gpubuf_strerror(e), "unknown error");
        ck_assert_str_ne(gpubuf_err_name(e), "EUNKNOWN");
    }
    ck_assert_str_eq(gpubuf_err_name(-ENOENT), "ENOENT");
    ck_assert_str_eq(gpubuf_strerror(-ENOENT), strerror(ENOENT));
    ck_assert_str_eq(gpubuf_strerror(-99999), "unknown error");
}
END_TEST

START_TEST(format_helpers) {
    char b[32], u[41];
    uint8_t id[16];
    for (int i = 0; i < 16; i++)
        id[i] = (uint8_t)(i * 17);
    ck_assert_str_eq(gpubuf_format_size(256ull << 20, b, sizeof(b)), "256.0 MiB");
    ck_assert_str_eq(gpubuf_format_size(10, b, sizeof(b)), "10 B");
    gpubuf_format_uuid(id, u);
    ck_assert_str_eq(u, "GPU-00112233-4455-6677-8899-aabbccddeeff");
}
END_TEST

int main(void) {
    Suite *s = suite_create("wire");
    TCase *t = add_case(s, "frames", NULL, NULL, 0);
    add_tests(t, header_roundtrip, header_bad_magic, header_bad_version_and_flags, header_oversized,
              read_frame_whole, read_frame_truncated, read_frame_truncated_header,
              read_frame_oversized_no_alloc, read_frame_garbage, fd_passing,
              recv_surplus_fds_closed, protobuf_roundtrip);
    TCase *u = add_case(s, "helpers", NULL, NULL, 0);
    add_tests(u, parse_size, names, text_clean, wire_nul_strings, error_strings, format_helpers);
    return run_suite(s);
}
