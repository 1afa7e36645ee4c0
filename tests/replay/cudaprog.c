/* cudaprog.c  A "CUDA application" for the CUDA uprobe tests: links the fake libcuda.so.1 and
 * libcudart.so.12 (tests/replay/fakecuda*.c), holds look-alike device files open (argv[1..])
 * so that fdtrack takes it for a GPU process, and calls the traced functions with known
 * arguments on command (stdin, one per line):
 *   round     one round of calls (see do_round); prints its results as JSON
 *   loop      rounds in a worker thread (always the same one) until `stop`, which prints
 *             how many rounds so far and in how many the results differed from the first's
 *   addrs     prints the addresses of a few traced functions and of an untraced one
 *   bench N   ns per call: N calls to a traced driver function, a traced runtime function
 *             (which calls the driver: two probe pairs), and an untraced one
 *   bad N     N launches with a NULL config (an argument the probe cannot read); prints
 *             the sum of the error codes
 *   quit
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "fakecuda.h"

unsigned long long fakecuda_launched_threads(void);

struct result { unsigned long long checksum, threads; int rc_sum; };

static unsigned long long fnv(const unsigned char *p, size_t n)
{
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static struct result do_round(void)
{
    struct result r = {0, 0, 0};
    unsigned long long threads_before = fakecuda_launched_threads();
    CUdeviceptr d1 = 0, bad = 0;
    void *d2 = 0, *hp = 0, *hp2 = 0;
    unsigned char *hpage = malloc(1 << 20), *hreg = malloc(1 << 20);
    CUstream s = (CUstream)0x1;
    CUfunction f = (CUfunction)0x2;
    for (int i = 0; i < (1 << 20); i++) {
        hpage[i] = (unsigned char)(i * 7);
        hreg[i] = (unsigned char)(i * 13);
    }
    /* allocations: 1 MiB + 3 MiB device, one failure, 2 MiB + 512 KiB pinned, 1 MiB registered */
    r.rc_sum += cuMemAlloc_v2(&d1, 1 << 20);
    r.rc_sum += cudaMalloc(&d2, 3 << 20);
    r.rc_sum += cuMemAlloc_v2(&bad, 1ULL << 50);                 /* fails: out of memory */
    r.rc_sum += cuMemHostAlloc(&hp, 2 << 20, 0);
    r.rc_sum += cudaHostAlloc(&hp2, 512 << 10, 0);
    r.rc_sum += cuMemHostRegister_v2(hreg, 1 << 20, 0);
    memset(hp, 0x5a, 2 << 20);
    memset(hp2, 0xa5, 512 << 10);
    /* copies */
    r.rc_sum += cuMemcpyHtoD_v2(d1, (char *)hp + 4096, 65536);          /* htod pinned */
    r.rc_sum += cuMemcpyHtoD_v2(d1, hpage, 1 << 20);                     /* htod pageable */
    r.rc_sum += cuMemcpyDtoH_v2(hpage, d1, 300000);                      /* dtoh pageable */
    r.rc_sum += cuMemcpyHtoDAsync_v2(d1, hp2, 524288, s);               /* htod pinned async */
    r.rc_sum += cuMemcpyDtoHAsync_v2(hreg + 100, d1, 4000, s);          /* dtoh pinned async */
    r.rc_sum += cuMemcpyDtoD_v2((CUdeviceptr)d2, d1, 1000);             /* dtod */
    r.rc_sum += cudaMemcpy(d2, hpage, 200000, cudaMemcpyHostToDevice);  /* htod pageable */
    r.rc_sum += cudaMemcpy(hp2, d2, 100000, cudaMemcpyDeviceToHost);    /* dtoh pinned */
    r.rc_sum += cudaMemcpyAsync(d2, hp, 4096, cudaMemcpyDefault, s);    /* htod pinned async */
    r.rc_sum += cuMemcpy((CUdeviceptr)hpage, d1, 5000);                 /* unknown */
    r.rc_sum += cudaMemcpy(hpage, hpage + 500000, 1000, cudaMemcpyHostToHost); /* htoh */
    /* launches: grid 8 x block 128 (x3), 1000 x 256, 256 x 512 (x5), 27 x 128 */
    for (int i = 0; i < 3; i++)
        r.rc_sum += cuLaunchKernel(f, 4, 2, 1, 128, 1, 1, 0, s, 0, 0);
    CUlaunchConfig config = {1000, 1, 1, 256, 1, 1, 0, s, 0, 0};
    r.rc_sum += cuLaunchKernelEx(&config, f, 0, 0);
    dim3 grid = {16, 16, 1}, block = {32, 8, 2};
    for (int i = 0; i < 5; i++)
        r.rc_sum += cudaLaunchKernel(f, grid, block, 0, 0, s);
    cudaLaunchConfig_t rt_config = {{3, 3, 3}, {64, 2, 1}, 0, s, 0, 0};
    r.rc_sum += cudaLaunchKernelExC(&rt_config, f, 0);
    /* graphs: 2 driver, 3 runtime */
    for (int i = 0; i < 2; i++)
        r.rc_sum += cuGraphLaunch((CUgraphExec)0x3, s);
    for (int i = 0; i < 3; i++)
        r.rc_sum += cudaGraphLaunch((CUgraphExec)0x3, s);
    /* syncs: stream 20 ms x2, ctx 30 ms, event 10 ms, and the runtime's three */
    r.rc_sum += cuStreamSynchronize(s);
    r.rc_sum += cuStreamSynchronize(s);
    r.rc_sum += cuCtxSynchronize();
    r.rc_sum += cuEventSynchronize((CUevent)0x4);
    r.rc_sum += cudaDeviceSynchronize();
    r.rc_sum += cudaStreamSynchronize(s);
    r.rc_sum += cudaEventSynchronize((cudaEvent_t)0x4);
    /* the results, before the memory goes */
    r.checksum = fnv((unsigned char *)d1, 1 << 20) ^ fnv(d2, 3 << 20) ^ fnv(hpage, 1 << 20) ^
                 fnv(hp2, 512 << 10) ^ fnv(hreg, 1 << 20);
    /* frees: 2 device, 3 host */
    r.rc_sum += cuMemFree_v2(d1);
    r.rc_sum += cudaFree(d2);
    r.rc_sum += cuMemFreeHost(hp);
    r.rc_sum += cudaFreeHost(hp2);
    r.rc_sum += cuMemHostUnregister(hreg);
    for (int i = 0; i < 10; i++) {                 /* untraced */
        int version;
        r.rc_sum += cuDriverGetVersion(&version);
    }
    free(hpage);
    free(hreg);
    r.threads = fakecuda_launched_threads() - threads_before;
    return r;
}

static void print_result(struct result r)
{
    printf("{\"checksum\": %llu, \"threads\": %llu, \"rc_sum\": %d}\n", r.checksum, r.threads,
           r.rc_sum);
    fflush(stdout);
}

static volatile int looping, worker_idle = 1;
static long loop_rounds, loop_mismatches;

/* One worker thread for every `loop`: its per-thread probe state carries over. */
static void *loop_thread(void *arg)
{
    struct result first = {0, 0, 0};
    for (;;) {
        if (!looping) {
            worker_idle = 1;
            usleep(1000);
            continue;
        }
        struct result r = do_round();
        if (loop_rounds++ == 0)
            first = r;
        else if (r.checksum != first.checksum || r.threads != first.threads ||
                 r.rc_sum != first.rc_sum)
            loop_mismatches++;
    }
    return 0;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void bench(long n)
{
    int version;
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        cuGraphLaunch((CUgraphExec)0x3, 0);
    double t1 = now_ns();
    for (long i = 0; i < n; i++)
        cudaGraphLaunch((CUgraphExec)0x3, 0);
    double t2 = now_ns();
    for (long i = 0; i < n; i++)
        cuDriverGetVersion(&version);
    double t3 = now_ns();
    printf("{\"traced_ns\": %.1f, \"traced_nested_ns\": %.1f, \"untraced_ns\": %.1f}\n",
           (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    char line[128];
    pthread_t thread;
    int worker_started = 0;
    for (int i = 1; i < argc; i++)
        if (open(argv[i], O_RDWR) < 0) {
            perror(argv[i]);
            return 1;
        }
    printf("{\"pid\": %d}\n", getpid());
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin)) {
        if (!strncmp(line, "round", 5)) {
            print_result(do_round());
        } else if (!strncmp(line, "loop", 4)) {
            worker_idle = 0;
            looping = 1;
            if (!worker_started && pthread_create(&thread, 0, loop_thread, 0) == 0)
                worker_started = 1;
        } else if (!strncmp(line, "stop", 4)) {
            looping = 0;
            while (!worker_idle)
                usleep(1000);
            printf("{\"rounds\": %ld, \"mismatches\": %ld}\n", loop_rounds, loop_mismatches);
            fflush(stdout);
        } else if (!strncmp(line, "addrs", 5)) {
            printf("{\"cuStreamSynchronize\": %lu, \"cuLaunchKernel\": %lu, \"cudaMemcpy\": %lu, "
                   "\"cudaLaunchKernel\": %lu, \"cuDriverGetVersion\": %lu}\n",
                   (unsigned long)&cuStreamSynchronize, (unsigned long)&cuLaunchKernel,
                   (unsigned long)&cudaMemcpy, (unsigned long)&cudaLaunchKernel,
                   (unsigned long)&cuDriverGetVersion);
            fflush(stdout);
        } else if (!strncmp(line, "bench", 5)) {
            bench(atol(line + 5));
        } else if (!strncmp(line, "bad", 3)) {
            long n = atol(line + 3), sum = 0;
            for (long i = 0; i < n; i++)
                sum += cuLaunchKernelEx(0, 0, 0, 0);
            printf("{\"rc_sum\": %ld}\n", sum);
            fflush(stdout);
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
    }
    return 0;
}
