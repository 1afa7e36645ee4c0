// sched.bpf.c  Where the threads of GPU processes and of their workers spend their time.
//
// For the threads user space asks for (the `watched` map: threads of processes that hold
// NVIDIA fds, and the processes they fork, e.g. DataLoader workers; and those of a serving
// engine's other processes, its frontend and its engine loop, told by `role`), accumulate
// on-CPU time, time runnable but waiting for a CPU (run-queue latency), time asleep
// (interruptible) and blocked (uninterruptible, usually I/O), voluntary and involuntary
// context switches and migrations. New threads and children of a watched thread are
// watched from their birth. Any other thread costs an array lookup per event.
// On a host with several NUMA nodes, on-CPU time is also added up per GPU process and node
// (one hash update per switch-out of a watched thread): which socket its threads ran on.
// Bytes a watched thread receives from TCP/IP sockets are counted too, at
// sock:sock_recv_length (Linux 6.4+) or else a kprobe on tcp_cleanup_rbuf, and so is the
// interruptible sleep that ended right before such a receive: an S3 or HTTP loader waiting
// for the network sleeps like an idle one, and only this tells them apart. Every receive on
// the host costs the same array lookup as any other event.
#include <uapi/linux/ptrace.h>

// ST_* (ThreadState), HINT_SLOTS, MAX_WATCHED, NUMA_NODES, MAX_CPUS, MAX_NODE_KEYS,
// NET_RX_* (NetRx), NET_RX, FAMILY_INET, FAMILY_INET6, FLAG_PEEK: generated from
// probes/sched.py (bpf_defines()), compiled in as -D flags.
#define HINT_MASK (HINT_SLOTS - 1)
// sched_switch's prev_state as the tracepoint reports it (__trace_sched_switch_state):
#define REPORT_UNINTERRUPTIBLE 0x2
#define REPORT_PREEMPTED 0x100      // TASK_REPORT_MAX: switched out while runnable

struct thread_t {
    u64 last_ns;
    u32 state;
    u32 owner;               // the GPU process this thread is accounted to
    u64 on_cpu_ns;
    u64 runqueue_ns;
    u64 sleep_ns;
    u64 blocked_ns;
    u64 voluntary;
    u64 involuntary;
    u64 migrations;
    u32 seeded;              // added by user space, its state read from /proc: see settle()
    u32 cpu;                 // where it last went on a CPU: user space credits the running
                             // slice not yet settled to that CPU's node
    u32 role;                // 0: the owner's or a worker's; 1: of the owner's serving
                             // frontend, 2: of its engine loop (ROLE_* in sched.py; set by
                             // user space, inherited at fork); not 0: kept out of its
                             // per-node time
    u32 unused;              // (explicit: the entry's bytes are compared whole)
    u64 net_rx_bytes;        // received from TCP/IP sockets
    u64 net_wait_ns;         // asleep (interruptible) right before receiving from one
    u64 slept_ns;            // its last sleep, until it switches out again or receives
};

// MAX_WATCHED is probes.max_threads: each flush's batch read walks every slot, used or not.
BPF_HASH(watched, u32, struct thread_t, MAX_WATCHED);
BPF_ARRAY(watch_hint, s32, HINT_SLOTS);        // kernel's own additions (births)
BPF_ARRAY(watch_hint_user, s32, HINT_SLOTS);   // user space's additions and removals
BPF_PERCPU_ARRAY(drops, u64, 1);
BPF_PERCPU_ARRAY(missed_switch_in, u64, 1);    // see settle()
BPF_PERCPU_ARRAY(missed_switch_out, u64, 1);

#if NUMA_NODES > 1
struct node_key_t {
    u32 owner;
    u32 node;
};
BPF_ARRAY(cpu_node, u32, MAX_CPUS);                         // filled by user space
BPF_HASH(node_time, struct node_key_t, u64, MAX_NODE_KEYS);  // on-CPU ns per (owner, node)

// Credit a slice the thread just ran, on this CPU, to this CPU's node.
static __always_inline void credit_node(u32 owner, u64 delta)
{
    u32 cpu = bpf_get_smp_processor_id();
    u32 *node = cpu_node.lookup(&cpu);
    if (!node)
        return;
    struct node_key_t key = {.owner = owner, .node = *node};
    u64 *ns = node_time.lookup(&key);
    if (ns) {
        __sync_fetch_and_add(ns, delta);
        return;
    }
    if (node_time.insert(&key, &delta) != 0) {    // full, or another CPU inserted it first
        ns = node_time.lookup(&key);
        if (ns)
            __sync_fetch_and_add(ns, delta);
    }
}
#endif

static __always_inline struct thread_t *find(u32 tid)
{
    u32 slot = tid & HINT_MASK;
    s32 *kernel_count = watch_hint.lookup(&slot);
    s32 *user_count = watch_hint_user.lookup(&slot);
    if (!kernel_count || !user_count || (*kernel_count + *user_count) <= 0)
        return 0;
    return watched.lookup(&tid);
}

// Credit the time since last_ns to the state the thread was in. For a thread user space
// has just added, the state it read from /proc may be stale: the thread can switch out
// between that read and the entry being in place, and a sleeping thread taken for a running
// one would be credited its whole sleep as CPU time at its next switch. Its first event
// proves what the state was (a switch-out: running; a switch-in: runnable; a wakeup:
// asleep), so that event's state is the one credited.
// A switch-out and an exit prove the thread running too, seeded or not: one last seen
// runnable went on a CPU unseen. The kernel does not hand BPF every sched_switch (a few in a
// thousand on a 6.18 VM, with no recursion miss counted), and a busy worker alone on a CPU
// then had its whole run, hundreds of ms until its next switch-out or its exit, counted as
// waiting. It ran: it is counted so, with the wait before the lost switch-in (unknowable,
// short beside a long run), and missed_switch_in says how often that happened. The same lost
// event loses the other thread's switch-out: one still taken for running is switched in.
// Whether it then ran, waited or slept cannot be told apart, so it is only counted
// (missed_switch_out), its time left as it was credited.
static __always_inline void settle(struct thread_t *t, u64 now, u32 proven)
{
    u64 delta = now - t->last_ns;
    u32 state = t->seeded ? proven : t->state;
    int zero = 0;
    if (proven == ST_RUNNING && state == ST_RUNNABLE) {
        state = ST_RUNNING;
        u64 *missed = missed_switch_in.lookup(&zero);
        if (missed)
            (*missed)++;
    } else if (proven == ST_RUNNABLE && state == ST_RUNNING) {
        u64 *missed = missed_switch_out.lookup(&zero);
        if (missed)
            (*missed)++;
    }
    if (state == ST_RUNNING) {
        t->on_cpu_ns += delta;
#if NUMA_NODES > 1
        if (!t->role)            // node_time: the GPU process's and its workers' only
            credit_node(t->owner, delta);
#endif
    } else if (state == ST_RUNNABLE)
        t->runqueue_ns += delta;
    else if (state == ST_SLEEPING)
        t->sleep_ns += delta;
    else if (state == ST_BLOCKED)
        t->blocked_ns += delta;
    t->last_ns = now;
    t->seeded = 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    struct thread_t *prev = find(args->prev_pid);
    if (prev && prev->state != ST_DEAD) {
        settle(prev, now, ST_RUNNING);
        prev->slept_ns = 0;      // it ran without receiving: that sleep was not for data
        long state = args->prev_state;
        if (state == 0 || (state & REPORT_PREEMPTED)) {
            prev->state = ST_RUNNABLE;
            prev->involuntary++;
        } else {
            prev->state = (state & REPORT_UNINTERRUPTIBLE) ? ST_BLOCKED : ST_SLEEPING;
            prev->voluntary++;
        }
    }
    struct thread_t *next = find(args->next_pid);
    if (next && next->state != ST_DEAD) {
        settle(next, now, ST_RUNNABLE);
        next->state = ST_RUNNING;
        next->cpu = bpf_get_smp_processor_id();
    }
    return 0;
}

static __always_inline int on_wakeup(u32 tid)
{
    struct thread_t *t = find(tid);
    if (t && (t->seeded || t->state == ST_SLEEPING || t->state == ST_BLOCKED)) {
        u64 now = bpf_ktime_get_ns();
        t->slept_ns = (!t->seeded && t->state == ST_SLEEPING) ? now - t->last_ns : 0;
        settle(t, now, t->state == ST_BLOCKED ? ST_BLOCKED : ST_SLEEPING);
        t->state = ST_RUNNABLE;
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) { return on_wakeup(args->pid); }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { return on_wakeup(args->pid); }

TRACEPOINT_PROBE(sched, sched_migrate_task)
{
    struct thread_t *t = find(args->pid);
    if (t)
        t->migrations++;
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    struct thread_t *parent = find((u32)bpf_get_current_pid_tgid());
    if (!parent)
        return 0;
    u32 child = args->child_pid;
    struct thread_t born = {.last_ns = bpf_ktime_get_ns(), .state = ST_RUNNABLE,
                            .owner = parent->owner, .role = parent->role};
    if (watched.update(&child, &born) != 0) {
        int zero = 0;
        u64 *counter = drops.lookup(&zero);
        if (counter)
            (*counter)++;
        return 0;
    }
    u32 slot = child & HINT_MASK;
    s32 *count = watch_hint.lookup(&slot);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    struct thread_t *t = find((u32)bpf_get_current_pid_tgid());
    if (t) {
        settle(t, bpf_ktime_get_ns(), ST_RUNNING);      // an exiting thread runs
        t->state = ST_DEAD;   // user space reads the last figures, then deletes the entry
    }
    return 0;
}

#if NET_RX != NET_RX_NONE
// The current thread received `copied` bytes from a socket (`ip`: a TCP/IP one), if it is
// watched. The sleep it woke from was a wait for these bytes if this is its first receive
// since, within NET_WAIT_WINDOW_NS of going on a CPU (a thread that woke for something
// else, or ran a while, and then found data waiting did not wait for it).
static __always_inline void count_rx(int copied, int ip)
{
    struct thread_t *t = find((u32)bpf_get_current_pid_tgid());
    if (!t)
        return;
    u64 slept = t->slept_ns;
    t->slept_ns = 0;             // only this thread writes its own: it is running here
    if (!ip || copied <= 0)
        return;
    __sync_fetch_and_add(&t->net_rx_bytes, copied);
    if (slept && bpf_ktime_get_ns() - t->last_ns <= NET_WAIT_WINDOW_NS)
        t->net_wait_ns += slept;
}
#endif

#if NET_RX == NET_RX_TRACEPOINT
TRACEPOINT_PROBE(sock, sock_recv_length)
{
    // As the tracepoint prints its length: IP families only (not UNIX sockets: the queues
    // between a loader and its workers), and a peek is no receive.
    if (!(args->flags & FLAG_PEEK))
        count_rx(args->ret, args->family == FAMILY_INET || args->family == FAMILY_INET6);
    return 0;
}
#elif NET_RX == NET_RX_KPROBE
// Attached by user space: tcp_recvmsg reports what it copied to the reader here.
int on_tcp_cleanup_rbuf(struct pt_regs *ctx, void *sk, int copied)
{
    count_rx(copied, 1);
    return 0;
}
#endif
