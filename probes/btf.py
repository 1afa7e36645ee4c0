"""Find struct member offsets in the kernel's BTF (/sys/kernel/btf/vmlinux).

bcc compiles against whatever kernel headers are installed, which may not match the
running kernel (a VM kernel with Debian's generic headers, say), so reading a kernel
struct through the headers' layout would read the wrong bytes. The running kernel
describes its own layout in BTF; we read the few offsets we need from it and hand them
to the BPF programs as plain numbers: what CO-RE relocations do, for four fields.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

BTF_MAGIC = 0xEB9F
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_ENUM64 = 13, 14, 15, 17, 19
_EXTRA = {KIND_INT: (4, 0), KIND_ARRAY: (12, 0), KIND_STRUCT: (0, 12), KIND_UNION: (0, 12),
          KIND_ENUM: (0, 8), KIND_FUNC_PROTO: (0, 8), KIND_VAR: (4, 0),
          KIND_DATASEC: (0, 12), KIND_DECL_TAG: (4, 0), KIND_ENUM64: (0, 12)}


class BTFError(Exception):
    """The BTF blob is missing, malformed, or lacks what we look for."""


@dataclass(frozen=True)
class TaskOffsets:
    """Byte offsets in ``struct task_struct`` that the probes read."""

    group_leader: int
    real_parent: int
    tgid: int
    start_boottime: int
    exit_code: int


@dataclass
class _Type:
    kind: int
    name: str
    kind_flag: bool
    members: list[tuple[str, int, int]]   # (name, type id, bit offset)


def _parse(blob: bytes, wanted: set[str]) -> tuple[dict[int, _Type], dict[str, int]]:
    if len(blob) < 24:
        raise BTFError("BTF blob too short")
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", blob, 0)
    if magic != BTF_MAGIC:
        raise BTFError(f"bad BTF magic {magic:#x}")
    type_off, type_len, str_off, _str_len = struct.unpack_from("<IIII", blob, 8)
    types_start = hdr_len + type_off
    strings = hdr_len + str_off

    def name_at(offset: int) -> str:
        end = blob.index(b"\0", strings + offset)
        return blob[strings + offset:end].decode()

    aggregates: dict[int, _Type] = {}
    named: dict[str, int] = {}
    pos, type_id, end = types_start, 1, types_start + type_len
    while pos < end:
        name_off, info, _size = struct.unpack_from("<III", blob, pos)
        kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31)
        fixed, per_member = _EXTRA.get(kind, (0, 0))
        body = pos + 12
        if kind in (KIND_STRUCT, KIND_UNION):
            name = name_at(name_off) if name_off else ""
            if not name or name in wanted:
                members = [(name_at(m_name) if m_name else "", m_type, m_off)
                           for m_name, m_type, m_off in
                           (struct.unpack_from("<III", blob, body + 12 * i) for i in range(vlen))]
                aggregates[type_id] = _Type(kind, name, kind_flag, members)
                if name and name not in named and vlen:
                    named[name] = type_id
        pos = body + fixed + per_member * vlen
        type_id += 1
    return aggregates, named


def _member_offset(types: dict[int, _Type], type_id: int, member: str) -> int | None:
    """Bit offset of ``member`` in the aggregate, looking inside anonymous members."""
    aggregate = types.get(type_id)
    if aggregate is None:
        return None
    for name, m_type, raw_offset in aggregate.members:
        offset = raw_offset & 0xFFFFFF if aggregate.kind_flag else raw_offset
        if name == member:
            return offset
        if not name:
            inner = _member_offset(types, m_type, member)
            if inner is not None:
                return offset + inner
    return None


def task_offsets(path: str | Path = "/sys/kernel/btf/vmlinux") -> TaskOffsets:
    """Offsets of the task_struct fields gpuwhy reads; raises :class:`BTFError`."""
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise BTFError(f"cannot read {path}: {exc.strerror}") from None
    types, named = _parse(blob, {"task_struct"})
    if "task_struct" not in named:
        raise BTFError("struct task_struct not in BTF")
    offsets = {}
    for field in ("group_leader", "real_parent", "tgid", "start_boottime", "exit_code"):
        bits = _member_offset(types, named["task_struct"], field)
        if bits is None or bits % 8:
            raise BTFError(f"task_struct.{field} not found in BTF")
        offsets[field] = bits // 8
    return TaskOffsets(**offsets)
