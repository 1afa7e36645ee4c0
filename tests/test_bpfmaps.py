"""probes/bpfmaps.py: a BPF hash map read whole by batches (the kernel's
BPF_MAP_LOOKUP_BATCH stood in for here at the libbcc call; the real one runs in the
privileged fdtrack tests), chunk after chunk to the end, and key by key where the kernel
cannot batch."""

from __future__ import annotations

import ctypes
import errno

import pytest

from gpuwhy.probes.bpfmaps import MapReader, per_cpu_words


class Key(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32)]


Leaf = ctypes.c_uint64 * 2             # a per-CPU value: one leaf for each of two CPUs


class Table:
    """What MapReader uses of a bcc table: Key, Leaf, map_fd, items()."""

    Key, Leaf, map_fd = Key, Leaf, 7

    def __init__(self, entries: dict[int, tuple[int, int]]):
        self.entries = entries
        self.walked = 0

    def items(self):
        self.walked += 1
        return [(Key(k), Leaf(*v)) for k, v in self.entries.items()]


class Kernel:
    """BPF_MAP_LOOKUP_BATCH over ``table``: ``count`` entries from the token on; ENOENT with
    the last ones. ``fail``: the errno of every call."""

    def __init__(self, table: Table, fail: int = 0):
        self.items = sorted(table.entries.items())
        self.fail = fail
        self.calls = []

    def __call__(self, fd, in_batch, out_batch, keys, values, count):
        self.calls.append(None if in_batch is None else in_batch._obj.value)
        if self.fail:
            ctypes.set_errno(self.fail)
            return -1
        start = 0 if in_batch is None else in_batch._obj.value
        room = count._obj.value
        taken = self.items[start:start + room]
        keys_out = ctypes.cast(keys, ctypes.POINTER(Key * room)).contents
        values_out = ctypes.cast(values, ctypes.POINTER(Leaf * room)).contents
        for i, (k, v) in enumerate(taken):
            keys_out[i] = Key(k)
            values_out[i] = Leaf(*v)
        count._obj.value = len(taken)
        out_batch._obj.value = start + len(taken)
        if start + room >= len(self.items):
            ctypes.set_errno(errno.ENOENT)
            return -1
        return 0


def _plain(items):
    return sorted((k.id, tuple(v)) for k, v in items)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 9])
def test_every_entry_is_read_chunk_after_chunk(size):
    table = Table({k: (k, 10 * k) for k in range(size)})
    kernel = Kernel(table)
    reader = MapReader(table, chunk=4, lookup_batch=kernel)
    assert _plain(reader.items()) == _plain(table.items())
    assert max(1, -(-size // 4)) <= len(kernel.calls) <= size // 4 + 1
    assert kernel.calls[0] is None and kernel.calls[1:] == list(range(4, size + 1, 4))[
        :len(kernel.calls) - 1]
    assert table.walked == 1                       # only the comparison walked it
    # read again: the buffers are reused, what was read before is a copy
    first = reader.items()
    kernel.items = [(k, (99, 99)) for k, _ in kernel.items]
    assert all(v == (99, 99) for _, v in _plain(reader.items()))
    assert _plain(first) == sorted((k, (k, 10 * k)) for k in range(size))


def test_a_kernel_without_batch_lookup_is_read_key_by_key_from_then_on():
    table = Table({1: (1, 2), 2: (3, 4)})
    kernel = Kernel(table, fail=errno.EINVAL)
    reader = MapReader(table, chunk=4, lookup_batch=kernel)
    assert _plain(reader.items()) == [(1, (1, 2)), (2, (3, 4))]
    assert not reader.batched and table.walked == 1
    reader.items()
    assert len(kernel.calls) == 1 and table.walked == 2     # not asked again


def test_a_bucket_larger_than_the_chunk_is_read_key_by_key_that_time():
    table = Table({1: (1, 2)})
    reader = MapReader(table, chunk=4, lookup_batch=Kernel(table, fail=errno.ENOSPC))
    assert _plain(reader.items()) == [(1, (1, 2))]
    assert reader.batched                                   # the next read batches again


def test_another_failure_is_an_error_that_says_so():
    table = Table({1: (1, 2)})
    reader = MapReader(table, chunk=4, lookup_batch=Kernel(table, fail=errno.EBADF))
    with pytest.raises(OSError, match="BPF_MAP_LOOKUP_BATCH: Bad file descriptor"):
        reader.items()


class Stats(ctypes.Structure):
    """A per-CPU value as bcc lays it out: 8-byte counters, then u32 buckets."""

    _fields_ = [("count", ctypes.c_uint64), ("latency_sum_ns", ctypes.c_uint64),
                ("buckets", ctypes.c_uint32 * 6)]


def test_one_field_of_every_cpu_is_read_as_words():
    values = (Stats * 224)()
    values[3].count, values[223].count, values[223].latency_sum_ns = 5, 9, 700
    counts = per_cpu_words(values, "count")
    assert len(counts) == 224 and counts[3] == 5 and counts[223] == 9 and sum(counts) == 14
    assert list(per_cpu_words(values, "latency_sum_ns"))[223] == 700
    values[0].count = 1
    assert counts.tobytes() != bytes(224 * 8)        # a view: the values as they are now


def test_a_field_that_is_not_an_aligned_word_is_refused():
    class Odd(ctypes.Structure):
        _fields_ = [("count", ctypes.c_uint32), ("flag", ctypes.c_uint32)]

    with pytest.raises(ValueError, match="Odd.count"):
        per_cpu_words((Odd * 2)(), "count")
