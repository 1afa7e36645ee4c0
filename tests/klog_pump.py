"""Stand-ins at the kernel-log pump's two edges, for tests: a reader that hands over given
lines, and a publisher that keeps what it sends, encoded as the bus encodes it."""

from __future__ import annotations

from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.wire import from_frames, to_payload


class FakeReader:
    """Hands over ``lines``, at most ``limit`` a call, as the journald and kmsg readers do."""

    def __init__(self, lines: list[RawLine], origin: str = "kmsg"):
        self.origin = origin
        self._lines = iter(lines)

    def lines(self, limit: int = 1000):
        for _ in range(limit):
            line = next(self._lines, None)
            if line is None:
                return
            yield line


class WirePublisher:
    """Publishes through the real wire encoding (as the bus does) into a list."""

    def __init__(self):
        self.envelopes = []
        self.seq = 0
        self.dropped = 0

    def publish(self, event) -> bool:
        self.seq += 1
        self.envelopes.append(from_frames([event.topic.encode(),
                                           to_payload(event, src="klog", seq=self.seq)]))
        return True
