/* Running gpubufd: its shutdown, its configuration and flags, its socket,
 * and gpubufctl's output. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <json-c/json.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "gpubuf.pb-c.h"
#include "harness.h"
#include "wire.h"
#include "check_main.h"
#include "daemon_fixture.h"

/* A client that says on the pipe *arg when it is connected and then waits
 * for a buffer never sealed; 0 when the open fails as the daemon stops. */
static int open_until_shutdown(const test_daemon *d, void *arg) {
    int r = td_open_once(d, "never-sealed", 0, -1, *(int *)arg);
    return r == -ESHUTDOWN || r == GPUBUF_EDISCONNECTED ? 0 : 2;
}

START_TEST(sigterm_with_live_clients) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "live", &b), 0);
    /* A second client blocked in a waiting open. */
    int sync[2];
    ck_assert_int_eq(pipe(sync), 0);
    pid_t p = td_spawn(open_until_shutdown, &D, &sync[1]);
    char ch;
    ck_assert_int_eq(read(sync[0], &ch, 1), 1);
    ck_assert(td_wait_waiting_opens(&D, 1, 10000)); /* the open reaches the daemon and waits */
    ck_assert_int_eq(td_stop(&D), 0);
    ck_assert_int_eq(td_wait(p), 0);
    /* Our own next request fails cleanly. */
    gpubuf_buffer *y = NULL;
    int r = gpubuf_alloc(c, NULL, 4096, NULL, &y);
    ck_assert(r == -ESHUTDOWN || r == GPUBUF_EDISCONNECTED || r == -ECONNRESET || r == -EPIPE);
    ck_assert_ptr_null(y);
    ck_assert_int_eq(access(D.socket, F_OK), -1);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    /* Restart on the same socket: clients reconnect. */
    start_default();
    assert_serving();
}
END_TEST

START_TEST(second_daemon_refuses_live_socket) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s --pool h=host 2>/dev/null", GPUBUFD_PATH,
             D.socket);
    int st = system(cmd);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 1);
    assert_serving();
}
END_TEST

/* Run gpubufd with the arguments printf formats, stderr into the output;
 * returns the output and stores the exit status. */
__attribute__((format(printf, 2, 3))) static char *run_gpubufd(int *ret_exit, const char *fmt,
                                                              ...) {
    char args[512], cmd[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", GPUBUFD_PATH, args);
    return td_capture(cmd, ret_exit);
}

START_TEST(gpubufctl_table_and_json) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b, *o;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 3 << 20, "ctl-demo", &b), 0);
    ck_assert_int_eq(gpubuf_seal(b), 0);
    ck_assert_int_eq(gpubuf_open(c, "ctl-demo", 0, &o), 0);
    char *out = td_ctl(&D, "status", 0);
    ck_assert(strstr(out, "ctl-demo") != NULL);
    ck_assert(strstr(out, "sealed") != NULL);
    ck_assert(strstr(out, "3.0 MiB") != NULL);
    free(out);
    out = td_ctl(&D, "--json status", 0);
    json_object *j = json_tokener_parse(out);
    ck_assert_ptr_nonnull(j);
    json_object *pools, *bufs, *clients, *x;
    ck_assert(json_object_object_get_ex(j, "pools", &pools));
    ck_assert(json_object_object_get_ex(j, "buffers", &bufs));
    ck_assert(json_object_object_get_ex(j, "clients", &clients));
    ck_assert_int_eq(json_object_array_length(pools), 1);
    ck_assert_int_eq(json_object_array_length(bufs), 1);
    x = json_object_array_get_idx(bufs, 0);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "name")), "ctl-demo");
    ck_assert_int_eq(json_object_get_int(json_object_object_get(x, "refs")), 2);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "state")), "sealed");
    x = json_object_array_get_idx(pools, 0);
    ck_assert_int_eq(json_object_get_int64(json_object_object_get(x, "used")), 3 << 20);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "kind")), "host");
    /* Our client (2 refs) and gpubufctl itself. */
    ck_assert_int_eq(json_object_array_length(clients), 2);
    json_object_put(j);
    free(out);
    gpubuf_release(o);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

/* True when s is valid UTF-8 without control characters but '\n' (checked
 * with the C library's decoder, not with gpubuf's). */
static bool printable_utf8(const char *s) {
    mbstate_t ps;
    memset(&ps, 0, sizeof(ps));
    size_t n = strlen(s);
    while (n) {
        wchar_t wc;
        size_t k = mbrtowc(&wc, s, n, &ps);
        if (k == (size_t)-1 || k == (size_t)-2 || k == 0)
            return false;
        if ((wc < 0x20 && wc != '\n') || (wc >= 0x7f && wc <= 0x9f) || wc == 0x202e)
            return false;
        s += k;
        n -= k;
    }
    return true;
}

/* Client names with terminal escapes, newlines, invalid UTF-8, bidi marks or
 * a character across the 63-byte cut reach gpubufctl's table, JSON and
 * metrics as printable, valid UTF-8; the JSON parses with UTF-8 checks on. */
START_TEST(client_names_clean_in_gpubufctl) {
    static const struct {
        const char *sent, *shown;
    } names[] = {
        {"\x1b]0;pwned\x07\x1b[2J", "\\x1b]0;pwned\\x07\\x1b[2J"},
        {"evil\n99 1 0 forged-row", "evil\\x0a99 1 0 forged-row"},
        {"bad\xff\xfe\xc3", "bad\\xff\\xfe\\xc3"},
        {"rtl\xe2\x80\xaegnp.exe", "rtl\\xe2\\x80\\xaegnp.exe"},
        {"caf\xc3\xa9", "caf\xc3\xa9"},
        /* 62 bytes, then a 2-byte character across the cut at 63 bytes */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9",
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
    };
    enum { N = sizeof(names) / sizeof(names[0]) };
    int fds[N];
    ck_assert_ptr_nonnull(setlocale(LC_CTYPE, "C.UTF-8"));
    for (int i = 0; i < N; i++) {
        rp_hello h;
        rp_hello_init(&h, 0, names[i].sent);
        fds[i] = raw_connect();
        gpubuf__response__free_unpacked(
            td_raw_expect(fds[i], &h.req, GPUBUF__RESPONSE__BODY_HELLO), NULL);
    }
    char *out = td_ctl(&D, "--json clients", 0);
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *j = json_tokener_parse_ex(tok, out, (int)strlen(out));
    ck_assert_msg(j != NULL, "gpubufctl --json is not valid JSON (%s): %s",
                  json_tokener_error_desc(json_tokener_get_error(tok)), out);
    json_tokener_free(tok);
    json_object *clients;
    ck_assert(json_object_object_get_ex(j, "clients", &clients));
    for (int i = 0; i < N; i++) {
        bool found = false;
        for (size_t k = 0; k < json_object_array_length(clients); k++) {
            const char *got = json_object_get_string(
                json_object_object_get(json_object_array_get_idx(clients, k), "name"));
            found |= strcmp(got, names[i].shown) == 0;
        }
        ck_assert_msg(found, "client %d not shown as '%s' in %s", i, names[i].shown, out);
    }
    json_object_put(j);
    free(out);
    /* The table: one row per client (this query's included), nothing a
     * terminal would act on. */
    out = td_ctl(&D, "clients", 0);
    ck_assert_msg(printable_utf8(out), "table: %s", out);
    int rows = 0;
    for (const char *p = out; *p; p++)
        rows += *p == '\n';
    ck_assert_int_eq(rows, 1 + N + 1);
    ck_assert_msg(strstr(out, "\\x1b]0;pwned") != NULL, "table: %s", out);
    free(out);
    out = td_ctl(&D, "status", 0);
    ck_assert_msg(printable_utf8(out), "status: %s", out);
    free(out);
    out = td_ctl(&D, "metrics", 0);
    ck_assert_msg(printable_utf8(out), "metrics: %s", out);
    free(out);
    for (int i = 0; i < N; i++)
        close(fds[i]);
}
END_TEST

START_TEST(gpubufctl_exit_codes) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s/none.sock status 2>/dev/null", GPUBUFCTL_PATH,
             D.dir);
    free(td_capture_exit(cmd, 3));
    free(td_ctl(&D, "frobnicate 2>/dev/null", 2));
    char *out = td_ctl(&D, "--json pools", 0);
    ck_assert(strstr(out, "\"buffers\":[") == NULL);
    ck_assert(strstr(out, "\"pools\"") != NULL);
    free(out);
}
END_TEST

START_TEST(config_file_errors_name_file_and_line) {
    char conf[160], cmd[512];
    snprintf(conf, sizeof(conf), "%s/bad.conf", D.dir);
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nlog_level = info\n\n[pool:a]\nkind = floppy\n"),
                     0);
    snprintf(cmd, sizeof(cmd), "%s --config %s --check-config 2>&1", GPUBUFD_PATH, conf);
    char *out = td_capture_exit(cmd, 2);
    ck_assert_msg(strstr(out, "bad.conf:5") != NULL, "got: %s", out);
    ck_assert(strstr(out, "floppy") != NULL);
    free(out);
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nsocket_mode = 0600\n[pool:a]\nkind = host\n"
                                         "capacity = 1G\nslab_size = 8M\n[pool:b]\nkind=host\n"),
                     0);
    out = td_capture_exit(cmd, 0);
    ck_assert(strstr(out, "2 pool(s)") != NULL);
    free(out);
    unlink(conf);
}
END_TEST

/* --check-config refuses what start-up refuses, with the same message and
 * exit status (both go through the same table of keys and the same check). */
START_TEST(check_config_refuses_what_startup_refuses) {
    char conf[160];
    int check_exit, start_exit;
    snprintf(conf, sizeof(conf), "%s/small.conf", D.dir);
    ck_assert_int_eq(td_write_file(conf, "[pool:a]\nkind = host\ncapacity = 1K\n"), 0);
    char *checked = run_gpubufd(&check_exit, "--config %s --check-config", conf);
    char *started = run_gpubufd(&start_exit, "--config %s --socket %s/small.sock", conf, D.dir);
    ck_assert_int_eq(check_exit, 2);
    ck_assert_int_eq(start_exit, 2);
    ck_assert_msg(strstr(checked, "granularity") != NULL, "got: %s", checked);
    ck_assert_str_eq(started, checked);
    free(checked);
    free(started);
    unlink(conf);
}
END_TEST

/* Sizes and ids that do not fit are refused, not wrapped, whether they come
 * from the file, from --pool, with --check-config or at start-up. */
START_TEST(config_values_cannot_overflow) {
    static const struct {
        const char *key, *val, *expect;
    } cases[] = {
        {"slab", "18446744073709551615", "bad slab size '18446744073709551615'"},
        {"slab_size", "16777216T", "bad slab size '16777216T'"},
        {"slab", "2048T", "at most 1024T"},
        {"capacity", "18446744073709551615", "bad capacity '18446744073709551615'"},
        {"capacity", "99999999999999999999", "bad capacity"},
        {"allow_uids", "4294967296", "bad user id '4294967296'"},
        {"allow_uids", "4294967295", "bad user id"},
        {"allow_gids", "18446744073709551616", "bad group id"},
    };
    char conf[160], flag[200];
    int ex;
    snprintf(conf, sizeof(conf), "%s/overflow.conf", D.dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[200];
        snprintf(text, sizeof(text), "[pool:a]\nkind = host\n%s = %s\n", cases[i].key,
                 cases[i].val);
        ck_assert_int_eq(td_write_file(conf, text), 0);
        char *checked = run_gpubufd(&ex, "--config %s --check-config", conf);
        ck_assert_msg(ex == 2 && strstr(checked, cases[i].expect) &&
                          strstr(checked, "overflow.conf:3"),
                      "%s = %s: exit %d: %s", cases[i].key, cases[i].val, ex, checked);
        free(checked);
        char *started = run_gpubufd(&ex, "--config %s --socket %s/of.sock", conf, D.dir);
        ck_assert_msg(ex == 2 && strstr(started, cases[i].expect), "start: exit %d: %s", ex,
                      started);
        free(started);
        snprintf(flag, sizeof(flag), "a=host,%s=%s", cases[i].key, cases[i].val);
        char *flagged = run_gpubufd(&ex, "--pool %s --check-config", flag);
        ck_assert_msg(ex == 2 && strstr(flagged, cases[i].expect), "--pool %s: exit %d: %s", flag,
                      ex, flagged);
        free(flagged);
    }
    /* The largest accepted values still give a working pool description. */
    ck_assert_int_eq(td_write_file(conf, "[pool:a]\nkind = host\ncapacity = 1024T\nslab = 1024T\n"
                                         "allow_uids = 0, 4294967294\n"),
                     0);
    char *out = run_gpubufd(&ex, "--config %s --check-config", conf);
    ck_assert_msg(ex == 0, "exit %d: %s", ex, out);
    free(out);
    unlink(conf);
}
END_TEST

START_TEST(config_file_pools_used) {
    char conf[160];
    test_daemon d2;
    snprintf(conf, sizeof(conf), "/tmp/gpubuf-conf-%d.conf", (int)getpid());
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nsocket_mode = 0600\n\n[pool:alpha]\n"
                                         "kind = host\ncapacity = 32M\nslab_size = 2M\n"),
                     0);
    const char *args[] = {"--config", conf, NULL};
    td_start(&d2, args);
    struct stat sb;
    ck_assert_int_eq(stat(d2.socket, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_eq(s->n_pools, 1);
    ck_assert_str_eq(s->pools[0].name, "alpha");
    ck_assert_uint_eq(s->pools[0].capacity, 32u << 20);
    ck_assert_uint_eq(s->pools[0].slab_size, 2u << 20);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
    unlink(conf);
}
END_TEST

START_TEST(default_configuration_without_gpu) {
    test_daemon d2;
    /* No pools given: a host pool when no GPU is visible. */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    td_start(&d2, NULL);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_ge(s->n_pools, 1);
    ck_assert_str_eq(s->pools[0].name, "host");
    ck_assert_int_eq(s->pools[0].kind, GPUBUF_POOL_HOST);
    ck_assert_uint_eq(s->pools[0].capacity, 4ull << 30);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

START_TEST(bad_flags_exit_2) {
    char cmd[512];
    const char *bad[] = {"--pool nocomma", "--pool x=tape", "--pool x=host,capacity=lots",
                         "--log-level loud", "extra-arg"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s --socket %s/x.sock %s 2>/dev/null", GPUBUFD_PATH, D.dir,
                 bad[i]);
        free(td_capture_exit(cmd, 2));
    }
}
END_TEST

START_TEST(refuses_to_replace_a_regular_file) {
    char path[160], cmd[512];
    snprintf(path, sizeof(path), "%s/precious", D.dir);
    ck_assert_int_eq(td_write_file(path, "data\n"), 0);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --pool h=host 2>&1", GPUBUFD_PATH, path);
    char *out = td_capture_exit(cmd, 1);
    ck_assert(strstr(out, "not a socket") != NULL);
    free(out);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert(S_ISREG(sb.st_mode));
    unlink(path);
}
END_TEST

START_TEST(pool_flags_override_config) {
    char conf[160], cmd[600];
    snprintf(conf, sizeof(conf), "%s/p.conf", D.dir);
    ck_assert_int_eq(td_write_file(conf, "[pool:a]\nkind = host\ncapacity = 2G\n"), 0);
    test_daemon d2;
    const char *args[] = {"--config", conf, "--pool", "a=host,capacity=1G", NULL};
    td_start(&d2, args);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_eq(s->n_pools, 1);
    ck_assert_uint_eq(s->pools[0].capacity, 1ull << 30);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
    /* A pool section without a kind is an error, not a host pool. */
    ck_assert_int_eq(td_write_file(conf, "[pool:gpu0]\ndevice = 0\n"), 0);
    snprintf(cmd, sizeof(cmd), "%s --config %s --check-config 2>&1", GPUBUFD_PATH, conf);
    char *out = td_capture_exit(cmd, 2);
    ck_assert(strstr(out, "no kind") != NULL);
    free(out);
    /* The first bad line is the one reported, with its own message. */
    ck_assert_int_eq(td_write_file(conf, "[pool:a]\nkind = host\nbogus = 1\ncapacity = zz\n"), 0);
    out = td_capture_exit(cmd, 2);
    ck_assert_msg(strstr(out, "p.conf:3: unknown pool key 'bogus'") != NULL, "got %s", out);
    free(out);
    unlink(conf);
}
END_TEST

/* The CPU time gpubufd pid has used so far, in ms. */
static double daemon_cpu_ms(pid_t pid) {
    clockid_t id;
    struct timespec t;
    ck_assert_int_eq(clock_getcpuclockid(pid, &id), 0);
    ck_assert_int_eq(clock_gettime(id, &t), 0);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* poll_us: the loop polls for the next request after handling some, but
 * stops once poll_us pass without one, and stops polling altogether while
 * requests come further apart than that (docs/operations.md). With 1 ms of
 * polling after every request, the 100 requests 5 ms apart would cost the
 * daemon 100 ms of CPU, and 300 ms idle as much if the polling never
 * stopped. */
START_TEST(daemon_polls_only_while_requests_come) {
    char conf[160];
    test_daemon d2;
    gpubuf_buffer_info info;
    snprintf(conf, sizeof(conf), "/tmp/gpubuf-poll-%d.conf", (int)getpid());
    ck_assert_int_eq(td_write_file(conf, "[daemon]\npoll_us = 1000\n"), 0);
    const char *args[] = {"--config", conf, "--pool", "a=host,capacity=64M", NULL};
    td_start(&d2, args);
    gpubuf_client *c = td_connect(&d2);
    for (int i = 0; i < 50; i++) /* in quick succession: the loop polls */
        ck_assert_int_eq(gpubuf_stat(c, "never", &info), -ENOENT);
    double a = daemon_cpu_ms(d2.pid);
    usleep(300 * 1000);
    double idle = daemon_cpu_ms(d2.pid) - a;
    ck_assert_msg(idle < 60, "idle for 300 ms, gpubufd used %.1f ms of CPU", idle);
    a = daemon_cpu_ms(d2.pid);
    for (int i = 0; i < 100; i++) {
        usleep(5 * 1000);
        ck_assert_int_eq(gpubuf_stat(c, "never", &info), -ENOENT);
    }
    double sparse = daemon_cpu_ms(d2.pid) - a;
    ck_assert_msg(sparse < 60, "100 requests 5 ms apart cost gpubufd %.1f ms of CPU", sparse);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d2), 0);
    unlink(conf);
}
END_TEST

SUITE_MAIN("operations", "operations", start_default, td_stop_clean, 60,
          sigterm_with_live_clients, second_daemon_refuses_live_socket,
          gpubufctl_table_and_json, client_names_clean_in_gpubufctl, gpubufctl_exit_codes,
          config_file_errors_name_file_and_line, config_file_pools_used,
          check_config_refuses_what_startup_refuses, config_values_cannot_overflow,
          default_configuration_without_gpu, bad_flags_exit_2,
          refuses_to_replace_a_regular_file, pool_flags_override_config,
          daemon_polls_only_while_requests_come)
