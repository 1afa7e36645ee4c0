// storm.c  Hammer one device file with ioctls from several threads; report what was sent.
//
// USAGE: storm PATH THREADS SECONDS [CMD]
// Prints one JSON line: {"pid": ..., "calls": N, "seconds": S, "per_second": R}.
// Used by the storm test (losses are counted, the caller never blocks) and the benchmark.
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static int fd;
static unsigned long cmd = 0xc020462aUL;   // NV_ESC_RM_CONTROL
static double seconds;
static volatile int go;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *hammer(void *arg)
{
    uint64_t *calls = arg;
    unsigned char params[32] = {0};
    while (!go)
        ;
    double end = now() + seconds;
    while (1) {
        for (int i = 0; i < 256; i++)
            ioctl(fd, cmd, params);
        *calls += 256;
        if (now() >= end)
            break;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s PATH THREADS SECONDS [CMD]\n", argv[0]);
        return 2;
    }
    fd = open(argv[1], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    int threads = atoi(argv[2]);
    seconds = atof(argv[3]);
    if (argc > 4)
        cmd = strtoul(argv[4], NULL, 0);
    pthread_t ids[64];
    uint64_t calls[64] = {0};
    if (threads < 1 || threads > 64)
        return 2;
    for (int i = 0; i < threads; i++)
        pthread_create(&ids[i], NULL, hammer, &calls[i]);
    double start = now();
    go = 1;
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], NULL);
        total += calls[i];
    }
    double elapsed = now() - start;
    printf("{\"pid\": %d, \"calls\": %llu, \"seconds\": %.3f, \"per_second\": %.0f}\n",
           getpid(), (unsigned long long)total, elapsed, total / elapsed);
    fflush(stdout);
    if (argc > 5)        // hold: wait for a line on stdin before closing
        getchar();
    close(fd);
    return 0;
}
