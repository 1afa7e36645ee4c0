"""The ZeroMQ event bus: sources publish ``[topic, payload]``, the correlator subscribes.

The correlator is the stable side and binds; sources connect. Publishers never block:
past the high-water mark a message is dropped and counted. Every event carries the
publisher's sequence number, so the subscriber counts what went missing in between
(drops, a subscriber that was not yet connected, a restart). A source that emits many
events at once (a probe's flush) sends them in batch messages (``Publisher.batched``);
the subscriber hands out events either way.

A bound SUB socket forwards its subscriptions to a newly connected publisher only when
it next processes commands (a poll or recv; libzmq#2267). The correlator polls all the
time, so in service this is invisible; code that waits for a subscriber in the same
thread must keep the subscriber polling (see :meth:`Subscriber.process_commands`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urlparse

import zmq

from gpuwhy.errors import BusError, DecodeError
from gpuwhy.events import TOPICS, Envelope, Event
from gpuwhy.wire import decode_message, join_payloads, to_payload

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
BATCH_BYTES = MAX_MESSAGE_BYTES // 4    # a batch message stays far below the subscriber's limit
BATCH_EVENTS = 256


def _ms(seconds: float) -> int:
    """A poll timeout in whole ms, rounded up: 0.4 ms truncated to 0 would spin to a deadline."""
    return math.ceil(seconds * 1000)


def _ipc_path(endpoint: str) -> str | None:
    if not endpoint.startswith("ipc://"):
        return None
    return urlparse(endpoint).path or endpoint[len("ipc://"):]


def _prepare_ipc(endpoint: str) -> None:
    path = _ipc_path(endpoint)
    if path and os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)


def _socket_inode(path: str | None) -> int | None:
    try:
        return os.stat(path).st_ino if path else None
    except OSError:
        return None


class Publisher:
    """A source's end of the bus.

    >>> pub = Publisher("ipc:///run/gpuwhy/bus.sock", src="fdtrack")  # doctest: +SKIP
    >>> pub.publish(SourceHealth(ts=now_ns(), source="fdtrack", state="ok"))  # doctest: +SKIP
    """

    def __init__(self, endpoint: str, src: str, hwm: int = 10000,
                 context: zmq.Context | None = None):
        self.src = src
        self.seq = 0
        self.dropped = 0
        self._context = context or zmq.Context.instance()
        # XPUB instead of PUB: it tells us when a subscriber is there (no sleeping to beat
        # the slow joiner), and with NODROP a full queue raises Again, so drops get counted.
        self._socket = self._context.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.XPUB_NODROP, 1)
        # VERBOSE: a reconnecting subscriber re-sends subscriptions on the same pipe (the
        # connecting side keeps its pipe across reconnects); without it they are deduplicated.
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._socket.setsockopt(zmq.LINGER, 1000)
        self.subscriptions = 0
        self._held: list[tuple[str, bytes]] | None = None    # inside batched()
        self._poller: zmq.Poller | None = None                 # wait()'s, for _wait_fds
        self._wait_fds: tuple[int, ...] | None = None
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(0)
            raise BusError(f"cannot connect to bus {endpoint}: {exc}") from None

    def publish(self, event: Event) -> bool:
        """Send one event without blocking; False (and counted) when it had to be dropped.
        Inside :meth:`batched` the event is held and True returned."""
        self.seq += 1
        payload = to_payload(event, src=self.src, seq=self.seq)
        if self._held is not None:
            self._held.append((event.topic, payload))
            return True
        return self._send(event.topic, payload, 1)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Hold what :meth:`publish` is given in the block and send it at the end as few
        messages: one per run of consecutive events of a topic (the order stays as
        published), at most BATCH_EVENTS events or BATCH_BYTES each. A dropped batch counts
        each of its events in ``dropped``."""
        if self._held is not None:      # nested: the outer block sends
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            self._send_held(held)

    def _send_held(self, held: list[tuple[str, bytes]]) -> None:
        run: list[bytes] = []
        run_topic, run_bytes = "", 0
        for topic, payload in [*held, ("", b"")]:      # the sentinel sends the last run
            if run and (topic != run_topic or len(run) >= BATCH_EVENTS
                        or run_bytes + len(payload) > BATCH_BYTES):
                self._send(run_topic, run[0] if len(run) == 1 else join_payloads(run), len(run))
                run, run_bytes = [], 0
            run.append(payload)
            run_topic, run_bytes = topic, run_bytes + len(payload)

    def _send(self, topic: str, payload: bytes, events: int) -> bool:
        try:
            self._socket.send_multipart([topic.encode(), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += events
            return False
        return True

    def poll_subscriptions(self, timeout: float = 0.0) -> bool:
        """True when a subscriber (re)subscribed since the last call: time to re-send state."""
        subscribed = False
        while self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN or \
                (timeout > 0 and self._socket.poll(_ms(timeout), zmq.POLLIN)):
            if self._socket.recv()[:1] == b"\x01":
                subscribed = True
                self.subscriptions += 1
            timeout = 0
        return subscribed

    def wait(self, fds: Sequence[int], timeout: float) -> bool:
        """Sleep until a subscription reaches this socket or one of ``fds`` is readable, at
        most ``timeout`` s; True when something is ready (then read it)."""
        if tuple(fds) != self._wait_fds:
            self._poller = zmq.Poller()
            self._poller.register(self._socket, zmq.POLLIN)
            for fd in fds:
                self._poller.register(fd, zmq.POLLIN)
            self._wait_fds = tuple(fds)
        assert self._poller is not None
        return bool(self._poller.poll(_ms(timeout)))

    def wait_for_subscriber(self, timeout: float = 5.0) -> bool:
        """Block until a subscriber's subscription has reached us, at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.subscriptions:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll_subscriptions(remaining)
        return True

    def close(self, linger: float | None = None) -> None:
        """Close; messages still queued are sent for ``linger`` s (default: the socket's
        1 s) and then dropped, unseen by the subscriber's gap count when they are the last."""
        self._socket.close(None if linger is None else int(linger * 1000))


class Subscriber:
    """The correlator's end of the bus: binds, subscribes, decodes, counts what was lost."""

    def __init__(self, endpoint: str, topics: tuple[str, ...] = TOPICS, hwm: int = 10000,
                 context: zmq.Context | None = None):
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.RCVHWM, hwm)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.LINGER, 0)
        for topic in topics:
            self._socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        _prepare_ipc(endpoint)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(0)
            raise BusError(f"cannot bind bus {endpoint}: {exc}") from None
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ipc_path = _ipc_path(endpoint)
        self._ipc_inode = _socket_inode(self._ipc_path)   # ours, to remove on close
        self.last_seq: dict[str, int] = {}
        self.counters: Counter[str] = Counter()
        self._ready: deque[Envelope] = deque()   # decoded, not yet handed out
        self._poller = zmq.Poller()              # kept: Socket.poll() makes one a call
        self._poller.register(self._socket, zmq.POLLIN)

    def process_commands(self) -> None:
        """Let libzmq handle pending commands (new peers), so subscriptions propagate."""
        self._socket.getsockopt(zmq.EVENTS)

    def receive(self, timeout: float) -> Envelope | None:
        """The next decodable event, or None after ``timeout`` seconds of silence."""
        if not self._ready and not self._read(timeout):
            return None
        return self._ready.popleft()

    def receive_many(self, timeout: float, limit: int) -> list[Envelope]:
        """The events queued now (at least ``limit`` when that many are, whole messages), or
        those of the first message within ``timeout`` seconds; [] after silence."""
        if not self._ready:
            self._read(timeout)
        while len(self._ready) < limit and self._read(0):
            pass
        envelopes = list(self._ready)
        self._ready.clear()
        return envelopes

    def _read(self, timeout: float) -> bool:
        """Decode the next message into ``_ready``; False after ``timeout`` s of silence."""
        deadline = time.monotonic() + timeout
        while True:
            # a queued message first (a poll per message costs a syscall); asked through
            # EVENTS, not a recv that fails: an idle correlator raised zmq.Again twice a wake
            if not self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                remaining = max(0.0, deadline - time.monotonic())
                if not remaining or not self._poller.poll(_ms(remaining)):
                    return False
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            try:
                envelopes, errors = decode_message(frames)
            except DecodeError as exc:
                envelopes, errors = [], [str(exc)]
            if errors:
                self.counters["decode_errors"] += len(errors)
                log.warning("dropped %d undecodable event(s) of a bus message: %s",
                            len(errors), errors[0])
            for envelope in envelopes:
                self._account(envelope)
            if envelopes:
                self._ready.extend(envelopes)
                return True

    def _account(self, envelope: Envelope) -> None:
        self.counters["received"] += 1
        last = self.last_seq.get(envelope.src)
        if last is not None:
            if envelope.seq > last + 1:
                self.counters["gap_messages"] += envelope.seq - last - 1
            elif envelope.seq <= last:
                self.counters["publisher_restarts"] += 1
        self.last_seq[envelope.src] = envelope.seq

    def close(self) -> None:
        """Close the socket and remove its file (libzmq leaves it): a later start must not
        take a dead file for a live bus. Only the file this socket made is removed."""
        self._socket.close()
        path = self._ipc_path         # not None where the inode is (it is the path's)
        if path is not None and self._ipc_inode is not None and \
                _socket_inode(path) == self._ipc_inode:
            try:
                os.unlink(path)
            except OSError:
                pass
