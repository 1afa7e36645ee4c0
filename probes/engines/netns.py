"""Make a TCP socket inside an engine's network namespace, for a scrape of its loopback.

An engine in a container with its own network (Docker's default bridge, every Kubernetes
pod) listens on *its* loopback, which gpuwhy's cannot reach. A socket belongs to the
network namespace of the thread that created it, and a thread may enter another network
namespace alone (``setns(fd, CLONE_NEWNET)``, CAP_SYS_ADMIN): so a thread enters the
engine's namespace, creates the socket and comes straight back, before anything connects,
sends or reads. The scrape then runs on gpuwhy's side as any other (the deadline, body cap
and redirect refusal of :func:`gpuwhy.probes.engines.source.get`), on a socket that reaches
the engine's 127.0.0.1 or ::1.

The thread that enters is one of this module's own, which does nothing else, never the
scrape worker: a ThreadPoolExecutor's worker cannot be retired from inside (it catches
every exception of its work), so a worker that failed to come back would go on scraping,
and resolving, from the engine's network. The namespace thread takes each request in
gpuwhy's namespace, and the only code it ever runs inside a foreign one is ``socket()`` and
the ``setns`` back; one that cannot come back ends there, and the next request starts
another. It lives on between scrapes: a thread started for each socket cost half the
engines source's CPU for engines in namespaces (scripts/bench_engines.py --netns).

The namespace entered is checked to be the engine's: the namespace file opened must have
the inode discovery recorded for the engine, and the process must still have the start time
of its :class:`ProcessKey` once the file is open (a pid reused by another process, or an
engine that moved, is refused, never scraped in its place).
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import re
import socket
import threading
from collections.abc import Callable

from gpuwhy.caps import effective_capabilities
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.engines.discover import start_time

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000      # <linux/sched.h>: setns's nstype for a network namespace
HELPER_JOIN_S = 1.0            # at most, waiting for the namespace thread (it never blocks)
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


class _Request:
    """One socket asked of the namespace thread: the namespace to make it in (an open
    /proc/PID/ns/net, closed by the thread), its family, and what came back."""

    __slots__ = ("fd", "family", "done", "sock", "failure", "abandoned", "stuck")

    def __init__(self, fd: int, family: int):
        self.fd, self.family = fd, family
        self.done = threading.Event()
        self.sock: socket.socket | None = None
        self.failure = ""
        self.abandoned = False      # the caller stopped waiting: a socket made is closed
        self.stuck = False          # the thread could not come back: it ended there


class Namespaces:
    """gpuwhy's own network namespace, held open from the start (the way back), and sockets
    made in engines' namespaces with it. Thread-safe: one thread of its own makes every
    socket, one at a time (see the module docstring)."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        # the namespace of the thread that builds the source: gpuwhy's (no thread of gpuwhy
        # is ever left elsewhere); /proc/thread-self is this process's, whatever proc_root
        self._own_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.own = os.readlink("/proc/thread-self/ns/net")
        self.entered = 0           # sockets made in another namespace
        self.stuck = 0             # namespace threads that could not come back (ended there)
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def close(self) -> None:
        with self._lock:
            fd, self._own_fd = self._own_fd, -1
            self._closed = True             # no request is queued from here on
            thread, self._thread = self._thread, None
        self._drain()                       # before the stop: a drain would take it too
        if thread is not None:
            self._requests.put(None)        # it ends after the request in hand, if any
        if fd >= 0:
            os.close(fd)

    def _drain(self) -> None:
        """Close the namespace files of requests no thread will take (closed, or stuck)."""
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                os.close(request.fd)
                request.failure = "the engines source is closed"
                request.done.set()

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
        return self._made_in(fd, family, wait)      # the namespace thread closes fd

    def _made_in(self, fd: int, family: int, wait: float) -> socket.socket:
        """socket(family) made by the namespace thread inside the namespace ``fd`` opens."""
        request = _Request(fd, family)
        with self._lock:
            failure = "the engines source is closed" if self._closed else ""
            if not failure and (self._thread is None or not self._thread.is_alive()):
                try:
                    own_fd = os.dup(self._own_fd)     # the thread's own way back
                except OSError as exc:
                    failure = f"cannot hold gpuwhy's own namespace: {exc.strerror}"
                else:
                    # started from a scrape worker, in gpuwhy's namespace: it starts there
                    thread = threading.Thread(target=self._serve, args=(own_fd,),
                                              name="gpuwhy-netns", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError as exc:       # no thread to be had: this one fails
                        os.close(own_fd)
                        failure = f"cannot start a thread to enter it: {exc}"
                    else:
                        self._thread = thread
            if not failure:
                self._requests.put(request)
        if failure:
            os.close(fd)
            raise NamespaceError(failure)
        if not request.done.wait(wait):
            with self._lock:
                if not request.done.is_set():
                    request.abandoned = True
                    raise NamespaceError(f"entering the network namespace took over {wait:g} s")
        if request.stuck:
            log.critical("a gpuwhy thread could not return from an engine's network "
                         "namespace; it ended there, its socket unused")
        if request.sock is None:
            raise NamespaceError(request.failure or "no socket was made")
        return request.sock

    def _serve(self, own_fd: int) -> None:
        """The namespace thread: takes requests in gpuwhy's namespace, enters each
        request's, makes its socket and comes straight back. It runs nothing else inside a
        foreign namespace; one that cannot come back ends there."""
        try:
            while True:
                request = self._requests.get()
                if request is None:
                    return
                try:
                    back = self._make(request, own_fd)
                finally:
                    os.close(request.fd)
                    request.done.set()
                if not back:
                    with self._lock:
                        self.stuck += 1
                        if self._thread is threading.current_thread():
                            self._thread = None       # the next request starts another
                    return
        finally:
            os.close(own_fd)

    def _make(self, request: _Request, own_fd: int) -> bool:
        """Make ``request``'s socket in its namespace; whether this thread came back."""
        try:
            setns(request.fd, CLONE_NEWNET)
        except OSError as exc:
            request.failure = (f"cannot enter its network namespace: setns: {exc.strerror} "
                               "(it takes CAP_SYS_ADMIN, and setns for net let through by any "
                               "seccomp filter: systemd's RestrictNamespaces=net)")
            return True
        sock: socket.socket | None = None
        try:
            sock = socket.socket(request.family, socket.SOCK_STREAM)
        except OSError as exc:
            request.failure = f"cannot create a socket in its network namespace: {exc}"
        finally:
            try:
                setns(own_fd, CLONE_NEWNET)
                back = back_home(self.own)
            except OSError:
                back = False
        if not back:
            # never happens short of a kernel out of memory; were it to, this thread ends
            # here, in that namespace, having run nothing else there (not even the log
            # line, which the scrape that asked writes: a log handler may open a socket)
            if sock is not None:
                sock.close()
            request.stuck = True
            request.failure = ("could not return from its network namespace (the thread that "
                               "entered it ended there)")
            return False
        if sock is not None:
            with self._lock:
                if request.abandoned:
                    sock.close()          # the caller gave up waiting: nobody takes it
                else:
                    self.entered += 1
                    request.sock = sock
        return True


def back_home(own: str) -> bool:
    """Whether the calling thread is in the network namespace ``own`` (its link)."""
    try:
        return os.readlink("/proc/thread-self/ns/net") == own
    except OSError:
        return False
