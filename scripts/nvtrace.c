/* nvtrace.c: the real-GPU kit's recorder of one process's NVIDIA driver calls (harness only).
 *
 * gpuwhy itself never preloads anything into the processes it watches. This library exists
 * for the validation kit alone (scripts/gpu-kit.sh): preloaded into the kit's own PyTorch
 * load, it writes every ioctl that process sends to an NVIDIA character device, with the
 * parameter bytes before and after the driver saw them, so that the probe's decoding can
 * be checked on real traffic and the traffic replayed through the real probe here
 * (gpuwhy/app/demo/recorded.py, tests/privileged/test_fdtrack_recorded.py).
 *
 *   gcc -O2 -shared -fPIC -o libnvtrace.so scripts/nvtrace.c -ldl
 *   NVTRACE_OUT=calls.nvt NVTRACE_PTRS="..." LD_PRELOAD=./libnvtrace.so python3 load.py
 *
 * NVTRACE_PTRS names the pointers inside a call's parameters whose buffers are kept too:
 * entries "nr,size,ptr_off,len_off,fixed,nested" separated by ';' (scripts/gpu_kit.py
 * builds them from gpuwhy.nvioctl). size 0 matches any size; the buffer is len_off's u32
 * bytes long, or `fixed` when len_off is -1; nested 1 means the buffer is a wrapped call's
 * parameters (NV_ESC_IOCTL_XFER_CMD), whose escape is the u32 at the parent's offset 0 and
 * whose own pointers are looked up in turn. NVTRACE_MAX_BYTES caps the file (64 MiB).
 *
 * Cost: one fstat() per ioctl of the process, and for the NVIDIA ones two copies of the
 * parameters and one write(). Buffers are read with process_vm_readv, so a bad pointer in
 * a call costs a short read, never a crash.
 *
 * File: "NVTRACE1", then per call a record, little-endian, 8-byte aligned:
 *   u32 len (the whole record), u32 nbufs, u64 realtime_ns, u64 duration_ns, u64 request,
 *   u32 tid, s32 fd, u32 major, u32 minor, s32 ret, s32 err, char path[64] (NUL-padded),
 *   then nbufs buffers: u32 parent (0xffffffff for the call's own parameters), u32 field
 *   (offset of the pointer in the parent; bit 31 set for a wrapped call's parameters), u64 address, u32 wanted, u32 got,
 *   `got` bytes before the call, `got` bytes after it, padded to 8.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_BUFS 4
#define MAX_BUF 4096   /* bytes kept of one buffer; larger ones are cut (`wanted` says by how much) */
#define MAX_PTRS 32
#define MAX_MAJORS 16
#define NV_MAGIC 'F'
#define NESTED 0x80000000u   /* the buffer is a wrapped call's parameters */
#define TOP 0xffffffffu      /* the call's own parameters have no parent */

struct ptr_rule { uint32_t nr, size; int32_t ptr_off, len_off; uint32_t fixed, nested; };
struct buf {
    uint32_t parent, field;   /* field: the pointer's offset in the parent, | NESTED */
    uint64_t addr;
    uint32_t wanted, got;
    uint8_t before[MAX_BUF];
};
struct rec_head {
    uint32_t len, nbufs;
    uint64_t realtime_ns, duration_ns, request;
    uint32_t tid;
    int32_t fd;
    uint32_t major, minor;
    int32_t ret, err;
    char path[64];   /* the device file, as /proc/self/fd names it */
};

static int (*real_ioctl)(int, unsigned long, ...);
static int out_fd = -1;
static uint64_t written, max_bytes = 64ull << 20;
static struct ptr_rule rules[MAX_PTRS];
static int nrules;
static unsigned majors[MAX_MAJORS];
static int nmajors;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char device_dir[64];

static void load_majors(void)
{
    /* Character devices the driver registers: nvidia, nvidiactl, nvidia-uvm, nvidia-caps... */
    FILE *f = fopen("/proc/devices", "re");
    char line[128], name[96];
    unsigned major;
    int block = 0;
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Block", 5) == 0)
            block = 1;
        if (!block && nmajors < MAX_MAJORS && sscanf(line, "%u %95s", &major, name) == 2 &&
            strncmp(name, "nvidia", 6) == 0)
            majors[nmajors++] = major;
    }
    fclose(f);
}

static void load_rules(const char *spec)
{
    while (spec && *spec && nrules < MAX_PTRS) {
        struct ptr_rule r;
        if (sscanf(spec, "%u,%u,%d,%d,%u,%u", &r.nr, &r.size, &r.ptr_off, &r.len_off,
                   &r.fixed, &r.nested) == 6)
            rules[nrules++] = r;
        spec = strchr(spec, ';');
        if (spec)
            spec++;
    }
}

static void setup(void)
{
    real_ioctl = dlsym(RTLD_NEXT, "ioctl");
    const char *path = getenv("NVTRACE_OUT"), *cap = getenv("NVTRACE_MAX_BYTES");
    if (cap)
        max_bytes = strtoull(cap, NULL, 10);
    if (getenv("NVTRACE_DEVICE_DIR"))
        snprintf(device_dir, sizeof(device_dir), "%s/", getenv("NVTRACE_DEVICE_DIR"));
    load_rules(getenv("NVTRACE_PTRS"));
    load_majors();
    if (!path)
        return;
    out_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st;
    if (out_fd >= 0 && fstat(out_fd, &st) == 0 && st.st_size == 0 &&
        write(out_fd, "NVTRACE1", 8) != 8)
        out_fd = -1;
}

static int is_nvidia(int fd, unsigned *major, unsigned *minor, char *path)
{
    struct stat st;
    char link[32];
    if (out_fd < 0 || fstat(fd, &st) != 0)
        return 0;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, 63);
    path[n > 0 ? n : 0] = 0;
    /* Look-alike device files under NVTRACE_DEVICE_DIR count too: the recorder's own test. */
    if (device_dir[0] && S_ISREG(st.st_mode) && strncmp(path, device_dir, strlen(device_dir)) == 0)
        return 1;
    if (!S_ISCHR(st.st_mode))
        return 0;
    *major = major(st.st_rdev);
    *minor = minor(st.st_rdev);
    for (int i = 0; i < nmajors; i++)
        if (majors[i] == *major)
            return 1;
    return 0;
}

static uint32_t read_self(void *dst, uint64_t addr, uint32_t len)
{
    struct iovec local = {dst, len}, remote = {(void *)(uintptr_t)addr, len};
    ssize_t got = addr ? process_vm_readv(getpid(), &local, 1, &remote, 1, 0) : -1;
    return got > 0 ? (uint32_t)got : 0;
}

static uint64_t now(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const struct ptr_rule *rule_for(uint32_t nr, uint32_t size, int from)
{
    for (int i = from; i < nrules; i++)
        if (rules[i].nr == nr && (rules[i].size == 0 || rules[i].size == size))
            return &rules[i];
    return NULL;
}

int ioctl(int fd, unsigned long request, ...)
{
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    pthread_once(&once, setup);
    unsigned major = 0, minor = 0;
    char path[64];
    if (!is_nvidia(fd, &major, &minor, path) || written >= max_bytes)
        return real_ioctl(fd, request, arg);

    static __thread struct buf bufs[MAX_BUFS];
    int nbufs = 0;
    uint32_t cmd = (uint32_t)request;
    int frontend = ((cmd >> 8) & 0xff) == NV_MAGIC;
    uint32_t nr = frontend ? (cmd & 0xff) : cmd;
    uint32_t size = frontend ? ((cmd >> 16) & 0x3fff) : 0;
    /* UVM commands carry no size: keep a page's worth, as far as it is mapped. */
    uint32_t top = frontend ? size : 1024;
    bufs[0] = (struct buf){.parent = TOP, .addr = (uintptr_t)arg, .wanted = top};
    bufs[0].got = read_self(bufs[0].before, bufs[0].addr, top > MAX_BUF ? MAX_BUF : top);
    nbufs = 1;
    /* Pointers inside: the rules for this escape, and for a wrapped call's own escape. */
    for (int b = 0; b < nbufs && nbufs < MAX_BUFS; b++) {
        uint32_t bnr = nr, bsize = size;
        if (b > 0 && !(bufs[b].field & NESTED))
            continue;
        if (b > 0) {   /* a wrapped call's parameters: escape and size are the wrapper's */
            uint32_t inner[2] = {0, 0};
            memcpy(inner, bufs[bufs[b].parent].before, sizeof(inner));
            bnr = inner[0] & 0xff;
            bsize = inner[1];
        }
        if (!frontend)
            continue;
        for (const struct ptr_rule *r = rule_for(bnr, bsize, 0); r && nbufs < MAX_BUFS;
             r = rule_for(bnr, bsize, (int)(r - rules) + 1)) {
            uint64_t addr = 0;
            uint32_t len = r->fixed;
            if (r->ptr_off < 0 || (uint32_t)r->ptr_off + 8 > bufs[b].got)
                continue;
            memcpy(&addr, bufs[b].before + r->ptr_off, 8);
            if (r->len_off >= 0 && (uint32_t)r->len_off + 4 <= bufs[b].got)
                memcpy(&len, bufs[b].before + r->len_off, 4);
            struct buf *nb = &bufs[nbufs++];
            nb->parent = (uint32_t)b;
            nb->field = (uint32_t)r->ptr_off | (r->nested ? NESTED : 0);
            nb->addr = addr;
            nb->wanted = len;
            nb->got = read_self(nb->before, addr, len > MAX_BUF ? MAX_BUF : len);
        }
    }

    uint64_t t0 = now(CLOCK_REALTIME), m0 = now(CLOCK_MONOTONIC);
    int ret = real_ioctl(fd, request, arg);
    int err = ret < 0 ? errno : 0;
    uint64_t m1 = now(CLOCK_MONOTONIC);

    size_t total = sizeof(struct rec_head);
    for (int b = 0; b < nbufs; b++)
        total += 24 + ((2 * (size_t)bufs[b].got + 7) & ~(size_t)7);
    uint8_t *rec = malloc(total);
    if (rec) {
        struct rec_head *h = (struct rec_head *)rec;
        *h = (struct rec_head){.len = (uint32_t)total, .nbufs = (uint32_t)nbufs,
                               .realtime_ns = t0, .duration_ns = m1 - m0, .request = request,
                               .tid = (uint32_t)syscall(SYS_gettid), .fd = fd,
                               .major = major, .minor = minor, .ret = ret, .err = err};
        memcpy(h->path, path, sizeof(h->path));
        uint8_t *p = rec + sizeof(*h);
        for (int b = 0; b < nbufs; b++) {
            struct buf *bf = &bufs[b];
            memcpy(p, &bf->parent, 4);
            memcpy(p + 4, &bf->field, 4);
            memcpy(p + 8, &bf->addr, 8);
            memcpy(p + 16, &bf->wanted, 4);
            memcpy(p + 20, &bf->got, 4);
            p += 24;
            memcpy(p, bf->before, bf->got);
            read_self(p + bf->got, bf->addr, bf->got);   /* after: what the driver wrote */
            p += (2 * (size_t)bf->got + 7) & ~(size_t)7;
        }
        memset(p, 0, (size_t)(rec + total - p));
        if (write(out_fd, rec, total) == (ssize_t)total)
            __atomic_add_fetch(&written, total, __ATOMIC_RELAXED);
        free(rec);
    }
    if (ret < 0)
        errno = err;
    return ret;
}
