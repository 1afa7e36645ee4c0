"""Tell systemd that the service is ready and alive (``Type=notify``, ``WatchdogSec=``).

Active only when systemd started us with ``$NOTIFY_SOCKET``; otherwise every call does
nothing, so the service calls it unconditionally. Messages go through systemd-python's
``systemd.daemon.notify`` (sd_notify(3)).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def _sd_notify(message: str) -> bool:
    from systemd import daemon

    return daemon.notify(message)


def _send_safely(send: Callable[[str], bool]) -> Callable[[str], bool]:
    """A notification must never take the service down: a signal arriving during the send
    (EINTR) is retried once; any other socket error (systemd gone) is logged and dropped."""
    failed = False

    def safe(message: str) -> bool:
        nonlocal failed
        for _attempt in range(2):
            try:
                return send(message)
            except InterruptedError:
                continue
            except OSError as exc:
                if not failed:
                    log.warning("cannot notify systemd (%s): %s", message.split("=")[0], exc)
                    failed = True
                return False
        return False
    return safe


def watchdog_interval(environ: Mapping[str, str]) -> float | None:
    """Seconds between watchdog pings: half of ``$WATCHDOG_USEC`` (sd_watchdog_enabled(3)),
    or None when no watchdog is asked for, or it is meant for another process."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


class Notifier:
    """READY=1 once, WATCHDOG=1 while the service is healthy, STOPPING=1 at the end."""

    def __init__(self, send: Callable[[str], bool] | None, interval: float | None,
                 clock: Callable[[], float] = time.monotonic):
        self._send = _send_safely(send) if send is not None else None
        self.interval = interval
        self._clock = clock
        self._last_ping = float("-inf")
        self._reported_unhealthy = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        environ = os.environ if environ is None else environ
        if not environ.get("NOTIFY_SOCKET"):
            return cls(None, None)
        try:
            import systemd.daemon  # noqa: F401
        except ImportError:
            # Only the systemd units need it: said once, instead of failing at READY=1.
            log.warning("NOTIFY_SOCKET is set but systemd-python is not installed: no READY "
                        "or watchdog notifications (pip install systemd-python)")
            return cls(None, None)
        return cls(_sd_notify, watchdog_interval(environ))

    @property
    def active(self) -> bool:
        return self._send is not None

    def ready(self, status: str) -> None:
        if self._send is not None:
            self._send(f"READY=1\nSTATUS={status[:200]}")
            self._last_ping = self._clock()

    def alive(self, healthy: bool, why: str = "") -> None:
        """Ping the watchdog when healthy and due; an unhealthy service stops pinging, so
        systemd restarts it after ``WatchdogSec=`` (``Restart=on-failure``)."""
        if self._send is None or self.interval is None:
            return
        if not healthy:
            if not self._reported_unhealthy:
                log.error("not healthy (%s): no more watchdog pings, systemd will restart us",
                          why or "a part stopped")
                self._send(f"STATUS=unhealthy: {why[:200]}")
                self._reported_unhealthy = True
            return
        now = self._clock()
        if now - self._last_ping >= self.interval:
            self._send("WATCHDOG=1")
            self._last_ping = now

    def stopping(self) -> None:
        if self._send is not None:
            self._send("STOPPING=1")
