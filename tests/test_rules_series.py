"""A signal's samples packed in two arrays read as the (ts, value) list they replace."""

from array import array

import pytest

from gpuwhy.correlator.rules.evaluator import ASOF_TOLERANCE_NS, _align
from gpuwhy.correlator.rules.signal_series import Series
from gpuwhy.correlator.rules.signals import RowWindow, derive_series

NS = 10**9
T0 = 1_764_000_000 * NS


def packed(pairs):
    return Series(array("q", [ts for ts, _ in pairs]), array("d", [v for _, v in pairs]))


def samples(*pairs):
    return [(T0 + s * NS, float(v)) for s, v in pairs]


def test_a_series_reads_like_its_list_of_pairs():
    pairs = samples((0, 1), (1, 2.5), (3, -4))
    series = packed(pairs)
    assert len(series) == 3 and series and not Series()
    assert list(series) == pairs and series == pairs and series == packed(pairs)
    assert series[0] == pairs[0] and series[-1] == (T0 + 3 * NS, -4.0)
    assert series[1:] == pairs[1:] and isinstance(series[1:], Series)
    assert series != samples((0, 1), (1, 2.5)) and series != packed(pairs[:2])
    with pytest.raises(IndexError):
        Series()[-1]
    with pytest.raises(TypeError):
        hash(series)


def test_a_series_packs_its_samples_and_keeps_full_precision():
    big = T0 + 123_456_789        # a realtime ns stamp needs all 64 bits
    series = packed([(big, 0.1), (big + 1, 1e300)])
    assert series.times.typecode == "q" and series.values.typecode == "d"
    assert series[0] == (big, 0.1) and series[1] == (big + 1, 1e300)
    assert series.times.itemsize + series.values.itemsize == 16


def test_between_takes_both_ends_and_copies():
    series = packed(samples((0, 0), (1, 1), (2, 2), (2, 2.5), (3, 3)))
    part = series.between(T0 + 1 * NS, T0 + 2 * NS)
    assert part == samples((1, 1), (2, 2), (2, 2.5))
    part.values[0] = 99.0
    assert series[1] == (T0 + NS, 1.0)
    assert series.between(T0 + 4 * NS, T0 + 9 * NS) == []
    assert series.position(T0 + 2 * NS) == 2 and series.position(T0 - 1) == 0


def test_a_series_is_cut_and_extended_at_either_end():
    series = packed(samples((2, 2), (3, 3)))
    series.prepend(packed(samples((0, 0), (1, 1))))
    series.extend(packed(samples((4, 4))))
    assert series == samples((0, 0), (1, 1), (2, 2), (3, 3), (4, 4))
    series.cut_before(2)
    series.cut_from(2)
    assert series == samples((2, 2), (3, 3))


def test_derived_values_are_packed_and_unknown_rows_left_out():
    rows = [(T0, {"gpu_util": 50}), (T0 + NS, {"gpu_util": None}), (T0 + 2 * NS, {})]
    series = derive_series("gpu.util", rows)
    assert isinstance(series, Series) and series == [(T0, 0.5)]


def test_a_window_of_a_series_reads_what_a_fresh_read_gives():
    source = packed(samples(*[(s, s % 7) for s in range(0, 600)]))
    window = RowWindow(T0, Series())
    for end in range(30, 600, 10):
        start, stop = T0 + (end - 30) * NS, T0 + end * NS
        got = window.rows_in(start, stop, end, source.between)
        assert isinstance(got, Series) and got == source.between(start, stop)
    assert len(window.rows) < 600


def test_aligning_on_a_shared_timeline_or_another_gives_the_latest_sample():
    times = packed(samples((0, 0), (1, 0), (2, 0), (3, 0))).times
    same = packed(samples((0, 5), (1, 6), (2, 7), (3, 8)))
    assert _align(same, times) == [5.0, 6.0, 7.0, 8.0]
    sparse = packed([(T0 + NS // 2, 1.0), (T0 + 2 * NS, 2.0)])
    assert _align(sparse, times) == [None, 1.0, 2.0, 2.0]
    stale = packed([(T0 - ASOF_TOLERANCE_NS - NS, 9.0)])
    assert _align(stale, times) == [None, None, None, None]
    assert _align(Series(), array("q", times)) == [None] * 4
