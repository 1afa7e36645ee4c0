"""/dev/kmsg lent by the privileged probes to the unprivileged kernel-log source, over a socket.

The kernel-log source reads journald and holds /dev/kmsg only as a bell (``KernelLineBell``).
Where systemd runs gpuwhy, ``gpuwhy-kmsg.socket`` opens /dev/kmsg and passes it to the
service. A Kubernetes pod has no such unit, and its unprivileged container is refused the
device (the device cgroup, ``kernel.dmesg_restrict``), while the probes' privileged container
may open it. So, where ``klog.kmsg_socket`` is set, `gpuwhy probes` listens on that unix
socket and hands each caller a fresh read-only /dev/kmsg fd (``SCM_RIGHTS``; a fresh open
so that no two readers share a read position), and the kernel-log source borrows one.

What is lent reads the kernel log: the socket is made 0660 in a directory the two share with
the bus, which already trusts both.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import threading

log = logging.getLogger(__name__)

GREETING = b"kmsg"
BORROW_TIMEOUT_S = 1.0


class KmsgLender:
    """Listens on ``socket_path`` and answers each connection with a /dev/kmsg fd, in its own
    thread (``start()``, ``close()``): the probes' loop never waits on it."""

    def __init__(self, socket_path: str, kmsg_path: str = "/dev/kmsg"):
        self.socket_path, self.kmsg_path = socket_path, kmsg_path
        os.close(self._open())         # refused here (not privileged)? say so at start
        self.lent = self.failed = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _remove_stale_socket(socket_path)
            self._listener.bind(socket_path)
            os.chmod(socket_path, 0o660)
            self._listener.listen(8)
        except OSError:
            self._listener.close()
            raise
        self._thread: threading.Thread | None = None
        self._closing = False

    def _open(self) -> int:
        fd = os.open(self.kmsg_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ENOTTY, f"{self.kmsg_path} is not the kernel's log device")
        return fd

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="gpuwhy-kmsg-lend",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._closing:
                    return
                raise
            with connection:
                self.lend_to(connection)

    def lend_to(self, connection: socket.socket) -> None:
        """One fresh fd to one caller; a caller that has gone is not an error."""
        try:
            fd = self._open()
        except OSError as exc:
            self.failed += 1
            log.warning("cannot lend %s: %s", self.kmsg_path, exc)
            return
        try:
            connection.settimeout(BORROW_TIMEOUT_S)
            socket.send_fds(connection, [GREETING], [fd])
            self.lent += 1
        except OSError as exc:
            self.failed += 1
            log.info("a kernel-log borrower left before its fd was sent: %s", exc)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._closing = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)   # wakes a blocked accept() on Linux
        except OSError:
            pass
        self._listener.close()
        if self._thread is not None:
            self._thread.join(2)
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass


def _remove_stale_socket(path: str) -> None:
    """A socket file left by an earlier run is replaced; anything else is left alone."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def borrow_kmsg(socket_path: str, timeout: float = BORROW_TIMEOUT_S) -> int:
    """A read-only /dev/kmsg fd from the lender at ``socket_path``. Raises OSError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        connection.connect(socket_path)
        message, fds, _, _ = socket.recv_fds(connection, len(GREETING), 1)
    if message != GREETING or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise OSError(errno.EPROTO, f"{socket_path} answered without a kernel-log fd")
    return fds[0]
