// cuda.bpf.c  Host-side CUDA API calls of GPU processes: launches, copies, syncs, allocations.
//
// Two programs, cuda_enter and cuda_leave, attached by probes/cuda/probe.py through uprobe_multi
// links (one entry and one return link per library per process, only to processes that
// hold NVIDIA fds, only to libraries whose build id is allowed). Each uprobe's cookie says
// which function it is: id | shape << 8 | arg << 16 (probes/cuda/libraries.py's FUNCTIONS; the
// SH_* shapes come from there as cflags).
//
//  - `config.enabled` is checked first: the kill switch takes effect at once, before the
//    links are closed. Turned on again, `config.epoch` changes, which voids the calls that
//    were in flight (their returns were not seen).
//  - Only the outermost traced call of a thread is counted: cudaMemcpy calling cuMemcpy is one
//    copy. Nesting is told by the stack pointer: a call entered at or below the in-flight
//    call's frame is nested (or a tail call); one entered above it means the in-flight
//    call's return was never seen.
//  - Figures accumulate per process in a map the CPUs add to atomically (user space reads
//    it every second); single calls go to the ring buffer only when slow, big or failed,
//    within a budget.
//  - Pinned host memory is known from the allocations and registrations seen since attach.
#include <uapi/linux/ptrace.h>

#define GRID_BUCKETS 32
#define BLOCK_BUCKETS 16
#define LAT_BUCKETS 32
#define PINNED_SLOTS 128
#define SH_CALIBRATE 0xFF          // the load-time measurement of the trap cost: count nothing
#define ASYNC_FLAG 0x10000        // in call_t.fn: an async copy
#define RET_SP_DELTA 8           // x86-64: `ret` pops the return address before the uretprobe

// Same order as DIRECTIONS, SYNC_KINDS, LAUNCH_KINDS, GRAPH_KINDS and DROP_REASONS in
// probes/cuda/probe.py.
enum direction { DIR_HTOD, DIR_DTOH, DIR_DTOD, DIR_HTOH, DIR_UNKNOWN, DIRECTIONS };
enum drop_reason { DROP_RINGBUF, DROP_RATE_LIMITED, DROP_STATS_FULL, DROP_ALLOCS_FULL,
                   DROP_PINNED_FULL, DROP_INFLIGHT, DROP_STALE, DROP_READ, DROP_REASONS };
// cudaMemcpyKind
#define KIND_HTOH 0
#define KIND_HTOD 1
#define KIND_DTOH 2
#define KIND_DTOD 3
// Reasons of a single-call record.
#define R_SLOW 1
#define R_BIG 2
#define R_ERROR 4
// Pinned state of a copy's host side.
#define HOST_NONE 0
#define HOST_PINNED 1
#define HOST_PAGEABLE 2

struct config_t {
    u32 enabled;
    u32 epoch;               // raised when turned on again: calls in flight before are void
    u32 events_per_sec;
    u32 reserved;
    u64 slow_ns;
    u64 big_bytes;
};

struct call_t {                  // per thread: the outermost traced call in flight
    u32 active;
    u32 fn;
    u32 epoch;
    u32 reserved;
    u64 sp;
    u64 ts;
    u64 a0, a1, a2, a3;
};

struct copy_t { u64 count, bytes, ns, async_count, pinned_bytes, pageable_bytes; };
struct sync_t { u64 count, blocked_ns; };

struct cuda_stats_t {
    u64 launches[4];
    u64 graph_launches[2];
    u64 grid_log2[GRID_BUCKETS];     // blocks per launch (gridDim.x*y*z), log2 buckets
    u64 block_log2[BLOCK_BUCKETS];   // threads per block (blockDim.x*y*z), log2 buckets
    struct copy_t copies[DIRECTIONS];
    struct sync_t syncs[6];
    u64 sync_log2[LAT_BUCKETS];      // ns blocked per sync call, log2 buckets
    u64 allocs, alloc_bytes, frees, free_bytes, host_allocs, host_alloc_bytes, host_frees;
    u64 registers, register_bytes;
    u64 calls;                       // outermost traced calls
    u64 errors;                      // calls that returned an error code
    u64 hits;                        // program runs (entry and return), for the overhead
    u64 prog_ns;                     // time spent in these programs
};

struct alloc_key_t { u32 tgid; u32 reserved; u64 ptr; };
struct pinned_t { u64 base[PINNED_SLOTS]; u64 end[PINNED_SLOTS]; };

struct record_t {
    u32 tgid;
    u32 tid;
    u32 fn;
    u32 reasons;
    u64 ktime_ns;
    u64 latency_ns;
    u64 bytes;
    s64 ret;
    u32 direction;
    u32 host;                        // HOST_*
};

struct budget_t { u64 window; u32 used; u32 reserved; };

BPF_ARRAY(config, struct config_t, 1);
// One value a process for all CPUs, added to atomically (ADD): a per-CPU value would be kept
// for every possible CPU and preallocated for every entry, over 1 KB x 224 x MAX_PROCS on a
// 224-CPU host. A uprobe's trap costs microseconds; an atomic add, nanoseconds.
BPF_HASH(stats, u32, struct cuda_stats_t, MAX_PROCS);
BPF_ARRAY(zero_stats, struct cuda_stats_t, 1);
BPF_PERCPU_ARRAY(drops, u64, DROP_REASONS);
BPF_PERCPU_ARRAY(budget, struct budget_t, 1);
BPF_HASH(dev_allocs, struct alloc_key_t, u64, MAX_ALLOCS);
BPF_HASH(pinned, u32, struct pinned_t, MAX_PROCS);
BPF_PERCPU_ARRAY(zero_pinned, struct pinned_t, 1);
BPF_TASK_STORAGE(inflight, struct call_t);
BPF_RINGBUF_OUTPUT(records, RINGBUF_PAGES);

#define ADD(field, n) __sync_fetch_and_add(&(field), (n))

static __always_inline void count_drop(int reason)
{
    u64 *counter = drops.lookup(&reason);
    if (counter)
        (*counter)++;
}

static __always_inline struct cuda_stats_t *stats_of(u32 tgid)
{
    struct cuda_stats_t *s = stats.lookup(&tgid);
    if (s)
        return s;
    int zero = 0;
    struct cuda_stats_t *init = zero_stats.lookup(&zero);
    if (!init || stats.update(&tgid, init) != 0) {
        count_drop(DROP_STATS_FULL);
        return 0;
    }
    return stats.lookup(&tgid);
}

static __always_inline u32 log2_bucket(u64 v, u32 buckets)
{
    u32 b = 0;
    if (v >> 32) { v >>= 32; b += 32; }
    if (v >> 16) { v >>= 16; b += 16; }
    if (v >> 8) { v >>= 8; b += 8; }
    if (v >> 4) { v >>= 4; b += 4; }
    if (v >> 2) { v >>= 2; b += 2; }
    if (v >> 1) { b += 1; }
    return b < buckets ? b : buckets - 1;
}

static __always_inline u32 host_state(u32 tgid, u64 ptr)
{
    struct pinned_t *p = pinned.lookup(&tgid);
    if (!p)
        return HOST_PAGEABLE;
#pragma clang loop unroll(disable)
    for (int i = 0; i < PINNED_SLOTS; i++) {
        if (p->end[i] && p->base[i] <= ptr && ptr < p->end[i])
            return HOST_PINNED;
    }
    return HOST_PAGEABLE;
}

static __always_inline void pin(u32 tgid, u64 base, u64 size)
{
    struct pinned_t *p = pinned.lookup(&tgid);
    if (!p) {
        int zero = 0;
        struct pinned_t *empty = zero_pinned.lookup(&zero);   // larger than the BPF stack
        if (!empty || pinned.update(&tgid, empty) != 0) {
            count_drop(DROP_PINNED_FULL);
            return;
        }
        p = pinned.lookup(&tgid);
        if (!p)
            return;
    }
#pragma clang loop unroll(disable)
    for (int i = 0; i < PINNED_SLOTS; i++) {
        if (p->end[i] == 0) {
            p->base[i] = base;
            p->end[i] = base + size;
            return;
        }
    }
    count_drop(DROP_PINNED_FULL);
}

static __always_inline int unpin(u32 tgid, u64 base)
{
    struct pinned_t *p = pinned.lookup(&tgid);
    if (!p)
        return 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < PINNED_SLOTS; i++) {
        if (p->end[i] && p->base[i] == base) {
            p->end[i] = 0;
            return 1;
        }
    }
    return 0;
}

// Which side a pointer of a cuMemcpy/cudaMemcpyDefault is on: 1 device, 2 host, 0 unknown.
static __always_inline u32 side_of(u32 tgid, u64 ptr)
{
    struct alloc_key_t key = {.tgid = tgid, .ptr = ptr};
    if (dev_allocs.lookup(&key))
        return 1;
    return host_state(tgid, ptr) == HOST_PINNED ? 2 : 0;
}

static __always_inline int within_budget(struct config_t *cfg)
{
    int zero = 0;
    struct budget_t *b = budget.lookup(&zero);
    if (!b)
        return 0;
    u64 window = bpf_ktime_get_ns() / 1000000000ULL;
    if (b->window != window) {
        b->window = window;
        b->used = 0;
    }
    if (b->used >= cfg->events_per_sec) {
        count_drop(DROP_RATE_LIMITED);
        return 0;
    }
    b->used++;
    return 1;
}

static __always_inline void count_launch(struct cuda_stats_t *s, u32 which, u64 grid, u64 block)
{
    ADD(s->launches[which & 3], 1);
    ADD(s->grid_log2[log2_bucket(grid, GRID_BUCKETS)], 1);
    ADD(s->block_log2[log2_bucket(block, BLOCK_BUCKETS)], 1);
}

// Launch dimensions are read at entry (the arguments are gone at return).
static __always_inline void launch_at_entry(struct pt_regs *ctx, u32 shape,
                                            struct cuda_stats_t *s)
{
    u64 gx, gy, gz, bx, by, bz;
    if (shape == SH_LAUNCH_DRV) {
        // cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, shmem, stream, ...)
        u32 z = 0;
        gx = (u32)PT_REGS_PARM2(ctx);
        gy = (u32)PT_REGS_PARM3(ctx);
        gz = (u32)PT_REGS_PARM4(ctx);
        bx = (u32)PT_REGS_PARM5(ctx);
        by = (u32)PT_REGS_PARM6(ctx);
        // The 7th argument is on the stack, above the return address.
        if (bpf_probe_read_user(&z, sizeof(z), (void *)(PT_REGS_SP(ctx) + 8)) != 0)
            count_drop(DROP_READ);
        bz = z;
        count_launch(s, 0, gx * gy * gz, bx * by * bz);
    } else if (shape == SH_LAUNCH_RT) {
        // cudaLaunchKernel(func, dim3 grid, dim3 block, args, shmem, stream): each 12-byte
        // dim3 is two INTEGER eightbytes in the SysV ABI, (x | y << 32) and z.
        u64 grid_xy = PT_REGS_PARM2(ctx), block_xy = PT_REGS_PARM4(ctx);
        gx = (u32)grid_xy;
        gy = grid_xy >> 32;
        gz = (u32)PT_REGS_PARM3(ctx);
        bx = (u32)block_xy;
        by = block_xy >> 32;
        bz = (u32)PT_REGS_PARM5(ctx);
        count_launch(s, 2, gx * gy * gz, bx * by * bz);
    } else {
        // cuLaunchKernelEx(const CUlaunchConfig *) / cudaLaunchKernelExC(const
        // cudaLaunchConfig_t *): both start with gridDim x, y, z then blockDim x, y, z.
        u32 dims[6] = {};
        if (bpf_probe_read_user(dims, sizeof(dims), (void *)PT_REGS_PARM1(ctx)) != 0)
            count_drop(DROP_READ);
        count_launch(s, shape == SH_LAUNCH_DRV_EX ? 1 : 3,
                     (u64)dims[0] * dims[1] * dims[2], (u64)dims[3] * dims[4] * dims[5]);
    }
}

// What a call did, once it returned.
static __always_inline void finish(struct pt_regs *ctx, u32 fn, u32 shape, struct call_t *call,
                                   u64 now, u32 tgid, struct cuda_stats_t *s,
                                   struct config_t *cfg)
{
    if (shape == SH_CALIBRATE)
        return;
    s64 ret = (s32)PT_REGS_RC(ctx);
    u64 latency = now - call->ts;
    u64 bytes = 0;
    u32 direction = DIR_UNKNOWN, host = HOST_NONE, big = 0;
    ADD(s->calls, 1);
    if (ret != 0)
        ADD(s->errors, 1);

    if (shape >= SH_COPY_HTOD && shape <= SH_COPY_KIND && ret == 0) {
        // a0 = dst, a1 = src, a2 = bytes, a3 = kind (SH_COPY_KIND) or async flag
        u64 dst = call->a0, src = call->a1, host_ptr = 0;
        bytes = call->a2;
        if (shape == SH_COPY_HTOD) {
            direction = DIR_HTOD;
        } else if (shape == SH_COPY_DTOH) {
            direction = DIR_DTOH;
        } else if (shape == SH_COPY_DTOD) {
            direction = DIR_DTOD;
        } else {
            u32 kind = (u32)call->a3;
            if (shape == SH_COPY_KIND && kind == KIND_HTOD) direction = DIR_HTOD;
            else if (shape == SH_COPY_KIND && kind == KIND_DTOH) direction = DIR_DTOH;
            else if (shape == SH_COPY_KIND && kind == KIND_DTOD) direction = DIR_DTOD;
            else if (shape == SH_COPY_KIND && kind == KIND_HTOH) direction = DIR_HTOH;
            else {   // cuMemcpy / cudaMemcpyDefault: unified addressing; ask what we saw
                u32 d = side_of(tgid, dst), r = side_of(tgid, src);
                if (r == 2 && d == 1) direction = DIR_HTOD;
                else if (r == 1 && d == 2) direction = DIR_DTOH;
                else if (r == 1 && d == 1) direction = DIR_DTOD;
                else if (r == 2 && d == 2) direction = DIR_HTOH;
            }
        }
        if (direction == DIR_HTOD)
            host_ptr = src;
        else if (direction == DIR_DTOH)
            host_ptr = dst;
        u32 d = direction < DIRECTIONS ? direction : DIR_UNKNOWN;
        struct copy_t *c = &s->copies[d];
        ADD(c->count, 1);
        ADD(c->bytes, bytes);
        ADD(c->ns, latency);
        if (call->fn & ASYNC_FLAG)
            ADD(c->async_count, 1);
        if (host_ptr) {
            host = host_state(tgid, host_ptr);
            if (host == HOST_PINNED)
                ADD(c->pinned_bytes, bytes);
            else
                ADD(c->pageable_bytes, bytes);
        }
        big = bytes >= cfg->big_bytes;
    } else if (shape == SH_SYNC) {
        u32 kind = (u32)call->a0;
        if (kind < 6) {
            ADD(s->syncs[kind].count, 1);
            ADD(s->syncs[kind].blocked_ns, latency);
        }
        ADD(s->sync_log2[log2_bucket(latency, LAT_BUCKETS)], 1);
    } else if (shape == SH_ALLOC && ret == 0) {
        // a0 = where the new pointer is written, a1 = size
        u64 ptr = 0;
        bytes = call->a1;
        ADD(s->allocs, 1);
        ADD(s->alloc_bytes, bytes);
        if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)call->a0) != 0) {
            count_drop(DROP_READ);
        } else {
            struct alloc_key_t key = {.tgid = tgid, .ptr = ptr};
            if (dev_allocs.update(&key, &bytes) != 0)
                count_drop(DROP_ALLOCS_FULL);
        }
        big = bytes >= cfg->big_bytes;
    } else if (shape == SH_FREE && ret == 0) {
        struct alloc_key_t key = {.tgid = tgid, .ptr = call->a0};
        u64 *size = dev_allocs.lookup(&key);
        ADD(s->frees, 1);
        if (size) {
            ADD(s->free_bytes, *size);
            bytes = *size;
            dev_allocs.delete(&key);
        }
    } else if (shape == SH_HOST_ALLOC && ret == 0) {
        u64 ptr = 0;
        bytes = call->a1;
        ADD(s->host_allocs, 1);
        ADD(s->host_alloc_bytes, bytes);
        if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)call->a0) != 0)
            count_drop(DROP_READ);
        else
            pin(tgid, ptr, bytes);
        big = bytes >= cfg->big_bytes;
    } else if (shape == SH_HOST_REGISTER && ret == 0) {
        bytes = call->a1;
        ADD(s->registers, 1);
        ADD(s->register_bytes, bytes);
        pin(tgid, call->a0, bytes);
    } else if (shape == SH_HOST_FREE && ret == 0) {
        ADD(s->host_frees, 1);
        unpin(tgid, call->a0);
    } else if (shape == SH_GRAPH) {
        ADD(s->graph_launches[call->a0 & 1], 1);
    }

    u32 reasons = (latency >= cfg->slow_ns ? R_SLOW : 0) | (big ? R_BIG : 0) |
                  (ret != 0 ? R_ERROR : 0);
    if (!reasons || !within_budget(cfg))
        return;
    struct record_t *r = records.ringbuf_reserve(sizeof(struct record_t));
    if (!r) {
        count_drop(DROP_RINGBUF);
        return;
    }
    r->tgid = tgid;
    r->tid = (u32)bpf_get_current_pid_tgid();
    r->fn = fn;
    r->reasons = reasons;
    r->ktime_ns = now;
    r->latency_ns = latency;
    r->bytes = bytes;
    r->ret = ret;
    r->direction = direction;
    r->host = host;
    records.ringbuf_submit(r, 0);
}

static __always_inline int on_enter(struct pt_regs *ctx, u32 fn, u32 shape, u32 arg)
{
    int zero = 0;
    struct config_t *cfg = config.lookup(&zero);
    if (!cfg || !cfg->enabled)
        return 0;
    u64 start = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 sp = PT_REGS_SP(ctx);
    struct cuda_stats_t *s = stats_of(tgid);
    if (!s)
        return 0;
    ADD(s->hits, 1);
    struct call_t *call = inflight.task_storage_get(bpf_get_current_task_btf(), 0,
                                                     BPF_LOCAL_STORAGE_GET_F_CREATE);
    // A call in flight from before the probes were last turned off never returns here.
    u32 current = call && call->active && call->epoch == cfg->epoch;
    if (!call) {
        count_drop(DROP_INFLIGHT);
    } else if (current && sp <= call->sp) {
        // nested in (or tail-called from) a traced call: counted as that one
    } else {
        if (current)
            count_drop(DROP_STALE);       // the last call's return was not seen
        call->active = 1;
        call->epoch = cfg->epoch;
        call->fn = fn;
        call->sp = sp;
        if (shape <= SH_LAUNCH_RT_EX) {
            launch_at_entry(ctx, shape, s);
        } else if (shape == SH_SYNC || shape == SH_GRAPH) {
            call->a0 = arg;
        } else {
            // copies: (dst, src, bytes[, kind]); allocations: (out pointer, size);
            // frees and registrations: (pointer[, size])
            call->a0 = PT_REGS_PARM1(ctx);
            call->a1 = PT_REGS_PARM2(ctx);
            call->a2 = PT_REGS_PARM3(ctx);
            call->a3 = PT_REGS_PARM4(ctx);
        }
        if (arg && shape >= SH_COPY_HTOD && shape <= SH_COPY_KIND)
            call->fn |= ASYNC_FLAG;
        call->ts = bpf_ktime_get_ns();
    }
    ADD(s->prog_ns, bpf_ktime_get_ns() - start);
    return 0;
}

static __always_inline int on_return(struct pt_regs *ctx, u32 fn, u32 shape)
{
    int zero = 0;
    struct config_t *cfg = config.lookup(&zero);
    if (!cfg || !cfg->enabled)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct cuda_stats_t *s = stats_of(tgid);
    if (!s)
        return 0;
    ADD(s->hits, 1);
    struct call_t *call = inflight.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (call && call->active && call->epoch == cfg->epoch && (call->fn & ~ASYNC_FLAG) == fn &&
        PT_REGS_SP(ctx) >= call->sp + RET_SP_DELTA) {
        call->active = 0;
        finish(ctx, fn, shape, call, now, tgid, s, cfg);
    }
    ADD(s->prog_ns, bpf_ktime_get_ns() - now);
    return 0;
}

int cuda_enter(struct pt_regs *ctx)
{
    u64 cookie = bpf_get_attach_cookie(ctx);
    return on_enter(ctx, cookie & 0xFF, (cookie >> 8) & 0xFF, (cookie >> 16) & 0xFF);
}

int cuda_leave(struct pt_regs *ctx)
{
    u64 cookie = bpf_get_attach_cookie(ctx);
    return on_return(ctx, cookie & 0xFF, (cookie >> 8) & 0xFF);
}
