"""Wrong-token attempts per client address: a leaky bucket, in process, over a bounded table."""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

FREE_ATTEMPTS = 5            # quick attempts an address gets before it has to wait
DRAIN_SECONDS = 12.0         # then one attempt every 12 s: a guess rate that goes nowhere
MAX_CLIENTS = 4096           # addresses remembered at most (least recently seen go first)


def client_key(address: str | None) -> str:
    """The bucket of an address: itself, or its /64 for IPv6 (one host usually holds a whole
    /64, so per-address buckets would give it 2**64 of them)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or ""
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Throttle:
    """Each failed attempt fills a client's bucket by one and the bucket drains at a steady
    rate; a full bucket means wait.

    A failure is charged and checked in one step under the lock (rather than counted after
    the answer) so that it stays exact under the threaded server: parallel guesses cannot all
    slip in before the first failure is counted.
    """

    def __init__(self, free: int = FREE_ATTEMPTS, drain_seconds: float = DRAIN_SECONDS,
                 max_clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free, self.drain_seconds, self.max_clients = free, drain_seconds, max_clients
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # level, at
        self._lock = threading.Lock()

    def attempt(self, client: str) -> int:
        """Charge one attempt to ``client``: 0 when it may go ahead, else the whole seconds
        to wait (for Retry-After), and then nothing is charged."""
        now = self.clock()
        with self._lock:
            level, at = self._buckets.get(client, (0.0, now))
            level = max(0.0, level - (now - at) / self.drain_seconds)
            if level + 1 > self.free:
                return max(1, math.ceil((level + 1 - self.free) * self.drain_seconds))
            self._buckets[client] = (level + 1, now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
            return 0

    def __len__(self) -> int:
        return len(self._buckets)
