"""Make a TCP socket inside an engine's network namespace, for a scrape of its loopback.

An engine in a container with its own network (Docker's default bridge, every Kubernetes
pod) listens on *its* loopback, which gpuwhy's cannot reach. A socket belongs to the
network namespace of the thread that created it, and a thread may enter another network
namespace alone (``setns(fd, CLONE_NEWNET)``, CAP_SYS_ADMIN): so a thread enters the
engine's namespace, creates the socket and comes straight back, before anything connects,
sends or reads. The scrape then runs on gpuwhy's side as any other (the deadline, body cap
and redirect refusal of :func:`gpuwhy.probes.engines.source.get`), on a socket that reaches
the engine's 127.0.0.1 or ::1.

The thread that enters is a one-shot one started for that socket alone, never the scrape
worker: a ThreadPoolExecutor's worker cannot be retired from inside (it catches every
exception of its work), so a worker that failed to come back would go on scraping, and
resolving, from the engine's network. A one-shot thread ends whatever happens: the only code
ever run inside a foreign namespace is ``socket()`` and the ``setns`` back.

The namespace entered is checked to be the engine's: the namespace file opened must have
the inode discovery recorded for the engine, and the process must still have the start time
of its :class:`ProcessKey` once the file is open (a pid reused by another process, or an
engine that moved, is refused, never scraped in its place).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import socket
import threading
from collections.abc import Callable

from gpuwhy.caps import effective_capabilities
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.engines.discover import start_time

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000      # <linux/sched.h>: setns's nstype for a network namespace
HELPER_JOIN_S = 1.0            # at most, waiting for the one-shot thread (it never blocks)
_LINK = re.compile(r"net:\[([0-9]{1,20})\]")


class NamespaceError(OSError):
    """No socket could be made in the engine's namespace; the message says why in one line.
    An OSError: :func:`gpuwhy.probes.engines.source.get` reports it as the scrape's failure."""


def can_enter(status: str = "/proc/self/status") -> bool:
    """Whether this process may enter another network namespace: CAP_SYS_ADMIN in its
    effective set (``CapEff`` bit 21). Root holds it; the shipped gpuwhy.service does not."""
    try:
        return "CAP_SYS_ADMIN" in effective_capabilities(status)
    except OSError:
        return False


def link_inode(link: str | None) -> int | None:
    """The inode of a namespace link as /proc/PID/ns/net reads (``net:[4026531833]``)."""
    match = _LINK.fullmatch(link or "")
    return int(match[1]) if match else None


_setns: Callable[[int, int], int] | None = None


def setns(fd: int, nstype: int) -> None:
    """setns(2) for the calling thread (Python 3.11 has no os.setns). Raises OSError."""
    global _setns
    if _setns is None:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.setns
        call.argtypes = [ctypes.c_int, ctypes.c_int]
        call.restype = ctypes.c_int
        _setns = call
    if _setns(fd, nstype) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class Namespaces:
    """gpuwhy's own network namespace, held open from the start (the way back), and sockets
    made in engines' namespaces with it. Thread-safe: each socket has its own thread."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        # the namespace of the thread that builds the source: gpuwhy's (no thread of gpuwhy
        # is ever left elsewhere); /proc/thread-self is this process's, whatever proc_root
        self._own_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.own = os.readlink("/proc/thread-self/ns/net")
        self.entered = 0           # sockets made in another namespace
        self.stuck = 0             # one-shot threads that could not come back (ended there)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            fd, self._own_fd = self._own_fd, -1
        if fd >= 0:
            os.close(fd)

    def socket_in(self, process: ProcessKey, netns: str, family: int,
                  wait: float = HELPER_JOIN_S) -> socket.socket:
        """A TCP socket of ``family`` created in the network namespace of ``process``,
        which discovery saw as ``netns`` (its /proc/PID/ns/net link). Raises
        :class:`NamespaceError` when that is not (or no longer) the process's namespace,
        or it cannot be entered."""
        expected = link_inode(netns)
        if expected is None:
            raise NamespaceError(f"no network namespace known for pid {process.pid}")
        path = f"{self.proc_root}/{process.pid}/ns/net"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NamespaceError(f"cannot open {path}: {exc.strerror}") from None
        try:
            # the file is open: it holds that namespace whatever the pid does next, and the
            # start time read after the open says whether the pid was still the engine's
            if start_time(process.pid, self.proc_root) != process.start_time:
                raise NamespaceError(f"pid {process.pid} is no longer the engine "
                                     f"(started {process.start_time}): not entered")
            held = os.fstat(fd).st_ino
            if held != expected:
                raise NamespaceError(f"pid {process.pid}'s network namespace is net:[{held}], "
                                     f"not the net:[{expected}] it was found in: not entered")
        except BaseException:
            os.close(fd)
            raise
        return self._made_in(fd, family, wait)      # which closes fd

    def _made_in(self, fd: int, family: int, wait: float) -> socket.socket:
        """socket(family) made by a one-shot thread inside the namespace ``fd`` opens. The
        thread closes ``fd`` when done (the caller may have stopped waiting by then)."""
        result: list[socket.socket] = []
        failure: list[str] = []
        stuck = threading.Event()
        abandoned = threading.Event()
        with self._lock:
            try:
                # the thread's own way back: close() may close the source's at any time
                own_fd = os.dup(self._own_fd) if self._own_fd >= 0 else -1
            except OSError as exc:
                own_fd = -1
                failure.append(f"cannot hold gpuwhy's own namespace: {exc.strerror}")
        if own_fd < 0:
            os.close(fd)
            raise NamespaceError(failure[0] if failure else "the engines source is closed")

        def entered(fd: int) -> None:
            try:
                setns(fd, CLONE_NEWNET)
            except OSError as exc:
                failure.append(f"cannot enter its network namespace: setns: {exc.strerror} "
                               "(it takes CAP_SYS_ADMIN, and setns for net let through by "
                               "any seccomp filter: systemd's RestrictNamespaces=net)")
                return
            sock: socket.socket | None = None
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                failure.append(f"cannot create a socket in its network namespace: {exc}")
            finally:
                try:
                    setns(own_fd, CLONE_NEWNET)
                    back = os.readlink("/proc/thread-self/ns/net") == self.own
                except OSError:
                    back = False
                if not back:
                    # never happens short of a kernel out of memory; were it to, this thread
                    # ends here, in that namespace, having run nothing else there (not even
                    # the log line: a log handler may open a socket)
                    stuck.set()
                    failure.append("could not return from its network namespace (the "
                                   "thread that entered it ended there)")
                    if sock is not None:
                        sock.close()
                    sock = None
            if sock is not None:
                with self._lock:
                    if abandoned.is_set():
                        sock.close()          # the caller gave up waiting: nobody takes it
                    else:
                        self.entered += 1
                        result.append(sock)

        def one_shot() -> None:
            try:
                entered(fd)
            finally:
                os.close(fd)
                os.close(own_fd)

        thread = threading.Thread(target=one_shot, name="gpuwhy-netns", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:           # no thread to be had: this scrape fails
            os.close(fd)
            os.close(own_fd)
            raise NamespaceError(f"cannot start a thread to enter it: {exc}") from None
        thread.join(wait)
        if stuck.is_set():
            with self._lock:
                self.stuck += 1
            log.critical("a gpuwhy thread could not return from an engine's network "
                         "namespace; it ended there, its socket unused")
        with self._lock:
            if not result and not failure:
                abandoned.set()
                raise NamespaceError(f"entering the network namespace took over {wait:g} s")
        if failure:
            raise NamespaceError(failure[0])
        return result[0]
