"""The correlator's wait on the bus ends when the first thing is due, and never spins."""

from __future__ import annotations

import time

from gpuwhy.correlator.pipeline import DECIDE_EVERY, MAX_SLEEP
from gpuwhy.events import Envelope


def test_a_pending_batch_waits_for_its_write_not_for_an_overdue_decide_beat(harness):
    correlator = harness.correlator
    correlator.flush_interval = 1.0
    now = time.monotonic()
    correlator._last_decide = now - 5 * DECIDE_EVERY        # the beat is long overdue...
    correlator.pending = [Envelope("t", 1, harness.sample(0, 50))]
    # ...but the batch's write (which runs the decide stage) is due in 0.6 s: no spinning
    assert abs(correlator._sleep_for(now, now - 0.4, now + 60) - 0.6) < 1e-6


def test_an_idle_correlator_wakes_for_its_beat_and_no_later_than_max_sleep(harness):
    correlator = harness.correlator
    correlator.pending = []
    now = time.monotonic()
    correlator._last_decide = now - 0.25 * DECIDE_EVERY
    assert abs(correlator._sleep_for(now, None, now + 60) - 0.75 * DECIDE_EVERY) < 1e-6
    correlator._last_decide = now + 60                     # nothing due for a minute
    assert correlator._sleep_for(now, None, now + 60) == MAX_SLEEP
    assert correlator._sleep_for(now, None, now - 1) == 0.0      # a chore overdue: at once
