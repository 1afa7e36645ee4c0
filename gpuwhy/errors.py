"""The one exception hierarchy of gpuwhy; each error carries the ids it is about."""

from __future__ import annotations


class GpuwhyError(Exception):
    """Base class of every error gpuwhy raises on purpose."""


class ConfigError(GpuwhyError):
    """A configuration file or override is unreadable, unknown or of the wrong type."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        where = " ".join(part for part in (source, key and f"[{key}]") if part)
        super().__init__(f"{where}: {message}" if where else message)


class ProbeLoadError(GpuwhyError):
    """An eBPF program could not be compiled, loaded or attached."""

    def __init__(self, probe: str, reason: str):
        self.probe = probe
        self.reason = reason
        super().__init__(f"probe {probe!r} failed to load: {reason}")


class BusError(GpuwhyError):
    """The event bus could not bind, connect or decode a message."""


class DecodeError(BusError):
    """A message on the bus does not follow the event schema."""


class StoreError(GpuwhyError):
    """The SQLite store cannot be opened, migrated or written."""


class NoSuchProcess(GpuwhyError):
    """The process is gone (or never existed) under this pid."""

    def __init__(self, pid: int, start_time: int | None = None):
        self.pid = pid
        self.start_time = start_time
        key = f"{pid}" if start_time is None else f"{pid}-{start_time}"
        super().__init__(f"no such process {key}")
