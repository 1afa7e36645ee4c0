"""The web view's HTTP server: cheroot (CherryPy's pure-Python WSGI server), in-process.

`gpuwhy up` runs it as a thread beside the correlator. Bounded on every side:

* a fixed pool of ``web.max_connections`` worker threads, and as many accepted connections
  waiting for one; past that a connection waits in the listen backlog (``LISTEN_BACKLOG``,
  deep, so that a burst is queued rather than its SYNs dropped and retried seconds later),
  then gets a 503 (``QUEUE_TIMEOUT``): never a thread per connection;
* a new connection gets no worker until it has sent something: it waits in cheroot's
  selector, as an idle keep-alive connection does, so connections that send nothing cost a
  file descriptor, not a thread;
* per client address (an IPv6 /64 counts as one, as for the token limiter), at most
  ``per_client`` connections that are idle or still sending their request head (the
  :class:`_Gate`); past that a new one gets a 503 at once and an idle keep-alive one is
  closed, so one address trickling requests (slowloris) holds at most that many workers;
* the request line and headers must arrive within ``HEADER_TIMEOUT`` of the connection's
  start (of the first byte, for a later request on a kept-alive connection), in all, however
  slowly they trickle: then a 408; ``REQUEST_TIMEOUT`` bounds every other read and write and
  an idle keep-alive connection;
* request line and headers at most ``MAX_HEADER_BYTES`` together (414 / 413).

What cheroot does by itself: the pool (``numthreads``), the accepted queue and its timeout
(``accepted_queue_size``, ``accepted_queue_timeout``), the per-read ``timeout``, the idle
keep-alive cap (``keep_alive_conn_limit``), the header size cap, the listen backlog. What it
cannot: its timeout is per read (a byte every few seconds never trips it), it hands every new
connection to a worker at once, and it knows no client addresses; the deadline thread, the
selector-first accept and the gate add those.

The ``Server`` header says ``gpuwhy`` and nothing else, on cheroot's own error answers too:
versions only help whoever looks for a known hole.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any

from cheroot import connections, errors
from cheroot.server import HTTPConnection, HTTPRequest
from cheroot.wsgi import Server

from gpuwhy.config import Config
from gpuwhy.threads import Thread
from gpuwhy.webui import create_app
from gpuwhy.webui.throttle import client_key

SERVER_NAME = "gpuwhy"
REQUEST_TIMEOUT = 10.0    # seconds: one read or write of a connection, or keep-alive idleness
HEADER_TIMEOUT = 5.0      # seconds for the request line and headers in all (or the timeout if less)
QUEUE_TIMEOUT = 1.0       # seconds an accepted connection waits for room in the queue: then 503
LISTEN_BACKLOG = 1024     # connections the kernel holds before accept (capped by somaxconn)
GRACE = 1.0               # seconds a new connection may take to send its head before it is slow
HARD_FACTOR = 8           # waiting connections per address in all, grace or not: cap times this
SHUTDOWN_TIMEOUT = 1.0    # seconds stop() gives busy workers before it closes their sockets
STOP_WAIT = 3.0           # seconds shutdown() waits in all; a request still running is left
MAX_HEADER_BYTES = 64 * 1024
DEADLINE_CHECK = 0.25     # how late past its deadline a request's read may be shut
# cheroot's select timeout, and how often it closes connections idle past REQUEST_TIMEOUT:
# its 0.5 s woke an idle web view twice a second (0.04 % of a core); a stop wakes it at once
EXPIRATION_INTERVAL = 5.0

BUSY = "busy: try again in a moment"
# sent by the selector thread to a connection over its address's cap: small enough that a new
# socket's empty send buffer always takes it whole, so the send never waits
_REFUSED = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(BUSY)}\r\nRetry-After: 1\r\nConnection: close\r\n"
            f"Server: {SERVER_NAME}\r\n\r\n{BUSY}").encode("ascii")

log = logging.getLogger("gpuwhy.web")


def per_client_cap(max_connections: int) -> int:
    """Slow or idle connections one address may hold: half the pool (2 at least), so that
    one address trickling requests leaves the other half to everyone else."""
    return max(2, max_connections // 2)


class _Gate:
    """Per client address, the connections that are idle or still sending their request head
    ("waiting"), and those of them a worker is reading a half-sent head from ("reading").

    A new connection is refused when its address already has ``cap`` connections waiting
    for longer than ``GRACE`` (slow or idle), or ``HARD_FACTOR * cap`` waiting in all; a
    half-sent head gets a worker only while its address has fewer than ``cap`` reading. A
    connection whose head has arrived whole is being served and counts in neither, and the
    grace lets a burst of quick clients from one address (their heads a moment behind their
    connects) through: the cap is on what costs a worker or a descriptor without asking.
    """

    def __init__(self, cap: int, grace: float = GRACE) -> None:
        self.cap, self.grace, self.hard = cap, grace, HARD_FACTOR * cap
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[_Connection, float]] = {}    # since when
        self._reading: dict[str, set[_Connection]] = {}

    def admit(self, conn: _Connection) -> bool:
        """Count ``conn`` as waiting from now, unless its address has its share already."""
        now = time.monotonic()
        with self._lock:
            waiting = self._waiting.setdefault(conn.client, {})
            if conn in waiting:
                return True
            slow = sum(since < now - self.grace for since in waiting.values())
            if slow >= self.cap or len(waiting) >= self.hard:
                if not waiting:
                    del self._waiting[conn.client]
                return False
            waiting[conn] = now
            return True

    def read(self, conn: _Connection) -> bool:
        """Count ``conn``, whose head is half here, as read by a worker, unless its address
        has ``cap`` such already."""
        with self._lock:
            reading = self._reading.setdefault(conn.client, set())
            if len(reading) >= self.cap:
                return False
            reading.add(conn)
            return True

    def release(self, conn: _Connection) -> None:
        """``conn``'s head is here whole, or it is closed: it waits no more."""
        with self._lock:
            for table in (self._waiting, self._reading):
                held = table.get(conn.client)
                if held is not None and conn in held:
                    if isinstance(held, dict):
                        del held[conn]
                    else:
                        held.discard(conn)
                    if not held:
                        del table[conn.client]

    def waiting(self, client: str) -> int:
        with self._lock:
            return len(self._waiting.get(client, ()))


def _head_complete(conn: HTTPConnection) -> bool:
    """Whether the request head (line and headers, up to the blank line) is already here, in
    cheroot's read buffer or the socket's, peeked without taking it; the end of the stream
    counts as complete too (the worker reads it and closes at once)."""
    if conn.rfile.has_data():
        return True
    sock = conn.socket
    timeout = sock.gettimeout()
    # a socket with a timeout waits for data before it reads, MSG_DONTWAIT or not: no timeout
    # for the peek (no worker uses the socket meanwhile: it is the selector's)
    sock.settimeout(0)
    try:
        data = sock.recv(MAX_HEADER_BYTES + 4, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:
        return True                         # reset: the worker's read ends it
    finally:
        sock.settimeout(timeout)
    return not data or b"\r\n\r\n" in data or len(data) > MAX_HEADER_BYTES


class _Deadlines:
    """The request line and headers must arrive within the server's timeout IN ALL: cheroot's
    own timeout is per read, which a client that sends a byte every few seconds never trips.
    One thread shuts the read side of a request past its deadline; its parse then ends."""

    def __init__(self) -> None:
        # One condition for arm, disarm and stop: the thread sleeps until the first
        # deadline, or for good while no request is being read (no wake-ups when idle).
        self._changed = threading.Condition()
        self._armed: dict[int, tuple[_Request, float]] = {}
        self._stopped = False

    def arm(self, request: _Request, deadline: float) -> None:
        with self._changed:
            self._armed[id(request)] = (request, deadline)
            self._changed.notify()

    def disarm(self, request: _Request) -> None:
        with self._changed:
            self._armed.pop(id(request), None)

    def run(self, slack: float) -> None:
        """Until stop(): shut each request's read side once its deadline is ``slack`` s
        past (late by at most that, so that deadlines close together share a wake-up)."""
        while True:
            with self._changed:
                if self._stopped:
                    return
                now = time.monotonic()
                late = [r for r, deadline in self._armed.values() if deadline <= now]
                if not late:
                    first = min((d for _, d in self._armed.values()), default=None)
                    self._changed.wait(None if first is None else first - now + slack)
                    continue
                for request in late:
                    self._armed.pop(id(request), None)
            for request in late:
                request.expired = True
                try:
                    request.conn.socket.shutdown(socket.SHUT_RD)
                except OSError:
                    pass                              # closed meanwhile

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()


class _Request(HTTPRequest):
    expired = False          # its headers took longer than the timeout: answered 408

    def parse_request(self) -> None:
        conn, server = self.conn, self.server
        # the first request's head is timed from the connection's start, a later one's from
        # its first byte: a client that connects and waits has used its time already
        started = conn.started if not conn.served else time.monotonic()
        server.deadlines.arm(self, started + server.header_timeout)
        try:
            super().parse_request()
        finally:
            server.deadlines.disarm(self)
            conn.served = True
            server.gate.release(conn)

    def simple_response(self, status: str, msg: str | bytes = "") -> None:
        """cheroot's own answers (400, 408, 413, 414...), with our ``Server`` header: cheroot
        writes none on them."""
        if self.expired:
            status, msg = "408 Request Timeout", ""
        status = str(status)
        body = msg.encode("ISO-8859-1") if isinstance(msg, str) else msg
        head = [f"{self.server.protocol} {status}", f"Content-Length: {len(body)}",
                "Content-Type: text/plain", f"Server: {SERVER_NAME}"]
        if status[:3] in {"413", "414"}:
            self.close_connection = True
            head.append("Connection: close")
        try:
            self.conn.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("ISO-8859-1") + body)
        except OSError as exc:
            if exc.args[0] not in errors.socket_errors_to_ignore:
                raise


class _Connection(HTTPConnection):
    RequestHandlerClass = _Request
    client = ""              # the gate's key of the peer's address
    served = False           # a request head has been read on it
    started = 0.0            # monotonic time of accept

    def close(self) -> None:
        self.server.gate.release(self)
        super().close()


class _Connections(connections.ConnectionManager):
    """cheroot's connection manager, whose ``stop()`` does not wait out the select's timeout
    (EXPIRATION_INTERVAL): it touches the listening socket, as cheroot's own server stop
    does for its accept()."""

    # Made by ConnectionManager.__init__, left out of cheroot's stub (whose selector's
    # ``connections`` would be None there: it yields (fd, connection) pairs).
    _selector: Any

    def stop(self) -> None:
        self._stop_requested = True         # the flag cheroot's stop() sets, before the touch
        _touch(self.server.socket)
        super().stop()

    def _expire(self, threshold: float) -> None:
        """cheroot's expiry of idle connections, with the header deadline for a new one that
        has sent nothing (cheroot would give it the whole keep-alive timeout)."""
        headless = time.monotonic() - self.server.header_timeout
        timed_out = [(fd, conn) for fd, conn in self._selector.connections
                     if conn is not self.server and (
                         conn.last_used < threshold or
                         (not conn.served and conn.started < headless))]
        for fd, conn in timed_out:
            self._selector.unregister(fd)
            conn.close()


def _touch(sock: socket.socket | None) -> None:
    """Connect to a listening socket and leave at once: its select returns."""
    if sock is None:
        return
    try:
        host, port = sock.getsockname()[:2]
        with socket.create_connection((host, port), timeout=0.5):
            pass
    except OSError:
        pass                    # closed already, or unreachable: the select times out


class WebServer(Server):
    """cheroot's WSGI server, bound when made (``server_port`` is the real one for port 0),
    served by :meth:`serve_forever`, stopped by :meth:`shutdown` and :meth:`server_close`
    (the calls of Werkzeug's server, which the service and tests make)."""

    ConnectionClass = _Connection

    def __init__(self, app, host: str, port: int, max_connections: int,  # noqa: ANN001
                 timeout: float = REQUEST_TIMEOUT, per_client: int | None = None,
                 header_timeout: float = HEADER_TIMEOUT):
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        # cheroot's stub says int for these seconds; cheroot takes floats (a socket's timeout,
        # a queue's, a join's), its stub only copied its docstrings
        super().__init__((host, port), app, numthreads=max_connections, max=max_connections,
                         server_name=SERVER_NAME, request_queue_size=LISTEN_BACKLOG,
                         timeout=timeout, shutdown_timeout=SHUTDOWN_TIMEOUT,  # type: ignore[arg-type]
                         accepted_queue_size=max_connections,
                         accepted_queue_timeout=QUEUE_TIMEOUT)  # type: ignore[arg-type]
        self.software = SERVER_NAME              # the WSGI SERVER_SOFTWARE
        self.max_request_header_size = MAX_HEADER_BYTES
        self.keep_alive_conn_limit = max_connections
        self._lock = threading.Lock()
        self._closed = False
        self._served = threading.Event()         # serve_forever() has returned
        self.deadlines = _Deadlines()
        self.header_timeout = min(timeout, header_timeout)
        self.gate = _Gate(per_client or per_client_cap(max_connections))
        self.expiration_interval = EXPIRATION_INTERVAL
        self._listen()

    def _listen(self) -> None:
        """Bind and listen now, as Werkzeug's server did: a taken port fails here, and port 0's
        real number is known before the thread starts. (cheroot's own prepare() binds later,
        and takes fd 3 whenever LISTEN_PID is set.)"""
        host, port = self.bind_addr
        failure: OSError | None = None
        for family, kind, proto, _, address in socket.getaddrinfo(
                host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE):
            sock = self.prepare_socket(self.bind_addr, family, kind, proto, self.nodelay,
                                       None, self.reuse_port)
            try:
                sock.bind(address)
                sock.listen(self.request_queue_size)
            except OSError as exc:
                sock.close()
                failure = exc
                continue
            sock.settimeout(1)
            self.socket = sock
            self.bind_addr = self.resolve_real_bind_addr(sock)
            return
        raise failure or OSError(f"no address to bind for {host}")

    def process_conn(self, conn: _Connection) -> None:
        """From cheroot's selector thread: a new connection, or one with something to read.

        A new one is counted at its address's gate (a 503 at once past the cap) and waits in
        the selector until it sends; one whose request head is here whole is being served and
        leaves the gate; then to a worker, or with the queue full a 503 at once (cheroot's own
        answers it from another thread, with no Server header)."""
        new = not conn.started
        if new:
            conn.started = time.monotonic()
            conn.client = client_key(conn.remote_addr)
            if not self.gate.admit(conn):
                self._refuse(conn)
                return
        if _head_complete(conn):
            self.gate.release(conn)
        elif new:
            self._connections.put(conn)               # no worker until it sends
            return
        elif not self.gate.read(conn):
            self._refuse(conn)                        # its address holds its share of workers
            return
        try:
            self.requests.put(conn)
        except queue.Full:
            try:
                _Request(self, conn).simple_response("503 Service Unavailable", BUSY)
            except OSError:
                pass                                  # the client left
            conn.linger = True
            conn.close()

    def _refuse(self, conn: _Connection) -> None:
        try:
            conn.socket.send(_REFUSED, socket.MSG_DONTWAIT)
        except OSError:
            pass                              # the client left, or its buffer is full
        conn.close()

    def put_conn(self, conn: _Connection) -> None:
        """A kept-alive connection back to the selector, idle: it counts at its address's
        gate again, and is closed when the address has its share of waiting ones already."""
        if self.ready and self.gate.admit(conn):
            self._connections.put(conn)
        else:
            conn.close()

    @property
    def server_port(self) -> int:
        return self.bind_addr[1]

    def prepare(self) -> None:
        """cheroot's prepare() on the socket bound in __init__: workers, connection manager."""
        self._interrupt = None
        Thread(target=self.deadlines.run, args=(DEADLINE_CHECK,),
               name="gpuwhy-web-deadlines", daemon=True).start()
        self._connections = _Connections(self)
        self.requests.start()
        self.ready = True
        self._start_time = time.time()

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`. Run it in a daemon thread: the workers it starts are
        daemon threads too, so a server never stopped does not keep the process alive."""
        try:
            with self._lock:
                if self._closed or self.socket is None:
                    return
                self.prepare()
            self.serve()
        finally:
            self._served.set()

    def shutdown(self) -> None:
        """Stop serving and wait (``STOP_WAIT`` s at most) for serve_forever() to return.

        Idle workers end at once; a busy one gets ``SHUTDOWN_TIMEOUT`` s, then its socket is
        shut. cheroot then waits for it without a bound: a request still running in the app
        (a PDF report) is left to finish on its daemon thread rather than hold up the stop.
        """
        with self._lock:
            self._closed = True
            serving = self.ready
        if not serving:
            return
        self.deadlines.stop()
        stopper = Thread(target=self.stop, name="gpuwhy-web-stop", daemon=True)
        stopper.start()
        deadline = time.monotonic() + STOP_WAIT
        stopper.join(STOP_WAIT)
        self._served.wait(max(0.0, deadline - time.monotonic()))
        if stopper.is_alive():
            log.warning("the web view stopped with a request still running")

    def server_close(self) -> None:
        """Close the listening socket (stop() closes it too; here also when never served)."""
        with self._lock:
            self._closed = True
            sock, self.socket = (None, None) if self.ready else (self.socket, None)
        if sock is not None:
            sock.close()


def make_web_server(config: Config, timeout: float = REQUEST_TIMEOUT) -> WebServer:
    """The server of ``create_app(config)`` on web.host and web.port (0: any free port)."""
    return WebServer(create_app(config), config["web.host"], config["web.port"],
                     config["web.max_connections"], timeout=timeout)
