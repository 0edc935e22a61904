/*
 * LD_PRELOAD shim: shifts a process's wall clock (CLOCK_REALTIME and its
 * coarse variant, gettimeofday, time) by a signed count of nanoseconds that
 * another process may change while this one runs. The monotonic clocks are
 * left alone.
 *
 * The shift is the first 8 bytes (a native int64) of the file named by
 * LEASEWORKER_CLOCK_SHIFT_FILE, mapped shared on the first call, so a write
 * to that file is seen by the next call. Without the variable, or without
 * the file, the clock is not shifted.
 *
 * Why not libfaketime: Debian's redis-server is linked with jemalloc, whose
 * start-up calls clock_gettime while libfaketime initialises through dlsym,
 * and the server hangs before it listens (libfaketime issue 130). This shim
 * never calls dlsym or malloc: the real clock is read by the raw syscall.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const int64_t *shift_map;
static int shift_state; /* 0: not looked for yet, 1: looked for */

static int64_t shift_ns(void)
{
    if (!__atomic_load_n(&shift_state, __ATOMIC_ACQUIRE)) {
        const char *path = getenv("LEASEWORKER_CLOCK_SHIFT_FILE");
        const int64_t *map = NULL;
        if (path != NULL) {
            int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                syscall(SYS_close, fd);
                if (p != MAP_FAILED)
                    map = p;
            }
        }
        /* Two threads racing here both map the file: one mapping leaks, both read the same. */
        __atomic_store_n(&shift_map, map, __ATOMIC_RELEASE);
        __atomic_store_n(&shift_state, 1, __ATOMIC_RELEASE);
    }
    const int64_t *map = __atomic_load_n(&shift_map, __ATOMIC_ACQUIRE);
    return map == NULL ? 0 : __atomic_load_n(map, __ATOMIC_RELAXED);
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    long rc = syscall(SYS_clock_gettime, clock, ts);
    if (rc != 0)
        return -1; /* errno set by syscall() */
    if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + shift_ns();
        ts->tv_sec = (time_t)(ns / 1000000000);
        ts->tv_nsec = (long)(ns % 1000000000);
        if (ts->tv_nsec < 0) {
            ts->tv_nsec += 1000000000;
            ts->tv_sec -= 1;
        }
    }
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
