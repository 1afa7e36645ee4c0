// bench_attach.bpf.c  The floor of each way to see ioctl: bare programs, one array lookup.
//
// Compiled once per variant (-DVARIANT_...) by scripts/bench_attach.py. Each program does
// what fdtrack's cheap exit does for an untracked process (one array lookup by pid), so the
// cost measured is the attachment's own: what no program body can go below. With no
// variant defined it is the prelude of P2's floor (attach_probes_floor adds the programs).
#include <uapi/linux/ptrace.h>
#include <asm/ptrace.h>

#define IOCTL_NR 16     // x86-64

BPF_ARRAY(hint, u32, 4096);

static __always_inline int untracked(void)
{
    u32 slot = bpf_get_current_pid_tgid() & 4095;
    u32 *count = hint.lookup(&slot);
    return !count || !*count;
}

#if defined(VARIANT_TP_PAIR) || defined(VARIANT_TP_ENTER)
TRACEPOINT_PROBE(syscalls, sys_enter_ioctl) { return untracked() ? 0 : 1; }
#endif
#ifdef VARIANT_TP_PAIR
TRACEPOINT_PROBE(syscalls, sys_exit_ioctl) { return untracked() ? 0 : 1; }
#endif

#if defined(VARIANT_RAW_PAIR) || defined(VARIANT_RAW_ENTER)
RAW_TRACEPOINT_PROBE(sys_enter)     // (struct pt_regs *regs, long id): every syscall
{
    if (ctx->args[1] != IOCTL_NR)
        return 0;
    return untracked() ? 0 : 1;
}
#endif
#ifdef VARIANT_RAW_PAIR
RAW_TRACEPOINT_PROBE(sys_exit)      // (struct pt_regs *regs, long ret): the id is in regs
{
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    long id = -1;
    bpf_probe_read_kernel(&id, sizeof(id), &regs->orig_ax);
    if (id != IOCTL_NR)
        return 0;
    return untracked() ? 0 : 1;
}
#endif

#ifdef VARIANT_KPROBE
int on_ioctl(struct pt_regs *ctx) { return untracked() ? 0 : 1; }
#endif

#ifdef VARIANT_FENTRY
KFUNC_PROBE(__x64_sys_ioctl) { return untracked() ? 0 : 1; }
KRETFUNC_PROBE(__x64_sys_ioctl) { return untracked() ? 0 : 1; }
#endif
