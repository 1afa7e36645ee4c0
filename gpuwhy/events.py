"""The event schema: one frozen dataclass per event kind, the wire contract of the bus.

A message on the bus is two frames, ``[topic, payload]``. The payload is UTF-8 JSON::

    {"v": 1, "kind": "device_opened", "src": "fdtrack", "seq": 17, "ts": 1764492000123456789,
     "process": {"pid": 4242, "start_time": 991823}, "fd": 5, "path": "/dev/nvidiactl", ...}

``v`` is :data:`SCHEMA_VERSION`; ``seq`` is the publisher's message counter (gaps are
drops); ``ts`` is CLOCK_REALTIME in ns, converted at the source; ``raw_ts`` keeps the
source's own clock value where it has one. Topics name the source kind and none is a
prefix of another, because ZeroMQ subscriptions match by prefix.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuwhy.errors import DecodeError
from gpuwhy.identity import ProcessKey

SCHEMA_VERSION = 1

TOPICS = ("proc", "fd", "ioctl", "health", "gpu", "klog", "cron", "sched")


@dataclass(frozen=True)
class Event:
    """Base of all events. ``topic`` and ``kind`` are class attributes; ``ts`` is realtime ns."""

    topic: ClassVar[str]
    kind: ClassVar[str]

    ts: int
    raw_ts: int | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ProcessSeen(Event):
    """Event name: ``process_seen`` (topic ``proc``). Facts about a process, first time it
    matters. ``comm``, ``cmdline``, ``exe`` and ``tag`` are controlled by the process:
    untrusted, already bounded in length, to be escaped wherever shown."""

    topic = "proc"
    kind = "process_seen"

    process: ProcessKey
    comm: str = ""
    cmdline: str = ""
    exe: str = ""
    ppid: int = 0
    uid: int = -1
    cgroup: str = ""
    tag: str | None = None


@dataclass(frozen=True)
class ProcessExited(Event):
    """Event name: ``process_exited`` (topic ``proc``). A traced process ended."""

    topic = "proc"
    kind = "process_exited"

    process: ProcessKey


@dataclass(frozen=True)
class DeviceOpened(Event):
    """Event name: ``device_opened`` (topic ``fd``). A process holds an fd on a device file;
    ``scanned`` is true when it was found by the start-up /proc scan rather than seen opening."""

    topic = "fd"
    kind = "device_opened"

    process: ProcessKey
    fd: int
    path: str
    device: str
    minor: int | None = None
    scanned: bool = False


@dataclass(frozen=True)
class DeviceClosed(Event):
    """Event name: ``device_closed`` (topic ``fd``). The fd was closed (or its process exited)."""

    topic = "fd"
    kind = "device_closed"

    process: ProcessKey
    fd: int
    path: str


@dataclass(frozen=True)
class IoctlCounts(Event):
    """Event name: ``ioctl_counts`` (topic ``ioctl``). Cumulative ioctl counts of one process
    on one device path, by command number (the raw ``_IOC`` value, as a decimal string key,
    because JSON keys are strings). Cumulative, so a lost message is repaired by the next."""

    topic = "ioctl"
    kind = "ioctl_counts"

    process: ProcessKey
    path: str
    device: str
    counts: dict[str, int]


@dataclass(frozen=True)
class SourceHealth(Event):
    """Event name: ``source_health`` (topic ``health``). A source's heartbeat: ``state`` is
    ``ok``, ``degraded`` or ``failed``; ``counters`` holds its totals (events, drops by reason)."""

    topic = "health"
    kind = "source_health"

    source: str
    state: str
    detail: str = ""
    counters: dict[str, int] = field(default_factory=dict)


# --- probes: lifecycle, scheduler, driver calls (eBPF probes issue) ---
# --- end probes ---

# --- GPU counter sources (GPU sources issue) ---
# --- end GPU counter sources ---

# --- kernel log and cron sources (kernel-log and cron issue) ---
# --- end kernel log and cron sources ---


def _concrete_event_types(base: type[Event]) -> list[type[Event]]:
    found = []
    for cls in base.__subclasses__():
        if "kind" in cls.__dict__:
            found.append(cls)
        found += _concrete_event_types(cls)
    return found


EVENT_TYPES: dict[str, type[Event]] = {cls.kind: cls for cls in _concrete_event_types(Event)}


def to_payload(event: Event, *, src: str, seq: int) -> bytes:
    """Serialise an event with its envelope to the JSON payload frame."""
    body = dataclasses.asdict(event)
    body.update(v=SCHEMA_VERSION, kind=event.kind, src=src, seq=seq)
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Envelope:
    """A decoded message: the event plus who sent it and its sequence number."""

    src: str
    seq: int
    event: Event


def from_frames(frames: list[bytes]) -> Envelope:
    """Decode ``[topic, payload]`` into an :class:`Envelope`; raises :class:`DecodeError`."""
    if len(frames) != 2:
        raise DecodeError(f"expected 2 frames, got {len(frames)}")
    topic, payload = frames
    try:
        body = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DecodeError(f"payload is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise DecodeError("payload is not a JSON object")
    if body.pop("v", None) != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version in {payload[:80]!r}")
    cls = EVENT_TYPES.get(body.pop("kind", None))
    if cls is None:
        raise DecodeError(f"unknown event kind in {payload[:80]!r}")
    if topic.decode(errors="replace") != cls.topic:
        raise DecodeError(f"event {cls.kind} sent on topic {topic!r}, expected {cls.topic!r}")
    src, seq = body.pop("src", None), body.pop("seq", None)
    if not isinstance(src, str) or not isinstance(seq, int):
        raise DecodeError("envelope lacks src or seq")
    return Envelope(src, seq, _build(cls, body))


def _build(cls: type[Event], body: dict[str, Any]) -> Event:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in body:
            continue
        value = body[f.name]
        if hints[f.name] is ProcessKey:
            try:
                value = ProcessKey(int(value["pid"]), int(value["start_time"]))
            except (KeyError, TypeError, ValueError):
                raise DecodeError(f"{cls.kind}.{f.name} is not a process key") from None
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise DecodeError(f"{cls.kind}: {exc}") from None
