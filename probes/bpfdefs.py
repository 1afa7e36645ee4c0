"""Constants the BPF C programs share with Python: defined once, in Python, compiled in.

Each probe's loader has a ``bpf_defines()``: the names its ``.bpf.c`` uses, mapped to
their values (a number, or a C expression for a function-like macro such as
``NOTABLE_HINT_SLOT(c)``). :func:`cflags` turns them into the ``-D`` flags the program is
compiled with, :func:`header` into the ``#define`` lines ``gpuwhy probes --ebpf`` prints.
A ``.bpf.c`` keeps in C only what Python never sees (buffer sizes of its own, bit masks
of the kernel's tracepoint formats). ``tests/test_bpf_constants.py`` checks that no
``.bpf.c`` defines a generated name again; ``tests/privileged/test_bpf_constants_compiled.py``
reads the values back from the compiled programs.
"""

from __future__ import annotations

import enum
import fcntl
import os
import termios
from collections.abc import Iterable, Mapping

Define = int | str   # a number, or C text (an expression, the body of a function-like macro)


class Hex(int):
    """A number written in hex in the C (a flag, a magic number, an ioctl command)."""


# The kernel's syscall ABI, as this host's Python has it (the probes run on this host).
SYSCALL_DEFINES: dict[str, int] = {
    "O_CLOEXEC_FLAG": Hex(os.O_CLOEXEC),
    "F_DUPFD_CMD": fcntl.F_DUPFD,
    "F_SETFD_CMD": fcntl.F_SETFD,
    "F_DUPFD_CLOEXEC_CMD": fcntl.F_DUPFD_CLOEXEC,
    "FD_CLOEXEC_FLAG": Hex(fcntl.FD_CLOEXEC),
    "FIONCLEX_CMD": Hex(termios.FIONCLEX),
    "FIOCLEX_CMD": Hex(termios.FIOCLEX),
}
CLONE_THREAD = Hex(getattr(os, "CLONE_THREAD", 0x00010000))   # in os from Python 3.12


def enum_defines(prefix: str, members: type[enum.IntEnum] | type[enum.IntFlag]
                 ) -> dict[str, Define]:
    """``{prefix + NAME: member}`` for an enum's members (IntFlag values print in hex)."""
    return {f"{prefix}{member.name}": member for member in members}


def c_lookup(argument: str, table: Mapping[int, int], default: int) -> str:
    """A C expression giving ``table[argument]``, or ``default`` for any other value."""
    expression = str(default)
    for key, value in reversed(list(table.items())):
        expression = f"(({argument}) == {key:#x}U ? {value} : {expression})"
    return expression


def c_member_of(argument: str, values: Iterable[int]) -> str:
    """A C expression: whether ``argument`` is one of ``values``."""
    return "(" + " || ".join(f"({argument}) == {value}" for value in values) + ")"


def render(value: Define) -> str:
    """The C text of a value: flags in hex, unsigned past INT_MAX, expressions as given."""
    if isinstance(value, str):
        return value
    number = int(value)
    text = f"{number:#x}" if isinstance(value, enum.Flag | Hex) else str(number)
    return text + ("U" if number > 0x7FFFFFFF else "")


def cflags(defines: Mapping[str, Define]) -> tuple[str, ...]:
    """The ``-D`` compiler flags that define ``defines``."""
    return tuple(f"-D{name}={render(value)}" for name, value in defines.items())


def header(defines: Mapping[str, Define], origin: str) -> str:
    """``defines`` as ``#define`` lines, saying where they come from."""
    lines = [f"// Generated from {origin} (bpf_defines()), compiled in as -D flags:"]
    lines += [f"#define {name} {render(value)}" for name, value in defines.items()]
    return "\n".join(lines) + "\n"


def macro_name(name: str) -> str:
    """``NAME`` of a define named ``NAME`` or ``NAME(args)``."""
    return name.split("(", 1)[0]
