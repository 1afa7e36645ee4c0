// lifecycle.bpf.c  exec, fork and exit of every process on the host, with exact identity.
//
// Each record carries the process's start time in clock ticks, read from the running
// kernel's task_struct at offsets user space took from BTF (the installed headers may
// describe another kernel), so (pid, start_time) is exact even for a process that is gone
// before user space looks at /proc. Threads are left out: forks are reported from
// task_newtask, whose clone flags tell a thread from a process.
#include <uapi/linux/ptrace.h>

// EV_* (EventType), CLONE_THREAD_FLAG, RINGBUF_PAGES: generated from probes/process_events.py
// (bpf_defines()), compiled in as -D flags.
#define FILENAME_LEN 128

struct config_t {
    u64 ns_per_tick;
    u32 valid;
    u32 off_group_leader;
    u32 off_start_boottime;
    u32 off_real_parent;
    u32 off_tgid;
    u32 off_exit_code;
};

struct event_t {
    u32 type;
    u32 tgid;
    u64 start_ticks;
    u64 ktime_ns;
    u32 other_tgid;          // EV_EXEC: parent; EV_FORK: child
    u32 reserved;
    u64 other_start_ticks;   // start of that other process
    s32 exit_code;           // EV_EXIT: the kernel's exit_code (status << 8 | signal)
    u32 reserved2;
    char filename[FILENAME_LEN];
};

BPF_ARRAY(config, struct config_t, 1);
BPF_PERCPU_ARRAY(drops, u64, 1);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

static __always_inline void *read_ptr(void *base, u32 off)
{
    void *value = 0;
    bpf_probe_read_kernel(&value, sizeof(value), base + off);
    return value;
}

static __always_inline u64 start_ticks_of(struct config_t *cfg, void *task)
{
    if (!task || !cfg->ns_per_tick)
        return 0;
    void *leader = read_ptr(task, cfg->off_group_leader);
    u64 start = 0;
    bpf_probe_read_kernel(&start, sizeof(start), (leader ? leader : task) + cfg->off_start_boottime);
    return start / cfg->ns_per_tick;
}

static __always_inline u32 tgid_of(struct config_t *cfg, void *task)
{
    u32 tgid = 0;
    if (task)
        bpf_probe_read_kernel(&tgid, sizeof(tgid), task + cfg->off_tgid);
    return tgid;
}

static __always_inline struct event_t *new_event(u32 type, struct config_t **cfg_out)
{
    int zero = 0;
    struct config_t *cfg = config.lookup(&zero);
    if (!cfg || !cfg->valid)
        return 0;
    struct event_t *event = events.ringbuf_reserve(sizeof(struct event_t));
    if (!event) {
        u64 *counter = drops.lookup(&zero);
        if (counter)
            (*counter)++;
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    event->type = type;
    event->tgid = bpf_get_current_pid_tgid() >> 32;
    event->ktime_ns = bpf_ktime_get_ns();
    event->start_ticks = start_ticks_of(cfg, (void *)bpf_get_current_task());
    *cfg_out = cfg;
    return event;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct config_t *cfg = 0;
    struct event_t *event = new_event(EV_EXEC, &cfg);
    if (!event)
        return 0;
    void *parent = read_ptr((void *)bpf_get_current_task(), cfg->off_real_parent);
    event->other_tgid = tgid_of(cfg, parent);
    event->other_start_ticks = start_ticks_of(cfg, parent);
    TP_DATA_LOC_READ_STR(event->filename, filename, FILENAME_LEN);
    events.ringbuf_submit(event, 0);
    return 0;
}

RAW_TRACEPOINT_PROBE(task_newtask)
{
    // TP_PROTO(struct task_struct *task, unsigned long clone_flags)
    void *child = (void *)ctx->args[0];
    u64 clone_flags = ctx->args[1];
    if (clone_flags & CLONE_THREAD_FLAG)
        return 0;
    struct config_t *cfg = 0;
    struct event_t *event = new_event(EV_FORK, &cfg);
    if (!event)
        return 0;
    event->other_tgid = tgid_of(cfg, child);
    event->other_start_ticks = start_ticks_of(cfg, child);
    events.ringbuf_submit(event, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((u32)id != (u32)(id >> 32))
        return 0;   // a thread, not the whole process
    struct config_t *cfg = 0;
    struct event_t *event = new_event(EV_EXIT, &cfg);
    if (!event)
        return 0;
    bpf_probe_read_kernel(&event->exit_code, sizeof(event->exit_code),
                          (void *)bpf_get_current_task() + cfg->off_exit_code);
    events.ringbuf_submit(event, 0);
    return 0;
}
