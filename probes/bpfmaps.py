"""A BPF hash map read whole in a few system calls: BPF_MAP_LOOKUP_BATCH a chunk of entries
at a time, and bcc's key-by-key walk where the kernel has no batch lookup (before 5.6).

bcc's ``items()`` makes two system calls an entry (next key, then its value), and its own
batch read allocates room for every entry the map may ever hold (64 Ki entries × every CPU
for the per-operation statistics) on each call; read each second, that was half of what
the probes process spent on a busy host.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import Any

log = logging.getLogger(__name__)
CHUNK = 256                 # entries a call: the hash bucket holding most must fit in it
# the kernel's answers to a batch lookup it cannot make: no such command, not for this map
_NO_BATCH = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def per_cpu_words(values: Any, field: str) -> memoryview:
    """The 8-byte ``field`` of every CPU's value in a per-CPU map's ``values`` (bcc's array
    of one struct per possible CPU), as a view of u64 words: its ``tobytes()`` is taken in C,
    where a Python step per CPU costs a 224-CPU host milliseconds an entry read."""
    struct = values._type_
    words = ctypes.sizeof(struct) // 8
    offset = getattr(struct, field).offset
    if ctypes.sizeof(struct) % 8 or offset % 8 or getattr(struct, field).size != 8:
        raise ValueError(f"{struct.__name__}.{field} is not an aligned 8-byte field of a "
                         "struct of 8-byte words")
    return memoryview(values).cast("B").cast("Q")[offset // 8::words]


class NoBatchLookup(OSError):
    """The kernel cannot read this map in batches."""


class MapReader:
    """``items()`` of a bcc hash table (per-CPU ones included: a value is then one leaf per
    possible CPU), by batches while the kernel allows them."""

    def __init__(self, table: Any, chunk: int = CHUNK, lookup_batch: Any = None):
        self.table = table
        self.chunk = chunk
        self._keys = (table.Key * chunk)()
        self._values = (table.Leaf * chunk)()
        if lookup_batch is None:
            from bcc.libbcc import lib

            lookup_batch = lib.bpf_lookup_batch
        self._lookup_batch = lookup_batch
        self.batched = True

    def items(self) -> list[tuple[Any, Any]]:
        if self.batched:
            try:
                return self._read_batched()
            except NoBatchLookup as exc:
                self.batched = False
                log.info("no batch lookup of BPF maps here (%s): reading them key by key", exc)
        return self.table.items()

    def _read_batched(self) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = []
        token, count = ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        while True:
            count.value = self.chunk
            result = self._lookup_batch(self.table.map_fd,
                                        None if first else ctypes.byref(token),
                                        ctypes.byref(token), ctypes.byref(self._keys),
                                        ctypes.byref(self._values), ctypes.byref(count))
            code = ctypes.get_errno() if result != 0 else 0
            if code == errno.ENOSPC:       # a bucket larger than the chunk: this read only
                return self.table.items()
            if code not in (0, errno.ENOENT):
                if first and code in _NO_BATCH:
                    raise NoBatchLookup(code, os.strerror(code))
                raise OSError(code, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(code)}")
            # copied out of the buffers the next call reuses; by offset, as an element of an
            # array of a simple type (a u32 key) reads back as a plain int
            key_type, value_type = self.table.Key, self.table.Leaf
            key_size, value_size = ctypes.sizeof(key_type), ctypes.sizeof(value_type)
            out += [(key_type.from_buffer_copy(self._keys, i * key_size),
                     value_type.from_buffer_copy(self._values, i * value_size))
                    for i in range(count.value)]
            if code == errno.ENOENT:      # the end of the map
                return out
            first = False
