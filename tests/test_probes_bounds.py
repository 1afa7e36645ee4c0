"""The probes' bounds on a storm (#54), without eBPF: a poll that stopped at its cap holds
fdtrack's ring out of the next reads for a while, the bus queue is sized in bytes, and a
probe that lost records says so in its health. The real storm: tests/privileged/
test_probe_memory.py."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from gpuwhy.bus import BATCH_BYTES
from gpuwhy.probes import privileged as service
from gpuwhy.probes.privileged import (
    FDTRACK_FULL_HOLD_S,
    SEND_QUEUE_BYTES,
    Probes,
    counted_health,
    send_hwm,
)


class _Publisher:
    dropped = 0

    def publish(self, event: object) -> bool:
        return True

    @contextmanager
    def batched(self):
        yield


class _FdTrack:
    """Stops at its cap while ``storm`` is set, as fdtrack.poll() says."""

    def __init__(self) -> None:
        self.polls = 0
        self.storm = True

    def poll(self, timeout_ms: int = 100) -> bool:
        self.polls += 1
        return self.storm


@pytest.fixture
def probes(tmp_config, monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr(service.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(service.time, "sleep", lambda s: clock.update(now=clock["now"] + s))
    probes = Probes(tmp_config, _Publisher())
    probes.fdtrack = _FdTrack()
    probes.lifecycle = probes.sched = probes.cuda = None
    probes.clock = clock
    return probes


FDS = {"fdtrack": 10, "lifecycle": 11}


def test_a_poll_cut_short_holds_the_ring_then_lets_it_back(probes):
    probes.poll(0)                                  # read its cap: the ring may hold more
    assert probes.fdtrack.polls == 1
    assert probes.fdtrack_held_until == 100.0 + FDTRACK_FULL_HOLD_S
    assert probes.waited_on(FDS) == [11]            # not woken by it while held
    assert probes.held_until(105.0) == 100.0 + FDTRACK_FULL_HOLD_S   # the wait ends then

    probes.poll(0)                                  # a wake-up for something else
    assert probes.fdtrack.polls == 1                # ... does not read it

    probes.clock["now"] += FDTRACK_FULL_HOLD_S
    probes.fdtrack.storm = False
    probes.poll(0)                                  # the hold is over: read, not cut short
    assert probes.fdtrack.polls == 2
    assert probes.fdtrack_held_until == 0.0
    assert probes.waited_on(FDS) == [10, 11]
    assert probes.held_until(105.0) == 105.0


def test_a_poll_that_waits_sleeps_out_the_hold_instead_of_spinning(probes):
    probes.poll(0)
    probes.poll(100)                               # the loop that polls every 100 ms
    assert probes.fdtrack.polls == 1
    assert probes.clock["now"] == pytest.approx(100.0 + FDTRACK_FULL_HOLD_S)


def test_the_bus_queue_is_sized_in_bytes():
    assert send_hwm(10_000) == SEND_QUEUE_BYTES // BATCH_BYTES == 128
    assert send_hwm(50) == 50                      # a smaller setting stands
    assert send_hwm(0) == 128                      # ZeroMQ's "no limit": the bound stands


def test_a_probe_that_lost_records_says_degraded():
    assert counted_health("lifecycle", {"records": 5, "dropped_ringbuf_full": 0}).state == "ok"
    lost = counted_health("lifecycle", {"records": 5, "dropped_ringbuf_full": 1128})
    assert lost.state == "degraded" and "1128" in lost.detail
    assert lost.counters["dropped_ringbuf_full"] == 1128
