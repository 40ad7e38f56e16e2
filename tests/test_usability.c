/* What a user and an operator see: every error message says what happened
 * and what to do; gpubufctl names bad commands and options, deletes, watches
 * with rates; the daemon's counters move as requests are made. All on host
 * pools against a real gpubufd. */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <pty.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "util.h"

#define NOBODY 65534

static char dir[64];

static void mkdir_tmp(void) {
    td_mkdtemp(dir, "use");
}

static void rm_tmp(void) {
    td_rmtree(dir);
}

/* The message of the last call contains every one of the NULL-terminated
 * words. */
#define ck_assert_message_has(...)                                                                 \
    do {                                                                                           \
        const char *words_[] = {__VA_ARGS__, NULL};                                                \
        const char *m_ = gpubuf_last_error_message();                                              \
        for (int i_ = 0; words_[i_]; i_++)                                                         \
            ck_assert_msg(strstr(m_, words_[i_]) != NULL, "message lacks '%s': %s", words_[i_],    \
                          m_);                                                                     \
    } while (0)

static void must_contain(const char *text, const char *word) {
    ck_assert_msg(strstr(text, word) != NULL, "'%s' not in: %s", word, text);
}

/* A NULL-terminated list of words, for says(). */
#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The output out (of a command run with td_capture) contains every one of
 * words; frees it. */
static void says(char *out, const char *const *words) {
    for (; *words; words++)
        must_contain(out, *words);
    free(out);
}

/* Run cmd; it must exit with code want, and say every one of the words. */
#define capture_says(cmd, want, ...) says(td_capture_exit((cmd), (want)), WORDS(__VA_ARGS__))

/* Run gpubufctl with args, stderr into the output (td_ctl). */
static char *ctl_exit(const test_daemon *d, const char *args, int want) {
    char words[1024];
    snprintf(words, sizeof(words), "%s 2>&1", args);
    return td_ctl(d, words, want);
}

/* gpubufctl with args must exit with code want and say every one of the
 * words. */
#define ctl_says(d, args, want, ...) says(ctl_exit((d), (args), (want)), WORDS(__VA_ARGS__))

/* Connect, retrying while the daemon refuses for lack of room: sessions
 * that just closed (the harness's probe, a status) are reaped a moment
 * later. */
static gpubuf_client *connect_retry(const test_daemon *d) {
    for (int i = 0; i < 250; i++) {
        gpubuf_client *c;
        int r = gpubuf_connect(d->socket, &c);
        if (r == 0)
            return c;
        ck_assert_msg(r == -EUSERS, "connect: %s", gpubuf_last_error_message());
        td_sleep_ms(20);
    }
    ck_abort_msg("the daemon kept refusing connections");
    return NULL;
}

/* The one pool most tests here need. */
static const char *const ONE_POOL[] = {"--pool", "p=host,capacity=16M", NULL};

/* ---- connecting -------------------------------------------------------- */

START_TEST(no_daemon_says_start_it_or_set_the_socket) {
    char path[128];
    gpubuf_client *c = NULL;
    snprintf(path, sizeof(path), "%s/none.sock", dir);
    ck_assert_int_eq(gpubuf_connect(path, &c), -ENOENT);
    /* Old: "cannot connect to gpubufd at P: No such file or directory". */
    ck_assert_message_has(path, "no such socket", "Is gpubufd running?", "Start it",
                          "GPUBUF_SOCKET");
    /* Where the path came from is said when the caller did not name it. */
    setenv("GPUBUF_SOCKET", path, 1);
    ck_assert_int_eq(gpubuf_connect(NULL, &c), -ENOENT);
    ck_assert_message_has("(from $GPUBUF_SOCKET)");
    unsetenv("GPUBUF_SOCKET");
    /* The producer prints the reason once, not twice. */
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/gpubuf-producer --socket %s 2>&1", EXAMPLES_DIR, path);
    char *out = td_capture_exit(cmd, 1);
    ck_assert_int_eq(td_count(out, "cannot connect"), 1);
    ck_assert_int_eq(td_count(out, "No such file or directory"), 0);
    says(out, WORDS("Is gpubufd running?"));
}
END_TEST

START_TEST(stale_socket_says_restart_gpubufd) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    gpubuf_client *c = NULL;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/stale.sock", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd); /* a socket file nobody listens on: what a crash leaves */
    ck_assert_int_eq(gpubuf_connect(sa.sun_path, &c), -ECONNREFUSED);
    /* Old: "cannot connect to gpubufd at P: Connection refused". */
    ck_assert_message_has(sa.sun_path, "stale socket", "no gpubufd listens", "start gpubufd again");
}
END_TEST

/* Connect as uid/gid NOBODY to path; the child exits 0 when the error is
 * -EACCES and (join) names group gname and how to join it, or (!join) says
 * that the administrator gives the socket a group, where. */
static int connect_as_nobody(const char *path, const char *gname, bool join) {
    if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
        return 10;
    gpubuf_client *c;
    int r = gpubuf_connect(path, &c);
    const char *m = gpubuf_last_error_message();
    char want[128];
    snprintf(want, sizeof(want), "group '%s'", gname);
    if (r != -EACCES) {
        fprintf(stderr, "connect: %d %s\n", r, m);
        return 11;
    }
    if (!strstr(m, want) || !strstr(m, "permission denied")) {
        fprintf(stderr, "message: %s\n", m);
        return 12;
    }
    if (join ? !strstr(m, "usermod -aG")
             : strstr(m, "usermod") || !strstr(m, "socket_group=") || !strstr(m, "SocketGroup=") ||
                   !strstr(m, "gpubufd.socket")) {
        fprintf(stderr, "message (%s): %s\n", join ? "join the group" : "give it a group", m);
        return 13;
    }
    return 0;
}

/* A group other than root's that NOBODY is not in, or NULL. */
static const struct group *other_group(void) {
    static const char *const names[] = {"daemon", "bin", "sys", "adm", "users", "nogroup", NULL};
    for (int i = 0; names[i]; i++) {
        const struct group *g = getgrnam(names[i]);
        if (g && g->gr_gid != 0 && g->gr_gid != NOBODY)
            return g;
    }
    return NULL;
}

/* The advice to join the socket's group is given only where the group
 * decides: a socket of group root (mode 0660) gets the way to give it a
 * group instead (it told uids to "join group 'root'"). */
START_TEST(permission_error_names_the_socket_group) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    /* The daemon's socket, mode 0660, given to root's group (gid 0). */
    ck_assert_int_eq(chmod(d.socket, 0660), 0);
    struct group *g = getgrgid(0);
    const char *gname = g ? g->gr_name : "0";
    if (getuid() == 0) {
        ck_assert_int_eq(chown(d.socket, 0, 0), 0);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            _exit(connect_as_nobody(d.socket, gname, false));
        ck_assert_int_eq(td_wait(pid), 0);
        /* A group of users: joining it is the advice. */
        const struct group *og = other_group();
        if (og) {
            char oname[64];
            snprintf(oname, sizeof(oname), "%s", og->gr_name);
            ck_assert_int_eq(chown(d.socket, 0, og->gr_gid), 0);
            fflush(NULL);
            pid = fork();
            if (pid == 0)
                _exit(connect_as_nobody(d.socket, oname, true));
            ck_assert_int_eq(td_wait(pid), 0);
        } else {
            printf("permission_error_names_the_socket_group: no group but root's to try "
                   "the advice to join a group with\n");
        }
    } else {
        /* Not root: a socket we may not write to; its mode gives its
         * group no access, so joining the group is no advice. */
        struct stat st;
        ck_assert_int_eq(chmod(d.socket, 0), 0);
        ck_assert_int_eq(stat(d.socket, &st), 0);
        g = getgrgid(st.st_gid);
        gpubuf_client *c;
        ck_assert_int_eq(gpubuf_connect(d.socket, &c), -EACCES);
        char want[128];
        snprintf(want, sizeof(want), "group '%s'", g ? g->gr_name : "?");
        ck_assert_message_has("permission denied", want, "socket_group=", "SocketGroup=");
        ck_assert_int_eq(chmod(d.socket, 0660), 0);
    }
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* --socket '' is refused with a reason (it was taken as unset: the daemon
 * listened on the default socket). Start-up reads the options as
 * --check-config does (read_config()); only --check-config is run here, so
 * that an old gpubufd would not listen on the system's socket. */
START_TEST(empty_socket_flag_is_refused) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket '' --pool p=host,capacity=16M --check-config 2>&1",
             GPUBUFD_PATH);
    capture_says(cmd, 2,
                 "gpubufd: --socket '': an empty socket path; name the socket to listen "
                 "on (--socket PATH)");
}
END_TEST

START_TEST(refused_connection_gets_its_reason) {
    test_daemon d;
    char conf[128], line[256];
    snprintf(conf, sizeof(conf), "%s/limits.conf", dir);
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nmax_clients = 2\n"), 0);
    const char *args[] = {"--config", conf, "--pool", "p=host,capacity=16M", NULL};
    td_start(&d, args);
    gpubuf_client *a = connect_retry(&d), *b = connect_retry(&d), *c = NULL;
    /* Old: "sending to gpubufd: Broken pipe" (GPUBUF_EDISCONNECTED). */
    ck_assert_int_eq(gpubuf_connect(d.socket, &c), -EUSERS);
    ck_assert_message_has("gpubufd refused the connection", "at most max_clients = 2",
                          "close connections you do not need", "raise max_clients");
    /* gpubufctl reports the same reason. */
    ctl_says(&d, "pools", 3, "refused the connection");
    gpubuf_disconnect(b);
    gpubuf_disconnect(a);
    ck_assert_int_eq(td_stop(&d), 0);

    /* Per uid. */
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nmax_clients_per_uid = 1\n"), 0);
    td_start(&d, args);
    a = connect_retry(&d);
    ck_assert_int_eq(gpubuf_connect(d.socket, &c), -EUSERS);
    snprintf(line, sizeof(line), "uid %u already has max_clients_per_uid = 1 connections",
             (unsigned)getuid());
    ck_assert_message_has("gpubufd refused the connection", line, "max_clients_per_uid");
    gpubuf_disconnect(a);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* ---- allocating ------------------------------------------------------- */

START_TEST(larger_than_the_pool_is_not_full) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(
        &d, TD_ARGS("--pool", "h=host,capacity=64M,slab=16M", "--pool", "g=host,capacity=16M"));
    gpubuf_buffer *b[8];
    /* Old: "pool 'h' is full: 0 of 67108864 bytes in slabs, 1099511627776 more needed". */
    ck_assert_int_eq(gpubuf_alloc(c, "h", 1ull << 40, NULL, &b[0]), GPUBUF_EPOOLFULL);
    ck_assert_message_has("1.0 TiB", "larger than pool 'h'", "capacity 64.0 MiB",
                          "ask for at most 64.0 MiB", "raise");
    ck_assert_ptr_null(strstr(gpubuf_last_error_message(), "is full"));
    /* Really full: four 16 MiB slabs taken. */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(gpubuf_alloc(c, "h", 16 << 20, NULL, &b[i]), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "h", 1 << 20, NULL, &b[4]), GPUBUF_EPOOLFULL);
    ck_assert_message_has("pool 'h' is full", "64.0 MiB of 64.0 MiB in slabs",
                          "16.0 MiB more needed", "release or delete buffers");
    for (int i = 0; i < 4; i++)
        gpubuf_release(b[i]);
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(unknown_pool_lists_the_pools) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(
        &d, TD_ARGS("--pool", "gpu0=host,capacity=16M", "--pool", "staging=host,capacity=16M"));
    gpubuf_buffer *b;
    /* Old: "no pool named 'nope'". */
    ck_assert_int_eq(gpubuf_alloc(c, "nope", 4096, NULL, &b), GPUBUF_ENOPOOL);
    ck_assert_message_has("no pool named 'nope'", "pools: gpu0, staging", "default pool 'gpu0'");
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(name_rule_and_size_zero) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(&d, ONE_POOL);
    gpubuf_buffer *b;
    /* Old: "invalid name '/x': 1..255 bytes of A-Z a-z 0-9 . _ : / @ + -", which lists '/'. */
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "/x", &b), -EINVAL);
    ck_assert_message_has("'/x'", "may not start with '/'", "use 'x'");
    ck_assert_int_eq(gpubuf_open(c, "a b", 0, &b), -EINVAL);
    ck_assert_message_has("'a b'", "at byte 1 is not allowed", "A-Z a-z 0-9");
    /* Old: -EINVAL with the previous call's message still there. */
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 0, "fine", &b), -EINVAL);
    ck_assert_message_has("size 0", "at least 1 byte");
    ck_assert_ptr_null(strstr(gpubuf_last_error_message(), "name"));
    /* The daemon gives the same rule to a client that does not check. */
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(last_error_message_belongs_to_the_last_call) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(&d, ONE_POOL);
    gpubuf_buffer *b, *s;
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_open(c, "missing", 0, &b), -ENOENT);
    ck_assert_message_has("missing");
    /* A success clears it... */
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "here", &b), 0);
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    /* ...and every failure has its own, argument checks included. */
    ck_assert_int_eq(gpubuf_stat(c, "missing", &info), -ENOENT);
    ck_assert_int_eq(gpubuf_buffer_slice(b, 4000, 200, &s), GPUBUF_ERANGE);
    ck_assert_message_has("slice");
    ck_assert_int_eq(gpubuf_seal(NULL), -EINVAL);
    ck_assert_message_has("NULL");
    ck_assert_int_eq(gpubuf_stat(NULL, "x", &info), -EINVAL);
    ck_assert_str_ne(gpubuf_last_error_message(), "");
    ck_assert_ptr_null(strstr(gpubuf_last_error_message(), "NULL) to seal"));
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    ck_assert_int_eq(gpubuf_seal_sync(b), GPUBUF_ESTATE);
    ck_assert_message_has("already sealed");
    ck_assert_int_eq(gpubuf_release(b), 0);
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    td_disconnect_stop(&d, c);
}
END_TEST

/* A name the caller gives comes back in a message as printable text: the
 * library's name rule and the daemon's "no pool named" write an escape as
 * "\x1b", so no message can drive the terminal that shows it. */
START_TEST(names_in_messages_are_escaped) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(&d, ONE_POOL);
    static const struct {
        const char *name, *says;
    } cases[] = {
        /* Old: "invalid name '/<ESC>[2J': ..." and "invalid name 'a!<ESC>[2J'". */
        {"/\033[2J", "invalid name '/\\x1b[2J'"},
        {"a!\033[2J", "invalid name 'a!\\x1b[2J': '!' at byte 1"},
        /* Old: "(not printable)" in place of the name. */
        {"\033[2J", "invalid name '\\x1b[2J': 0x1b at byte 0"},
        /* The daemon's sentence. Old: "no pool named '<ESC>]0;x<BEL>'". */
        {"/\033]0;x\a/y", "no pool named '\\x1b]0;x\\x07'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_int_lt(gpubuf_delete(c, cases[i].name), 0);
        const char *m = gpubuf_last_error_message();
        ck_assert_msg(strstr(m, cases[i].says) != NULL, "case %zu: %s", i, m);
        ck_assert_msg(!strchr(m, '\033') && !strchr(m, '\a'), "case %zu: raw control in %s", i, m);
    }
    td_disconnect_stop(&d, c);
}
END_TEST

/* ---- the example programs ------------------------------------------------ */

/* Old: "gpubuf-producer: bad size '12Q'", without the forms a size takes. */
START_TEST(producer_bad_size_lists_the_units) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/gpubuf-producer --size 12Q 2>&1", EXAMPLES_DIR);
    capture_says(cmd, 2, "bad size '12Q'", "K, M, G or T", "e.g. 4096, 64K, 256M, 8G");
    snprintf(cmd, sizeof(cmd), "%s/gpubuf-producer --size 2 2>&1", EXAMPLES_DIR);
    capture_says(cmd, 2, "size '2' is below 4 bytes");
}
END_TEST

/* The consumer says what it waits for before it blocks, and after the
 * timeout that the name was not found and where names are listed. Old: ten
 * seconds of silence, then only "open: timed out waiting for ...". */
START_TEST(consumer_says_what_it_waits_for) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/gpubuf-consumer --socket %s --name no/such --timeout 1500 2>&1",
             EXAMPLES_DIR, d.socket);
    char *out = td_capture_exit(cmd, 1);
    /* The wait is announced before it starts. */
    ck_assert_ptr_nonnull(strstr(out, "waiting up to"));
    ck_assert(strstr(out, "waiting up to") < strstr(out, "timed out"));
    says(out, WORDS("waiting up to 1.5 s for 'no/such' to be published and sealed",
                    "no sealed buffer 'no/such' was found within 1.5 s",
                    "'gpubufctl buffers' lists them"));
    /* A name that is there: no word about waiting. */
    snprintf(cmd, sizeof(cmd),
             "%s/gpubuf-producer --socket %s --name here --size 4K 2>&1 && "
             "%s/gpubuf-consumer --socket %s --name here 2>&1",
             EXAMPLES_DIR, d.socket, EXAMPLES_DIR, d.socket);
    out = td_capture_exit(cmd, 0);
    ck_assert_ptr_null(strstr(out, "waiting"));
    says(out, WORDS("0 mismatches"));
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* ---- gpubufctl ---------------------------------------------------------- */

/* gpubufctl with args exits with code and says says. */
typedef struct ctl_case {
    const char *args, *says;
    int code;
} ctl_case;

/* Run each of the n cases; check(case, output) checks more of each. */
static void ctl_cases(const test_daemon *d, const ctl_case *cases, size_t n,
                      void (*check)(const ctl_case *c, const char *out)) {
    for (size_t i = 0; i < n; i++) {
        char *out = ctl_exit(d, cases[i].args, cases[i].code);
        must_contain(out, cases[i].says);
        check(&cases[i], out);
        free(out);
    }
}

/* Usage errors point at --help instead of printing all of it. */
static void points_at_help(const ctl_case *c, const char *out) {
    if (c->code == 2 && strncmp(c->args, "--pool nope", 11))
        must_contain(out, "(see gpubufctl --help)");
    ck_assert_ptr_null(strstr(out, "Usage:"));
}

static void no_raw_control(const ctl_case *c, const char *out) {
    ck_assert_msg(!strchr(out, '\033') && !strchr(out, '\a'), "gpubufctl %s: raw control in %s",
                  c->args, out);
}

START_TEST(gpubufctl_names_bad_commands_and_values) {
    test_daemon d;
    const char *args[] = {"--pool", "gpu0=host,capacity=16M", "--pool", "staging=host", NULL};
    td_start(&d, args);
    static const ctl_case cases[] = {
        {"bogus", "unknown command 'bogus'; commands: status, pools", 2},
        {"--bogus", "unknown option '--bogus'", 2},
        {"-x", "unknown option '-x'", 2},
        {"--watch=1x pools", "bad --watch value '1x'", 2},
        {"--watch=0 pools", "bad --watch value '0'", 2},
        {"--pid abc clients", "bad --pid value 'abc'", 2},
        {"--uid -1 clients", "bad --uid value '-1'", 2},
        {"--state open buffers", "bad --state value 'open': give allocated, sealed or deleted", 2},
        {"pools extra", "'pools' takes no arguments, got 'extra'", 2},
        {"delete", "delete needs the name of a buffer", 2},
        {"--id pools", "--id goes with delete only", 2},
        {"delete --id x", "bad buffer id 'x'", 2},
        {"--pool", "option '--pool' needs a value", 2},
        /* Old: an empty table and exit 0. */
        {"--pool nope pools", "no pool named 'nope'; pools: gpu0, staging", 2},
        {"--pool nope --json buffers", "no pool named 'nope'", 2},
    };
    ctl_cases(&d, cases, sizeof(cases) / sizeof(cases[0]), points_at_help);
    ctl_says(NULL, "pools", 3, "Is gpubufd running?");
    char *out = ctl_exit(&d, "--pool gpu0 pools", 0);
    ck_assert_ptr_null(strstr(out, "staging"));
    says(out, WORDS("gpu0"));
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* As uid NOBODY, delete name with gpubufctl; exit 0 when it was refused with
 * a message that names the owner rule. */
static int delete_as_nobody(const test_daemon *d, const char *name, const char *stage,
                            const char *exe) {
    if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
        return 10;
    char cmd[1024];
    int code;
    snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s %s --socket %s delete %s 2>&1", stage, exe,
             d->socket, name);
    char *out = td_capture(cmd, &code);
    int rc = code == 4 && strstr(out, "only its owner or root may delete it") ? 0 : 11;
    if (rc)
        fprintf(stderr, "exit %d: %s\n", code, out);
    free(out);
    return rc;
}

START_TEST(gpubufctl_delete_by_name_and_id) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    /* The socket open to everyone: the ownership check is the daemon's. */
    ck_assert_int_eq(chmod(d.socket, 0666), 0);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    gpubuf_client *c = td_connect(&d);
    gpubuf_buffer *a, *b, *x;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "del/a", &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "del/b", &b), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "del/x", &x), 0);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(x), 0);
    uint64_t bid = gpubuf_buffer_id(b);
    gpubuf_release(a);
    gpubuf_release(b);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    if (getuid() == 0) {
        /* The build tree may be out of NOBODY's reach (a clone under a 0700
         * folder): it runs a copy of gpubufctl staged in /tmp. */
        char stage[64];
        char *exe = td_stage_public(GPUBUFCTL_PATH, stage);
        pid_t pid = fork();
        if (pid == 0)
            _exit(delete_as_nobody(&d, "del/x", stage, exe));
        ck_assert_int_eq(td_wait(pid), 0);
        td_unstage(stage);
        free(exe);
    }
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "delete del/a --id %llu", (unsigned long long)bid);
    /* "--id" makes every target an id: del/a is then a bad id. */
    free(ctl_exit(&d, cmd, 2));
    ctl_says(&d, "delete del/a", 0, "deleted del/a");
    snprintf(cmd, sizeof(cmd), "delete --id %llu", (unsigned long long)bid);
    free(ctl_exit(&d, cmd, 0));
    gpubuf_status *s = td_status(&d);
    ck_assert_ptr_null(td_find_buffer(s, "del/a"));
    ck_assert_ptr_null(td_find_buffer(s, "del/b"));
    ck_assert_ptr_nonnull(td_find_buffer(s, "del/x")); /* nobody may not, and held anyway */
    gpubuf_status_free(s);
    /* Unknown targets: exit 4, every target tried, a hint for numbers. */
    ctl_says(&d, "delete nope 12345", 4, "delete nope: no buffer named 'nope'",
             "use 'gpubufctl delete --id 12345'");
    gpubuf_release(x);
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(gpubufctl_watch_appends_lines_with_rates_when_piped) {
    test_daemon d;
    const char *args[] = {"--pool", "p=host,capacity=64M", NULL};
    td_start(&d, args);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "timeout -s INT 1.6 %s --socket %s -w 0.3 pools", GPUBUFCTL_PATH,
             d.socket);
    /* Requests while it watches: allocations of 1 MiB. */
    pid_t pid = fork();
    if (pid == 0) {
        gpubuf_client *c;
        if (gpubuf_connect(d.socket, &c) < 0)
            _exit(1);
        for (int i = 0; i < 60; i++) {
            gpubuf_buffer *b;
            if (gpubuf_alloc(c, NULL, 1 << 20, NULL, &b) < 0)
                _exit(2);
            gpubuf_release(b);
            gpubuf_flush(c);
            td_sleep_ms(20); /* paces the load the watch measures: a duration */
        }
        gpubuf_disconnect(c);
        _exit(0);
    }
    int code;
    char *out = td_capture(cmd, &code);
    ck_assert_int_eq(td_wait(pid), 0);
    /* No escape sequences into a pipe; one line per snapshot with rates. */
    ck_assert_ptr_null(strchr(out, '\033'));
    ck_assert_int_ge(td_count(out, "--- "), 3);
    ck_assert_int_ge(td_count(out, "POOL "), 3);
    must_contain(out, "requests -/s"); /* the first snapshot has no rates yet */
    /* A later one has some: requests per second and bytes allocated per second above 0. */
    bool moved = false;
    for (const char *p = out; (p = strstr(p, "requests ")); p++) {
        double rate;
        char unit[16];
        double bytes;
        if (sscanf(p, "requests %lf/s, allocated %lf %15s", &rate, &bytes, unit) == 3 && rate > 0 &&
            bytes > 0)
            moved = true;
    }
    ck_assert_msg(moved, "no moving rates in: %s", out);
    free(out);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

START_TEST(gpubufctl_watch_redraws_in_place_on_a_terminal) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        execl(GPUBUFCTL_PATH, "gpubufctl", "--socket", d.socket, "-w0.2", "pools", (char *)NULL);
        _exit(127);
    }
    char buf[16384];
    size_t len = 0;
    /* Until three snapshots came (one every 0.2 s; a deadline of 60 s for a
     * loaded machine). */
    uint64_t end = gpubuf_now_ns() + 60000000000ull;
    buf[0] = '\0';
    while (gpubuf_now_ns() < end && len < sizeof(buf) - 1 && td_count(buf, "\033[H\033[2J") < 3) {
        fd_set rd;
        struct timeval tv = {0, 100000};
        FD_ZERO(&rd);
        FD_SET(master, &rd);
        if (select(master + 1, &rd, NULL, NULL, &tv) > 0) {
            ssize_t n = read(master, buf + len, sizeof(buf) - 1 - len);
            if (n <= 0)
                break;
            len += (size_t)n;
            buf[len] = '\0';
        }
    }
    buf[len] = '\0';
    kill(pid, SIGINT);
    td_wait(pid);
    close(master);
    /* Each snapshot homes the cursor and clears the screen; no "--- " lines. */
    ck_assert_int_ge(td_count(buf, "\033[H\033[2J"), 3);
    ck_assert_int_eq(td_count(buf, "--- "), 0);
    must_contain(buf, "requests ");
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

START_TEST(gpubufctl_output_replaces_the_file) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    char path[128], cmd[256];
    snprintf(path, sizeof(path), "%s/gpubuf.prom", dir);
    snprintf(cmd, sizeof(cmd), "metrics --output %s", path);
    char *out = ctl_exit(&d, cmd, 0);
    ck_assert_str_eq(out, ""); /* nothing on stdout */
    free(out);
    snprintf(cmd, sizeof(cmd), "cat %s; ls %s", path, dir);
    out = td_capture_exit(cmd, -1);
    ck_assert_ptr_null(strstr(out, ".tmp.")); /* the temporary file was renamed */
    says(out, WORDS("# TYPE gpubuf_requests_total counter"));
    /* A directory that does not exist: exit 4, named. */
    ctl_says(&d, "metrics --output /nonexistent/dir/x.prom", 4,
             "cannot write /nonexistent/dir/x.prom");
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* --output never writes through a link it did not make. A link planted at
 * the old predictable temporary name (FILE.tmp.PID: the child plants it
 * for its own pid, then becomes gpubufctl) and one at FILE itself: the
 * files they point to keep their contents, FILE becomes a regular file
 * with the metrics, mode 0644 less the umask, and no temporary file stays.
 * Old: the metrics went into the planted link's target. */
START_TEST(gpubufctl_output_never_follows_a_planted_link) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    char path[128], victim[128], victim2[128];
    snprintf(path, sizeof(path), "%s/gpubuf.prom", dir);
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    snprintf(victim2, sizeof(victim2), "%s/victim2", dir);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? victim2 : victim, "w");
        ck_assert_ptr_nonnull(f);
        fputs("precious\n", f);
        ck_assert_int_eq(fclose(f), 0);
    }
    ck_assert_int_eq(symlink(victim, path), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char planted[192];
        snprintf(planted, sizeof(planted), "%s.tmp.%d", path, (int)getpid());
        if (symlink(victim2, planted) < 0)
            _exit(120);
        umask(022);
        execl(GPUBUFCTL_PATH, "gpubufctl", "--socket", d.socket, "metrics", "--output", path,
              (char *)NULL);
        _exit(127);
    }
    ck_assert_int_eq(td_wait(pid), 0);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cat %s %s", victim, victim2);
    char *out = td_capture_exit(cmd, -1);
    ck_assert_msg(strcmp(out, "precious\nprecious\n") == 0,
                  "the target of a planted link was written: %.80s", out);
    free(out);
    struct stat st;
    ck_assert_int_eq(lstat(path, &st), 0);
    ck_assert_msg(S_ISREG(st.st_mode), "%s is not a regular file", path);
    ck_assert_int_eq(st.st_mode & 07777, 0644);
    snprintf(cmd, sizeof(cmd), "cat %s", path);
    capture_says(cmd, -1, "# TYPE gpubuf_requests_total counter");
    /* No file of gpubufctl's stays: the planted link and the victims only. */
    snprintf(cmd, sizeof(cmd),
             "ls -A %s | grep -v -x -e gpubuf.prom -e victim -e victim2 "
             "-e 'gpubuf.prom.tmp.[0-9]*'",
             dir);
    out = td_capture_exit(cmd, -1);
    ck_assert_msg(out[0] == '\0', "left behind: %s", out);
    free(out);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Arguments gpubufctl repeats in a message have their control characters
 * escaped: no argument can clear the screen or retitle the terminal of the
 * one who reads the error. Old: "gpubufctl: delete <ESC>[2J: ...". */
START_TEST(gpubufctl_escapes_control_characters_in_arguments) {
    test_daemon d;
    td_start(&d, ONE_POOL);
    static const ctl_case cases[] = {
        {"delete '\033[2J'", "gpubufctl: delete \\x1b[2J: invalid name '\\x1b[2J'", 4},
        {"delete 'x\033[2J'", "gpubufctl: delete x\\x1b[2J: invalid name 'x\\x1b[2J'", 4},
        {"delete '/\033]0;x\a/y'", "no pool named '\\x1b]0;x\\x07'", 4},
        {"delete --id '1\033[2J'", "bad buffer id '1\\x1b[2J'", 2},
        {"'\033[2J'", "unknown command '\\x1b[2J'", 2},
        {"'-\033'", "unknown option '-\\x1b'", 2},
        {"'--\033[2J'", "unknown option '--\\x1b[2J'", 2},
        {"pools '\033[2J'", "got '\\x1b[2J'", 2},
        {"--state '\033[2J' buffers", "bad --state value '\\x1b[2J'", 2},
        {"--pid '\033' clients", "bad --pid value '\\x1b'", 2},
        {"--watch='\033' pools", "bad --watch value '\\x1b'", 2},
        {"--pool '\033[31m' pools", "no pool named '\\x1b[31m'", 2},
        {"-o '/nonexistent/\033[2J/x' metrics", "cannot write /nonexistent/\\x1b[2J/x", 4},
    };
    ctl_cases(&d, cases, sizeof(cases) / sizeof(cases[0]), no_raw_control);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Complete the words of line (the last one being completed) with the bash
 * completion script; returns COMPREPLY, one per line. */
static char *complete(const test_daemon *d, const char *line) {
    char cmd[2048], bindir[512];
    snprintf(bindir, sizeof(bindir), "%s", GPUBUFCTL_PATH);
    *strrchr(bindir, '/') = '\0';
    snprintf(cmd, sizeof(cmd),
             "PATH=%s:$PATH GPUBUF_SOCKET=%s bash -c 'source %s/ctl/completion/gpubufctl.bash; "
             "COMP_WORDS=(%s); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); "
             "COMP_LINE=\"${COMP_WORDS[*]}\"; _gpubufctl; printf \"%%s\\n\" \"${COMPREPLY[@]}\"'",
             bindir, d->socket, SOURCE_DIR, line);
    return td_capture_exit(cmd, 0);
}

/* The completion of line is exactly want. */
static void complete_is(const test_daemon *d, const char *line, const char *want) {
    char *out = complete(d, line);
    ck_assert_str_eq(out, want);
    free(out);
}

START_TEST(bash_completion) {
    test_daemon d;
    gpubuf_client *c =
        td_start_connect(&d, TD_ARGS("--pool", "gpu0=host,capacity=16M", "--pool", "staging=host"));
    gpubuf_buffer *b;
    gpubuf_buffer *b0;
    ck_assert_int_eq(gpubuf_alloc(c, "staging", 4096, "frame/1", &b), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "frame/0", &b0), 0);
    complete_is(&d, "gpubufctl de", "delete\n");
    complete_is(&d, "gpubufctl --po", "--pool\n");
    complete_is(&d, "gpubufctl --state s", "sealed\n");
    complete_is(&d, "gpubufctl --pool \"\"", "gpu0\nstaging\n");
    /* Names are per pool: a plain name for the default pool's buffers,
     * /POOL/NAME for every buffer. */
    complete_is(&d, "gpubufctl delete fr", "frame/0\n");
    complete_is(&d, "gpubufctl delete /st", "/staging/frame/1\n");
    says(complete(&d, "gpubufctl --json \"\""), WORDS("buffers\n", "metrics\n"));
    gpubuf_release(b);
    gpubuf_release(b0);
    td_disconnect_stop(&d, c);
}
END_TEST

/* Names are per pool: gpubufctl shows the pool and owner of each name and
 * where plain names are looked up; delete takes /POOL/NAME or --pool. */
START_TEST(gpubufctl_names_per_pool) {
    test_daemon d;
    gpubuf_client *c =
        td_start_connect(&d, TD_ARGS("--pool", "gpu0=host,capacity=16M", "--pool", "staging=host"));
    gpubuf_buffer *a, *b, *x;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "frames", &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "staging", 4096, "frames", &b), 0);
    /* The qualified form names the pool too, and must agree with it. */
    ck_assert_int_eq(gpubuf_alloc(c, "gpu0", 4096, "/staging/x", &x), -EINVAL);
    ck_assert_message_has("'/staging/x'", "pool 'staging'", "'gpu0'");
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "/staging/x", &x), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "/nosuch/x", &x), GPUBUF_ENOPOOL);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(x), 0);
    gpubuf_release(a);
    gpubuf_release(b);
    gpubuf_release(x);
    ctl_says(&d, "pools", 0, "names without a pool (not /POOL/NAME) are looked up in pool 'gpu0'");
    char *out = ctl_exit(&d, "buffers", -1);
    ck_assert_int_eq(td_count(out, "frames "), 2);
    says(out, WORDS("OWNER"));
    ctl_says(&d, "--json pools", -1, "\"default\":true", "\"publishers\":\"\"");
    /* A malformed qualified name is refused before the daemon sees it. */
    ctl_says(&d, "delete /staging", 4, "'/POOL/NAME' names buffer NAME of pool POOL");
    ctl_says(&d, "delete /staging/frames", 0, "deleted /staging/frames");
    ctl_says(&d, "--pool staging delete frames", 4, "no buffer named 'frames' in pool 'staging'");
    free(ctl_exit(&d, "--pool staging delete x", 0));
    gpubuf_status *s = td_status(&d);
    ck_assert_ptr_nonnull(td_find_buffer(s, "/gpu0/frames"));
    ck_assert_ptr_null(td_find_buffer(s, "/staging/frames"));
    ck_assert_ptr_null(td_find_buffer(s, "x"));
    gpubuf_status_free(s);
    free(ctl_exit(&d, "delete frames", 0));
    td_disconnect_stop(&d, c);
}
END_TEST

/* ---- counters ----------------------------------------------------------- */

static const gpubuf_request_counters *req(const gpubuf_status *s, const char *type) {
    for (size_t i = 0; i < s->counters.n_requests; i++)
        if (!strcmp(s->counters.requests[i].type, type))
            return &s->counters.requests[i];
    ck_abort_msg("no counters for %s", type);
    return NULL;
}

static uint64_t err_count(const gpubuf_status *s, int code) {
    for (size_t i = 0; i < s->counters.n_errors; i++)
        if (s->counters.errors[i].code == code)
            return s->counters.errors[i].count;
    return 0;
}

static uint64_t named(const gpubuf_named_counter *v, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i].name, name))
            return v[i].count;
    ck_abort_msg("no counter %s", name);
    return 0;
}

/* Open name in a child process (a client of its own) and exit. */
static int open_and_exit(const test_daemon *d, void *arg) {
    return td_open_once(d, arg, 0, 0, -1) < 0;
}

START_TEST(counters_move_with_requests) {
    test_daemon d;
    const char *args[] = {"--pool", "p=host,capacity=64M,slab=16M", NULL};
    td_start(&d, args);
    gpubuf_status *s0 = td_status(&d);
    ck_assert(s0->counters.present);
    ck_assert_int_eq(s0->counters.n_bounds, 19);
    gpubuf_client *c = td_connect(&d);
    gpubuf_buffer *a, *b, *x;
    ck_assert_int_eq(gpubuf_alloc(c, "p", 1000, "cnt/a", &a), 0); /* 1024 after alignment */
    ck_assert_int_eq(gpubuf_alloc(c, "p", 4096, NULL, &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_open(c, "cnt/none", 0, &x), -ENOENT);
    ck_assert_int_eq(gpubuf_open(c, "cnt/none", 50, &x), -ETIMEDOUT);
    ck_assert_int_eq(gpubuf_alloc(c, "p", 1ull << 30, NULL, &x), GPUBUF_EPOOLFULL);
    /* Another process opens cnt/a: it has nothing in that slab, an import. */
    ck_assert_int_eq(td_wait(td_spawn(open_and_exit, &d, "cnt/a")), 0);
    gpubuf_release(b);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    /* A client that sends garbage is disconnected for it. */
    int fd = td_raw_connect(&d, 60);
    char junk[256];
    ck_assert_int_eq(write(fd, "XXXXXXXXXXXXXXXX", 16), 16);
    while (read(fd, junk, sizeof(junk)) > 0)
        ;
    close(fd);
    ck_assert(td_wait_clients(&d, 1, 5000));
    gpubuf_status *s1 = td_status(&d);
    const gpubuf_counters *k0 = &s0->counters, *k1 = &s1->counters;
    ck_assert_uint_eq(req(s1, "alloc")->requests - req(s0, "alloc")->requests, 3);
    ck_assert_uint_eq(req(s1, "alloc")->errors - req(s0, "alloc")->errors, 1);
    ck_assert_uint_eq(req(s1, "open")->requests - req(s0, "open")->requests, 3);
    ck_assert_uint_eq(req(s1, "open")->errors - req(s0, "open")->errors, 2);
    ck_assert_uint_eq(req(s1, "seal")->requests - req(s0, "seal")->requests, 1);
    ck_assert_uint_eq(req(s1, "release")->requests - req(s0, "release")->requests, 2);
    ck_assert_uint_ge(req(s1, "hello")->requests - req(s0, "hello")->requests, 3);
    ck_assert_uint_eq(err_count(s1, -ENOENT) - err_count(s0, -ENOENT), 1);
    ck_assert_uint_eq(err_count(s1, -ETIMEDOUT) - err_count(s0, -ETIMEDOUT), 1);
    ck_assert_uint_eq(err_count(s1, GPUBUF_EPOOLFULL) - err_count(s0, GPUBUF_EPOOLFULL), 1);
    ck_assert_uint_eq(err_count(s1, GPUBUF_EPROTOCOL) - err_count(s0, GPUBUF_EPROTOCOL), 1);
    ck_assert_uint_eq(named(k1->disconnects, k1->n_disconnects, "protocol") -
                          named(k0->disconnects, k0->n_disconnects, "protocol"),
                      1);
    ck_assert_uint_eq(k1->open_timeouts - k0->open_timeouts, 1);
    ck_assert_uint_eq(k1->pools[0].bytes_allocated - k0->pools[0].bytes_allocated, 1024 + 4096);
    ck_assert_uint_eq(k1->pools[0].bytes_freed - k0->pools[0].bytes_freed, 4096);
    ck_assert_uint_eq(k1->pools[0].alloc_failures - k0->pools[0].alloc_failures, 1);
    ck_assert_uint_eq(k1->pools[0].slabs_created, 1);
    /* alloc by c maps the slab (1), the child's open of cnt/a (1). */
    ck_assert_uint_eq(k1->slab_imports - k0->slab_imports, 2);
    /* The child and the status connection of s0 came and went. */
    ck_assert_uint_ge(named(k1->disconnects, k1->n_disconnects, "closed") -
                          named(k0->disconnects, k0->n_disconnects, "closed"),
                      2);
    ck_assert_uint_ge(k1->connections - k0->connections, 3);
    /* Histogram: the buckets add up to the count. */
    for (size_t i = 0; i < k1->n_requests; i++) {
        uint64_t sum = 0;
        ck_assert_uint_eq(k1->requests[i].n_buckets, k1->n_bounds + 1);
        for (size_t j = 0; j < k1->requests[i].n_buckets; j++)
            sum += k1->requests[i].buckets[j];
        ck_assert_uint_eq(sum, k1->requests[i].requests);
    }
    ck_assert_uint_gt(req(s1, "alloc")->duration_ns, 0);
    gpubuf_status_free(s0);
    gpubuf_status_free(s1);

    /* The same through gpubufctl metrics, in Prometheus names. */
    ctl_says(&d, "metrics", 0, "gpubuf_requests_total{type=\"alloc\"} 3\n",
             "gpubuf_request_errors_total{type=\"open\"} 2\n",
             "gpubuf_errors_total{code=\"GPUBUF_EPOOLFULL\"} 1\n",
             "gpubuf_pool_allocated_bytes_total{pool=\"p\"} 5120\n",
             "gpubuf_pool_freed_bytes_total{pool=\"p\"} 4096\n", "gpubuf_open_timeouts_total 1\n",
             "gpubuf_request_duration_seconds_bucket{type=\"alloc\",le=\"+Inf\"} 3\n",
             "gpubuf_request_duration_seconds_count{type=\"alloc\"} 3\n",
             "# TYPE gpubuf_request_duration_seconds histogram\n");
    gpubuf_release(a);
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(counters_of_refusals) {
    test_daemon d;
    char conf[128];
    snprintf(conf, sizeof(conf), "%s/two.conf", dir);
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nmax_clients = 2\n"), 0);
    const char *args[] = {"--config", conf, "--pool", "p=host,capacity=16M", NULL};
    td_start(&d, args);
    gpubuf_client *c = connect_retry(&d), *c1 = connect_retry(&d), *c2;
    gpubuf_status *s0, *s1;
    ck_assert_int_eq(gpubuf_status_get(c, &s0), 0);
    ck_assert_int_eq(gpubuf_connect(d.socket, &c2), -EUSERS);
    ck_assert_int_eq(gpubuf_connect(d.socket, &c2), -EUSERS);
    ck_assert_int_eq(gpubuf_status_get(c, &s1), 0);
    ck_assert_uint_eq(named(s1->counters.refused, s1->counters.n_refused, "max_clients") -
                          named(s0->counters.refused, s0->counters.n_refused, "max_clients"),
                      2);
    ck_assert_uint_eq(named(s1->counters.refused, s1->counters.n_refused, "max_clients_per_uid"),
                      0);
    gpubuf_status_free(s0);
    gpubuf_status_free(s1);
    gpubuf_disconnect(c1);
    td_disconnect_stop(&d, c);
}
END_TEST

/* The items of batch requests, per batch type, through the library's
 * status and gpubufctl (table, JSON, metrics). */
START_TEST(batch_counters_are_shown) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(&d, TD_ARGS("--pool", "p=host,capacity=64M,slab=16M"));
    enum { N = 5 };
    uint64_t sizes[N];
    gpubuf_buffer *b[N], *o[N + 1];
    int st[N + 1];
    for (int i = 0; i < N; i++)
        sizes[i] = 4096;
    ck_assert_int_eq(gpubuf_alloc_many(c, "p", N, sizes, NULL, GPUBUF_ALLOC_SEAL, b, st), 0);
    uint64_t ids[N + 1];
    for (int i = 0; i < N; i++)
        ids[i] = gpubuf_buffer_id(b[i]);
    ids[N] = 999999; /* unknown: one item fails */
    ck_assert_int_eq(gpubuf_open_many(c, N + 1, NULL, ids, 0, o, st), 1);
    ck_assert_int_eq(st[N], -ENOENT);
    ck_assert_int_eq(gpubuf_release_many(o, N, st), 0);
    ck_assert_int_eq(gpubuf_release_many(b, N, st), 0);
    gpubuf_status *s = td_status(&d);
    const gpubuf_counters *k = &s->counters;
    ck_assert_uint_eq(k->n_batches, 5);
    uint64_t items[5] = {0}, errors[5] = {0};
    static const char *const types[5] = {"batch_open", "batch_release", "batch_alloc",
                                         "batch_seal", "batch_delete"};
    for (size_t i = 0; i < k->n_batches; i++)
        for (int t = 0; t < 5; t++)
            if (!strcmp(k->batches[i].type, types[t])) {
                items[t] = k->batches[i].items;
                errors[t] = k->batches[i].item_errors;
            }
    ck_assert_uint_eq(items[0], N + 1);
    ck_assert_uint_eq(errors[0], 1);
    ck_assert_uint_eq(items[1], 2 * N);
    ck_assert_uint_eq(errors[1], 0);
    ck_assert_uint_eq(items[2], N);
    gpubuf_status_free(s);
    ctl_says(&d, "metrics", 0, "# TYPE gpubuf_batch_items_total counter\n",
             "gpubuf_batch_items_total{type=\"batch_open\"} 6\n",
             "gpubuf_batch_item_errors_total{type=\"batch_open\"} 1\n",
             "gpubuf_batch_items_total{type=\"batch_release\"} 10\n");
    ctl_says(&d, "--json status", 0,
             "\"batches\":[{\"type\":\"batch_open\",\"items\":6,\"item_errors\":1}");
    ctl_says(&d, "status", 0,
             "batch items: open 6 (1 failed), release 10, alloc 5, seal 0, delete 0\n");
    td_disconnect_stop(&d, c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("usability");
    TCase *m = add_case(s, "messages", mkdir_tmp, rm_tmp, 60);
    add_tests(m, no_daemon_says_start_it_or_set_the_socket, stale_socket_says_restart_gpubufd,
              permission_error_names_the_socket_group, empty_socket_flag_is_refused,
              refused_connection_gets_its_reason, larger_than_the_pool_is_not_full,
              unknown_pool_lists_the_pools, name_rule_and_size_zero,
              last_error_message_belongs_to_the_last_call, names_in_messages_are_escaped,
              producer_bad_size_lists_the_units, consumer_says_what_it_waits_for);
    TCase *g = add_case(s, "gpubufctl", mkdir_tmp, rm_tmp, 60);
    add_tests(g, gpubufctl_names_bad_commands_and_values, gpubufctl_delete_by_name_and_id,
              gpubufctl_watch_appends_lines_with_rates_when_piped,
              gpubufctl_watch_redraws_in_place_on_a_terminal, gpubufctl_output_replaces_the_file,
              gpubufctl_output_never_follows_a_planted_link,
              gpubufctl_escapes_control_characters_in_arguments, bash_completion,
              gpubufctl_names_per_pool);
    TCase *k = add_case(s, "counters", mkdir_tmp, rm_tmp, 60);
    add_tests(k, counters_move_with_requests, counters_of_refusals, batch_counters_are_shown);
    return run_suite(s);
}
