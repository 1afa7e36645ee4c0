"""fdtrack's per-operation statistics summed over CPUs (the per-CPU map stood in for at the
MapReader it is read through; the real map runs in the privileged fdtrack tests): an entry
is summed again only when a CPU's count moved, and a big host's idle CPUs add nothing."""

from __future__ import annotations

import ctypes

from gpuwhy.probes.fdtable import LAT_BUCKETS
from gpuwhy.probes.fdtrack import FdTrackProbe


class Key(ctypes.Structure):
    _fields_ = [("open_seq", ctypes.c_uint64), ("tgid", ctypes.c_uint32),
                ("cmd", ctypes.c_uint32), ("sub", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


class Stats(ctypes.Structure):      # struct stats_t of fdtrack.bpf.c
    _fields_ = [("count", ctypes.c_uint64), ("errors", ctypes.c_uint64),
                ("latency_sum_ns", ctypes.c_uint64), ("latency_max_ns", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("latency_log2", ctypes.c_uint32 * LAT_BUCKETS)]


CPUS = 224


class Reader:
    def __init__(self):
        self.entries: dict[int, ctypes.Array] = {}

    def items(self):
        return [(Key(seq, 10, 0xC020462A, 0x201), values)
                for seq, values in self.entries.items()]


def _calls(values, cpu, count, latency_ns, errors=0):
    values[cpu].count += count
    values[cpu].errors += errors
    values[cpu].latency_sum_ns += count * latency_ns
    values[cpu].latency_max_ns = max(values[cpu].latency_max_ns, latency_ns)
    values[cpu].latency_log2[latency_ns.bit_length() - 1] += count


def _probe(tmp_config, reader):
    probe = FdTrackProbe(tmp_config, lambda event: None)
    probe._stats_reader = reader
    return probe


def test_every_cpu_adds_up_and_an_entry_that_did_not_move_is_not_summed_again(tmp_config):
    reader = Reader()
    busy, idle = (Stats * CPUS)(), (Stats * CPUS)()
    _calls(busy, 0, 3, 1000, errors=1)
    _calls(busy, 223, 2, 5000)
    _calls(idle, 17, 1, 300)
    reader.entries = {1: busy, 2: idle}
    probe = _probe(tmp_config, reader)

    first = {seq: total for _, seq, _, _, total in probe.read_stats()}
    assert (first[1].count, first[1].errors, first[1].latency_sum_ns) == (5, 1, 13_000)
    assert first[1].latency_max_ns == 5000 and sum(first[1].latency_log2) == 5
    assert (first[2].count, first[2].latency_sum_ns) == (1, 300)

    _calls(busy, 100, 1, 2000)                    # only the busy entry moved, on another CPU
    second = {seq: total for _, seq, _, _, total in probe.read_stats()}
    assert second[2] is first[2]                  # the same sum, not taken again
    assert (second[1].count, second[1].latency_sum_ns) == (6, 15_000)


def test_an_entry_gone_and_back_under_a_new_open_is_summed_afresh(tmp_config):
    reader = Reader()
    values = (Stats * CPUS)()
    _calls(values, 5, 4, 100)
    reader.entries = {1: values}
    probe = _probe(tmp_config, reader)
    probe.read_stats()
    reader.entries = {2: values}                  # the fd closed; a new open, the same counts
    (_, seq, _, _, total), = probe.read_stats()
    assert seq == 2 and total.count == 4
