"""A signal's samples, (ts, value) in time order, packed in two arrays.

The rules hold minutes of samples for every GPU field and process between rounds. As a list
of tuples a sample costs about 120 bytes (the tuple, its int and float objects, the list's
slot); packed it costs 16. A :class:`Series` reads like the list it replaces (``len``,
``series[-1]`` is a ``(ts, value)`` tuple, iteration yields tuples), and the hot paths read
``times`` and ``values`` directly, with no object made per sample.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from typing import overload


class Series(Sequence[tuple[int, float]]):
    """Samples of one signal: ``times`` (int64 ns) and ``values`` (float64), same length."""

    __slots__ = ("times", "values")

    def __init__(self, times: array | None = None, values: array | None = None):
        self.times = array("q") if times is None else times
        self.values = array("d") if values is None else values

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self.times, self.values, strict=True)

    @overload
    def __getitem__(self, index: int) -> tuple[int, float]: ...
    @overload
    def __getitem__(self, index: slice) -> Series: ...
    def __getitem__(self, index: int | slice) -> tuple[int, float] | Series:
        if isinstance(index, slice):
            return Series(self.times[index], self.values[index])
        return self.times[index], self.values[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Series):
            return self.times == other.times and self.values == other.values
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    # No __hash__: defining __eq__ leaves it None, unhashable (mutable, like the list it
    # replaces).

    def __repr__(self) -> str:
        return f"Series({list(self)!r})"

    def between(self, start: int, end: int) -> Series:
        """The samples with ``start <= ts <= end``, copied."""
        low = bisect.bisect_left(self.times, start)
        high = bisect.bisect_right(self.times, end, lo=low)
        return Series(self.times[low:high], self.values[low:high])

    def position(self, ts: int) -> int:
        """Where a sample at ``ts`` would go: before every sample at ``ts`` or later."""
        return bisect.bisect_left(self.times, ts)

    def prepend(self, earlier: Series) -> None:
        self.times[:0] = earlier.times
        self.values[:0] = earlier.values

    def extend(self, later: Series) -> None:
        self.times.extend(later.times)
        self.values.extend(later.values)

    def cut_before(self, index: int) -> None:
        """Drop the samples before ``index``."""
        del self.times[:index], self.values[:index]

    def cut_from(self, index: int) -> None:
        """Drop the samples from ``index`` on."""
        del self.times[index:], self.values[index:]
