import time

from gpuwhy.clock import ClockConverter, ticks_to_ns


def test_monotonic_and_boottime_convert_to_now():
    clock = ClockConverter()
    for now_in_clock, convert in ((time.monotonic_ns(), clock.realtime_from_monotonic),
                                  (time.clock_gettime_ns(time.CLOCK_BOOTTIME),
                                   clock.realtime_from_boottime)):
        assert abs(convert(now_in_clock) - time.time_ns()) < 50_000_000


def test_offset_is_refreshed_when_the_wall_clock_steps():
    offsets = iter([100, 200, 5_000, 5_100])
    clock = ClockConverter(refresh_ns=0, measure=lambda clock_id: next(offsets))
    assert clock.monotonic_offset == 100
    # refresh_ns=0: the next conversion re-measures, as after an NTP step
    assert clock.realtime_from_monotonic(1) == 5_001


def test_offset_is_kept_between_refreshes():
    calls = []
    clock = ClockConverter(refresh_ns=10**12, measure=lambda c: calls.append(c) or 7)
    clock.realtime_from_monotonic(0)
    clock.realtime_from_boottime(0)
    assert len(calls) == 2   # measured once at start (both clocks), not per conversion


def test_ticks_to_ns():
    import os

    assert ticks_to_ns(os.sysconf("SC_CLK_TCK")) == 1_000_000_000
