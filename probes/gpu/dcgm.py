"""The DCGM source, through NVIDIA's Python bindings (``pydcgm``, ``dcgm_structs``).

The bindings are not on PyPI; they ship with datacenter-gpu-manager-4 and are imported
from ``gpu.dcgm_bindings`` on first use. We connect to a running nv-hostengine first and
start an embedded one only when none answers and no nv-hostengine or dcgm-exporter
process runs: two hostengines on one host can deadlock the driver (DCGM #108).

Two field groups are watched: the basic fields and the profiling fields, so that when
profiling is unavailable (consumer GPUs, profiling module not loaded, Nsight holding the
counters, ``gpuwhy dcgm pause``) the basic fields go on. Every value since the last read
is used (``GetAllSinceLastCall``), grouped into one sample per GPU per interval.

MIG: the GPU instances in DCGM's MIG hierarchy (``dcgmGetGpuInstanceHierarchy``; entities
of group ``DCGM_FE_GPU_I`` whose parent is a GPU) are watched in an entity group of their
own, with the memory fields and the profiling fields, and give one sample per GPU instance
per interval: ``instance`` its NVML GPU instance id (dcgm-exporter's ``GPU_I_ID``),
``labels["mig_profile"]`` its profile, read as dcgm-exporter reads it (field 50,
``DCGM_FI_DEV_NAME``, of the GPU instance entity). The hierarchy is read again every
``mig_recheck_s`` seconds and after a failed instance read: a reconfiguration re-makes the
group, an instance gone stops.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import psutil

from gpuwhy.clock import now_ns
from gpuwhy.events import Event, GpuSample, GpuState, GpuXid
from gpuwhy.gpufields import BASIC_IDS, BY_ID, BY_NAME, PROFILING_IDS, is_blank, plausible
from gpuwhy.identity import GpuIdentity
from gpuwhy.probes.gpu.nvml import mig_profile
from gpuwhy.probes.gpu.source import (
    GpuInfo,
    SourceUnavailable,
    minor_from_procfs,
    normalise_bus_id,
)

HOSTENGINE_PROCESSES = ("nv-hostengine", "dcgm-exporter")
XID_FIELD = 230
ENTITY_STATUS_LOST = 4   # DcgmEntityStatusLost in dcgm_structs.h (set on NVML GPU_IS_LOST)
KEEP_AGE_S = 60.0
# dcgm_fields.DCGM_FE_GPU / DCGM_FE_GPU_I and dcgm_structs.DCGM_FV_FLAG_LIVE_DATA, should a
# binding lack the names (dcgm_fields.h, dcgm_structs.h)
FE_GPU, FE_GPU_I, FV_FLAG_LIVE_DATA = 1, 4, 1
NAME_FIELD = 50            # DCGM_FI_DEV_NAME: a GPU instance's is its profile ("1g.10gb")
# What a GPU instance is watched for: its memory, and the profiling fields (in MIG mode the
# only activity there is: the whole GPU has no DCGM_FI_DEV_GPU_UTIL)
MIG_WATCHES = (("mig_basic", tuple(BY_NAME[name].field_id
                                   for name in ("fb_total_mib", "fb_used_mib"))),
               ("mig_profiling", PROFILING_IDS))
MIG_RECHECK_S = 30.0


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance as DCGM's hierarchy gives it: its GPU, NVML GPU instance id, profile."""

    gpu: GpuInfo
    gpu_instance: int
    profile: str | None


class Bindings:
    """The DCGM modules, imported from sys.path or the configured directories."""

    def __init__(self, search_path: str = ""):
        for directory in filter(None, search_path.split(":")):
            if os.path.isdir(directory) and directory not in sys.path:
                sys.path.append(directory)
        try:
            self.pydcgm: ModuleType = importlib.import_module("pydcgm")
            self.structs: ModuleType = importlib.import_module("dcgm_structs")
        except ImportError:
            raise SourceUnavailable("dcgm", "not installed (no pydcgm module; looked in "
                                            f"{search_path or 'sys.path'})") from None
        # The raw calls (pydcgm's DcgmSystem has no MIG hierarchy call) and the entity
        # group ids; pydcgm itself imports both, a partial install may lack them (no MIG)
        self.agent: ModuleType | None = _optional("dcgm_agent")
        self.fields: ModuleType | None = _optional("dcgm_fields")

    def status_name(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        for name in dir(self.structs):
            if name.startswith("DCGM_ST_") and getattr(self.structs, name) == value:
                return name
        return f"status {value}"


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _other_hostengine_running() -> str | None:
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in HOSTENGINE_PROCESSES:
            return f"{proc.info['name']} (pid {proc.pid})"
    return None


def connect(bindings: Bindings, host: str, embedded_allowed: bool) -> tuple[Any, str]:
    """A DcgmHandle: to the hostengine at ``host``, else embedded when that is safe."""
    s = bindings.structs
    try:
        return bindings.pydcgm.DcgmHandle(ipAddress=host), f"hostengine {host}"
    except s.DCGMError as exc:
        status = bindings.status_name(exc)
        if exc.value == s.DCGM_ST_LIBRARY_NOT_FOUND:
            raise SourceUnavailable("dcgm", "libdcgm.so.4 not found") from None
        if exc.value == s.DCGM_ST_VER_MISMATCH:
            raise SourceUnavailable("dcgm", f"bindings and hostengine at {host} differ in "
                                            "version (DCGM_ST_VER_MISMATCH)") from None
        if exc.value != s.DCGM_ST_CONNECTION_NOT_VALID:
            raise SourceUnavailable("dcgm", f"cannot connect to {host}: {status}") from None
    if not embedded_allowed:
        raise SourceUnavailable("dcgm", f"no hostengine at {host} (embedded mode is off)")
    other = _other_hostengine_running()
    if other:
        raise SourceUnavailable("dcgm", f"no hostengine answers at {host} but {other} runs; "
                                        "not starting a second one (DCGM #108)")
    try:
        handle = bindings.pydcgm.DcgmHandle(ipAddress=None,
                                            opMode=s.DCGM_OPERATION_MODE_AUTO)
    except s.DCGMError as exc:
        raise SourceUnavailable("dcgm", f"no hostengine at {host}, embedded start failed: "
                                        f"{bindings.status_name(exc)}") from None
    return handle, "embedded hostengine"


class DcgmSource:
    """DCGM over every supported GPU, sampled every ``interval`` seconds."""

    name = "dcgm"
    simulated = False

    def __init__(self, host: str = "localhost:5555", interval: float = 1.0,
                 bindings_path: str = "", embedded: bool = True, proc_root: str = "/proc"):
        self.host, self.interval, self.embedded = host, interval, embedded
        self.bindings_path, self.proc_root = bindings_path, proc_root
        self.gpus: list[GpuInfo] = []
        self.mode = ""
        self.profiling_note = ""
        # DCGM's objects (untyped bindings) from open() to close(), else None; every reader
        # runs in between. A Bindings' attributes are modules: Any to mypy either way.
        self._b: Any = None
        self._handle: Any = None
        self._group: Any = None
        self._groups: dict[str, Any] = {}
        self._cursors: dict[str, Any] = {}
        self._last_ts: dict[tuple[object, str, int], int] = {}   # (handle, instance, field)
        self._by_dcgm_id: dict[int, GpuInfo] = {}
        self._lost: set[int] = set()
        # MIG: the GPU instances by DCGM entity id, their entity group, field groups, cursors
        self.mig_note = ""
        self.mig_recheck_s = MIG_RECHECK_S
        self._instances: dict[int, MigInstance] = {}
        self._mig_group: Any = None
        self._mig_groups: dict[str, Any] = {}
        self._mig_cursors: dict[str, Any] = {}
        self._mig_checked: float | None = None   # monotonic time of the last hierarchy read

    def open(self) -> list[GpuInfo]:
        self._b = Bindings(self.bindings_path)
        self._handle, self.mode = connect(self._b, self.host, self.embedded)
        s = self._b.structs
        try:
            system = self._handle.GetSystem()
            ids = list(system.discovery.GetAllSupportedGpuIds())
            if not ids:
                raise SourceUnavailable("dcgm", f"{self.mode} reports no supported GPU")
            self.gpus = [self._describe(system, gpu_id) for gpu_id in ids]
            self._group = system.GetGroupWithGpuIds(f"gpuwhy-{os.getpid()}", ids)
            self._watch("basic", BASIC_IDS)
        except s.DCGMError as exc:
            self.close()
            raise SourceUnavailable("dcgm", f"{self.mode}: {self._b.status_name(exc)}") from None
        try:
            self._watch("profiling", PROFILING_IDS)
        except s.DCGMError as exc:
            self.profiling_note = (f"profiling fields unavailable ({self._b.status_name(exc)}"
                                   "): consumer GPU, profiling module not loaded, or another "
                                   "tool (Nsight) holds the counters")
        self._discover_instances()
        return self.gpus

    def _describe(self, system: Any, gpu_id: int) -> GpuInfo:
        ids = system.discovery.GetGpuAttributes(gpu_id).identifiers
        bus_id = normalise_bus_id(ids.pciBusId)
        identity = GpuIdentity(uuid=ids.uuid or None, pci_bus_id=bus_id, index=gpu_id,
                               minor=minor_from_procfs(bus_id, self.proc_root))
        info = GpuInfo(identity, model=ids.deviceName, driver_version=ids.driverVersion,
                       handle=gpu_id)
        self._by_dcgm_id[gpu_id] = info
        return info

    def _watch(self, kind: str, field_ids: tuple[int, ...]) -> None:
        group = self._b.pydcgm.DcgmFieldGroup(self._handle, name=f"gpuwhy-{os.getpid()}-{kind}",
                                              fieldIds=list(field_ids))
        self._groups[kind] = group
        try:
            self._group.samples.WatchFields(group, int(self.interval * 1e6), KEEP_AGE_S, 0)
        except self._b.structs.DCGMError:
            del self._groups[kind]
            group.Delete()
            raise

    def notes(self) -> list[str]:
        notes = [f"connected to {self.mode}"]
        if self.profiling_note:
            notes.append(self.profiling_note)
        if self._instances:
            notes.append(f"MIG: {len(self._instances)} GPU instance(s) watched")
        if self.mig_note:
            notes.append(self.mig_note)
        return notes + [f"{self._by_dcgm_id[i].id}: lost" for i in sorted(self._lost)]

    def read(self) -> list[Event]:
        s = self._b.structs
        values: dict[int, dict[int, list]] = {}
        for kind, group in list(self._groups.items()):
            try:
                cursor = self._group.samples.GetAllSinceLastCall(self._cursors.get(kind), group)
            except s.DCGMError as exc:
                if exc.value == s.DCGM_ST_GPU_IS_LOST:
                    continue   # which GPU: asked below, per GPU without a sample
                if exc.value == s.DCGM_ST_CONNECTION_NOT_VALID:
                    raise SourceUnavailable("dcgm", f"lost the connection to {self.mode}"
                                            ) from None
                if kind == "profiling":
                    self.profiling_note = f"profiling read failed: {self._b.status_name(exc)}"
                    continue
                raise SourceUnavailable("dcgm", f"read failed: {self._b.status_name(exc)}"
                                        ) from None
            self._cursors[kind] = cursor
            for gpu_id, by_field in cursor.values.items():
                for field_id, series in by_field.items():
                    values.setdefault(gpu_id, {}).setdefault(field_id, []).extend(series)
            cursor.EmptyValues()
        events: list[Event] = []
        for gpu_id, by_field in values.items():
            if gpu_id in self._by_dcgm_id and gpu_id not in self._lost:
                events += self._gpu_events(self._by_dcgm_id[gpu_id], by_field)
        sampled = {e.gpu_id for e in events if isinstance(e, GpuSample)}
        for gpu in self.gpus:
            if gpu.id not in sampled and gpu.handle not in self._lost:
                events += self._check_lost(gpu)
        return events + self._read_instances()

    def _check_lost(self, gpu: GpuInfo) -> list[Event]:
        try:
            status = self._handle.GetSystem().discovery.GetGpuStatus(gpu.handle)
        except self._b.structs.DCGMError:
            return []
        if getattr(status, "value", status) != ENTITY_STATUS_LOST:
            return []
        self._lost.add(cast(int, gpu.handle))      # a DCGM GPU's handle: its DCGM id
        return [GpuState(ts=now_ns(), gpu_id=gpu.id, state="lost", source="dcgm",
                         simulated=False, detail="DCGM: GPU is lost (DcgmEntityStatusLost)")]

    def _gpu_events(self, gpu: GpuInfo, by_field: dict[int, list],
                    instance: MigInstance | None = None) -> list[Event]:
        """One sample per interval bucket (DCGM stamps each field separately, µs apart); a
        GPU instance's samples name it and its profile."""
        step_us = max(1, int(self.interval * 1e6))
        buckets: dict[int, dict[str, float]] = {}
        stamps: dict[int, int] = {}
        events: list[Event] = []
        prof_seen = prof_blank = 0
        mark: dict[str, Any] = dict(gpu_id=gpu.id, source="dcgm", simulated=False)
        extra: dict = {}
        if instance is not None:
            extra = dict(instance=str(instance.gpu_instance),
                         labels={"mig_profile": instance.profile} if instance.profile else {})
        for field_id, series in by_field.items():
            field = BY_ID.get(field_id)
            for v in series:
                key = (gpu.handle, extra.get("instance", ""), field_id)
                if field is None or v.ts <= self._last_ts.get(key, -1):
                    continue   # GetAllSinceLastCall may repeat the latest value
                self._last_ts[key] = v.ts
                if field.profiling:
                    prof_seen += 1
                if v.isBlank or is_blank(v.value):
                    prof_blank += field.profiling
                    continue
                if field_id == XID_FIELD:
                    if v.value and instance is None:
                        events.append(GpuXid(ts=v.ts * 1000, raw_ts=v.ts, xid=int(v.value),
                                             detail="DCGM field 230", **mark))
                    continue
                if not plausible(field, float(v.value)):
                    continue
                bucket = v.ts // step_us
                stamps[bucket] = min(stamps.get(bucket, v.ts), v.ts)
                buckets.setdefault(bucket, {})[field.name] = float(v.value)
        if instance is None and prof_seen and prof_seen == prof_blank:
            self.profiling_note = ("profiling fields blank: paused (gpuwhy dcgm pause) or "
                                   "another tool (Nsight) holds the counters")
        elif instance is None and prof_seen:
            self.profiling_note = ""
        for bucket in sorted(buckets):
            events.append(GpuSample(ts=stamps[bucket] * 1000, raw_ts=stamps[bucket],
                                    fields=buckets[bucket], **mark, **extra))
        return events

    # --- MIG: the GPU instances --------------------------------------------------------

    def _entity_group_ids(self) -> tuple[int, int]:
        fields = self._b.fields
        return (getattr(fields, "DCGM_FE_GPU", FE_GPU), getattr(fields, "DCGM_FE_GPU_I", FE_GPU_I))

    def _discover_instances(self) -> None:
        """Read DCGM's MIG hierarchy; when its GPU instances changed, watch the new set.

        Never fails the source: without the raw bindings, on a hostengine that cannot give
        the hierarchy, or when the watch is refused, there are no instance samples and the
        notes say why (a GPU not in MIG mode simply has no GPU instance in the hierarchy).
        """
        b = self._b
        self._mig_checked = time.monotonic()
        if b.agent is None:
            self.mig_note = "MIG instances not watched: no dcgm_agent module in the bindings"
            return
        fe_gpu, fe_gpu_i = self._entity_group_ids()
        try:
            hierarchy = b.agent.dcgmGetGpuInstanceHierarchy(self._handle.handle)
        except b.structs.DCGMError as exc:
            self.mig_note = f"MIG hierarchy unavailable ({b.status_name(exc)})"
            return
        entities = {}
        for entry in hierarchy.entityList[:hierarchy.count]:
            if (entry.entity.entityGroupId == fe_gpu_i and entry.parent.entityGroupId == fe_gpu
                    and entry.parent.entityId in self._by_dcgm_id):
                entities[entry.entity.entityId] = (entry.entity, entry.parent.entityId,
                                                   int(entry.info.nvmlInstanceId))
        self.mig_note = ""
        profiles = self._profiles([entity for entity, _, _ in entities.values()])
        found = {entity_id: MigInstance(self._by_dcgm_id[gpu_id], gi, profiles.get(entity_id))
                 for entity_id, (_, gpu_id, gi) in entities.items()}
        if found == self._instances and (self._mig_groups or not found):
            return
        self._unwatch_instances()
        self._instances = found
        if found:
            self._watch_instances([entity for entity, _, _ in entities.values()])

    def _profiles(self, entities: list) -> dict[int, str]:
        """Each GPU instance's profile, by entity id, from its ``DCGM_FI_DEV_NAME``, read
        live (``dcgmEntitiesGetLatestValues``, as dcgm-exporter reads it)."""
        b = self._b
        if not entities:
            return {}
        flag = getattr(b.structs, "DCGM_FV_FLAG_LIVE_DATA", FV_FLAG_LIVE_DATA)
        try:
            values = b.agent.dcgmEntitiesGetLatestValues(self._handle.handle, entities,
                                                         [NAME_FIELD], flag)
        except b.structs.DCGMError as exc:
            self.mig_note = f"MIG profile names unavailable ({b.status_name(exc)})"
            return {}
        profiles = {}
        for fv in values:
            if fv.status != b.structs.DCGM_ST_OK or fv.fieldId != NAME_FIELD:
                continue
            profile = mig_profile(fv.value.str)
            if profile is not None:
                profiles[fv.entityId] = profile
        return profiles

    def _watch_instances(self, entities: list) -> None:
        b = self._b
        system = self._handle.GetSystem()
        name = f"gpuwhy-{os.getpid()}-mig"
        try:
            self._mig_group = system.GetGroupWithEntities(name, entities)
        except b.structs.DCGMError as exc:
            self.mig_note = f"MIG instances not watched ({b.status_name(exc)})"
            self._instances = {}
            return
        refused = []
        for kind, field_ids in MIG_WATCHES:
            group = b.pydcgm.DcgmFieldGroup(self._handle, name=f"gpuwhy-{os.getpid()}-{kind}",
                                            fieldIds=list(field_ids))
            try:
                self._mig_group.samples.WatchFields(group, int(self.interval * 1e6),
                                                    KEEP_AGE_S, 0)
            except b.structs.DCGMError as exc:
                refused.append(f"{kind} ({b.status_name(exc)})")
                group.Delete()
                continue
            self._mig_groups[kind] = group
        if refused:
            self.mig_note = "MIG instance fields not watched: " + ", ".join(refused)

    def _unwatch_instances(self) -> None:
        _drop_groups(self._mig_group, self._mig_groups)
        self._mig_cursors.clear()
        self._mig_group = None
        self._instances = {}

    def _read_instances(self) -> list[Event]:
        """Every GPU instance value since the last read, one sample per instance per
        interval; the hierarchy is read again when it is due or a read failed."""
        if self._b.agent is not None and (
                self._mig_checked is None
                or time.monotonic() - self._mig_checked >= self.mig_recheck_s):
            self._discover_instances()
        s = self._b.structs
        _, fe_gpu_i = self._entity_group_ids()
        values: dict[int, dict[int, list]] = {}
        for kind, group in list(self._mig_groups.items()):
            try:
                cursor = self._mig_group.samples.GetAllSinceLastCall_v2(
                    self._mig_cursors.get(kind), group)
            except s.DCGMError as exc:
                if exc.value == s.DCGM_ST_CONNECTION_NOT_VALID:
                    raise SourceUnavailable("dcgm", f"lost the connection to {self.mode}"
                                            ) from None
                # an instance destroyed under the watch, or the profiling counters taken:
                # this read has no instance values of that kind; the hierarchy is read again
                self.mig_note = f"MIG instance read failed: {self._b.status_name(exc)}"
                self._mig_checked = None
                continue
            self._mig_cursors[kind] = cursor
            for entity_id, by_field in cursor.values.get(fe_gpu_i, {}).items():
                for field_id, series in by_field.items():
                    values.setdefault(entity_id, {}).setdefault(field_id, []).extend(series)
            cursor.EmptyValues()
        events: list[Event] = []
        for entity_id, by_field in sorted(values.items()):
            instance = self._instances.get(entity_id)
            if instance is not None and instance.gpu.handle not in self._lost:
                events += self._gpu_events(instance.gpu, by_field, instance)
        return events

    def pause_profiling(self, pause: bool) -> None:
        """``gpuwhy dcgm pause|resume``: let Nsight and friends use the counters."""
        system = self._handle.GetSystem()
        if pause:
            system.profiling.Pause()
        else:
            system.profiling.Resume()

    def close(self) -> None:
        if self._handle is not None:
            self._unwatch_instances()
        _drop_groups(self._group, self._groups)
        self._group = None
        if self._handle is not None:
            self._handle.Shutdown()
            self._handle = None


def _drop_groups(entities: Any, fields: dict) -> None:
    """Unwatch and delete the field groups watched on an entity group, then the entity
    group itself; best effort (the hostengine may be gone) and ``fields`` emptied."""
    for group in fields.values():
        try:
            entities.samples.UnwatchFields(group)
            group.Delete()
        except Exception:  # noqa: BLE001 - best effort on a hostengine that may be gone
            pass
    fields.clear()
    if entities is not None:
        try:
            entities.Delete()
        except Exception:  # noqa: BLE001
            pass
