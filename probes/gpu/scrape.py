"""One HTTP GET with a limit on its total time and on the size of its body.

A socket timeout bounds each read only: a target that sends a byte a second never trips it
and holds the caller for as long as it likes. Here a watchdog (one thread for every scrape
of the process) shuts the connection's socket down when the scrape's time is up, which
wakes whatever read is blocked on it (connect, TLS handshake, headers, body). urllib still
does the request, so proxies from the environment and HTTPS work as with ``urlopen``.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from gpuwhy.threads import Thread


class ScrapeFailed(Exception):
    """A scrape that gave no usable body; ``reason`` says why in one line."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class Deadline:
    """A scrape's total-time limit: once ``seconds`` have passed, every socket it watches
    is shut down and ``expired`` is set. A context manager; leaving it ends the limit.
    Every Deadline of the process is kept by one thread (:class:`_Watchdog`): a timer
    thread started for each scrape cost more CPU than the engines source's whole parse
    (scripts/bench_engines.py)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self.done = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Deadline:
        _WATCHDOG.add(self, time.monotonic() + self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.done = True      # the watchdog drops it when its time comes

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _cut(sock)

    def _expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            for sock in self._sockets:
                _cut(sock)


class _Watchdog:
    """One thread that expires every Deadline at its time: it sleeps until the first one
    is due, or for good while none is held (no wake-ups when idle); started at the first."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline, due: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (due, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():   # first, or forked
                self._thread = Thread(target=self._run, name="gpuwhy-deadlines", daemon=True)
                self._thread.start()
            elif self._due[0][2] is deadline:
                self._changed.notify()         # due before the one the thread waits for

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._due and self._due[0][2].done:
                    heapq.heappop(self._due)          # left in time
                if not self._due:
                    self._changed.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                _, _, deadline = heapq.heappop(self._due)
            deadline._expire()


_WATCHDOG = _Watchdog()


def _cut(sock: socket.socket) -> None:
    # The plain socket's shutdown, also under TLS: SSLSocket.shutdown drops its SSL state
    # under the feet of the thread reading. Shutting down (not closing) wakes a blocked recv.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass   # already closed or never connected


def _watched(connection_class: type[http.client.HTTPConnection],
             deadline: Deadline) -> Callable[..., http.client.HTTPConnection]:
    """A factory of ``connection_class`` connections whose raw socket ``deadline`` watches
    from the moment it exists (before a TLS handshake, which is bounded too)."""
    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        connection = connection_class(*args, **kwargs)
        # what connect() calls to get the socket: private, undeclared in the stubs
        create = connection._create_connection  # type: ignore[attr-defined]

        def create_watched(*a: Any, **kw: Any) -> socket.socket:
            sock = create(*a, **kw)
            deadline.watch(sock)
            return sock
        connection._create_connection = create_watched  # type: ignore[attr-defined]
        return connection
    return make


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req,
                            context=self._context)  # type: ignore[attr-defined]


def fetch_within(url: str, seconds: float, max_bytes: int) -> bytes:
    """The body of ``url``, fetched within ``seconds`` in all, of ``max_bytes`` at most.

    Raises :class:`ScrapeFailed`: "scrape of URL took longer than N s", "response from URL
    is larger than N bytes", "truncated response from URL (...)", "cannot scrape URL: ...".
    """
    deadline = Deadline(seconds)
    started = time.monotonic()
    failure: str | None = None
    body = b""
    with deadline:
        opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
        try:
            with opener.open(url, timeout=seconds) as response:
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    failure = f"response from {url} is larger than {max_bytes} bytes " \
                              f"(Content-Length {declared})"
                else:
                    body = response.read(max_bytes + 1)
            if failure is None and declared.isdigit() and len(body) < int(declared):
                # read(amt) returns short at EOF instead of raising IncompleteRead
                raise http.client.IncompleteRead(body, int(declared) - len(body))
        except http.client.IncompleteRead as exc:
            failure = f"truncated response from {url} ({len(exc.partial)} bytes, more expected)"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            failure = f"cannot scrape {url}: {getattr(exc, 'reason', exc)}"
    # Whatever the cut connection looked like to the reader (an error, a short body that
    # seemed complete), the time was up: that is the one reason to give. The socket's own
    # timeout (also ``seconds``, for each wait) can fire a moment before the timer does.
    if deadline.expired or time.monotonic() - started >= seconds:
        raise ScrapeFailed(f"scrape of {url} took longer than {seconds:g} s")
    if failure is not None:
        raise ScrapeFailed(failure)
    if len(body) > max_bytes:
        raise ScrapeFailed(f"response from {url} is larger than {max_bytes} bytes")
    return body
