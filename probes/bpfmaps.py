"""A BPF hash map read whole in a few system calls: BPF_MAP_LOOKUP_BATCH a chunk of entries
at a time, and bcc's key-by-key walk where the kernel has no batch lookup (before 5.6).

bcc's ``items()`` makes two system calls an entry (next key, then its value), and its own
batch read allocates room for every entry the map may ever hold (64 Ki entries for the
per-operation statistics, then per-CPU) on each call; read each second, that was half of
what the probes process spent on a busy host. Readers that need less than a ctypes object
an entry take its bytes (``raw()``), or only the entries that moved (``marked()``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)
CHUNK = 256                 # entries a call: the hash bucket holding most must fit in it
# the kernel's answers to a batch lookup it cannot make: no such command, not for this map
_NO_BATCH = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def per_cpu_words(values: Any, field: str) -> memoryview:
    """The 8-byte ``field`` of every CPU's value in a per-CPU map's ``values`` (bcc's array
    of one struct per possible CPU), as a view of u64 words: its ``tobytes()`` is taken in C,
    where a Python step per CPU costs a 224-CPU host milliseconds an entry read."""
    words, word = _word_layout(values._type_, field)
    return memoryview(values).cast("B").cast("Q")[word::words]


def _word_layout(struct: Any, field: str) -> tuple[int, int]:
    """(the struct's size in 8-byte words, ``field``'s word) of an aligned 8-byte field."""
    words = ctypes.sizeof(struct) // 8
    offset = getattr(struct, field).offset
    if ctypes.sizeof(struct) % 8 or offset % 8 or getattr(struct, field).size != 8:
        raise ValueError(f"{struct.__name__}.{field} is not an aligned 8-byte field of a "
                         "struct of 8-byte words")
    return words, offset // 8


class NoBatchLookup(OSError):
    """The kernel cannot read this map in batches."""


class _Oversized(Exception):
    """A hash bucket holds more entries than a chunk: this read goes key by key."""


# (the key's bytes, the mark of its value, the key and the value or None for both): see
# MapReader.marked
Marked = tuple[bytes, int, Any, Any]


class MapReader:
    """A bcc hash table read whole (per-CPU ones included: a value is then one leaf per
    possible CPU), by batches while the kernel allows them: as ``items()``, as bytes
    (``raw()``), or copying out only the entries that moved (``marked()``)."""

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
        """Every entry as (its key, its value), ctypes objects as bcc's ``items()``."""
        out = self._by_batches(self._items_batched)
        return self.table.items() if out is None else out

    def raw(self) -> list[tuple[bytes, bytes]]:
        """Every entry as (its key's bytes, its value's bytes; every CPU's, one after the
        other, in a per-CPU map), without a ctypes object an entry: a flush reads every
        thread of the GPU processes, thousands on a big host, and tells the few that moved
        from the rest by their bytes alone."""
        out = self._by_batches(self._raw_batched)
        if out is None:
            out = [(bytes(key), bytes(value)) for key, value in self.table.items()]
        return out

    def marked(self, field: str, moved: Callable[[bytes, int], bool]) -> list[Marked]:
        """Every entry as (its key's bytes, a mark of its 8-byte ``field``, its key, its
        value), the key and value copied out only where ``moved(key bytes, mark)`` says so,
        None for both elsewhere. The mark of a plain value is the field's value; of a
        per-CPU one, a hash of every CPU's (a counter's move on any CPU changes it; a
        collision is one in 2**64). A reader that keeps what it made of an entry by its mark
        copies and reads again only the entries that moved: a busy process calls a few of
        its operations each second."""
        out = self._by_batches(lambda: self._marked_batched(field, moved))
        if out is not None:
            return out
        per_cpu = issubclass(self.table.Leaf, ctypes.Array)
        out = []
        for key, value in self.table.items():
            key_bytes = bytes(key)
            mark = hash(per_cpu_words(value, field).tobytes()) if per_cpu else \
                getattr(value, field)
            out.append((key_bytes, mark, key, value) if moved(key_bytes, mark)
                       else (key_bytes, mark, None, None))
        return out

    def _by_batches(self, read: Callable[[], list]) -> list | None:
        """``read()`` by batches; None where the map is to be walked key by key instead:
        this time (a bucket larger than a chunk), or from now on (no batch lookup here)."""
        if not self.batched:
            return None
        try:
            return read()
        except _Oversized:
            return None
        except NoBatchLookup as exc:
            self.batched = False
            log.info("no batch lookup of BPF maps here (%s): reading them key by key", exc)
            return None

    def _items_batched(self) -> list[tuple[Any, Any]]:
        key_type, value_type = self.table.Key, self.table.Leaf
        key_size, value_size = ctypes.sizeof(key_type), ctypes.sizeof(value_type)
        out: list[tuple[Any, Any]] = []
        for count in self._chunks():
            # copied out of the buffers the next call reuses; by offset, as an element of an
            # array of a simple type (a u32 key) reads back as a plain int
            out += [(key_type.from_buffer_copy(self._keys, i * key_size),
                     value_type.from_buffer_copy(self._values, i * value_size))
                    for i in range(count)]
        return out

    def _raw_batched(self) -> list[tuple[bytes, bytes]]:
        key_size, value_size = ctypes.sizeof(self.table.Key), ctypes.sizeof(self.table.Leaf)
        keys, values = memoryview(self._keys).cast("B"), memoryview(self._values).cast("B")
        out: list[tuple[bytes, bytes]] = []
        for count in self._chunks():
            out += [(keys[i * key_size:(i + 1) * key_size].tobytes(),
                     values[i * value_size:(i + 1) * value_size].tobytes())
                    for i in range(count)]
        return out

    def _marked_batched(self, field: str, moved: Callable[[bytes, int], bool]) -> list[Marked]:
        key_type, value_type = self.table.Key, self.table.Leaf
        key_size, value_size = ctypes.sizeof(key_type), ctypes.sizeof(value_type)
        per_cpu = issubclass(value_type, ctypes.Array)
        cpus = value_type._length_ if per_cpu else 1
        words, word = _word_layout(value_type._type_ if per_cpu else value_type, field)
        keys = memoryview(self._keys).cast("B")
        # the field of every CPU of every entry in the buffer, in entry order
        fields = memoryview(self._values).cast("B").cast("Q")[word::words]
        out: list[Marked] = []
        for count in self._chunks():
            for i in range(count):
                key_bytes = keys[i * key_size:(i + 1) * key_size].tobytes()
                mark = hash(fields[i * cpus:(i + 1) * cpus].tobytes()) if per_cpu else \
                    fields[i]
                if moved(key_bytes, mark):
                    out.append((key_bytes, mark, key_type.from_buffer_copy(keys, i * key_size),
                                value_type.from_buffer_copy(self._values, i * value_size)))
                else:
                    out.append((key_bytes, mark, None, None))
        return out

    def _chunks(self) -> Iterator[int]:
        """Fill the buffers a chunk at a time, yielding how many entries each holds; raises
        _Oversized where a bucket does not fit in one chunk."""
        token, count = ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        while True:
            count.value = self.chunk
            result = self._lookup_batch(self.table.map_fd,
                                        None if first else ctypes.byref(token),
                                        ctypes.byref(token), ctypes.byref(self._keys),
                                        ctypes.byref(self._values), ctypes.byref(count))
            code = ctypes.get_errno() if result != 0 else 0
            if code == errno.ENOSPC:
                raise _Oversized
            if code not in (0, errno.ENOENT):
                if first and code in _NO_BATCH:
                    raise NoBatchLookup(code, os.strerror(code))
                raise OSError(code, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(code)}")
            yield count.value
            if code == errno.ENOENT:      # the end of the map
                return
            first = False
