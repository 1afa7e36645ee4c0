"""Apply bus events to the store, in batches, from the one writer (the correlator)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlite_utils import Database

from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    Envelope,
    Event,
    IoctlCounts,
    ProcessExited,
    ProcessSeen,
    SourceHealth,
)
from gpuwhy.identity import GpuIdentity


def _event_row(envelope: Envelope, **extra: object) -> dict:
    event = envelope.event
    process = getattr(event, "process", None)
    body = {k: v for k, v in vars(event).items() if k not in ("ts", "raw_ts", "process")}
    return {"ts": event.ts, "topic": event.topic, "kind": event.kind, "src": envelope.src,
            "pid": process.pid if process else None,
            "start_time": process.start_time if process else None,
            "body": json.dumps(body, separators=(",", ":")), **extra}


class StoreWriter:
    """Turns events into rows. Idempotent: a re-sent snapshot changes nothing."""

    def __init__(self, db: Database):
        self.db = db

    def write_batch(self, envelopes: Iterable[Envelope]) -> int:
        """Apply every envelope in one transaction; returns how many were applied."""
        applied = 0
        with self.db.atomic():
            for envelope in envelopes:
                self.apply(envelope)
                applied += 1
        return applied

    def apply(self, envelope: Envelope) -> None:
        event: Event = envelope.event
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(envelope, event)

    def _on_process_seen(self, envelope: Envelope, event: ProcessSeen) -> None:
        key = {"pid": event.process.pid, "start_time": event.process.start_time}
        existing = self.db.execute(
            "select first_seen from processes where pid = ? and start_time = ?",
            [key["pid"], key["start_time"]]).fetchone()
        self.db["processes"].upsert({
            **key, "comm": event.comm, "cmdline": event.cmdline, "exe": event.exe,
            "ppid": event.ppid, "uid": event.uid, "cgroup": event.cgroup, "tag": event.tag,
            "first_seen": existing[0] if existing else event.ts, "last_seen": event.ts,
        }, pk=("pid", "start_time"))

    def _on_process_exited(self, envelope: Envelope, event: ProcessExited) -> None:
        key = [event.process.pid, event.process.start_time]
        self.db.execute("update processes set exited_at = ?, last_seen = ? "
                        "where pid = ? and start_time = ?", [event.ts, event.ts, *key])
        self.db.execute("update gpu_bindings set until = ? where pid = ? and start_time = ? "
                        "and until is null", [event.ts, *key])
        self.db["events"].insert(_event_row(envelope))

    def _on_device_opened(self, envelope: Envelope, event: DeviceOpened) -> None:
        key = {"pid": event.process.pid, "start_time": event.process.start_time}
        self.db["device_fds"].upsert({
            **key, "fd": event.fd, "opened_at": event.ts, "path": event.path,
            "device": event.device, "minor": event.minor, "scanned": int(event.scanned),
        }, pk=("pid", "start_time", "fd", "opened_at"))
        gpu_id = None
        if event.device == "nvidiaN" and event.minor is not None:
            gpu_id = self._gpu_for_minor(event.minor, event.ts)
            open_binding = self.db.execute(
                "select 1 from gpu_bindings where pid = ? and start_time = ? and gpu_id = ? "
                "and until is null", [key["pid"], key["start_time"], gpu_id]).fetchone()
            if not open_binding:
                self.db["gpu_bindings"].insert({
                    **key, "gpu_id": gpu_id, "since": event.ts, "until": None,
                    "evidence": f"holds {event.path}",
                })
        self.db["events"].insert(_event_row(envelope, gpu_id=gpu_id))

    def _gpu_for_minor(self, minor: int, ts: int) -> str:
        row = self.db.execute("select id from gpus where minor = ?", [minor]).fetchone()
        if row:
            return row[0]
        gpu_id = GpuIdentity(minor=minor).id
        self.db["gpus"].insert({"id": gpu_id, "minor": minor, "first_seen": ts,
                                "last_seen": ts}, ignore=True)
        return gpu_id

    def _on_device_closed(self, envelope: Envelope, event: DeviceClosed) -> None:
        key = [event.process.pid, event.process.start_time]
        self.db.execute("update device_fds set closed_at = ? where pid = ? and start_time = ? "
                        "and fd = ? and closed_at is null", [event.ts, *key, event.fd])
        self.db["events"].insert(_event_row(envelope))

    def _on_ioctl_counts(self, envelope: Envelope, event: IoctlCounts) -> None:
        key = {"pid": event.process.pid, "start_time": event.process.start_time}
        self.db["ioctl_counts"].upsert_all([
            {**key, "path": event.path, "cmd": int(cmd), "device": event.device,
             "count": count, "updated_at": event.ts}
            for cmd, count in event.counts.items()
        ], pk=("pid", "start_time", "path", "cmd"))

    # --- probes handlers (eBPF probes issue) ---
    # --- end probes handlers ---

    # --- GPU source handlers (GPU sources issue) ---
    # --- end GPU source handlers ---

    # --- kernel log and cron handlers (kernel-log and cron issue) ---
    # --- end kernel log and cron handlers ---

    def _on_source_health(self, envelope: Envelope, event: SourceHealth) -> None:
        self.record_health(event.source, event.state, event.detail, event.counters, event.ts)

    def record_health(self, source: str, state: str, detail: str,
                      counters: dict[str, int], ts: int) -> None:
        self.db["source_health"].upsert({
            "source": source, "state": state, "detail": detail,
            "counters": json.dumps(counters, sort_keys=True), "last_seen": ts,
        }, pk="source")
