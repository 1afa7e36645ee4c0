"""Bytes GPU processes and their workers receive from sockets, through the real BPF program.

A watched process reads from a TCP server on loopback, peeks, sleeps and then reads from a
UNIX socket pair (the kind of queue a loader and its workers share), and forks a worker
that reads from the server too, after waiting half a second for its answer: only the TCP
bytes count, the worker's as the workers', and only the worker's wait was for the network.
Both hooks the probe can use: the sock:sock_recv_length tracepoint, and the tcp_cleanup_rbuf
kprobe on a kernel with kprobes (this VM has none, CONFIG_KPROBES off: there the probe must
say the bytes are unknown rather than count none).
"""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpuwhy.events import SchedStats
from gpuwhy.probes import sched
from gpuwhy.probes.sched import NetRx, SchedProbe
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

OWN, PEEKED, UNIX, WORKER = 300_000, 1000, 50_000, 500_000
WORKER_WAIT_S, OWN_SLEEP_S = 0.5, 0.6
KPROBES = os.path.isdir("/sys/bus/event_source/devices/kprobe")

# Waits for a line on stdin (the probe watches it by then), then receives.
CLIENT = f"""
import os, socket, sys, time
port = int(sys.argv[1])
sys.stdin.readline()

def fetch(n, peek=0, delay=0.0):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"%d %f\\n" % (n, delay))
    if peek:
        s.recv(peek, socket.MSG_PEEK | socket.MSG_WAITALL)
    got = 0
    while got < n:
        got += len(s.recv(65536))
    s.close()

fetch({OWN}, peek={PEEKED})
time.sleep({OWN_SLEEP_S})                 # then woken to read a UNIX socket: no network wait
a, b = socket.socketpair()
a.sendall(b"x" * {UNIX})
got = 0
while got < {UNIX}:
    got += len(b.recv(65536))
pid = os.fork()
if pid == 0:
    fetch({WORKER}, delay={WORKER_WAIT_S})
    os._exit(0)
os.waitpid(pid, 0)
print("done", flush=True)
sys.stdin.readline()
"""


def serve(server: socket.socket) -> None:
    """Send each connection as many bytes as its first line asks for, after the delay it
    asks for."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            wanted, delay = conn.makefile("rb").readline().split()
            time.sleep(float(delay))
            conn.sendall(b"\0" * int(wanted))


def received(config, hook: NetRx, monkeypatch) -> tuple[dict, dict]:
    """The client's own and workers' figures summed over the flushes after the watch."""
    monkeypatch.setattr(sched, "net_rx_hook", lambda: hook)
    server = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(server,), daemon=True).start()
    published = []
    probe = SchedProbe(config, published.append)
    probe.load()
    assert probe.net_rx == hook
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(server.getsockname()[1])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        key = process_key(client.pid)
        probe.watch(key)
        probe.flush()                            # a baseline: what follows is counted
        published.clear()
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "done"
        probe.flush()
    finally:
        client.stdin.close()
        client.wait(10)
        server.close()
        probe.close()
    stats = [e for e in published if isinstance(e, SchedStats) and e.process == key]
    assert stats
    own = {k: sum(e.own[k] for e in stats) for k in sched.NET_FIELDS}
    workers = {k: sum(e.workers[k] for e in stats) for k in sched.NET_FIELDS}
    return own, workers


def test_the_tracepoint_counts_tcp_bytes_not_unix_sockets_nor_peeks(tmp_config, monkeypatch):
    assert sched.net_rx_hook() == NetRx.TRACEPOINT      # this kernel (6.4+) has it
    own, workers = received(tmp_config, NetRx.TRACEPOINT, monkeypatch)
    assert own["net_rx_bytes"] == OWN
    assert workers["net_rx_bytes"] == WORKER
    # the worker slept in recv() until the answer came; the process's own long sleep ended
    # in a UNIX socket's receive
    assert 0.9 * WORKER_WAIT_S * 1e9 <= workers["net_wait_ns"] <= 3 * WORKER_WAIT_S * 1e9
    assert own["net_wait_ns"] < 0.3 * OWN_SLEEP_S * 1e9


def test_the_kprobe_counts_tcp_bytes_where_the_tracepoint_is_missing(tmp_config, monkeypatch):
    if not KPROBES:     # what this kernel can do: the probe must say so, not count zero
        monkeypatch.setattr(sched, "net_rx_hook", lambda: NetRx.KPROBE)
        probe = SchedProbe(tmp_config, lambda event: None)
        probe.load()
        try:
            assert probe.net_rx == NetRx.NONE
        finally:
            probe.close()
        return
    own, workers = received(tmp_config, NetRx.KPROBE, monkeypatch)
    # tcp_recvmsg reports a peek's bytes to tcp_cleanup_rbuf too (it cannot tell them apart)
    assert OWN <= own["net_rx_bytes"] <= OWN + PEEKED
    assert workers["net_rx_bytes"] == WORKER
    assert 0.9 * WORKER_WAIT_S * 1e9 <= workers["net_wait_ns"] <= 3 * WORKER_WAIT_S * 1e9


def test_a_kernel_without_either_hook_reports_the_bytes_unknown_not_zero(tmp_config,
                                                                        monkeypatch):
    monkeypatch.setattr(sched, "net_rx_hook", lambda: NetRx.KPROBE)
    monkeypatch.setattr(sched, "NET_RX_KPROBE", "gpuwhy_no_such_kernel_function")
    published = []
    probe = SchedProbe(tmp_config, published.append)
    probe.load()
    assert probe.net_rx == NetRx.NONE
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        probe.watch(process_key(sleeper.pid))
        probe.flush()
    finally:
        sleeper.kill()
        sleeper.wait(10)
        probe.close()
    stats = [e for e in published if isinstance(e, SchedStats)]
    assert stats and all(name not in e.own and name not in e.workers and "on_cpu_ns" in e.own
                         for e in stats for name in sched.NET_FIELDS)
