// bench_probes.c  Micro-benchmarks for scripts/bench_probes.py: the cost of a syscall.
//
// USAGE: bench_probes ioctl PATH N | rmcontrol DEVICE N | getppid N | pingpong N [DEVICE]
// Prints nanoseconds per operation (per round trip for pingpong). `rmcontrol` needs the real
// NVIDIA driver: it allocates an RM client on DEVICE (/dev/nvidiactl) and times a cheap
// control that succeeds (NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS), as a CUDA program's calls do.
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    if (!strcmp(argv[1], "ioctl") && argc >= 4) {
        int fd = open(argv[2], O_RDWR | O_CREAT, 0600);
        long n = atol(argv[3]);
        unsigned char params[32] = {0};
        double start = now_ns();
        for (long i = 0; i < n; i++)
            ioctl(fd, 0xc020462aUL, params);   // NV_ESC_RM_CONTROL
        printf("%.1f\n", (now_ns() - start) / n);
        return 0;
    }
    if (!strcmp(argv[1], "rmcontrol") && argc >= 4) {
        // Layouts as a PyTorch load sent them to driver 580 (tests/data/real/h200/nvtrace):
        // NVOS64 for the alloc (all zero: a root client, the driver picks the handle),
        // NVOS54 for the control; each returns its RM status in the struct.
        struct { uint32_t root, parent, handle, cls; uint64_t params, rights;
                 uint32_t size, flags, status, pad; } alloc = {0};
        struct { uint32_t client, object, cmd, flags; uint64_t params;
                 uint32_t size, status; } control = {0};
        uint32_t ids[32];
        int fd = open(argv[2], O_RDWR);
        long n = atol(argv[3]);
        if (fd < 0 || ioctl(fd, 0xc030462bUL, &alloc) || alloc.status || !alloc.handle) {
            fprintf(stderr, "rmcontrol: no RM client on %s (status 0x%x)\n", argv[2], alloc.status);
            return 1;
        }
        control.client = control.object = alloc.handle;
        control.cmd = 0x201;
        control.params = (uintptr_t)ids;
        control.size = sizeof(ids);
        if (ioctl(fd, 0xc020462aUL, &control) || control.status) {
            fprintf(stderr, "rmcontrol: the control failed (status 0x%x)\n", control.status);
            return 1;
        }
        double start = now_ns();
        for (long i = 0; i < n; i++)
            ioctl(fd, 0xc020462aUL, &control);
        printf("%.1f\n", (now_ns() - start) / n);
        return 0;
    }
    if (!strcmp(argv[1], "getppid")) {
        long n = atol(argv[2]);
        double start = now_ns();
        for (long i = 0; i < n; i++)
            getppid();
        printf("%.1f\n", (now_ns() - start) / n);
        return 0;
    }
    if (!strcmp(argv[1], "pingpong")) {
        long n = atol(argv[2]);
        int there[2], back[2];
        char byte = 0;
        if (pipe(there) || pipe(back))
            return 1;
        if (argc > 3)
            open(argv[3], O_RDWR);          // a GPU process: tracked, its threads watched
        pid_t child = fork();
        if (child == 0) {
            for (long i = 0; i < n; i++) {
                if (read(there[0], &byte, 1) != 1 || write(back[1], &byte, 1) != 1)
                    _exit(1);
            }
            _exit(0);
        }
        double start = now_ns();
        for (long i = 0; i < n; i++) {
            if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1)
                return 1;
        }
        double elapsed = now_ns() - start;
        waitpid(child, NULL, 0);
        printf("%.1f\n", elapsed / n);
        return 0;
    }
    return 2;
}
