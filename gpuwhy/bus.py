"""The ZeroMQ event bus: sources publish ``[topic, payload]``, the correlator subscribes.

The correlator is the stable side and binds; sources connect. Publishers never block:
past the high-water mark a message is dropped and counted. Every message carries the
publisher's sequence number, so the subscriber counts what went missing in between
(drops, a subscriber that was not yet connected, a restart).

A bound SUB socket forwards its subscriptions to a newly connected publisher only when
it next processes commands (a poll or recv; libzmq#2267). The correlator polls all the
time, so in service this is invisible; code that waits for a subscriber in the same
thread must keep the subscriber polling (see :meth:`Subscriber.process_commands`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from urllib.parse import urlparse

import zmq

from gpuwhy.errors import BusError, DecodeError
from gpuwhy.events import TOPICS, Envelope, Event, from_frames, to_payload

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20


def _prepare_ipc(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        directory = os.path.dirname(urlparse(endpoint).path or endpoint[len("ipc://"):])
        if directory:
            os.makedirs(directory, exist_ok=True)


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
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(0)
            raise BusError(f"cannot connect to bus {endpoint}: {exc}") from None

    def publish(self, event: Event) -> bool:
        """Send one event without blocking; False (and counted) when it had to be dropped."""
        self.seq += 1
        payload = to_payload(event, src=self.src, seq=self.seq)
        try:
            self._socket.send_multipart([event.topic.encode(), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        return True

    def poll_subscriptions(self, timeout: float = 0.0) -> bool:
        """True when a subscriber (re)subscribed since the last call: time to re-send state."""
        subscribed = False
        while self._socket.poll(int(timeout * 1000), zmq.POLLIN):
            if self._socket.recv()[:1] == b"\x01":
                subscribed = True
                self.subscriptions += 1
            timeout = 0
        return subscribed

    def wait_for_subscriber(self, timeout: float = 5.0) -> bool:
        """Block until a subscriber's subscription has reached us, at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.subscriptions:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll_subscriptions(remaining)
        return True

    def close(self) -> None:
        self._socket.close()


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
        self.last_seq: dict[str, int] = {}
        self.counters: Counter[str] = Counter()

    def process_commands(self) -> None:
        """Let libzmq handle pending commands (new peers), so subscriptions propagate."""
        self._socket.getsockopt(zmq.EVENTS)

    def receive(self, timeout: float) -> Envelope | None:
        """The next decodable message, or None after ``timeout`` seconds of silence."""
        deadline = time.monotonic() + timeout
        while True:
            try:            # a queued message first: a poll per message costs a syscall
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                remaining = max(0.0, deadline - time.monotonic())
                if not self._socket.poll(int(remaining * 1000), zmq.POLLIN):
                    return None
                continue
            try:
                envelope = from_frames(frames)
            except DecodeError as exc:
                self.counters["decode_errors"] += 1
                log.warning("dropped an undecodable bus message: %s", exc)
                continue
            self._account(envelope)
            return envelope

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
        self._socket.close()
