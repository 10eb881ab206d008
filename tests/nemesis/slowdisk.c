/*
 * The slow-disk nemesis of tests/nemesis (see nemeses.rs): loaded into a head replica with
 * LD_PRELOAD, it makes each fsync and fdatasync of the process wait first for the number of
 * milliseconds the file named by NEMESIS_SLOW_DISK_FILE holds (absent, empty or 0: no wait),
 * read at every call, so that the harness slows a replica's disk and heals it by writing that
 * file. A sync is what a slow disk makes slow for a raft log (writes land in the page cache);
 * this injects the latency at the process's own system calls, as libfiu's preloaded wrappers
 * do, because the machines this runs on have neither dm-delay nor cgroup v2's io.max to slow
 * a real block device.
 *
 * Built by the harness with the system's C compiler: cc -shared -fPIC -O2 -o slowdisk.so
 * slowdisk.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* The delay now, in milliseconds. */
static long delay_ms(void) {
    const char *path = getenv("NEMESIS_SLOW_DISK_FILE");
    if (path == NULL) {
        return 0;
    }
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved;
        return 0;
    }
    char text[32];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    errno = saved;
    if (n <= 0) {
        return 0;
    }
    text[n] = '\0';
    long ms = strtol(text, NULL, 10);
    return ms > 0 && ms < 600000 ? ms : 0;
}

static void wait_as_a_slow_disk(void) {
    long ms = delay_ms();
    if (ms <= 0) {
        return;
    }
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    int saved = errno;
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    wait_as_a_slow_disk();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    wait_as_a_slow_disk();
    return real(fd);
}
