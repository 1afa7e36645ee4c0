"""Sleep until a probe's BPF ring buffer holds records, instead of waking to look.

bcc's ``ring_buffer_poll(timeout)`` waits on one program's ring buffers; the probes are
several programs (fdtrack, lifecycle, cuda), so the loop polled one with a 100 ms timeout
and the others without: ten wake-ups a second on an idle host. libbpf gives each
``struct ring_buffer`` an epoll fd (``ring_buffer__epoll_fd``) that is readable when any
of its rings has data; one poll over those fds, the bus and the next flush's deadline
wakes the probes only for work. Where libbpf or bcc do not offer the fd, ``epoll_fd``
says so (None) and the loop polls as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Literal

log = logging.getLogger(__name__)

_libbpf: ctypes.CDLL | None | Literal[False] = False      # False: not looked up yet


def _load_libbpf() -> ctypes.CDLL | None:
    global _libbpf
    if _libbpf is False:
        _libbpf = None
        for name in ("libbpf.so.1", ctypes.util.find_library("bpf")):
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                lib.ring_buffer__epoll_fd.argtypes = [ctypes.c_void_p]
                lib.ring_buffer__epoll_fd.restype = ctypes.c_int
            except (OSError, AttributeError):
                continue
            _libbpf = lib
            break
    return _libbpf


def epoll_fd(bpf: object) -> int | None:
    """The epoll fd of a loaded bcc program's ring buffers (readable when any has records),
    or None: no ring buffer opened, or no libbpf with ``ring_buffer__epoll_fd`` (>= 0.3)."""
    manager = getattr(bpf, "_ringbuf_manager", None)   # bcc keeps libbpf's ring_buffer here
    lib = _load_libbpf()
    if not manager or lib is None:
        return None
    fd = lib.ring_buffer__epoll_fd(manager)
    return fd if fd >= 0 else None
