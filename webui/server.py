"""The web view's HTTP server: cheroot (CherryPy's pure-Python WSGI server), in-process.

`gpuwhy up` runs it as a thread beside the correlator. Bounded on every side:

* a fixed pool of ``web.max_connections`` worker threads, and as many accepted connections
  waiting for one; past that a connection waits in the listen backlog, then gets a 503
  (``QUEUE_TIMEOUT``): never a thread per connection;
* ``REQUEST_TIMEOUT`` for every read and write of a connection, for an idle keep-alive one,
  and for the request line and headers in all: a client that sends half a request, or
  trickles it (slowloris), loses its worker then, with a 408;
* request line and headers at most ``MAX_HEADER_BYTES`` together (414 / 413).

The ``Server`` header says ``gpuwhy`` and nothing else, on cheroot's own error answers too:
versions only help whoever looks for a known hole.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

from cheroot import connections, errors
from cheroot.server import HTTPConnection, HTTPRequest
from cheroot.wsgi import Server

from gpuwhy.config import Config
from gpuwhy.threads import Thread
from gpuwhy.webui import create_app

SERVER_NAME = "gpuwhy"
REQUEST_TIMEOUT = 10.0    # seconds: one read or write of a connection, or keep-alive idleness
QUEUE_TIMEOUT = 1.0       # seconds an accepted connection waits for room in the queue: then 503
SHUTDOWN_TIMEOUT = 1.0    # seconds stop() gives busy workers before it closes their sockets
STOP_WAIT = 3.0           # seconds shutdown() waits in all; a request still running is left
MAX_HEADER_BYTES = 64 * 1024
DEADLINE_CHECK = 0.25     # how late past its deadline a request's read may be shut
# cheroot's select timeout, and how often it closes connections idle past REQUEST_TIMEOUT:
# its 0.5 s woke an idle web view twice a second (0.04 % of a core); a stop wakes it at once
EXPIRATION_INTERVAL = 5.0

log = logging.getLogger("gpuwhy.web")


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
        deadlines = self.server.deadlines
        deadlines.arm(self, time.monotonic() + self.server.timeout)
        try:
            super().parse_request()
        finally:
            deadlines.disarm(self)

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


class _Connections(connections.ConnectionManager):
    """cheroot's connection manager, whose ``stop()`` does not wait out the select's timeout
    (EXPIRATION_INTERVAL): it touches the listening socket, as cheroot's own server stop
    does for its accept()."""

    def stop(self) -> None:
        self._stop_requested = True         # the flag cheroot's stop() sets, before the touch
        _touch(self.server.socket)
        super().stop()


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
                 timeout: float = REQUEST_TIMEOUT):
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        super().__init__((host, port), app, numthreads=max_connections, max=max_connections,
                         server_name=SERVER_NAME, request_queue_size=max_connections,
                         timeout=timeout, shutdown_timeout=SHUTDOWN_TIMEOUT,
                         accepted_queue_size=max_connections,
                         accepted_queue_timeout=QUEUE_TIMEOUT)
        self.software = SERVER_NAME              # the WSGI SERVER_SOFTWARE
        self.max_request_header_size = MAX_HEADER_BYTES
        self.keep_alive_conn_limit = max_connections
        self._lock = threading.Lock()
        self._closed = False
        self._served = threading.Event()         # serve_forever() has returned
        self.deadlines = _Deadlines()
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

    def process_conn(self, conn: HTTPConnection) -> None:
        """To a worker; with the queue full, a 503 at once (cheroot's own answers it from
        another thread, with no Server header)."""
        try:
            self.requests.put(conn)
        except queue.Full:
            try:
                _Request(self, conn).simple_response("503 Service Unavailable",
                                                     "busy: try again in a moment")
            except OSError:
                pass                                  # the client left
            conn.linger = True
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
