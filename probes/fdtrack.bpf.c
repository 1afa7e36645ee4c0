// fdtrack.bpf.c  Track which processes hold NVIDIA device fds and count their ioctls.
//
// Tracepoints only (no kprobes: not every kernel we target has them). The device path
// prefix comes from user space in the `prefix` map, so the same program watches
// /dev/nvidia* on a GPU host and look-alike files in tests. User space applies the full
// glob to each open and untracks what the prefix let through by mistake.
//
// Counting happens here, in a hash keyed by (open_seq, cmd): one map update per ioctl
// and no event per ioctl. open_seq numbers each tracked open, so a reused fd number
// never mixes two opens' counts. Every loss is counted in `drops`.
#include <uapi/linux/ptrace.h>

#ifndef PATH_LEN
#define PATH_LEN 128
#endif
#define PREFIX_LEN 64

enum drop_reason { DROP_RINGBUF = 0, DROP_TRACKED_FULL = 1, DROP_COUNTS_FULL = 2,
                   DROP_PENDING_FULL = 3, DROP_REASONS = 4 };
enum event_type { EV_OPEN = 1, EV_CLOSE = 2, EV_EXIT = 3 };

struct prefix_t {
    u32 len;
    char text[PREFIX_LEN];
};

struct fd_key_t {
    u32 tgid;
    s32 fd;
};

struct count_key_t {
    u64 open_seq;
    u32 tgid;
    u32 cmd;
};

struct path_t {
    char text[PATH_LEN];
};

struct event_t {
    u32 type;
    u32 tgid;
    s32 fd;
    u32 reserved;
    u64 open_seq;
    u64 ktime_ns;           // CLOCK_MONOTONIC; user space converts to realtime
    char path[PATH_LEN];
};

BPF_ARRAY(prefix, struct prefix_t, 1);
BPF_ARRAY(next_open_seq, u64, 1);
BPF_PERCPU_ARRAY(drops, u64, DROP_REASONS);
BPF_PERCPU_ARRAY(scratch, struct path_t, 1);
BPF_HASH(pending_open, u64, struct path_t, 4096);            // pid_tgid -> path at sys_enter
BPF_HASH(tracked, struct fd_key_t, u64, MAX_TRACKED);        // (tgid, fd) -> open_seq
BPF_HASH(fds_per_process, u32, u32, MAX_TRACKED);            // tgid -> tracked fds
BPF_HASH(ioctl_counts, struct count_key_t, u64, MAX_COUNTS);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

static __always_inline void count_drop(int reason)
{
    u64 *counter = drops.lookup(&reason);
    if (counter)
        (*counter)++;
}

static __always_inline int matches_prefix(const struct path_t *path)
{
    int zero = 0;
    struct prefix_t *want = prefix.lookup(&zero);
    if (!want || want->len == 0)
        return 0;
    for (int i = 0; i < PREFIX_LEN; i++) {
        if (i >= want->len)
            return 1;
        if (path->text[i] != want->text[i])
            return 0;
    }
    return 1;
}

static __always_inline int on_open_enter(const char *filename)
{
    int zero = 0;
    struct path_t *path = scratch.lookup(&zero);
    if (!path)
        return 0;
    if (bpf_probe_read_user_str(path->text, sizeof(path->text), filename) <= 0)
        return 0;
    if (!matches_prefix(path))
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if (pending_open.update(&id, path) != 0)
        count_drop(DROP_PENDING_FULL);
    return 0;
}

static __always_inline void emit(u32 type, u32 tgid, s32 fd, u64 open_seq,
                                 const struct path_t *path)
{
    struct event_t *event = events.ringbuf_reserve(sizeof(struct event_t));
    if (!event) {
        count_drop(DROP_RINGBUF);
        return;
    }
    event->type = type;
    event->tgid = tgid;
    event->fd = fd;
    event->reserved = 0;
    event->open_seq = open_seq;
    event->ktime_ns = bpf_ktime_get_ns();
    if (path)
        __builtin_memcpy(event->path, path->text, PATH_LEN);
    else
        event->path[0] = 0;
    events.ringbuf_submit(event, 0);
}

static __always_inline int on_open_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct path_t *path = pending_open.lookup(&id);
    if (!path)
        return 0;
    if (ret >= 0) {
        int zero = 0;
        u64 *seq_counter = next_open_seq.lookup(&zero);
        if (seq_counter) {
            u64 open_seq = __sync_fetch_and_add(seq_counter, 1) + 1;
            u32 tgid = id >> 32;
            struct fd_key_t key = {.tgid = tgid, .fd = (s32)ret};
            if (tracked.update(&key, &open_seq) == 0) {
                u32 one = 1;
                u32 *nfds = fds_per_process.lookup(&tgid);
                if (nfds)
                    __sync_fetch_and_add(nfds, 1);
                else
                    fds_per_process.update(&tgid, &one);
                emit(EV_OPEN, tgid, (s32)ret, open_seq, path);
            } else {
                count_drop(DROP_TRACKED_FULL);
            }
        }
    }
    pending_open.delete(&id);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat) { return on_open_enter(args->filename); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat) { return on_open_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_open) { return on_open_enter(args->filename); }
TRACEPOINT_PROBE(syscalls, sys_exit_open) { return on_open_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_openat2) { return on_open_enter(args->filename); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat2) { return on_open_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct fd_key_t key = {.tgid = tgid, .fd = (s32)args->fd};
    u64 *open_seq = tracked.lookup(&key);
    if (!open_seq)
        return 0;
    emit(EV_CLOSE, tgid, key.fd, *open_seq, 0);
    tracked.delete(&key);
    u32 *nfds = fds_per_process.lookup(&tgid);
    if (nfds && *nfds > 0)
        __sync_fetch_and_add(nfds, -1);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    struct fd_key_t key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = (s32)args->fd};
    u64 *open_seq = tracked.lookup(&key);
    if (!open_seq)
        return 0;
    struct count_key_t count_key = {.open_seq = *open_seq, .tgid = key.tgid,
                                    .cmd = (u32)args->cmd};
    u64 zero = 0;
    u64 *count = ioctl_counts.lookup_or_try_init(&count_key, &zero);
    if (count)
        __sync_fetch_and_add(count, 1);
    else
        count_drop(DROP_COUNTS_FULL);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id != tgid)
        return 0;   // a thread, not the whole process
    if (!fds_per_process.lookup(&tgid))
        return 0;
    fds_per_process.delete(&tgid);
    emit(EV_EXIT, tgid, -1, 0, 0);
    return 0;
}
