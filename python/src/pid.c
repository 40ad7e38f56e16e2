/* This process's id, read once and again in a forked child, for the
 * checks that keep a forked child off its parent's connection and views
 * (gpubufpy.h). Below every other file of the extension. */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

static pid_t g_pid;

static void pid_after_fork(void) {
    g_pid = getpid();
}

int gpubufpy_pid_init(void) {
    g_pid = getpid();
    int r = pthread_atfork(NULL, NULL, pid_after_fork);
    if (r != 0) {
        errno = r;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

pid_t gpubufpy_pid(void) {
    return g_pid;
}
