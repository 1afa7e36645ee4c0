"""probes/bpfmaps.py against the kernel: a real per-CPU hash map, filled from user space
with more entries than one chunk, read by batches (this kernel has BPF_MAP_LOOKUP_BATCH:
5.6 and later) exactly as bcc's key-by-key walk reads it."""

import ctypes
import platform

import pytest

from gpuwhy.probes.bpfmaps import MapReader

pytestmark = pytest.mark.root

PROGRAM = """
struct key_t { u32 a; u64 b; };
struct value_t { u64 count; u64 sum; u32 most; u32 least; };
BPF_PERCPU_HASH(stats, struct key_t, struct value_t, 4096);
"""


def test_a_per_cpu_hash_read_by_batches_equals_the_key_by_key_walk():
    from bcc import BPF

    bpf = BPF(text=PROGRAM)
    try:
        table = bpf[b"stats"]
        for n in range(700):                   # three chunks of 256
            leaf = table.Leaf()
            for cpu in range(len(leaf)):
                leaf[cpu].count, leaf[cpu].sum = n, n * 1000 + cpu
                leaf[cpu].most, leaf[cpu].least = cpu + 7, n % 5
            table[table.Key(a=n, b=n << 33)] = leaf

        def plain(items):
            return sorted(((k.a, k.b), tuple((v.count, v.sum, v.most, v.least) for v in cpus))
                          for k, cpus in items)

        reader = MapReader(table)
        batched = plain(reader.items())
        assert len(batched) == 700
        assert batched == plain(table.items())
        major, minor = (int(x) for x in platform.release().split(".")[:2])
        assert reader.batched == ((major, minor) >= (5, 6))
        del table[table.Key(a=5, b=5 << 33)]
        assert len(reader.items()) == 699
        assert ctypes.sizeof(table.Leaf) % 8 == 0
    finally:
        bpf.cleanup()


def test_a_plain_hash_with_a_simple_key_reads_the_same_by_batches():
    """sched's ``watched`` map: a u32 key (an array element of a simple ctypes type reads back
    as an int, not a ctypes value) and a struct leaf, no CPUs."""
    from bcc import BPF

    bpf = BPF(text=b"struct thread_t { u64 on_cpu_ns; u32 owner; u32 state; };\n"
                   b"BPF_HASH(watched, u32, struct thread_t, 4096);\n")
    try:
        table = bpf[b"watched"]
        for tid in range(600):
            table[table.Key(tid)] = table.Leaf(on_cpu_ns=tid * 1000, owner=tid % 7, state=1)
        batched = MapReader(table).items()
        assert sorted((k.value, v.on_cpu_ns, v.owner) for k, v in batched) == \
            sorted((k.value, v.on_cpu_ns, v.owner) for k, v in table.items())
        assert len(batched) == 600
        raw = MapReader(table).raw()             # the same values as bytes, keyed by bytes
        assert sorted((int.from_bytes(k, "little"), v) for k, v in raw) == \
            sorted((k.value, bytes(v)) for k, v in table.items())
        del table[batched[0][0]]                 # a key read back is usable as a key
        assert len(table.items()) == 599
    finally:
        bpf.cleanup()


def test_marks_of_a_real_per_cpu_map_move_with_its_counts_only():
    """MapReader.marked on the kernel's batches: an entry whose count moved on one CPU is the
    only one copied out again, with the values the key-by-key walk reads."""
    from bcc import BPF

    bpf = BPF(text=PROGRAM)
    try:
        table = bpf[b"stats"]
        for n in range(300):                   # two chunks
            leaf = table.Leaf()
            for cpu in range(len(leaf)):
                leaf[cpu].count, leaf[cpu].sum = n + cpu, 7
            table[table.Key(a=n, b=n)] = leaf
        reader = MapReader(table)
        first = {bytes(key): mark for _, mark, key, _ in reader.marked("count", lambda k, m: True)}
        assert len(first) == 300

        leaf = table[table.Key(a=42, b=42)]
        leaf[len(leaf) - 1].count += 1           # the last CPU called again
        table[table.Key(a=42, b=42)] = leaf
        leaf = table[table.Key(a=43, b=43)]
        leaf[0].sum += 1                         # not the count: the mark stays
        table[table.Key(a=43, b=43)] = leaf

        again = reader.marked("count", lambda k, m: first[k] != m)
        moved = [(key.a, [cpu.count for cpu in value]) for _, _, key, value in again
                 if value is not None]
        assert moved == [(42, [42 + cpu + (cpu == len(leaf) - 1) for cpu in range(len(leaf))])]
        assert len(again) == 300
    finally:
        bpf.cleanup()

