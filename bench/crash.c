/* crash: how soon the daemon drops the references of a client killed with
 * SIGKILL. */
#include <signal.h>
#include <sys/wait.h>

#include "bench.h"

/* Crash cleanup: a client holding a reference is SIGKILLed; how long until
 * the daemon shows the reference gone, measured from the moment its socket
 * is closed (waitpid returns after the kernel has closed the process' fds). */
static void crash_setup(void) {
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    CHECK(gpubuf_alloc(c, g_pool, 4096, "bench/crash", &b));
    CHECK(gpubuf_seal_sync(b));
    gpubuf_disconnect(c);
}

static void crash_cleanup(void) {
    enum { N = 30 };
    double t[N];
    /* This process only asks for status: it never maps (or initialises
     * CUDA), so the children it forks can. */
    gpubuf_client *c = conn();
    gpubuf_buffer_info info;
    for (int i = 0; i < N; i++) {
        int p[2];
        if (pipe(p) < 0)
            _exit(1);
        fflush(NULL);
        pid_t k = fork();
        if (k == 0) {
            gpubuf_client *x = conn();
            gpubuf_buffer *o;
            CHECK(gpubuf_open(x, "bench/crash", 0, &o));
            if (write(p[1], "r", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char ch;
        if (read(p[0], &ch, 1) != 1)
            _exit(1);
        close(p[0]);
        close(p[1]);
        kill(k, SIGKILL);
        waitpid(k, NULL, 0);
        double a = now_us();
        for (;;) {
            CHECK(gpubuf_stat(c, "bench/crash", &info));
            if (info.refs == 0)
                break;
        }
        t[i] = now_us() - a;
    }
    report("crash_cleanup_after_close", t, N);
    gpubuf_delete(c, "bench/crash");
    gpubuf_disconnect(c);
}

int crash_phase(void) {
    return run_child(crash_setup) || run_child(crash_cleanup);
}
