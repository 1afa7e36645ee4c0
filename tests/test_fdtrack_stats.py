"""fdtrack's per-operation statistics read back (the map stood in for at the batch lookup
its MapReader calls; the real map runs in the privileged fdtrack tests): every figure of an
entry, and an entry whose count did not move is not copied out or read again."""

from __future__ import annotations

import ctypes

from gpuwhy.probes.bpfmaps import MapReader
from gpuwhy.probes.fdtable import LAT_BUCKETS
from gpuwhy.probes.fdtrack import FdTrackProbe

from .test_bpfmaps import Kernel


class Key(ctypes.Structure):
    _fields_ = [("open_seq", ctypes.c_uint64), ("tgid", ctypes.c_uint32),
                ("cmd", ctypes.c_uint32), ("sub", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


class Stats(ctypes.Structure):      # struct stats_t of fdtrack.bpf.c
    _fields_ = [("count", ctypes.c_uint64), ("errors", ctypes.c_uint64),
                ("latency_sum_ns", ctypes.c_uint64), ("latency_max_ns", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("latency_log2", ctypes.c_uint32 * LAT_BUCKETS)]


class Table:
    """The stats map as MapReader reads it (through the kernel stand-in): by open_seq."""

    Key, Leaf, map_fd = Key, Stats, 9

    def __init__(self):
        self.entries: dict[int, Stats] = {}

    def raw(self):
        return [(Key(seq, 10, 0xC020462A, 0x201), value)
                for seq, value in sorted(self.entries.items())]

    items = raw


def _calls(value, count, latency_ns, errors=0, nbytes=0):
    value.count += count
    value.errors += errors
    value.latency_sum_ns += count * latency_ns
    value.latency_max_ns = max(value.latency_max_ns, latency_ns)
    value.bytes += nbytes
    value.latency_log2[latency_ns.bit_length() - 1] += count


def _probe(tmp_config, table):
    probe = FdTrackProbe(tmp_config, lambda event: None)
    probe._stats_reader = MapReader(table, chunk=4, lookup_batch=Kernel(table))
    return probe


def test_every_figure_is_read_and_an_entry_that_did_not_move_is_not_read_again(tmp_config):
    table = Table()
    busy, idle = Stats(), Stats()
    _calls(busy, 3, 1000, errors=1, nbytes=4096)
    _calls(busy, 2, 5000)
    _calls(idle, 1, 300)
    table.entries = {1: busy, 2: idle}
    probe = _probe(tmp_config, table)

    first = {seq: total for _, seq, _, _, total in probe.read_stats()}
    assert (first[1].count, first[1].errors, first[1].latency_sum_ns) == (5, 1, 13_000)
    assert (first[1].latency_max_ns, first[1].bytes) == (5000, 4096)
    assert first[1].latency_log2[9] == 3 and first[1].latency_log2[12] == 2
    assert (first[2].count, first[2].latency_sum_ns) == (1, 300)

    _calls(busy, 1, 2000)                         # only the busy entry moved
    idle.latency_max_ns = 999                     # not its count: not read again
    second = {seq: total for _, seq, _, _, total in probe.read_stats()}
    assert second[2] is first[2] and second[2].latency_max_ns == 300
    assert (second[1].count, second[1].latency_sum_ns) == (6, 15_000)


def test_an_entry_gone_and_back_under_a_new_open_is_read_afresh(tmp_config):
    table = Table()
    value = Stats()
    _calls(value, 4, 100)
    table.entries = {1: value}
    probe = _probe(tmp_config, table)
    probe.read_stats()
    table.entries = {2: value}                    # the fd closed; a new open, the same counts
    (_, seq, _, _, total), = probe.read_stats()
    assert seq == 2 and total.count == 4
