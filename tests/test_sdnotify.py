"""Readiness and watchdog notifications to systemd (gpuwhy/sdnotify.py)."""

import os
import socket

from gpuwhy.sdnotify import Notifier, watchdog_interval


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_without_notify_socket_nothing_is_sent():
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert not notifier.active
    notifier.ready("x")
    notifier.alive(True)
    notifier.stopping()          # no socket, no error


def test_watchdog_interval_is_half_and_only_for_us():
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) \
        == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "x"}) is None
    assert watchdog_interval({}) is None


def test_pings_are_paced_and_stop_when_unhealthy():
    sent, clock = [], Clock()
    notifier = Notifier(lambda m: sent.append(m) or True, 15.0, clock)
    notifier.ready("web view at http://127.0.0.1:8000")
    assert sent == ["READY=1\nSTATUS=web view at http://127.0.0.1:8000"]
    notifier.alive(True)                    # just said READY: not due yet
    clock.now += 15
    notifier.alive(True)
    clock.now += 5
    notifier.alive(True)                    # 5 s later: not due
    assert sent[1:] == ["WATCHDOG=1"]
    clock.now += 60
    notifier.alive(False, "gpuwhy-correlator stopped")
    notifier.alive(False, "gpuwhy-correlator stopped")
    assert sent[2:] == ["STATUS=unhealthy: gpuwhy-correlator stopped"]   # once, no ping


def test_a_failing_socket_never_raises():
    def send(message):
        raise ConnectionRefusedError(111, "Connection refused")
    notifier = Notifier(send, 1.0, Clock())
    notifier.ready("x")
    notifier.alive(True)
    notifier.stopping()


def test_an_interrupted_send_is_retried():
    calls = []

    def send(message):
        calls.append(message)
        if len(calls) == 1:
            raise InterruptedError(4, "Interrupted system call")
        return True
    Notifier(send, None).stopping()
    assert calls == ["STOPPING=1", "STOPPING=1"]


def test_real_sd_notify_reaches_the_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify"
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))     # sd_notify(3) reads it from environ
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        notifier = Notifier.from_environment()
        assert notifier.active and notifier.interval == 1.0
        notifier.ready("up")
        assert sock.recv(1024) == b"READY=1\nSTATUS=up"
