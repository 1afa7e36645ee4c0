"""probes/release.py against the kernel: a real bcc program whose LLVM module is freed after
loading keeps its maps (read, written, ring buffer delivering), and the compiler's clean
pages leave this process's RSS."""

import ctypes
import os

import pytest

from gpuwhy.probes.release import (
    ReleasedModuleError,
    close_released,
    drop_compiler_pages,
    release_module,
)

pytestmark = pytest.mark.root

PROGRAM = b"""
struct record_t { u32 pid; u64 value; };
BPF_ARRAY(config, u64, 1);
BPF_HASH(seen, u32, u64, 1024);
BPF_RINGBUF_OUTPUT(events, 8);

TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    int zero = 0;
    u64 *want = config.lookup(&zero);
    if (!want || *want != pid)
        return 0;
    u64 one = 1, *n = seen.lookup(&pid);
    if (n) { __sync_fetch_and_add(n, 1); } else { seen.update(&pid, &one); }
    struct record_t r = {.pid = pid, .value = 42};
    events.ringbuf_output(&r, sizeof(r), 0);
    return 0;
}
"""


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_a_released_program_keeps_its_maps_and_ring_buffer():
    from bcc import BPF

    bpf = BPF(text=PROGRAM)
    kept: list[int] = []
    try:
        got = []
        bpf[b"events"].open_ring_buffer(
            lambda ctx, data, size: got.append(bpf[b"events"].event(data).value))
        kept = release_module(bpf)
        assert bpf.module is None
        assert len(kept) == 3 and all(_fd_open(fd) for fd in kept)
        bpf[b"config"][ctypes.c_int(0)] = ctypes.c_uint64(os.getpid())   # written after
        for _ in range(3):
            os.getppid()
        bpf.ring_buffer_poll(1000)
        assert got == [42, 42, 42]
        assert bpf[b"seen"][ctypes.c_uint32(os.getpid())].value == 3
        with pytest.raises(ReleasedModuleError):
            bpf[b"no_such_table"]
    finally:
        bpf.cleanup()
        close_released(kept)
    assert not any(_fd_open(fd) for fd in kept)


def test_the_compiler_pages_leave_the_resident_set():
    from bcc import BPF

    BPF(text=PROGRAM).cleanup()          # LLVM and clang have run in this process

    def compiler_rss_kb() -> int:
        total, current = 0, False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if not head[0].endswith(":"):
                    current = "libLLVM" in line or "libclang" in line
                elif current and head[0] == "Rss:":
                    total += int(head[1])
        return total

    before = compiler_rss_kb()
    dropped = drop_compiler_pages()
    after = compiler_rss_kb()
    assert dropped > 10_000                       # kB: LLVM's code alone is tens of MB
    assert before - after >= dropped * 0.9        # (what ran meanwhile may come back)
    BPF(text=PROGRAM).cleanup()                   # and compiling again still works
