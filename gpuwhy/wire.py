"""The wire form of events: JSON payloads of one event or a batch, and their decoding.

A message on the bus is two frames, ``[topic, payload]``. The payload is UTF-8 JSON::

    {"v": 1, "kind": "device_opened", "src": "fdtrack", "seq": 17, "ts": 1764492000123456789,
     "process": {"pid": 4242, "start_time": 991823}, "fd": 5, "path": "/dev/nvidiactl", ...}

``v`` is :data:`~gpuwhy.events.SCHEMA_VERSION`; ``seq`` is the publisher's event counter
(gaps are drops). A batch is a JSON array of such objects, all of the message's topic, in
the order they were published (a probe's flush sends its per-process figures this way: a
message per event cost the bus more than decoding them). The store's JSON columns use the
same compact JSON (:func:`json_text`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass
from typing import Any

try:
    import orjson
except ImportError:     # scripts/check-env.sh runs this checkout before install, without it
    orjson = None  # type: ignore[assignment]

from gpuwhy.errors import DecodeError
from gpuwhy.events import EVENT_TYPES, SCHEMA_VERSION, Envelope, Event, event_fields
from gpuwhy.identity import ProcessKey


def to_payload(event: Event, *, src: str, seq: int) -> bytes:
    """Serialise an event with its envelope to the JSON payload frame."""
    body = event_fields(event)
    body.update(v=SCHEMA_VERSION, kind=event.kind, src=src, seq=seq)
    return json_bytes(body)


def json_bytes(value: Any, *, sort_keys: bool = False, default: Any = None) -> bytes:
    """Compact JSON of event data (the bus's payloads, the store's JSON columns): orjson,
    and the standard library, escaped to ASCII, for what orjson refuses: lone surrogates
    (a command line that is not UTF-8, read with surrogateescape), integers over 64 bits."""
    if orjson is not None:
        option = orjson.OPT_SORT_KEYS if sort_keys else 0
        if default is not None:    # what the standard library cannot encode goes to default
            option |= orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
        try:
            return orjson.dumps(value, default=default, option=option)
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys,
                      default=default).encode()


def json_text(value: Any, *, sort_keys: bool = False, default: Any = None) -> str:
    """:func:`json_bytes` as text, for a TEXT column."""
    return json_bytes(value, sort_keys=sort_keys, default=default).decode()


def _loads(payload: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass    # to_payload's fallback: escaped lone surrogates
    return json.loads(payload)


def from_frames(frames: list[bytes]) -> Envelope:
    """Decode ``[topic, payload]`` holding one event; raises :class:`DecodeError`."""
    topic, body = _split_frames(frames)
    if not isinstance(body, dict):
        raise DecodeError("payload is not a JSON object")
    return _envelope(topic, body)


def decode_message(frames: list[bytes]) -> tuple[list[Envelope], list[str]]:
    """Decode a message holding one event or a batch: the envelopes, and why each element
    that could not be decoded was not (a bad element costs only itself). Raises
    :class:`DecodeError` when the message as a whole is not one."""
    topic, body = _split_frames(frames)
    if isinstance(body, dict):
        return [_envelope(topic, body)], []
    if not isinstance(body, list):
        raise DecodeError("payload is neither a JSON object nor an array")
    envelopes, errors = [], []
    for element in body:
        try:
            if not isinstance(element, dict):
                raise DecodeError("batch element is not a JSON object")
            envelopes.append(_envelope(topic, element))
        except DecodeError as exc:
            errors.append(str(exc))
    return envelopes, errors


def join_payloads(payloads: list[bytes]) -> bytes:
    """One batch payload from events' payloads (:func:`to_payload`) of one topic."""
    return b"[" + b",".join(payloads) + b"]"


def _split_frames(frames: list[bytes]) -> tuple[str, Any]:
    if len(frames) != 2:
        raise DecodeError(f"expected 2 frames, got {len(frames)}")
    topic, payload = frames
    try:
        return topic.decode(errors="replace"), _loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DecodeError(f"payload is not JSON: {exc}") from None


def _envelope(topic: str, body: dict[str, Any]) -> Envelope:
    version, kind = body.pop("v", None), body.pop("kind", None)
    if version != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version {version!r} ({kind!r} event)")
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise DecodeError(f"unknown event kind {kind!r}"[:120])
    if topic != cls.topic:
        raise DecodeError(f"event {cls.kind} sent on topic {topic!r}, expected {cls.topic!r}")
    src, seq = body.pop("src", None), body.pop("seq", None)
    if not isinstance(src, str) or not isinstance(seq, int):
        raise DecodeError("envelope lacks src or seq")
    return Envelope(src, seq, _build(cls, body))


@dataclass(frozen=True)
class _DecodePlan:
    """How a body becomes an event of one class, worked out once per class."""

    names: frozenset[str]
    required: frozenset[str]
    defaults: dict[str, Any]                       # fields with a plain default
    factories: tuple[tuple[str, Any], ...]         # fields with a default factory
    process_keys: tuple[str, ...]                  # fields that hold a ProcessKey
    post_init: bool


@functools.cache
def _decode_plan(cls: type[Event]) -> _DecodePlan:
    # get_type_hints evaluates every annotation string (~0.5 ms), hence once per class
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return _DecodePlan(
        names=frozenset(f.name for f in fields),
        required=frozenset(f.name for f in fields if f.default is dataclasses.MISSING
                           and f.default_factory is dataclasses.MISSING),
        defaults={f.name: f.default for f in fields if f.default is not dataclasses.MISSING},
        factories=tuple((f.name, f.default_factory) for f in fields
                        if f.default_factory is not dataclasses.MISSING),
        process_keys=tuple(f.name for f in fields if hints[f.name] is ProcessKey),
        post_init=hasattr(cls, "__post_init__"))


def _build(cls: type[Event], body: dict[str, Any]) -> Event:
    plan = _decode_plan(cls)  # type: ignore[arg-type]  # a class is hashable (events.py)
    if not plan.required <= body.keys():
        missing = ", ".join(sorted(plan.required - body.keys()))
        raise DecodeError(f"{cls.kind}: missing field(s) {missing}")
    values = {**plan.defaults, **body}
    if not body.keys() <= plan.names:          # a newer sender's fields: not ours to keep
        for name in body.keys() - plan.names:
            del values[name]
    for name, factory in plan.factories:
        if name not in body:
            values[name] = factory()
    for name in plan.process_keys:
        value = values[name]
        try:
            values[name] = ProcessKey(int(value["pid"]), int(value["start_time"]))
        except (KeyError, TypeError, ValueError):
            raise DecodeError(f"{cls.kind}.{name} is not a process key") from None
    # What the frozen dataclass's __init__ would do, at once: it sets each field through
    # object.__setattr__, which made construction a third of decoding an event.
    event: Any = object.__new__(cls)          # may have a __post_init__ (plan.post_init)
    event.__dict__.update(values)
    if plan.post_init:
        try:
            event.__post_init__()
        except TypeError as exc:
            raise DecodeError(f"{cls.kind}: {exc}") from None
    return event
