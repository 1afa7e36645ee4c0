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
    """What MapReader uses of a bcc table: Key, Leaf, map_fd, items(); ``raw()`` is the
    map's entries as the kernel stand-in reads them."""

    Key, Leaf, map_fd = Key, Leaf, 7

    def __init__(self, entries: dict[int, tuple[int, int]]):
        self.entries = entries
        self.walked = 0

    def raw(self) -> list:
        return [(Key(k), Leaf(*v)) for k, v in sorted(self.entries.items())]

    def items(self):
        self.walked += 1
        return self.raw()


class Kernel:
    """BPF_MAP_LOOKUP_BATCH over ``table`` (any with Key, Leaf and ``raw()``): ``count``
    entries from the token on, their bytes copied into the caller's buffers; ENOENT with the
    last ones. ``fail``: the errno of every call."""

    def __init__(self, table, fail: int = 0):
        self.table = table
        self.fail = fail
        self.items: list = []
        self.calls = []

    def __call__(self, fd, in_batch, out_batch, keys, values, count):
        self.calls.append(None if in_batch is None else in_batch._obj.value)
        if self.fail:
            ctypes.set_errno(self.fail)
            return -1
        if in_batch is None:            # a read begins: the map as it is now
            self.items = self.table.raw()
        start = 0 if in_batch is None else in_batch._obj.value
        room = count._obj.value
        taken = self.items[start:start + room]
        key_size, value_size = ctypes.sizeof(self.table.Key), ctypes.sizeof(self.table.Leaf)
        for i, (k, v) in enumerate(taken):
            ctypes.memmove(ctypes.addressof(keys._obj) + i * key_size, ctypes.addressof(k),
                           key_size)
            ctypes.memmove(ctypes.addressof(values._obj) + i * value_size,
                           ctypes.addressof(v), value_size)
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
    table.entries = {k: (99, 99) for k in table.entries}
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


class StatsTable:
    """A per-CPU map of Stats on three CPUs, keyed by a u32 id."""

    Key, Leaf, map_fd = Key, Stats * 3, 8

    def __init__(self, counts: dict[int, tuple[int, int, int]]):
        self.values = {}
        for k, per_cpu in counts.items():
            self.values[k] = self.Leaf()
            for cpu, count in enumerate(per_cpu):
                self.values[k][cpu].count = count

    def raw(self) -> list:
        return [(Key(k), self.Leaf.from_buffer_copy(v)) for k, v in sorted(self.values.items())]

    items = raw


def _read_marked(reader, moved=lambda key_bytes, mark: True):
    asked = []

    def ask(key_bytes, mark):
        asked.append(key_bytes)
        return moved(key_bytes, mark)

    marked = reader.marked("count", ask)
    assert sorted(asked) == sorted(key_bytes for key_bytes, *_ in marked)   # each one asked
    return {Key.from_buffer_copy(key_bytes).id: (mark, key, value)
            for key_bytes, mark, key, value in marked}


@pytest.mark.parametrize("batched", [True, False])
def test_marked_entries_move_with_any_cpus_count_and_only_moved_ones_are_copied(batched):
    table = StatsTable({k: (k, 0, 2 * k) for k in range(9)})
    kernel = Kernel(table, fail=0 if batched else errno.EINVAL)
    reader = MapReader(table, chunk=4, lookup_batch=kernel)
    first = _read_marked(reader)
    assert sorted(first) == list(range(9)) and reader.batched == batched
    assert first[5][1].id == 5 and [cpu.count for cpu in first[5][2]] == [5, 0, 10]
    assert len({mark for mark, _, _ in first.values()}) == 9

    table.values[3][1].count += 1                 # one CPU of one entry called again
    table.values[6][2].latency_sum_ns += 500      # another field only: the mark stays
    marks = {k: mark for k, (mark, _, _) in first.items()}
    second = _read_marked(reader, lambda key_bytes, mark:
                          marks.get(Key.from_buffer_copy(key_bytes).id) != mark)
    assert [k for k, (mark, _, _) in second.items() if mark != marks[k]] == [3]
    assert {k for k, (_, key, value) in second.items() if value is not None} == {3}
    assert all(key is None for k, (_, key, _) in second.items() if k != 3)
    assert [cpu.count for cpu in second[3][2]] == [3, 1, 6]


class PlainTable(StatsTable):
    """The same values, one for all CPUs (a plain hash added to atomically)."""

    Leaf = Stats

    def __init__(self, counts: dict[int, int]):
        self.values = {k: Stats(count=count) for k, count in counts.items()}


@pytest.mark.parametrize("batched", [True, False])
def test_a_plain_values_mark_is_its_field(batched):
    table = PlainTable({1: 10, 2: 20, 3: 30})
    reader = MapReader(table, chunk=2,
                       lookup_batch=Kernel(table, fail=0 if batched else errno.EINVAL))
    first = _read_marked(reader)
    assert {k: mark for k, (mark, _, _) in first.items()} == {1: 10, 2: 20, 3: 30}
    table.values[2].count += 1
    table.values[3].latency_sum_ns += 7
    second = _read_marked(reader, lambda key_bytes, mark:
                          first[Key.from_buffer_copy(key_bytes).id][0] != mark)
    assert [(k, value.count) for k, (_, _, value) in second.items() if value is not None] \
        == [(2, 21)]


def test_marks_are_the_same_by_batches_and_key_by_key():
    table = StatsTable({k: (k, 7, 0) for k in range(5)})
    by_batches = _read_marked(MapReader(table, chunk=2, lookup_batch=Kernel(table)))
    key_by_key = _read_marked(MapReader(table, chunk=2,
                                        lookup_batch=Kernel(table, fail=errno.ENOSPC)))
    assert {k: m for k, (m, _, _) in by_batches.items()} == \
        {k: m for k, (m, _, _) in key_by_key.items()}


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


@pytest.mark.parametrize("batched", [True, False])
def test_raw_entries_are_each_keys_and_values_bytes(batched):
    table = PlainTable({1: 10, 2: 20, 3: 30})
    table.values[2].latency_sum_ns = 7
    reader = MapReader(table, chunk=2,
                       lookup_batch=Kernel(table, fail=0 if batched else errno.EINVAL))
    raw = {Key.from_buffer_copy(key).id: value for key, value in reader.raw()}
    assert raw == {tid: bytes(value) for tid, value in table.values.items()}
    assert len(raw[2]) == ctypes.sizeof(PlainTable.Leaf)
    assert PlainTable.Leaf.from_buffer_copy(raw[2]).latency_sum_ns == 7


def test_raw_entries_of_a_per_cpu_map_hold_every_cpus_value():
    table = StatsTable({1: (1, 2, 3)})
    (key, value), = MapReader(table, lookup_batch=Kernel(table)).raw()
    assert Key.from_buffer_copy(key).id == 1
    assert [cpu.count for cpu in StatsTable.Leaf.from_buffer_copy(value)] == [1, 2, 3]
