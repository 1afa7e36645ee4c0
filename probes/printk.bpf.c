// printk.bpf.c  how many records the kernel has put in its log, and when the last came.
//
// printk:console fires in printk_sprint() for every record stored in the ring buffer
// (kernel messages and lines written to /dev/kmsg alike), whatever the console log level.
// The correlator compares this count with the lines the kernel-log source read: a journald
// that stopped reading /dev/kmsg loses every line without a sign of its own, and the
// units' ProtectKernelLogs= keeps both processes from reading the ring to check.
// Cost: one array update per kernel log record (printk is rare: tens a minute on a busy host).

struct beat_t {
    u64 records;
    u64 last_ns;     // bpf_ktime_get_ns() of the newest record (CLOCK_MONOTONIC)
};

BPF_ARRAY(beat, struct beat_t, 1);

TRACEPOINT_PROBE(printk, console) {
    u32 zero = 0;
    struct beat_t *b = beat.lookup(&zero);
    if (b) {
        __sync_fetch_and_add(&b->records, 1);
        b->last_ns = bpf_ktime_get_ns();
    }
    return 0;
}
