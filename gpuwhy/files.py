"""Open and read files named by people (settings, command-line arguments) without hanging.

A path given on the command line or in a setting may name a FIFO, a device, a socket or a
file that fails every read (``/proc/self/mem``). Opening a FIFO for reading blocks until a
writer comes, and reading a device can block or never end, so every such path is opened
here: without blocking, checked with ``fstat`` on the open file (no race between the check
and the open), and refused with a :class:`FileRefused` that says why in one line.
"""

from __future__ import annotations

import io
import os
import stat
from typing import BinaryIO, cast


class FileRefused(ValueError):
    """A path that cannot be read as a plain file (or used as a directory): ``reason`` says
    why ("is a FIFO, not a regular file"); ``str()`` is the path, then the reason."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path, self.reason = os.fspath(path), reason
        super().__init__(f"{self.path} {reason}")


def kind_of(mode: int) -> str:
    """What a ``st_mode`` names, in words: "a FIFO", "a character device", ..."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading; :class:`FileRefused` when it is missing, not a
    regular file (a FIFO, a device, a socket, a directory) or its first read fails."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise FileRefused(path, f"cannot be read: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileRefused(path, f"is {kind_of(mode)}, not a regular file")
    # reads of a regular file never block; blocking mode back for whoever reads on
    os.set_blocking(fd, True)
    file = os.fdopen(fd, "rb")
    cast(io.FileIO, file.raw).name = os.fspath(path)   # in messages, the path, not the fd
    try:
        file.peek(1)            # a file that fails every read (/proc/self/mem) fails here
    except OSError as exc:
        file.close()
        raise FileRefused(path, f"cannot be read: {exc.strerror}") from None
    return file


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; :class:`FileRefused` when it is not one,
    cannot be read (``/proc/self/mem`` fails every read) or holds more than ``max_bytes``."""
    with open_regular(path) as file:
        try:
            data = file.read(max_bytes + 1)
        except OSError as exc:
            raise FileRefused(path, f"cannot be read: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise FileRefused(path, f"is larger than {max_bytes} bytes")
    return data


def check_readable(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` unless it is a regular file whose first byte can be read (the one
    check a command's argument gets before the command reads it in its own way)."""
    with open_regular(path):
        pass


def check_directory(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` unless it is a directory that can be listed."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise FileRefused(path, f"cannot be used: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise FileRefused(path, f"is {kind_of(mode)}, not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise FileRefused(path, "cannot be listed: permission denied")


def check_writable_target(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` as a file to write when something other than a regular file is
    there already (writing to a FIFO blocks until a reader comes; to a device, anything)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise FileRefused(path, f"cannot be used: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise FileRefused(path, f"is {kind_of(mode)}, not a regular file")
