"""Fill a store with simulated days: the GPU simulator's samples, jobs holding GPUs, Xids,
cron-driven resets and their incidents, written through the real StoreWriter. SIMULATED.

For the store benchmark, the README recipes test and trying the views without a GPU.
Samples are the simulator's (``SimulatedGpus``) re-timed onto a past clock; the host side
(processes, driver calls, kernel-log and cron lines) follows a fixed, seeded plan; the
incidents are written as the correlator would store them (``incidents`` and
``incident_links``), because the correlator's rules are not the point here.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import (
    CronExecution,
    DeviceOpened,
    DriverCall,
    Envelope,
    Event,
    GpuState,
    GpuXid,
    KernelLogRecord,
    ProcessExited,
    ProcessKey,
    ProcessSeen,
)
from gpuwhy.lifecycle import RESET, RESOLVED
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.reset import BIF_RESET, RESET_ACTION_SUFFIX, RESET_CONTROLS, RESET_STATES
from gpuwhy.store.fixtures import insert_links, xid_event_at
from gpuwhy.store.incident_rows import insert_incident
from gpuwhy.store.writer import StoreWriter

JOB_HOURS = 6          # each GPU runs one job after another, this long each
TAGS = ("team-a", "team-b", "")
# The 25 fields of the size budget: what a DCGM default field group reports on an H100.
BUDGET_FIELDS = (
    "gpu_util", "mem_util", "sm_clock_mhz", "mem_clock_mhz", "clocks_event_reasons", "pstate",
    "temp_c", "mem_temp_c", "power_w", "energy_mj", "power_violation_ns",
    "thermal_violation_ns", "fb_used_mib", "pcie_replays", "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
    "ecc_dbe_volatile", "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active",
    "dram_active", "fp16_active")


@dataclass
class FillStats:
    samples: int = 0
    events: int = 0
    incidents: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    gpus: int = 8
    days: float = 7.0
    interval: float = 1.0
    start_ns: int = 1_767_225_600 * NS_PER_SECOND   # 2026-01-01 00:00 UTC
    seed: int = 0
    fields: tuple[str, ...] | None = None           # None: every field the simulator has


def _host_events(plan: Plan, tick: int, t_ns: int, gpus: list) -> list[Event]:
    """Jobs start and end on each GPU; once a day a cron job resets a GPU after an Xid."""
    events: list[Event] = []
    seconds = round(tick * plan.interval)
    if tick and round((tick - 1) * plan.interval) == seconds:
        return events
    for index in range(len(gpus)):
        job, into = divmod(seconds + index * 900, JOB_HOURS * 3600)
        key = ProcessKey(10_000 + job * 64 + index, 1_000 + job * 64 + index)
        if into == 0 or seconds == 0:
            if job and into == 0:
                events.append(ProcessExited(ts=t_ns, process=ProcessKey(key.pid - 64,
                                                                        key.start_time - 64),
                                            exit_code=0))
            events += [
                ProcessSeen(ts=t_ns, process=key, comm="python",
                            cmdline=f"python train.py --job {job}", exe="/usr/bin/python3",
                            cgroup=f"/system.slice/docker-{job:04x}{index:02x}.scope",
                            tag=TAGS[(job + index) % len(TAGS)]),
                DeviceOpened(ts=t_ns, process=key, fd=5, path=f"/dev/nvidia{index}",
                             device="nvidiaN", minor=index)]
    day, into_day = divmod(seconds, 86_400)
    if into_day == 3 * 3600:
        events += _reset_story(day, t_ns, gpus[day % len(gpus)], day % len(gpus))
    return events


def _reset_story(day: int, t_ns: int, gpu: Any, index: int) -> list[Event]:
    s = NS_PER_SECOND
    mark = dict(gpu_id=gpu.id, source="sim", simulated=True)
    cron_pid = ProcessKey(50_000 + day, 900_000 + day)
    cursor = f"sim-{day}"
    return [
        KernelLogRecord(ts=t_ns, cursor=f"{cursor}-xid", origin="journald", boot_id="sim",
                        record_kind="xid", xid=79, pci=gpu.identity.pci_bus_id[:10],
                        uuid=gpu.identity.uuid, message="GPU has fallen off the bus.",
                        line="NVRM: Xid 79 (simulated)"),
        GpuXid(ts=t_ns, xid=79, detail="GPU has fallen off the bus (simulated)", **mark),
        GpuState(ts=t_ns, state="lost", detail="Xid 79 (simulated)", **mark),
        CronExecution(ts=t_ns + 60 * s, cursor=f"{cursor}-cron", phase="started", user="root",
                      command=f"nvidia-smi -i {index} -r", job_pid=cron_pid.pid,
                      job_start_time=cron_pid.start_time,
                      gpu_action="nvidia-smi -r" + RESET_ACTION_SUFFIX,
                      boot_id="sim"),
        ProcessSeen(ts=t_ns + 60 * s, process=cron_pid, comm="nvidia-smi",
                    cmdline=f"nvidia-smi -i {index} -r", cgroup="/system.slice/cron.service"),
        DriverCall(ts=t_ns + 61 * s, process=cron_pid, tid=cron_pid.pid, fd=3,
                   path="/dev/nvidiactl", device="nvidiactl", cmd=0xC020462A, nr=0x2A,
                   size=32, op="NV_ESC_RM_CONTROL", latency_ns=2_000_000, ret=0,
                   sub=BIF_RESET, sub_name=RESET_CONTROLS[0], reasons=["notable"]),
        GpuState(ts=t_ns + 62 * s, state=RESET_STATES[0], detail="GPU reset (simulated)", **mark),
        GpuState(ts=t_ns + 67 * s, state="back", detail="reset done (simulated)", **mark),
        ProcessExited(ts=t_ns + 68 * s, process=cron_pid, exit_code=0),
    ]


def _incident(db: Database, story_ts: int, gpu_id: str, xid_id: int | None) -> None:
    s = NS_PER_SECOND
    incident = insert_incident(db, {
        "opened_at": story_ts, "closed_at": story_ts + 70 * s, "kind": "gpu_reset",
        "severity": "critical", "gpu_id": gpu_id, "title": "GPU reset after Xid 79",
        "summary": "cron ran nvidia-smi -r after the GPU fell off the bus (simulated)",
        "chain": None, "state": RESOLVED, "resolution": RESET, "count": 1})
    links = [("xid", story_ts, "Xid 79: GPU has fallen off the bus"),
             ("cron_job", story_ts + 60 * s, "cron: nvidia-smi -r"),
             ("driver_call", story_ts + 61 * s, RESET_CONTROLS[0]),
             ("gpu_reset", story_ts + 62 * s, "GPU reset")]
    insert_links(db, [
        {"incident_id": incident, "seq": seq, "kind": kind, "ts": ts, "summary": summary,
         "evidence": json.dumps({"event_id": xid_id}), "confidence": 0.9, "gpu_id": gpu_id}
        for seq, (kind, ts, summary) in enumerate(links, start=1)])


def _retimed(events: list[Event], ts: int, keep: tuple[str, ...] | None) -> Iterator[Event]:
    for event in events:
        if keep is not None and hasattr(event, "fields"):
            fields = {k: v for k, v in event.fields.items() if k in keep}
            sample: Any = event             # a GpuSample (it has fields)
            yield dataclasses.replace(sample, ts=ts, fields=fields)
        else:
            yield dataclasses.replace(event, ts=ts)


def fill(db: Database, plan: Plan = Plan(), batch: int = 2000,
         progress: Callable[[float], None] | None = None) -> FillStats:
    """Write ``plan.days`` of ``plan.gpus`` simulated GPUs into ``db``; returns counts."""
    sim = SimulatedGpus(count=plan.gpus, seed=plan.seed, interval=plan.interval)
    gpus = sim.open()
    writer, stats = StoreWriter(db), FillStats()
    started = time.monotonic()
    pending = [Envelope("sim", 0, gpu.seen(plan.start_ns, "sim", True)) for gpu in gpus]
    ticks = int(plan.days * 86_400 / plan.interval)
    step_ns = int(plan.interval * NS_PER_SECOND)
    stories: list[tuple[int, str]] = []
    running: dict[int, ProcessKey] = {}
    for tick in range(ticks):
        t_ns = plan.start_ns + tick * step_ns
        for event in _retimed(sim.read(), t_ns, plan.fields):
            pending.append(Envelope("sim", tick, event))
            stats.samples += 1
        for event in _host_events(plan, tick, t_ns, gpus):
            pending.append(Envelope("host", tick, event))
            stats.events += 1
            if isinstance(event, GpuXid):
                stories.append((t_ns, event.gpu_id))
            if isinstance(event, ProcessSeen) and event.comm == "python":
                running[event.process.pid % 64] = event.process
        if len(pending) >= batch:
            writer.write_batch(pending)
            pending = []
            if progress:
                progress(tick / ticks)
    end = plan.start_ns + ticks * step_ns
    pending += [Envelope("host", ticks, ProcessExited(ts=end, process=key, exit_code=0))
                for key in running.values()]   # the jobs end with the simulation
    writer.write_batch(pending)
    with db.atomic():
        for story_ts, gpu_id in stories:
            _incident(db, story_ts, gpu_id, xid_event_at(db, story_ts))
    stats.incidents = len(stories)
    stats.seconds = time.monotonic() - started
    return stats
