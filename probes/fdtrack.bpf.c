// fdtrack.bpf.c  NVIDIA device fds per process, and every driver call on them, decoded.
//
// Tracepoints only (kprobes are not on every kernel we target). What it does:
//  - follows device fds through open/openat/openat2, dup/dup2/dup3/fcntl(F_DUPFD*),
//    fcntl(F_SETFD), close and close_range; fork and exec are reported for user space to
//    finish (inheritance, O_CLOEXEC);
//  - decodes each ioctl on a tracked fd at sys_enter (arguments the driver may rewrite,
//    e.g. hClass) and sys_exit (latency, syscall return, the RM status inside the struct),
//    where to look being told by the `decode` map that user space fills from
//    gpuwhy/nvioctl.py: the knowledge of the driver's structs lives in one place;
//  - aggregates per (open, command, sub-operation) in a map shared by the CPUs (atomic
//    adds), so its cost does not grow with the call rate nor its memory with the host's
//    CPUs; only notable calls are sent one by one.
//
// The cheap exits matter most: a process without tracked fds pays one array lookup per
// ioctl enter and one per exit (the "hint" arrays, indexed by pid modulo HINT_SLOTS; a
// slot shared by two pids only costs a hash lookup). Every loss is counted in `drops`.
#include <uapi/linux/ptrace.h>

// Generated from gpuwhy/nvioctl.py and probes/fdtrack.py (bpf_defines()), compiled in as -D
// flags (`gpuwhy probes --ebpf` prints them): F_* (DecodeFlag), CALL_* (CallFlag), EV_*
// (EventType), DROP_* and N_DROP_REASONS (Drop), NV_IOCTL_MAGIC, the struct offsets,
// the syscall ABI's O_CLOEXEC_FLAG, F_*_CMD, FD_CLOEXEC_FLAG, FIO*CLEX_CMD and
// CLONE_THREAD_FLAG, the sizes user space shares (PATH_LEN, PREFIX_LEN, HINT_SLOTS,
// LAT_BUCKETS, DECODE_*, MAX_*, RINGBUF_PAGES, NOTABLE_HINT_SLOTS), and the macros
// NOTABLE_HINT_SLOT(c), UVM_HIGH_SLOT(code), IS_HEAP_ALLOC(function).
#define HINT_MASK (HINT_SLOTS - 1)
#define PARAMS_PREFIX 32         // the decoded fields of most calls lie in it: one user read

struct config_t {
    u32 prefix_len;
    char prefix[PREFIX_LEN];
    u32 emit_all;            // gpuwhy trace: every call as an event
    u32 filter_tgid;         // 0: every process
    u32 error_events_per_sec;
    u64 slow_ns;
    u64 big_bytes;
    u64 ns_per_tick;         // /proc/PID/stat start times are in clock ticks
    u32 task_offsets_valid;  // offsets below come from the running kernel's BTF
    u32 off_group_leader;
    u32 off_start_boottime;
    u32 off_tgid;
    u64 repeat_ns;           // see repeated(); 0: every failed or big call goes to the budget
};

struct fd_key_t { u32 tgid; s32 fd; };
struct fd_info_t { u64 open_seq; u32 cloexec; u32 reserved; };
struct open_t { char path[PATH_LEN]; u32 cloexec; };
struct dup_t { s32 oldfd; s32 newfd; u64 old_seq; u32 cloexec; u32 old_tracked; };
struct decode_t { s32 status_off; s32 a0_off; s32 a0_len; s32 a1_off; s32 a1_len; u32 flags; };
// One slot per escape number (0-255) and per known UVM command (256-511, see decode_slot());
// a few layouts per slot, told apart by the size in the command (0: any size).
struct decode_variant_t { u32 size; u32 valid; struct decode_t d; };
struct decode_slot_t { struct decode_variant_t v[DECODE_VARIANTS]; };

// The aggregate a call adds to: known at enter, kept with the call so that the exit builds
// no key of its own (see sys_exit_ioctl on its stack).
struct stats_key_t { u64 open_seq; u32 tgid; u32 cmd; u32 sub; u32 reserved; };

// A failed or big call's kind, for repeated(): the aggregate's key, the call's result and
// its reasons (CALL_ERROR, CALL_BIG).
struct repeat_key_t { struct stats_key_t key; u32 status; u32 reasons; s64 ret; };

struct call_t {                  // per-thread, in task storage: one ioctl in flight
    u32 active;
    s32 fd;
    u64 ts;
    struct stats_key_t key;  // cmd: the effective command (the inner one for an XFER)
    u64 ptr;                 // the parameters (the inner ones for an XFER)
    u64 arg0;
    u64 arg1;
    u64 bytes;
    u64 latency;             // at exit
    s64 ret;                 // at exit: the syscall's return
    u32 nr;
    u32 size;
    u32 flags;
    s32 status_off;
    u32 status;              // at exit: the RM status in the struct
    u32 reserved;
    struct repeat_key_t kind;   // at exit, of a failed or big call: repeated() looks it up,
    u64 sent_at;                // from here, not the exit's stack (see sys_exit_ioctl)
};
struct stats_t {
    u64 count;
    u64 errors;
    u64 latency_sum_ns;
    u64 latency_max_ns;
    u64 bytes;
    u32 latency_log2[LAT_BUCKETS];
};

struct event_t {
    u32 type;
    u32 tgid;
    u32 tid;
    s32 fd;
    u64 open_seq;
    u64 ktime_ns;            // CLOCK_MONOTONIC; user space converts to realtime
    u64 start_ticks;         // process start time (ticks since boot), 0 when unknown
    s32 aux;                 // EV_DUP: old fd; EV_FORK: child pid; EV_CLOSE_RANGE: last fd
    u32 cloexec;             // EV_OPEN/EV_DUP: O_CLOEXEC; EV_CLOSE_RANGE: flags
    u32 cmd;
    u32 nr;
    u32 size;
    u32 sub;
    u32 status;
    u32 flags;
    u64 latency_ns;
    s64 ret;
    u64 arg0;
    u64 arg1;
    u64 bytes;
    char data[PATH_LEN];     // path, version string or GPU ids
};

struct budget_t { u64 window; u32 used; u32 reserved; };
struct fork_t { u32 parent; u32 execd; };

BPF_ARRAY(config, struct config_t, 1);
BPF_ARRAY(next_open_seq, u64, 1);
BPF_PERCPU_ARRAY(drops, u64, N_DROP_REASONS);
BPF_PERCPU_ARRAY(scratch, struct open_t, 1);
BPF_ARRAY(error_budget, struct budget_t, 1);     // host-wide: see error_event_allowed()
BPF_ARRAY(proc_hint, s32, HINT_SLOTS);        // kernel's own inserts minus removals
BPF_ARRAY(proc_hint_user, s32, HINT_SLOTS);   // user space's (scan, fork, exec, exit)
BPF_HASH(pending_open, u64, struct open_t, 4096);
BPF_HASH(pending_dup, u64, struct dup_t, 4096);
BPF_HASH(tracked, struct fd_key_t, struct fd_info_t, MAX_TRACKED);
BPF_TABLE("lru_hash", u32, u32, tracked_procs, MAX_TRACKED);
// A child forked by a tracked process, until user space has copied its fd table: its
// ioctls on inherited fds are followed from the first one (copied here on first use).
BPF_TABLE("lru_hash", u32, struct fork_t, fork_parent, 16384);
BPF_TASK_STORAGE(inflight, struct call_t);
BPF_ARRAY(decode, struct decode_slot_t, DECODE_SLOTS);
BPF_HASH(notable_controls, u32, u32, MAX_NOTABLE_CONTROLS);
BPF_ARRAY(notable_hint, u32, NOTABLE_HINT_SLOTS);   // most controls are ruled out here
BPF_HASH(memory_classes, u32, u32, MAX_MEMORY_CLASSES);
// One value for all CPUs, added to atomically: a per-CPU value is kept for every possible
// CPU and preallocated for every entry, 168 bytes x 224 x 65,536 = 2.5 GB of kernel memory
// on a 224-CPU host, for a map that holds a few hundred entries a GPU process. MAX_STATS
// is probes.max_call_stats: each flush's batch read walks every slot, used or not.
BPF_HASH(op_stats, struct stats_key_t, struct stats_t, MAX_STATS);
BPF_ARRAY(stats_zero, struct stats_t, 1);   // a new aggregate's first value: see sys_exit_ioctl
BPF_TABLE("lru_hash", struct repeat_key_t, u64, recent_calls, MAX_RECENT_CALLS);
BPF_PERCPU_ARRAY(repeats, u64, 1);         // failed or big calls only counted: repeated()
// Tail calls of sys_enter_ioctl (slots filled by user space): ENTER_INHERIT follows a forked
// child's first call on an fd it may have inherited, then calls ENTER_AGAIN, the enter itself.
BPF_PROG_ARRAY(enter_tails, ENTER_TAILS);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

static __always_inline struct config_t *get_config(void)
{
    int zero = 0;
    return config.lookup(&zero);
}

static __always_inline void count_drop(int reason)
{
    u64 *counter = drops.lookup(&reason);
    if (counter)
        (*counter)++;
}

static __always_inline u64 current_start_ticks(struct config_t *cfg)
{
    if (!cfg || !cfg->task_offsets_valid || !cfg->ns_per_tick)
        return 0;
    void *task = (void *)bpf_get_current_task();
    void *leader = 0;
    u64 start = 0;
    bpf_probe_read_kernel(&leader, sizeof(leader), task + cfg->off_group_leader);
    if (!leader)
        return 0;
    bpf_probe_read_kernel(&start, sizeof(start), leader + cfg->off_start_boottime);
    return start / cfg->ns_per_tick;
}

static __always_inline int process_is_tracked(u32 tgid)
{
    u32 slot = tgid & HINT_MASK;
    s32 *kernel_count = proc_hint.lookup(&slot);
    s32 *user_count = proc_hint_user.lookup(&slot);
    return kernel_count && user_count && (*kernel_count + *user_count) > 0;
}

static __always_inline void hint_add(u32 tgid, s32 delta)
{
    u32 slot = tgid & HINT_MASK;
    s32 *count = proc_hint.lookup(&slot);
    if (count)
        __sync_fetch_and_add(count, delta);
}

static __always_inline struct event_t *new_event(u32 type, u32 tgid, s32 fd, u64 open_seq,
                                                  struct config_t *cfg)
{
    struct event_t *event = events.ringbuf_reserve(sizeof(struct event_t));
    if (!event) {
        count_drop(DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    event->type = type;
    event->tgid = tgid;
    event->tid = (u32)bpf_get_current_pid_tgid();
    event->fd = fd;
    event->open_seq = open_seq;
    event->ktime_ns = bpf_ktime_get_ns();
    event->start_ticks = current_start_ticks(cfg);
    return event;
}

static __always_inline u64 new_open_seq(void)
{
    int zero = 0;
    u64 *counter = next_open_seq.lookup(&zero);
    return counter ? __sync_fetch_and_add(counter, 1) + 1 : 0;
}

static __always_inline int track(u32 tgid, s32 fd, u64 open_seq, u32 cloexec)
{
    struct fd_key_t key = {.tgid = tgid, .fd = fd};
    struct fd_info_t info = {.open_seq = open_seq, .cloexec = cloexec};
    if (tracked.update(&key, &info) != 0) {
        count_drop(DROP_TRACKED_FULL);
        return -1;
    }
    hint_add(tgid, 1);
    u32 one = 1;
    tracked_procs.update(&tgid, &one);
    return 0;
}

// --- open ------------------------------------------------------------------------------

static __always_inline int on_open_enter(const char *filename, u64 flags)
{
    struct config_t *cfg = get_config();
    int zero = 0;
    struct open_t *open = scratch.lookup(&zero);
    if (!cfg || !open || cfg->prefix_len == 0)
        return 0;
    if (bpf_probe_read_user_str(open->path, sizeof(open->path), filename) <= 0)
        return 0;
    for (int i = 0; i < PREFIX_LEN; i++) {
        if (i >= cfg->prefix_len)
            break;
        if (open->path[i] != cfg->prefix[i])
            return 0;
    }
    open->cloexec = (flags & O_CLOEXEC_FLAG) ? 1 : 0;
    u64 id = bpf_get_current_pid_tgid();
    if (pending_open.update(&id, open) != 0)
        count_drop(DROP_PENDING_FULL);
    return 0;
}

static __always_inline int on_open_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct open_t *open = pending_open.lookup(&id);
    if (!open)
        return 0;
    if (ret >= 0) {
        struct config_t *cfg = get_config();
        u32 tgid = id >> 32;
        u64 open_seq = new_open_seq();
        if (track(tgid, (s32)ret, open_seq, open->cloexec) == 0) {
            struct event_t *event = new_event(EV_OPEN, tgid, (s32)ret, open_seq, cfg);
            if (event) {
                event->cloexec = open->cloexec;
                __builtin_memcpy(event->data, open->path, PATH_LEN);
                events.ringbuf_submit(event, 0);
            }
        }
    }
    pending_open.delete(&id);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat) { return on_open_enter(args->filename, args->flags); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat) { return on_open_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_open) { return on_open_enter(args->filename, args->flags); }
TRACEPOINT_PROBE(syscalls, sys_exit_open) { return on_open_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_openat2)
{
    u64 flags = 0;   // struct open_how starts with u64 flags
    bpf_probe_read_user(&flags, sizeof(flags), args->how);
    return on_open_enter(args->filename, flags);
}
TRACEPOINT_PROBE(syscalls, sys_exit_openat2) { return on_open_exit(args->ret); }

// --- close -----------------------------------------------------------------------------

static __always_inline void untrack(u32 tgid, s32 fd, struct config_t *cfg)
{
    struct fd_key_t key = {.tgid = tgid, .fd = fd};
    struct fd_info_t *info = tracked.lookup(&key);
    if (!info)
        return;
    struct event_t *event = new_event(EV_CLOSE, tgid, fd, info->open_seq, cfg);
    if (event)
        events.ringbuf_submit(event, 0);
    tracked.delete(&key);
    hint_add(tgid, -1);
}

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!process_is_tracked(tgid))
        return 0;
    untrack(tgid, (s32)args->fd, get_config());
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_close_range)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!process_is_tracked(tgid))
        return 0;
    // No loops over fds here: user space knows which tracked fds fall in the range.
    struct event_t *event = new_event(EV_CLOSE_RANGE, tgid, (s32)args->fd, 0, get_config());
    if (event) {
        event->aux = (s32)(args->max_fd > 0x7fffffff ? 0x7fffffff : args->max_fd);
        event->cloexec = args->flags;
        events.ringbuf_submit(event, 0);
    }
    return 0;
}

// --- dup, dup2, dup3, fcntl ----------------------------------------------------------

static __always_inline int on_dup_enter(s32 oldfd, s32 newfd, u32 cloexec)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!process_is_tracked(tgid))
        return 0;
    struct fd_key_t key = {.tgid = tgid, .fd = oldfd};
    struct fd_info_t *info = tracked.lookup(&key);
    struct dup_t dup = {.oldfd = oldfd, .newfd = newfd, .cloexec = cloexec};
    if (info) {
        dup.old_seq = info->open_seq;
        dup.old_tracked = 1;
    } else if (newfd < 0) {
        return 0;   // dup of an untracked fd onto a fresh number: nothing to follow
    }
    if (pending_dup.update(&id, &dup) != 0)
        count_drop(DROP_PENDING_FULL);
    return 0;
}

static __always_inline int on_dup_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    struct dup_t *dup = pending_dup.lookup(&id);
    if (!dup)
        return 0;
    u32 tgid = id >> 32;
    struct config_t *cfg = get_config();
    if (ret >= 0 && ret != dup->oldfd) {
        untrack(tgid, (s32)ret, cfg);            // dup2/dup3 closed what was there
        if (dup->old_tracked) {
            u64 open_seq = new_open_seq();
            if (track(tgid, (s32)ret, open_seq, dup->cloexec) == 0) {
                struct event_t *event = new_event(EV_DUP, tgid, (s32)ret, open_seq, cfg);
                if (event) {
                    event->aux = dup->oldfd;
                    event->cloexec = dup->cloexec;
                    events.ringbuf_submit(event, 0);
                }
            }
        }
    }
    pending_dup.delete(&id);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_dup) { return on_dup_enter((s32)args->fildes, -1, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_dup) { return on_dup_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_dup2)
{
    return on_dup_enter((s32)args->oldfd, (s32)args->newfd, 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_dup2) { return on_dup_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_dup3)
{
    return on_dup_enter((s32)args->oldfd, (s32)args->newfd,
                        (args->flags & O_CLOEXEC_FLAG) ? 1 : 0);
}
TRACEPOINT_PROBE(syscalls, sys_exit_dup3) { return on_dup_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_fcntl)
{
    if (args->cmd == F_DUPFD_CMD || args->cmd == F_DUPFD_CLOEXEC_CMD)
        return on_dup_enter((s32)args->fd, -1, args->cmd == F_DUPFD_CLOEXEC_CMD);
    if (args->cmd != F_SETFD_CMD)
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!process_is_tracked(tgid))
        return 0;
    struct fd_key_t key = {.tgid = tgid, .fd = (s32)args->fd};
    struct fd_info_t *info = tracked.lookup(&key);
    if (info)
        info->cloexec = (args->arg & FD_CLOEXEC_FLAG) ? 1 : 0;
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_fcntl) { return on_dup_exit(args->ret); }

// --- ioctl -----------------------------------------------------------------------------

static __always_inline struct fd_info_t *inherit(u32 tgid, s32 fd)
{
    struct fork_t *fork = fork_parent.lookup(&tgid);
    if (!fork)
        return 0;
    struct fd_key_t parent_key = {.tgid = fork->parent, .fd = fd};
    struct fd_info_t *parent = tracked.lookup(&parent_key);
    if (!parent || (fork->execd && parent->cloexec))
        return 0;   // not the parent's device fd, or one that exec has closed
    u64 open_seq = new_open_seq();
    u32 cloexec = parent->cloexec;
    if (track(tgid, fd, open_seq, cloexec) != 0)
        return 0;
    struct event_t *event = new_event(EV_INHERIT, tgid, fd, open_seq, get_config());
    if (event) {
        event->aux = fork->parent;
        event->cloexec = cloexec;
        events.ringbuf_submit(event, 0);
    }
    struct fd_key_t key = {.tgid = tgid, .fd = fd};
    return tracked.lookup(&key);
}

static __always_inline int decode_slot(u32 space, u32 code)
{
    if (space == 0)
        return code & 0xff;
    if (code < UVM_SLOT_BASE)
        return UVM_SLOT_BASE + code;
    return UVM_HIGH_SLOT(code);      // -1: no slot
}

static __always_inline struct decode_t *find_decode(u32 space, u32 code, u32 size)
{
    int index = decode_slot(space, code);
    if (index < 0)
        return 0;
    struct decode_slot_t *slot = decode.lookup(&index);
    if (!slot)
        return 0;
    struct decode_t *any = 0;
    for (int i = 0; i < DECODE_VARIANTS; i++) {
        if (!slot->v[i].valid)
            break;
        if (slot->v[i].size == size)
            return &slot->v[i].d;
        if (slot->v[i].size == 0)
            any = &slot->v[i].d;
    }
    return any;
}

static __always_inline u64 param_field(u64 *prefix, int have_prefix, u64 ptr, s32 off,
                                       s32 len)
{
    // From the prefix read at enter when the field lies in it, else from user memory. The
    // prefix is read as aligned words: the verifier takes a variable offset into the stack
    // only so.
    u64 value = 0;
    if (off < 0)
        return 0;
    u32 at = off;
    if (have_prefix && len == 8 && (at & 7) == 0 && at <= PARAMS_PREFIX - 8)
        return prefix[(at >> 3) & (PARAMS_PREFIX / 8 - 1)];
    if (have_prefix && len == 4 && (at & 3) == 0 && at <= PARAMS_PREFIX - 4) {
        u64 word = prefix[(at >> 3) & (PARAMS_PREFIX / 8 - 1)];
        return (at & 4) ? word >> 32 : (u32)word;
    }
    bpf_probe_read_user(&value, len == 8 ? 8 : 4, (void *)(ptr + off));
    return value;
}

static __always_inline int control_is_notable(u32 control)
{
    u32 slot = NOTABLE_HINT_SLOT(control);          // Knuth's multiplicative hash
    u32 *maybe = notable_hint.lookup(&slot);
    return maybe && *maybe && notable_controls.lookup(&control);
}

static __always_inline u64 read_field(u64 base, s32 off, s32 len)
{
    u64 value = 0;
    if (off < 0 || !base)
        return 0;
    if (len == 8)
        bpf_probe_read_user(&value, 8, (void *)(base + off));
    else
        bpf_probe_read_user(&value, 4, (void *)(base + off));
    return value;
}

// The enter's own stack stays under 64 bytes (56), as the exit's (see there), and the
// parameters' prefix is read onto it, not into task storage: hardened usercopy checks a slab
// or per-CPU destination the slow way on every read, one on the task's stack at once. Hence
// fork inheritance in a tail call (bcc 0.26 links no BPF-to-BPF calls), the sub-operation
// and bytes worked out at exit, and each field written to the call as soon as it is known.
TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!process_is_tracked(tgid))
        return 0;
    struct fd_key_t key = {.tgid = tgid, .fd = (s32)args->fd};
    struct fd_info_t *info = tracked.lookup(&key);
    if (!info) {
        // inherit() in a program of its own: inlined, its locals took this one's stack
        // past 64 bytes (see above), and a forked child's first call is rare.
        if (fork_parent.lookup(&key.tgid))
            enter_tails.call(args, ENTER_INHERIT);
        return 0;
    }
    if (args->cmd == FIOCLEX_CMD || args->cmd == FIONCLEX_CMD) {
        // How CPython's os.set_inheritable() flips close-on-exec: not a driver call.
        info->cloexec = args->cmd == FIOCLEX_CMD;
        return 0;
    }

    struct call_t *call = inflight.task_storage_get(bpf_get_current_task_btf(), 0,
                                                     BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!call) {
        count_drop(DROP_INFLIGHT_FULL);
        return 0;
    }
    call->ts = bpf_ktime_get_ns();
    call->key.open_seq = info->open_seq;
    call->key.tgid = tgid;
    call->key.reserved = 0;
    call->fd = key.fd;
    call->flags = 0;
    call->arg0 = 0;
    call->arg1 = 0;
    call->bytes = 0;
    // Each field goes to the call as soon as it is known: values held across the helper
    // calls below would be spilled to the stack and take it past 64 bytes.
    u32 cmd = (u32)args->cmd;
    u32 space = ((cmd >> 8) & 0xff) == NV_IOCTL_MAGIC ? 0 : 1;
    call->key.cmd = cmd;
    call->key.sub = 0;
    call->nr = space == 0 ? (cmd & 0xff) : cmd;
    call->size = space == 0 ? ((cmd >> 16) & 0x3fff) : 0;
    call->ptr = args->arg;
    call->status_off = -1;
    u64 prefix[PARAMS_PREFIX / 8];
    struct decode_t *d = find_decode(space, call->nr, call->size);
    if (d && (d->flags & F_XFER)) {
        // nv_ioctl_xfer_t { u32 cmd; u32 size; u64 ptr; }: cmd is the bare escape number
        // (the driver switches on it as on _IOC_NR), reported as the _IOWR it stands for.
        if (bpf_probe_read_user(prefix, 16, (void *)call->ptr) != 0)
            prefix[0] = prefix[1] = 0;
        call->nr = prefix[0] & 0xff;
        call->size = prefix[0] >> 32;
        call->key.cmd = (3u << 30) | ((call->size & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) |
                        call->nr;
        call->ptr = prefix[1];
        call->flags |= CALL_XFERRED;
        d = find_decode(0, call->nr, call->size);
    }
    if (d) {
        call->flags |= d->flags;
        call->status_off = d->status_off;
        // A struct shorter than the prefix at the very end of a mapping fails this read:
        // its fields are then read one by one.
        int have_prefix = bpf_probe_read_user(prefix, PARAMS_PREFIX, (void *)call->ptr) == 0;
        call->arg0 = param_field(prefix, have_prefix, call->ptr, d->a0_off, d->a0_len);
        call->arg1 = param_field(prefix, have_prefix, call->ptr, d->a1_off, d->a1_len);
    }
    call->active = 1;
    return 0;
}

// A forked child's call on an fd its parent tracked: tracked from now on (when exec has not
// closed it), then the call itself decoded by the enter, run again.
int enter_inherit(void *ctx)       // bcc defines the args struct for the enter's signature
{
    struct tracepoint__syscalls__sys_enter_ioctl *args = ctx;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (inherit(tgid, (s32)args->fd))
        enter_tails.call(args, ENTER_AGAIN);
    return 0;
}

// What the arguments read at enter say (the sub-operation, the bytes, whether the control
// is notable): worked out at exit, whose stack has room, so that the enter's stays small.
// The allocation parameters' size is read then too, after the driver has had its say on it.
static __always_inline void finish_decode(struct call_t *call)
{
    u32 flags = call->flags;
    u32 arg0 = (u32)call->arg0;
    if (flags & F_SUB_ARG0)
        call->key.sub = arg0;
    if (flags & F_BYTES_ARG1)
        call->bytes = call->arg1;
    if (flags & F_LIMIT_ARG1)
        call->bytes = call->arg1 + 1;
    if ((flags & F_HEAP_ALLOC) && IS_HEAP_ALLOC(arg0))
        call->bytes = call->arg1;
    if ((flags & F_ALLOC_PARAMS) && memory_classes.lookup(&arg0))
        call->bytes = read_field(call->arg1, ALLOC_PARAMS_SIZE_OFFSET, 8);
    if ((flags & F_NOTABLE_SUB) && control_is_notable(arg0))
        call->flags |= F_NOTABLE;
}

// Failed or large calls sent one by one, at most error_events_per_sec a second for the
// whole host (more are counted in the aggregates only): a per-CPU budget would let a
// 64-CPU host send 64 times as many, and the sidecar's cost grow with the host. Only these
// calls touch the shared slot, so its atomic add is rare. The add returns nothing (an
// add that fetches needs a newer kernel): CPUs that check at the same moment, or that both
// see a new second, may let a few more through.
static __always_inline int error_event_allowed(struct config_t *cfg, u64 now)
{
    int zero = 0;
    struct budget_t *budget = error_budget.lookup(&zero);
    if (!budget)
        return 0;
    u64 window = now / 1000000000ULL;
    if (budget->window != window) {
        budget->window = window;
        budget->used = 0;
    }
    if (budget->used >= cfg->error_events_per_sec) {
        count_drop(DROP_RATE_LIMITED);
        return 0;
    }
    __sync_fetch_and_add(&budget->used, 1);
    return 1;
}

// A failed or big call like one sent less than repeat_ns ago (same open, command,
// sub-operation, result and reasons) is only counted, in its aggregate and in `repeats`:
// a process retrying an unsupported call 50 times a second says nothing new after the
// first. Told here, such a call costs user space nothing and takes nothing from the
// host-wide budget that the other processes' failures need. An entry the LRU map evicted
// sends the call again; user space checks as well (probes/fdtrack.py, _repeated).
static __always_inline int repeated(struct call_t *call, u32 reasons, struct config_t *cfg,
                                    u64 now)
{
    if (!cfg->repeat_ns)
        return 0;
    struct repeat_key_t *kind = &call->kind;
    kind->key = call->key;
    kind->status = call->status;
    kind->reasons = reasons;
    kind->ret = call->ret;
    u64 *sent = recent_calls.lookup(kind);
    if (sent && now - *sent < cfg->repeat_ns) {
        int zero = 0;
        u64 *counter = repeats.lookup(&zero);
        if (counter)
            (*counter)++;
        return 1;
    }
    call->sent_at = now;
    recent_calls.update(kind, &call->sent_at);
    return 0;
}

// The exit's own stack stays under 64 bytes (48): from 64 bytes on, kernels 6.13 and later
// give a program a per-CPU private stack, and the RM status read below would land in memory
// that hardened usercopy checks the slow way. Hence the aggregate's key kept with the call,
// its zero value taken from a map (it was 168 bytes zeroed on the stack at every exit), and
// the event filled from the call alone (few live values, few spills). 230 -> 220 ns a run
// under bpf_stats on a 6.18 VM.
TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!process_is_tracked(id >> 32))
        return 0;
    struct call_t *call = inflight.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!call || !call->active)
        return 0;
    call->active = 0;

    u64 now = bpf_ktime_get_ns();
    u64 latency = now - call->ts;
    u32 status = 0;
    if (call->status_off >= 0)
        bpf_probe_read_user(&status, sizeof(status), (void *)(call->ptr + call->status_off));
    call->latency = latency;
    call->status = status;
    call->ret = args->ret;
    finish_decode(call);
    u32 failed = call->ret < 0 || status != 0;

    int first = 0;
    struct stats_t *zero = stats_zero.lookup(&first);
    struct stats_t *stats = zero ? op_stats.lookup_or_try_init(&call->key, zero) : 0;
    if (stats) {
        // Threads of a process on other CPUs may add to the same entry at once. The max is
        // compared and set without a lock: of two calls ending together on two CPUs, the
        // larger may be lost from it (never from the sum or the histogram).
        __sync_fetch_and_add(&stats->count, 1);
        if (failed)
            __sync_fetch_and_add(&stats->errors, 1);
        __sync_fetch_and_add(&stats->latency_sum_ns, latency);
        if (latency > stats->latency_max_ns)
            stats->latency_max_ns = latency;
        if (call->bytes)
            __sync_fetch_and_add(&stats->bytes, call->bytes);
        u32 bucket = bpf_log2l(latency);
        if (bucket >= LAT_BUCKETS)
            bucket = LAT_BUCKETS - 1;
        __sync_fetch_and_add(&stats->latency_log2[bucket], 1);
    } else {
        count_drop(DROP_STATS_FULL);
    }

    struct config_t *cfg = get_config();
    if (!cfg)
        return 0;
    u32 flags = call->flags;
    if (failed)
        flags |= CALL_ERROR;
    if (latency >= cfg->slow_ns)
        flags |= CALL_SLOW;
    if (cfg->big_bytes && call->bytes >= cfg->big_bytes)
        flags |= CALL_BIG;
    int wanted = cfg->emit_all || (flags & (F_NOTABLE | CALL_SLOW));
    if (!wanted && (flags & (CALL_ERROR | CALL_BIG)) &&
            !repeated(call, flags & (CALL_ERROR | CALL_BIG), cfg, now))
        wanted = error_event_allowed(cfg, now);
    if (cfg->filter_tgid && cfg->filter_tgid != call->key.tgid)
        wanted = 0;
    if (!wanted)
        return 0;
    call->flags = flags;
    struct event_t *event = new_event(EV_CALL, call->key.tgid, call->fd, call->key.open_seq,
                                      cfg);
    if (!event)
        return 0;
    event->cmd = call->key.cmd;
    event->nr = call->nr;
    event->size = call->size;
    event->sub = call->key.sub;
    event->status = call->status;
    event->flags = call->flags;
    event->latency_ns = call->latency;
    event->ret = call->ret;
    event->arg0 = call->arg0;
    event->arg1 = call->arg1;
    event->bytes = call->bytes;
    if (call->flags & F_VERSION)
        bpf_probe_read_user_str(event->data, VERSION_STRING_LEN,
                                (void *)(call->ptr + VERSION_STRING_OFFSET));
    else if (call->flags & F_GPU_IDS)
        bpf_probe_read_user(event->data,
                            call->size < PATH_LEN ? call->size & (PATH_LEN - 1) : PATH_LEN,
                            (void *)call->ptr);
    // A notable call (a reset, a drain) wakes user space at once; a slow, failed or big one
    // waits for its next look (a flush a second at most): a process whose calls fail many
    // times a second (NVML polling unsupported fields) must not wake the probes and the
    // correlator at each of them.
    events.ringbuf_submit(event, (cfg->emit_all || (call->flags & F_NOTABLE))
                                 ? 0 : BPF_RB_NO_WAKEUP);
    return 0;
}

// --- fork, exec, exit of processes that hold tracked fds -------------------------------

RAW_TRACEPOINT_PROBE(task_newtask)
{
    // TP_PROTO(struct task_struct *task, unsigned long clone_flags). A new thread shares
    // the fd table; a new process gets a copy of it, which we follow.
    if (ctx->args[1] & CLONE_THREAD_FLAG)
        return 0;
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!tracked_procs.lookup(&parent))
        return 0;
    struct config_t *cfg = get_config();
    if (!cfg || !cfg->task_offsets_valid)
        return 0;
    u32 child = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (void *)ctx->args[0] + cfg->off_tgid);
    if (!child)
        return 0;
    struct fork_t fork = {.parent = parent};
    fork_parent.update(&child, &fork);
    u32 one = 1;
    tracked_procs.update(&child, &one);
    hint_add(child, 1);      // until the child exits; fdtrack counts its ioctls from now
    struct event_t *event = new_event(EV_FORK, parent, -1, 0, cfg);
    if (event) {
        event->aux = child;
        events.ringbuf_submit(event, 0);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!tracked_procs.lookup(&tgid))
        return 0;
    struct fork_t *fork = fork_parent.lookup(&tgid);
    if (fork)
        fork->execd = 1;
    struct event_t *event = new_event(EV_EXEC, tgid, -1, 0, get_config());
    if (event)
        events.ringbuf_submit(event, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id != tgid)
        return 0;   // a thread, not the whole process
    if (!tracked_procs.lookup(&tgid))
        return 0;
    tracked_procs.delete(&tgid);
    if (fork_parent.lookup(&tgid)) {
        fork_parent.delete(&tgid);
        hint_add(tgid, -1);
    }
    struct event_t *event = new_event(EV_EXIT, tgid, -1, 0, get_config());
    if (event)
        events.ringbuf_submit(event, 0);
    return 0;
}
