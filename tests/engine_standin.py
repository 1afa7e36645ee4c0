"""A stand-in inference engine for the engines source's tests: an HTTP server on 127.0.0.1
that serves recorded /metrics text (tests/data/engines/*.txt), the n-th request the n-th
scrape of the file (frames split at "# --- next scrape ---"; the last one repeats).

Started under the argv the real engine shows in /proc (``python -m
vllm.entrypoints.openai.api_server --port P`` through a module of that name, ``tritonserver
--metrics-port P`` through argv[0]), it reads the frames from ``STANDIN_FRAMES`` and the
port from its own command line. ``STANDIN_MODE`` makes it hostile: ``slow`` (headers, then
a byte every 0.2 s), ``huge`` (an endless body), ``garbage`` (an HTML page), ``redirect``
(302 elsewhere). ``STANDIN_DECOY`` also listens on a port that answers 404 (an engine's other
port), ``STANDIN_CHILD`` forks a child that sleeps (an engine's worker). It writes "ready"
on stdout once listening, and ends with its parent's pipe (stdin) or after 120 s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FRAME = "# --- next scrape ---\n"


def port_from_argv(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg in ("--port", "--metrics-port") and i + 1 < len(argv):
            return int(argv[i + 1])
    raise SystemExit("no --port")


def main() -> None:
    with open(os.environ["STANDIN_FRAMES"]) as f:
        frames = f.read().split(FRAME)
    mode = os.environ.get("STANDIN_MODE", "")
    # one sequence of frames per scraper (its User-Agent names its pid): a gpuwhy service
    # running on the same host finds this stand-in too, and its scrapes must not advance
    # the frames the test's own scraper reads
    served: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if mode == "redirect":
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1:9/metrics")
                self.end_headers()
                return
            if mode == "garbage":
                body = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n" * 10
            else:
                who = self.headers.get("User-Agent", "")
                with lock:
                    n = served.get(who, 0)
                    body = frames[min(n, len(frames) - 1)].encode()
                    served[who] = n + 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            if mode == "slow":
                self.end_headers()
                for byte in body[:200]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
                return
            if mode == "huge":
                self.end_headers()
                chunk = b"vllm:num_requests_running 1\n" * 40000    # ~1 MB
                try:
                    for _ in range(1000):
                        self.wfile.write(chunk)
                except OSError:
                    pass
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Decoy(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    servers = []
    decoy = os.environ.get("STANDIN_DECOY")
    if decoy:
        servers.append(ThreadingHTTPServer(("127.0.0.1", int(decoy)), Decoy))
    servers.append(ThreadingHTTPServer(("127.0.0.1", port_from_argv(sys.argv)), Handler))
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    # ends when the test closes our stdin (EOF), or after 120 s whatever happens
    timer = threading.Timer(120, os._exit, (0,))
    timer.daemon = True
    timer.start()
    if os.environ.get("STANDIN_CHILD") and os.fork() == 0:
        for server in servers:
            server.socket.close()
        sys.stdin.read()
        os._exit(0)
    print("ready", flush=True)
    sys.stdin.read()
    os._exit(0)

if __name__ == "__main__":
    main()
