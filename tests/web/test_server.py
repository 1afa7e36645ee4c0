"""The web view's production server (webui.server: cheroot, in-process), over real sockets:
a bounded pool that serves concurrently up to web.max_connections and no further, slow
clients dropped after the timeout without blocking anyone else, connections that send
nothing holding no worker, a cap per client address on slow or idle connections (300 of them
from one address leave another served at once), a Server header that names no versions,
port 0, and a stop that joins the thread at once.

A second client address is 127.0.0.2: Linux routes all of 127.0.0.0/8 to the loopback
interface, so a socket bound to it reaches the server on 127.0.0.1 from another address."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuwhy.config import load_config
from gpuwhy.errors import ConfigError
from gpuwhy.webui.server import (
    EXPIRATION_INTERVAL,
    GRACE,
    HEADER_TIMEOUT,
    QUEUE_TIMEOUT,
    SERVER_NAME,
    WebServer,
    make_web_server,
    per_client_cap,
)

OTHER = "127.0.0.2"        # another client address on the loopback interface
HALF_HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"       # no blank line: unfinished


class Gate:
    """A WSGI app whose /wait requests block until released, counting how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.environ: dict = {}

    def __call__(self, environ, start_response):
        self.environ = dict(environ)
        if environ["PATH_INFO"] == "/wait":
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                self.release.wait(10)
            finally:
                with self.lock:
                    self.running -= 1
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]


class Running:
    def __init__(self, server) -> None:
        self.server = server
        self.port = server.server_port
        self.thread = threading.Thread(target=server.serve_forever, name="test-web",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 5
        while not server.ready and time.monotonic() < deadline:
            time.sleep(0.01)

    def get(self, path: str = "/", timeout: float = 10, source: str | None = None):
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=timeout,
            source_address=(source, 0) if source else None)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        finally:
            connection.close()

    def stop(self) -> float:
        started = time.monotonic()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        assert not self.thread.is_alive()
        return time.monotonic() - started


@pytest.fixture
def serve():
    running: list[Running] = []

    def start(app, max_connections: int = 4, timeout: float = 10, **options) -> Running:
        server = WebServer(app, "127.0.0.1", 0, max_connections, timeout=timeout, **options)
        running.append(Running(server))
        return running[-1]

    yield start
    for live in running:
        live.server.shutdown()
        live.server.server_close()


def workers() -> int:
    return sum(t.name.startswith("CP Server") for t in threading.enumerate())


def test_port_0_gives_a_real_port_bound_before_serving_and_the_service_app_serves(tmp_config):
    server = make_web_server(tmp_config.replace({"web.host": "127.0.0.1", "web.port": 0}))
    try:
        assert server.server_port > 0
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=2):
            pass                                  # listening already: the port is ours
        live = Running(server)
        status, headers, _ = live.get("/healthz")       # 503: no correlator writes the store
        assert status in (200, 503) and headers.get_all("Server") == [SERVER_NAME]
        assert "Content-Security-Policy" in headers      # the app's headers, untouched
        assert live.stop() < 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_fails_when_made_with_the_os_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as failure:
            WebServer(Gate(), "127.0.0.1", taken.getsockname()[1], 2)
    assert failure.value.strerror


def test_the_server_header_and_software_name_no_versions(serve):
    app = Gate()
    live = serve(app)
    status, headers, _ = live.get("/")
    assert status == 200 and headers.get_all("Server") == ["gpuwhy"]
    assert app.environ["SERVER_SOFTWARE"] == "gpuwhy"
    # cheroot's own answers, before any app: a malformed request line
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        reply = sock.recv(4096).decode("latin-1")
    assert reply.startswith("HTTP/1.1 400 ") and "\r\nServer: gpuwhy\r\n" in reply
    assert "heroot" not in reply and "Python" not in reply


def test_requests_run_concurrently_up_to_the_cap_and_no_further(serve):
    app = Gate()
    before = workers()
    live = serve(app, max_connections=4)
    assert workers() - before == 4                       # a fixed pool, started with it
    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(live.get, "/wait") for _ in range(6)]
        deadline = time.monotonic() + 5
        while app.running < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)                                   # room for a fifth, were there one
        assert app.running == 4                           # four at once: concurrent, capped
        assert workers() - before == 4                    # no thread for the extra two
        app.release.set()
        assert [a.result(10)[0] for a in answers] == [200] * 6   # the two waited, then ran
    assert app.most == 4


def test_past_the_pool_and_its_queue_a_client_gets_503(serve):
    app = Gate()
    live = serve(app, max_connections=1)
    with ThreadPoolExecutor(4) as pool:
        busy = pool.submit(live.get, "/wait")
        while app.running < 1:
            time.sleep(0.02)
        queued = pool.submit(live.get, "/wait")          # waits in the queue (size 1)
        time.sleep(0.2)
        started = time.monotonic()
        status, headers, _ = live.get("/")
        assert status == 503 and time.monotonic() - started < QUEUE_TIMEOUT + 2
        assert headers.get_all("Server") == ["gpuwhy"]
        app.release.set()
        assert busy.result(10)[0] == 200 and queued.result(10)[0] == 200
    assert live.get("/")[0] == 200


@pytest.mark.parametrize("trickle", [False, True], ids=["half-request", "trickling"])
def test_a_slow_client_blocks_nobody_and_is_dropped_after_the_timeout(serve, trickle):
    live = serve(Gate(), max_connections=2, timeout=2.0)
    slow = socket.create_connection(("127.0.0.1", live.port), timeout=5)
    try:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")      # no blank line: unfinished
        started = time.monotonic()
        reply = b""
        stop = threading.Event()

        def drip() -> None:
            # a header byte every 0.4 s: every read succeeds, the request never ends
            while not stop.wait(0.4):
                try:
                    slow.sendall(b"X")
                except OSError:
                    return

        if trickle:
            threading.Thread(target=drip, daemon=True).start()
        for _ in range(5):                              # the other worker answers at once
            t = time.monotonic()
            assert live.get("/", timeout=3)[0] == 200
            assert time.monotonic() - t < 1.0           # not held until the slow one goes
        while chunk := slow.recv(4096):
            reply += chunk
        stop.set()
        held = time.monotonic() - started
        assert 1.5 < held < 4.0, held
        assert reply.startswith(b"HTTP/1.1 408 ") and b"\r\nServer: gpuwhy\r\n" in reply
    finally:
        slow.close()


def test_slow_clients_filling_the_pool_hold_it_only_until_the_timeout(serve):
    live = serve(Gate(), max_connections=2, timeout=1.0)
    slow = [socket.create_connection(("127.0.0.1", live.port), timeout=5,
                                     source_address=(OTHER, 0)) for _ in range(2)]
    try:
        for sock in slow:
            sock.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.2)
        started = time.monotonic()
        assert live.get("/", timeout=5)[0] == 200       # queued, served once they are dropped
        assert time.monotonic() - started < 3.0
    finally:
        for sock in slow:
            sock.close()


def test_stop_joins_the_thread_at_once_even_with_a_slow_client_connected(serve):
    live = serve(Gate(), max_connections=2, timeout=30)
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\n")
        assert live.get("/")[0] == 200
        assert live.stop() < 2.5
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", live.port), timeout=1).close()


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(serve):
    # cheroot closes idle connections at its select's timeout (EXPIRATION_INTERVAL, long so
    # that an idle server sleeps): one left open after its answer is closed, not kept
    live = serve(Gate(), max_connections=2, timeout=1)
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\nok"):       # the whole answer, then nothing
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        client.settimeout(1 + EXPIRATION_INTERVAL + 5)
        assert client.recv(4096) == b""                  # closed by the server


def test_stop_before_serving_and_twice_is_harmless():
    server = WebServer(Gate(), "127.0.0.1", 0, 2)
    server.shutdown()
    server.server_close()
    server.serve_forever()                               # closed: returns at once
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("value, ok", [("1", True), ("1024", True), ("0", False),
                                       ("1025", False), ("-3", False), ("x", False)])
def test_max_connections_is_bounded(value, ok):
    environ = {"GPUWHY_MAX_CONNECTIONS": value}
    if ok:
        assert load_config(environ=environ)["web.max_connections"] == int(value)
    else:
        with pytest.raises(ConfigError):
            load_config(environ=environ)
    assert load_config(environ={})["web.max_connections"] == 32


def connect(port: int, source: str = OTHER) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def answer(sock: socket.socket, timeout: float = 5) -> bytes:
    """All the server sends until it closes (or ``timeout``)."""
    sock.settimeout(timeout)
    reply = b""
    try:
        while chunk := sock.recv(4096):
            reply += chunk
    except OSError:          # reset after the answer: what came before it stands
        pass
    return reply


def test_a_connection_that_sends_nothing_holds_no_worker(serve):
    # one worker: cheroot gave it to the silent connection at once, and everyone else waited
    # until its read timed out
    live = serve(Gate(), max_connections=1, timeout=10, header_timeout=1.0)
    with connect(live.port) as silent:
        started = time.monotonic()
        assert live.get("/", timeout=5)[0] == 200
        assert time.monotonic() - started < 1.0
        # its head is timed from its connect, not from its first byte: late, at once a 408
        time.sleep(1.2)
        silent.sendall(HALF_HEAD)
        started = time.monotonic()
        reply = answer(silent)
        assert reply.startswith(b"HTTP/1.1 408 "), reply
        assert time.monotonic() - started < 1.0


def test_past_its_share_an_address_gets_503_at_once_and_others_are_served(serve):
    live = serve(Gate(), max_connections=4)            # a share of 2 per address
    assert per_client_cap(4) == 2 and per_client_cap(1) == 2 and per_client_cap(32) == 16
    held = [connect(live.port), connect(live.port)]
    try:
        held[0].sendall(HALF_HEAD)                        # one reading, one idle
        time.sleep(GRACE + 0.2)                           # slow now, both
        with connect(live.port) as third:
            started = time.monotonic()
            reply = answer(third)
            assert reply.startswith(b"HTTP/1.1 503 "), reply
            assert b"\r\nServer: gpuwhy\r\n" in reply and b"\r\nRetry-After: 1\r\n" in reply
            assert time.monotonic() - started < 1.0
        assert live.get("/", timeout=5)[0] == 200         # another address: served
        held.pop().close()                                # the idle one goes: room again
        assert live.get("/", timeout=5, source=OTHER)[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_half_sent_heads_get_at_most_their_share_of_the_workers(serve):
    app = Gate()
    live = serve(app, max_connections=4)               # 2 workers at most for one address
    slow = [connect(live.port) for _ in range(4)]
    try:
        for sock in slow:
            sock.sendall(HALF_HEAD)
        refused = []
        for sock in slow:
            sock.settimeout(0.5)
            try:
                refused.append(sock.recv(4096).startswith(b"HTTP/1.1 503 "))
            except TimeoutError:
                refused.append(False)                     # held by a worker, still reading
        assert refused.count(True) == 2, refused
        with ThreadPoolExecutor(2) as pool:               # two workers left for the rest
            waits = [pool.submit(live.get, "/wait") for _ in range(2)]
            deadline = time.monotonic() + 5
            while app.running < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert app.running == 2
            app.release.set()
            assert [w.result(10)[0] for w in waits] == [200, 200]
    finally:
        for sock in slow:
            sock.close()


def test_300_slow_connections_from_one_address_leave_another_served_at_once(serve):
    """Issue #54: 70 slow connections gave a normal client 503s and a 2.7 s median; 300 timed
    it out. Half of them send nothing, half a head they trickle a byte of every 0.2 s."""
    live = serve(Gate(), max_connections=32)           # the service's default pool
    assert live.server.header_timeout == HEADER_TIMEOUT
    slow: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.2):
            for sock in slow[1::2]:
                try:
                    sock.send(b"X", socket.MSG_DONTWAIT)
                except OSError:
                    pass                                  # refused and closed: fine

    dripping = threading.Thread(target=trickle, daemon=True)
    try:
        for n in range(300):
            sock = connect(live.port)
            if n % 2:
                sock.sendall(HALF_HEAD)
            slow.append(sock)
        dripping.start()
        times, statuses = [], []
        for _ in range(20):
            started = time.monotonic()
            statuses.append(live.get("/", timeout=10)[0])
            times.append(time.monotonic() - started)
            time.sleep(0.05)
        times.sort()
        # measured here: p95 0.002 s (before: timeouts); 1 s is the goal, room for a busy VM
        assert statuses == [200] * 20 and times[18] <= 1.0, times
        # what the slow ones got: a share of the workers, no more, the rest a 503 at once
        assert live.server.gate.waiting(OTHER) <= 8 * per_client_cap(32)
        assert sum(t.name.startswith("CP Server") for t in threading.enumerate()) >= 32
    finally:
        stop.set()
        for sock in slow:
            sock.close()
