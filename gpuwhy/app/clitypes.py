"""Click parameter types for every path and URL a gpuwhy command takes.

One place refuses FIFOs, devices, sockets and unreadable files (gpuwhy.files) before a
command reads them, so that no command hangs on ``mkfifo x; gpuwhy ... x`` or traces back
on ``/proc/self/mem``: click turns the refusal into a usage error (exit status 2, one line
naming the option and the path).
"""

from __future__ import annotations

import os
from typing import Any

import click

from gpuwhy.config import bad_http_url
from gpuwhy.files import (
    FileRefused,
    check_directory,
    check_readable,
    check_writable_target,
    open_regular,
)


class InputFile(click.ParamType):
    """A regular file to read. ``opened``: the value is the file opened for binary reading
    ("-": standard input, when ``allow_dash``); else its path as given, checked readable.
    ``dir_okay``: a directory is taken too (a folder of files the command walks)."""

    name = "file"

    def __init__(self, *, opened: bool = False, allow_dash: bool = False,
                 dir_okay: bool = False):
        self.opened, self.allow_dash, self.dir_okay = opened, allow_dash, dir_okay

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if not isinstance(value, (str, os.PathLike)):
            return value                 # already converted (a default given as a file)
        path = os.fspath(value)
        if self.allow_dash and path == "-":
            # click 8.3 deprecates get_binary_stream (typed object, a module __getattr__)
            return click.get_binary_stream("stdin") if self.opened else path  # type: ignore[operator]
        try:
            if self.dir_okay and os.path.isdir(path):
                check_directory(path)
                return path
            if self.opened:
                file = open_regular(path)
                if ctx is not None:
                    ctx.call_on_close(file.close)
                return file
            check_readable(path)
        except FileRefused as exc:
            self.fail(str(exc), param, ctx)
        return path


class _CheckedPath(click.ParamType):
    """A path that one check of :mod:`gpuwhy.files` accepts; its refusal is the usage
    error. ``allow_dash``: "-" stands for standard input or output, unchecked."""

    allow_dash = False

    @staticmethod
    def check(path: str) -> None:
        raise NotImplementedError

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        path = os.fspath(value)
        if self.allow_dash and path == "-":
            return path
        try:
            self.check(path)
        except FileRefused as exc:
            self.fail(str(exc), param, ctx)
        return path


class InputDir(_CheckedPath):
    """A directory to read from (a corpus, a procfs root)."""

    name = "directory"
    check = staticmethod(check_directory)


class OutputFile(_CheckedPath):
    """A file to write: absent, or a regular file (never a FIFO or a device, whose writes
    block or go anywhere). ``allow_dash``: "-" stands for standard output."""

    name = "file"
    check = staticmethod(check_writable_target)

    def __init__(self, *, allow_dash: bool = False):
        self.allow_dash = allow_dash


class HttpUrl(click.ParamType):
    """An http:// or https:// URL of a server (what a scrape or a push may reach)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        why = bad_http_url(str(value))
        if why:
            self.fail(f"{why}: {str(value)[:100]!r}", param, ctx)
        return str(value)

