"""The probes read the lifecycle ring in batches while processes come and go (#23): held out
of the wait after a read that found records, let back in once a read finds none."""

from __future__ import annotations

import pytest

from gpuwhy.probes import privileged as service
from gpuwhy.probes.privileged import LIFECYCLE_FULL_HOLD_S, LIFECYCLE_HOLD_S, Probes


class _Publisher:
    dropped = 0

    def publish(self, event: object) -> bool:
        return True


class _Lifecycle:
    ring_records = 2800


@pytest.fixture
def probes(tmp_config, monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr(service.time, "monotonic", lambda: clock["now"])
    probes = Probes(tmp_config, _Publisher())
    probes.lifecycle = _Lifecycle()
    probes.clock = clock
    return probes


FDS = {"fdtrack": 10, "lifecycle": 11}


def test_a_quiet_ring_is_waited_on(probes):
    probes._pace_lifecycle(0)
    assert probes.lifecycle_held_until == 0.0
    assert probes.waited_on(FDS) == [10, 11]


def test_a_read_with_records_holds_the_ring_out_until_a_read_finds_none(probes):
    probes._pace_lifecycle(3)                  # the first exec after a quiet spell
    assert probes.lifecycle_held_until == 100.0 + LIFECYCLE_HOLD_S
    assert probes.waited_on(FDS) == [10]       # fdtrack still wakes the probes at once

    probes.clock["now"] = 100.4                # an fdtrack wake-up in between: nothing new
    probes._pace_lifecycle(0)
    assert probes.waited_on(FDS) == [10]

    probes.clock["now"] = 101.0                # the hold ends with records read: held again
    probes._pace_lifecycle(40)
    assert probes.lifecycle_held_until == 101.0 + LIFECYCLE_HOLD_S
    probes.clock["now"] = 102.0                # ... and with none: waited on again
    probes._pace_lifecycle(0)
    assert probes.lifecycle_held_until == 0.0
    assert probes.waited_on(FDS) == [10, 11]


def test_a_read_that_found_the_ring_a_quarter_full_holds_it_briefly(probes):
    probes._pace_lifecycle(700)
    assert probes.lifecycle_held_until == 100.0 + LIFECYCLE_FULL_HOLD_S
    probes._pace_lifecycle(699)
    assert probes.lifecycle_held_until == 100.0 + LIFECYCLE_HOLD_S
