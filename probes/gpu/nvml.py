"""The NVML source, through nvidia-ml-py (``import pynvml``), for hosts without DCGM.

Per GPU and read: identity, utilisation, memory, clocks, clock-event reasons, power,
energy, temperature, PCIe throughput and link (generation and width, now and at most), ECC
and row remapping, the NVLink error counters summed over the active links (none on a GPU
without NVLink), the NVLink fabric's state and health on NVSwitch boards, the running
compute processes with their memory (and, in MIG mode, their GPU instance), and
per-process utilisation samples. On Hopper and later, GPM (GPU Performance Monitoring) adds
``gr_engine_active``, ``sm_active``, ``tensor_active`` and ``dram_active``: each read takes
one GPM sample and computes the metrics since the previous read's, so a GPU's first read
has none of them; before Hopper there are none.
A GPU in MIG mode also gets one sample per GPU instance (``instance`` its GPU instance id,
``labels["mig_profile"]`` its profile, e.g. ``1g.10gb``): the instance's memory, and on
Hopper and later its GPM metrics (``nvmlGpmMigSampleGet``). The whole GPU's sample keeps
what the device reports (in MIG mode NVML gives it no utilisation).
A thread waits for Xid events (NVML event sets are not thread safe: only that thread
touches its set). ``GPU_IS_LOST`` and ``RESET_REQUIRED`` become ``gpu_state`` events;
that GPU is then left alone. Anything NOT_SUPPORTED or NO_PERMISSION is missing, noted
once.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import queue
import re
import threading
from collections.abc import Callable
from time import monotonic_ns
from types import ModuleType
from typing import Any

from gpuwhy.clock import now_ns
from gpuwhy.errors import NoSuchProcess
from gpuwhy.events import Event, GpuProcesses, GpuSample, GpuState, GpuXid
from gpuwhy.gpufields import (
    BY_NAME,
    FABRIC_FAILURE,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_NOT_SUPPORTED,
    FABRIC_SUCCESS,
    FABRIC_UNRECOGNIZED,
    plausible,
)
from gpuwhy.identity import GpuIdentity
from gpuwhy.probes.gpu.source import (
    GpuInfo,
    SourceUnavailable,
    minor_from_procfs,
    normalise_bus_id,
)
from gpuwhy.proc import process_key

log = logging.getLogger(__name__)

XID_WAIT_MS = 500
MIB = 1 << 20
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "library not found (no libnvidia-ml.so.1)",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_LibRmVersionMismatch": "library/driver version mismatch "
                                      "(driver upgraded without a reboot?)",
    "NVMLError_NoPermission": "no permission to open the GPUs",
}


# Our profiling field <- the GPM metric that measures it (GPM: percent, 0-100; ours: 0-1).
# Each is the nearest GPM metric to the DCGM field, not the same counter (docs/gpu-fields.md);
# GRAPHICS_UTIL is the one DCGM itself reads for GR_ENGINE_ACTIVE on Hopper and later
# (DcgmFieldIdToNvmlGpmMetricId in dcgmlib/src/dcgm_fields.cpp).
GPM_METRICS = (("gr_engine_active", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
               ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
               ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
               ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL"))
GPM_NOTE = f"GPM metrics ({', '.join(name for name, _ in GPM_METRICS)})"
# NVML's GPM counters refresh about every 100 ms: two samples closer than that measure
# nothing ("the interval between two nvmlGpmSampleGet() calls should be greater than 100ms").
GPM_MIN_GAP_NS = 100_000_000
MIG_NOTE = "MIG instances"
MIG_GPM_NOTE = f"{GPM_NOTE} per MIG instance"
MIG_MEMORY_NOTE = "memory per MIG instance"
# NVML's "no such id" in a process's gpuInstanceId (NVML_VALUE_NOT_AVAILABLE as a c_uint):
# the process runs on a GPU that is not in MIG mode
NO_INSTANCE_ID = 0xFFFFFFFF
# "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG 1g.10gb+me", or a compute instance's
# "MIG 1c.3g.40gb" (one compute slice of a 3g.40gb GPU instance)
_MIG_NAME = re.compile(r"(?:^|\s)(?:MIG\s+)?(?:\d+c\.)?(\d+g\.\d+gb\S*)\s*$")


def mig_profile(name: str | bytes | None) -> str | None:
    """The GPU instance profile (``1g.10gb``) in a MIG device's or GPU instance's name, or
    None when the name has none. A compute instance's name (``MIG 1c.3g.40gb``) gives its
    GPU instance's profile (``3g.40gb``): samples are per GPU instance."""
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    match = _MIG_NAME.search((name or "").strip())
    return match.group(1) if match else None


def _load() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise SourceUnavailable("nvml", "not installed (no pynvml module: "
                                        "pip install nvidia-ml-py)") from None


def memory_info(nv: ModuleType, handle: object) -> Any:
    """The framebuffer as nvidia-smi and DCGM (field 252, with drivers from 510 on) count
    it: NVML's v2 struct, whose ``used`` leaves out what the driver reserves for itself
    (``reserved``). The v1 struct's ``used`` is total - free, the reserve included: 615 MiB
    on an idle H200 (driver 580.159.04) whose nvidia-smi says 0 MiB used, 616 reserved.
    A driver or binding without the v2 call gives v1."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch,
                nv.NVMLError_NotSupported):
            pass
    return nv.nvmlDeviceGetMemoryInfo(handle)


def _readers(nv: ModuleType) -> dict[str, Callable]:
    """Our field name -> how to read it from a device handle, in our unit."""
    return {
        "gpu_util": lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
        "mem_util": lambda h: nv.nvmlDeviceGetUtilizationRates(h).memory,
        "enc_util": lambda h: nv.nvmlDeviceGetEncoderUtilization(h)[0],
        "dec_util": lambda h: nv.nvmlDeviceGetDecoderUtilization(h)[0],
        "sm_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "clocks_event_reasons": nv.nvmlDeviceGetCurrentClocksEventReasons,
        "pstate": nv.nvmlDeviceGetPerformanceState,
        "temp_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "power_w": lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000,
        "power_limit_w": lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "energy_mj": nv.nvmlDeviceGetTotalEnergyConsumption,
        "fb_total_mib": lambda h: memory_info(nv, h).total / MIB,
        "fb_used_mib": lambda h: memory_info(nv, h).used / MIB,
        "pcie_replays": nv.nvmlDeviceGetPcieReplayCounter,
        "pcie_tx_bytes_per_s": lambda h: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024,
        "pcie_rx_bytes_per_s": lambda h: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024,
        "ecc_sbe_volatile": lambda h: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
        "ecc_dbe_volatile": lambda h: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        "row_remap_correctable": lambda h: nv.nvmlDeviceGetRemappedRows(h)[0],
        "row_remap_uncorrectable": lambda h: nv.nvmlDeviceGetRemappedRows(h)[1],
        "row_remap_failed": lambda h: int(bool(nv.nvmlDeviceGetRemappedRows(h)[3])),
        "row_remap_pending": lambda h: int(bool(nv.nvmlDeviceGetRemappedRows(h)[2])),
        "pcie_link_gen": nv.nvmlDeviceGetCurrPcieLinkGeneration,
        "pcie_link_width": nv.nvmlDeviceGetCurrPcieLinkWidth,
        "pcie_link_gen_max": nv.nvmlDeviceGetMaxPcieLinkGeneration,
        "pcie_link_width_max": nv.nvmlDeviceGetMaxPcieLinkWidth,
    }


# Our NVLink error field <- its NVML DL error counter, summed over the GPU's active links.
NVLINK_COUNTERS = (("nvlink_crc_flit_errors", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
                   ("nvlink_crc_data_errors", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
                   ("nvlink_replay_errors", "NVML_NVLINK_ERROR_DL_REPLAY"),
                   ("nvlink_recovery_errors", "NVML_NVLINK_ERROR_DL_RECOVERY"))
NVLINK_NOTE = "NVLink error counters"

# NVML's fabric probe, newest struct first. A driver answers ARGUMENT_VERSION_MISMATCH to a
# struct newer than it knows (v3 adds the health summary), and one older than the versioned
# call has only nvmlDeviceGetGpuFabricInfo (FUNCTION_NOT_FOUND for the other); an older
# nvidia-ml-py may lack a struct or call (skipped).
FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))
FABRIC_NOTE = "NVLink fabric state"


def fabric_state(nv: ModuleType, state: int, status: int) -> int:
    """NVML's fabric probe state and status as our ``fabric_state`` (DCGM's
    dcgmFabricManagerStatus_t), mapped as DCGM maps them: a completed probe is a Success
    only with NVML_SUCCESS as its status, else a Failure; a state NVML added since is
    Unrecognized."""
    if state == nv.NVML_GPU_FABRIC_STATE_COMPLETED:
        return FABRIC_SUCCESS if status == nv.NVML_SUCCESS else FABRIC_FAILURE
    return {nv.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: FABRIC_NOT_SUPPORTED,
            nv.NVML_GPU_FABRIC_STATE_NOT_STARTED: FABRIC_NOT_STARTED,
            nv.NVML_GPU_FABRIC_STATE_IN_PROGRESS: FABRIC_IN_PROGRESS}.get(state,
                                                                         FABRIC_UNRECOGNIZED)


def _missing(nv: ModuleType) -> tuple[type[Exception], ...]:
    """The errors that mean "this GPU, driver or library cannot give that", for good."""
    return (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission,
            nv.NVMLError_FunctionNotFound, nv.NVMLLibraryMismatchError)


class _GpmPair:
    """One GPU's (or MIG GPU instance's) two GPM sample buffers: the latest sample, and the
    one the next read fills.

    Allocated once per GPU and swapped on each read, so that a read is one
    ``nvmlGpmSampleGet`` (``take``; ``nvmlGpmMigSampleGet`` for a GPU instance) and one
    ``nvmlGpmMetricsGet``, and the metrics always span the real time since the previous
    read, however long that was.
    """

    def __init__(self, nv: ModuleType, take: Callable[[object], object]):
        self.nv, self.take = nv, take
        self.latest = nv.nvmlGpmSampleAlloc()
        try:
            self.spare = nv.nvmlGpmSampleAlloc()
        except nv.NVMLError:
            nv.nvmlGpmSampleFree(self.latest)
            raise
        self.latest_ns: int | None = None   # None: the latest buffer holds no sample yet
        self.measured = False               # a read has given metrics (two samples apart)

    def advance(self) -> object | None:
        """Take a sample; the metrics (a ``c_nvmlGpmMetricsGet_t``) since the previous
        one, or None when there is no previous one far enough back."""
        nv, now = self.nv, monotonic_ns()
        if self.latest_ns is not None and now - self.latest_ns <= GPM_MIN_GAP_NS:
            return None   # keep the older sample as the base: the next read spans both gaps
        self.take(self.spare)
        had_base = self.latest_ns is not None
        self.latest, self.spare = self.spare, self.latest
        self.latest_ns = now
        if not had_base:
            return None
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(GPM_METRICS)
        get.sample1, get.sample2 = self.spare, self.latest   # older first
        for i, (_, metric) in enumerate(GPM_METRICS):
            get.metrics[i].metricId = getattr(nv, metric)
        got = nv.nvmlGpmMetricsGet(get)
        self.measured = True
        return got

    def free(self) -> None:
        for sample in (self.latest, self.spare):
            try:
                self.nv.nvmlGpmSampleFree(sample)
            except self.nv.NVMLError:
                pass   # nothing else to do with a buffer NVML will not take back


class NvmlSource:
    """NVML over every GPU; ``proc_root`` resolves pids to (pid, start time)."""

    name = "nvml"
    simulated = False

    def __init__(self, proc_root: str = "/proc", xid_events: bool = True):
        self.proc_root = proc_root
        self.xid_events = xid_events
        self.gpus: list[GpuInfo] = []
        # pynvml from open() to close(), else None; every reader runs in between (a module's
        # attributes are Any to mypy either way: only the None would be checked)
        self._nv: Any = None
        self._readers: dict[str, Callable] = {}
        self._unsupported: dict[str, set[str]] = {}
        self._gone: dict[str, str] = {}
        self._last_util_ts: dict[str, int] = {}
        self._gpm: dict[str, _GpmPair | None] = {}   # None: no GPM on that GPU
        self._gpm_device: dict[str, bool] = {}         # whether the GPU has GPM at all
        # MIG: GPUs that cannot be in MIG mode (asked once), and each GPU instance's GPM pair
        # by (GPU, GPU instance id, profile); None: no GPM for that instance
        self._no_mig: set[str] = set()
        self._mig_gpm: dict[tuple[str, int, str | None], _GpmPair | None] = {}
        # The NVLink links each GPU has (asked once: a link's existence does not change while
        # the driver runs); an empty tuple: no NVLink on that GPU.
        self._nvlinks: dict[str, tuple[int, ...]] = {}
        # The FABRIC_CALLS entry each GPU's driver answers (found at the first read); None:
        # the GPU or driver has no fabric probe.
        self._fabric: dict[str, int | None] = {}
        self._xids: queue.Queue[Event] = queue.Queue()
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._xid_note = ""

    def open(self) -> list[GpuInfo]:
        nv = _load()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            reason = _INIT_REASONS.get(type(exc).__name__, f"nvmlInit failed: {exc}")
            raise SourceUnavailable("nvml", reason) from None
        self._nv = nv
        self._readers = _readers(nv)
        try:
            driver = nv.nvmlSystemGetDriverVersion()
            self.gpus = [self._describe(i, driver) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            nv.nvmlShutdown()
            raise SourceUnavailable("nvml", f"cannot list GPUs: {exc}") from None
        if not self.gpus:
            nv.nvmlShutdown()
            raise SourceUnavailable("nvml", "NVML sees no GPU")
        if self.xid_events:
            self._xid_thread = threading.Thread(target=self._wait_for_xids, daemon=True,
                                                name="gpuwhy-nvml-xid")
            self._xid_thread.start()
        return self.gpus

    def _describe(self, index: int, driver: str) -> GpuInfo:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        bus_id = normalise_bus_id(nv.nvmlDeviceGetPciInfo(handle).busId)
        try:
            minor = nv.nvmlDeviceGetMinorNumber(handle)
        except nv.NVMLError:
            minor = minor_from_procfs(bus_id, self.proc_root)
        identity = GpuIdentity(uuid=nv.nvmlDeviceGetUUID(handle), pci_bus_id=bus_id,
                               index=index, minor=minor)
        return GpuInfo(identity, model=nv.nvmlDeviceGetName(handle), driver_version=driver,
                       handle=handle)

    def notes(self) -> list[str]:
        notes = [f"{gpu_id}: {reason}" for gpu_id, reason in self._gone.items()]
        for name, gpus in sorted(self._unsupported.items()):
            notes.append(f"{name} not available on {len(gpus)} GPU(s)")
        return notes + ([self._xid_note] if self._xid_note else [])

    def read(self) -> list[Event]:
        events: list[Event] = []
        while not self._xids.empty():
            events.append(self._xids.get_nowait())
        for gpu in self.gpus:
            if gpu.id not in self._gone:
                events += self._read_gpu(gpu)
        return events

    def _read_gpu(self, gpu: GpuInfo) -> list[Event]:
        nv, ts = self._nv, now_ns()
        fields: dict[str, float] = {}
        try:
            for name, read in self._readers.items():
                try:
                    value = float(read(gpu.handle))
                except _missing(nv):
                    self._unsupported.setdefault(name, set()).add(gpu.id)
                    continue
                if plausible(BY_NAME[name], value):
                    fields[name] = value
            fields.update(self._nvlink_fields(gpu))
            fields.update(self._fabric_fields(gpu))
            fields.update(self._gpm_fields(gpu))
            processes = self._processes(gpu)
            instances = self._mig_samples(gpu, ts)
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired) as exc:
            state = "lost" if isinstance(exc, nv.NVMLError_GpuIsLost) else "reset_required"
            self._gone[gpu.id] = f"{state} ({exc})"
            return [GpuState(ts=ts, gpu_id=gpu.id, state=state, source="nvml",
                             simulated=False, detail=f"NVML: {exc}")]
        except nv.NVMLError as exc:
            log.warning("NVML read of %s failed: %s", gpu.id, exc)
            self._unsupported.setdefault(f"read ({exc})", set()).add(gpu.id)
            return []
        events: list[Event] = [GpuSample(ts=ts, gpu_id=gpu.id, source="nvml", simulated=False,
                                         fields=fields), *instances]
        if processes is not None:
            events.append(GpuProcesses(ts=ts, gpu_id=gpu.id, source="nvml",
                                       processes=processes))
        return events

    def _nvlink_fields(self, gpu: GpuInfo) -> dict[str, float]:
        """The NVLink DL error counters, each summed over the links that are active now.

        A GPU without NVLink, or with no link up, gets none of these fields: a zero would
        claim a clean link that is not there. A counter the GPU cannot give on some active
        link is left out whole (a partial sum would look like errors going away).
        """
        nv = self._nv
        if gpu.id not in self._nvlinks:
            self._nvlinks[gpu.id] = self._nvlink_links(gpu)
        links = self._nvlinks[gpu.id]
        if not links:
            return {}
        try:
            active = [link for link in links
                      if nv.nvmlDeviceGetNvLinkState(gpu.handle, link) == nv.NVML_FEATURE_ENABLED]
            if not active:
                return {}
            fields = {}
            for name, counter in NVLINK_COUNTERS:
                try:
                    total = sum(nv.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link,
                                                                   getattr(nv, counter))
                                for link in active)
                except _missing(nv):
                    self._unsupported.setdefault(name, set()).add(gpu.id)
                    continue
                if plausible(BY_NAME[name], float(total)):
                    fields[name] = float(total)
            return fields
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except nv.NVMLError as exc:
            # Only this read's NVLink fields are lost, not the GPU's other fields.
            self._read_failed(gpu, NVLINK_NOTE, "NVLink", exc)
            return {}

    def _nvlink_links(self, gpu: GpuInfo) -> tuple[int, ...]:
        """The link numbers NVML knows on this GPU, active or not. NVML answers
        NOT_SUPPORTED on a GPU without NVLink and INVALID_ARGUMENT past the GPU's last
        link; links need not be numbered without gaps, so every number is asked."""
        nv, links = self._nv, []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
                raise
            except (nv.NVMLError_InvalidArgument, *_missing(nv)):
                continue
            except nv.NVMLError as exc:
                log.info("%s: NVLink link %d: %s", gpu.id, link, exc)
                continue
            links.append(link)
        if not links:
            self._unsupported.setdefault(NVLINK_NOTE, set()).add(gpu.id)
        return tuple(links)

    def _fabric_fields(self, gpu: GpuInfo) -> dict[str, float]:
        """The NVLink fabric's state (``fabric_state``, DCGM's coding) and, from the v3
        struct on, its health summary (``fabric_health``).

        The newest struct the driver takes is found at the first read and kept. A GPU or
        driver without the probe (NOT_SUPPORTED, no such call) has neither field, noted
        once: absent, never 0, which would claim the probe said "no fabric".
        """
        nv = self._nv
        first = self._fabric.get(gpu.id, 0)
        if first is None:
            return {}
        for i in range(first, len(FABRIC_CALLS)):
            call, struct = FABRIC_CALLS[i]
            probe, make = getattr(nv, call, None), getattr(nv, struct, None)
            if probe is None or make is None:
                continue
            info = make()   # the versioned structs set their own version
            try:
                probe(gpu.handle, ctypes.byref(info))
            except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
                raise
            except (nv.NVMLError_ArgumentVersionMismatch, nv.NVMLError_FunctionNotFound):
                continue    # the driver knows an older struct or only the older call
            except _missing(nv):
                break
            except nv.NVMLError as exc:
                # Only this read's fabric fields are lost; the next read asks again.
                self._read_failed(gpu, FABRIC_NOTE, "Fabric", exc)
                return {}
            self._fabric[gpu.id] = i
            fields = {"fabric_state": float(fabric_state(nv, info.state, info.status))}
            if hasattr(info, "healthSummary") and plausible(BY_NAME["fabric_health"],
                                                            info.healthSummary):
                fields["fabric_health"] = float(info.healthSummary)
            return fields
        self._fabric[gpu.id] = None
        self._unsupported.setdefault(FABRIC_NOTE, set()).add(gpu.id)
        return {}

    def _read_failed(self, gpu: GpuInfo, note: str, what: str, exc: Exception) -> None:
        """A group of fields failed this read: noted, and warned once per GPU and error."""
        failed = self._unsupported.setdefault(f"{note} ({exc})", set())
        if gpu.id not in failed:
            log.warning("%s read of %s failed: %s", what, gpu.id, exc)
        failed.add(gpu.id)

    @property
    def rates_pending(self) -> bool:
        """Whether a GPU's GPM fields wait for a second read (``gpu sample --once`` then
        reads again rather than print a Hopper GPU without SM activity)."""
        pairs = [*self._gpm.values(), *self._mig_gpm.values()]
        return any(pair is not None and not pair.measured for pair in pairs)

    def _gpm_fields(self, gpu: GpuInfo) -> dict[str, float]:
        """GPM's graphics-engine, SM, tensor and DRAM activity since the previous read, as
        0-1 ratios, for the whole GPU (``nvmlGpmSampleGet`` on its handle). Its MIG GPU
        instances are read apart, each with ``nvmlGpmMigSampleGet`` (:meth:`_instance_gpm`).
        """
        nv = self._nv
        if gpu.id not in self._gpm:
            self._gpm[gpu.id] = self._gpm_open(gpu)
        pair = self._gpm[gpu.id]
        if pair is None:
            return {}
        try:
            got = pair.advance()
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except _missing(nv) as exc:
            pair.free()
            self._gpm[gpu.id] = None
            self._gpm_off(gpu, type(exc).__name__)
            return {}
        except nv.NVMLError as exc:
            # Kept on: a failed call costs this read's three values, not the GPU's other
            # fields, and the next read compares with the last sample that was taken.
            self._read_failed(gpu, GPM_NOTE, "GPM", exc)
            return {}
        return {} if got is None else self._gpm_values(gpu, got, "GPM")

    def _gpm_values(self, gpu: GpuInfo, got: Any, where: str) -> dict[str, float]:
        """Our fields from one ``nvmlGpmMetricsGet``; a metric NVML could not give is
        missing, noted under ``where``."""
        nv, fields = self._nv, {}
        for i, (name, _) in enumerate(GPM_METRICS):
            metric = got.metrics[i]
            if metric.nvmlReturn != nv.NVML_SUCCESS:
                code = type(nv.NVMLError(metric.nvmlReturn)).__name__
                self._unsupported.setdefault(f"{name} ({where}: {code})", set()).add(gpu.id)
                continue
            value = metric.value / 100
            if plausible(BY_NAME[name], value):
                fields[name] = value
        return fields

    def _gpm_open(self, gpu: GpuInfo) -> _GpmPair | None:
        nv = self._nv
        self._gpm_device[gpu.id] = False
        try:
            if not nv.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                self._gpm_off(gpu, "not a GPM GPU (GPM needs Hopper or later)")
                return None
            self._gpm_device[gpu.id] = True
            handle = gpu.handle
            return _GpmPair(nv, lambda sample: nv.nvmlGpmSampleGet(handle, sample))
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except _missing(nv) as exc:
            self._gpm_off(gpu, type(exc).__name__)
        except nv.NVMLError as exc:
            self._gpm_off(gpu, f"GPM set-up failed: {exc}")
        return None

    def _gpm_off(self, gpu: GpuInfo, reason: str) -> None:
        self._unsupported.setdefault(GPM_NOTE, set()).add(gpu.id)
        log.info("%s: no %s: %s", gpu.id, GPM_NOTE, reason)

    # --- MIG: one sample per GPU instance -------------------------------------------------

    def _mig_samples(self, gpu: GpuInfo, ts: int) -> list[GpuSample]:
        """One sample per GPU instance of a GPU whose current MIG mode is on; none otherwise.

        The instances are walked afresh at every read (MIG devices are at most 7 or 8 per
        GPU), so a reconfiguration between two reads is seen at the next: an instance gone
        stops (its GPM buffers freed), a new one starts. An instance destroyed during the
        walk (NOT_FOUND, INVALID_ARGUMENT) is skipped; any other error costs that instance
        or that field this read, never the GPU's other samples.
        """
        nv = self._nv
        if gpu.id in self._no_mig:
            return []
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(gpu.handle)
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except _missing(nv):
            self._no_mig.add(gpu.id)   # not MIG-capable, or a driver without MIG: not asked again
            return []
        except nv.NVMLError as exc:
            self._read_failed(gpu, MIG_NOTE, "MIG mode", exc)
            return []
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            self._forget_instances(gpu, set())
            return []
        samples = []
        kept = set()
        for gi, mig, profile in self._mig_devices(gpu):
            fields = self._instance_fields(gpu, gi, mig, profile)
            if fields is None:
                continue   # destroyed since the walk
            kept.add((gpu.id, gi, profile))
            samples.append(GpuSample(ts=ts, gpu_id=gpu.id, source="nvml", simulated=False,
                                     fields=fields, instance=str(gi),
                                     labels={"mig_profile": profile} if profile else {}))
        self._forget_instances(gpu, kept)
        return samples

    def _mig_devices(self, gpu: GpuInfo) -> list[tuple[int, object, str | None]]:
        """(GPU instance id, a MIG device handle in it, its profile) per GPU instance.

        A MIG device is a compute instance: a GPU instance split into several compute
        instances has several MIG devices, all with its memory; the first one stands for it.
        """
        nv, found = self._nv, {}
        try:
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except nv.NVMLError as exc:
            self._read_failed(gpu, MIG_NOTE, "MIG device count", exc)
            return []
        for index in range(slots):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mig))
                if gi in found:
                    continue
                found[gi] = (mig, mig_profile(nv.nvmlDeviceGetName(mig)))
            except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
                raise
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue   # an empty slot, or an instance destroyed since the count
            except nv.NVMLError as exc:
                self._read_failed(gpu, MIG_NOTE, f"MIG device {index}", exc)
        return [(gi, mig, profile) for gi, (mig, profile) in sorted(found.items())]

    def _instance_fields(self, gpu: GpuInfo, gi: int, mig: object,
                         profile: str | None) -> dict[str, float] | None:
        """A GPU instance's memory (MiB, as the whole GPU's) and GPM metrics; None when the
        instance is gone."""
        nv, fields = self._nv, {}
        try:
            memory = memory_info(nv, mig)
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
            return None
        except _missing(nv):
            self._unsupported.setdefault(MIG_MEMORY_NOTE, set()).add(gpu.id)
        except nv.NVMLError as exc:
            self._read_failed(gpu, MIG_MEMORY_NOTE, f"MIG instance {gi} memory", exc)
        else:
            for name, value in (("fb_total_mib", memory.total / MIB),
                                ("fb_used_mib", memory.used / MIB)):
                if plausible(BY_NAME[name], value):
                    fields[name] = value
        gpm = self._instance_gpm(gpu, gi, profile)
        return None if gpm is None else fields | gpm

    def _instance_gpm(self, gpu: GpuInfo, gi: int, profile: str | None) -> dict | None:
        """The GPU instance's GPM metrics since the previous read (``nvmlGpmMigSampleGet``
        on the parent GPU, as the whole GPU's); {} without them, None when the instance is
        gone."""
        nv, key = self._nv, (gpu.id, gi, profile)
        if not self._gpm_device.get(gpu.id):
            return {}
        if key not in self._mig_gpm:
            handle = gpu.handle
            try:
                self._mig_gpm[key] = _GpmPair(
                    nv, lambda sample: nv.nvmlGpmMigSampleGet(handle, gi, sample))
            except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
                raise
            except nv.NVMLError as exc:
                self._mig_gpm[key] = None
                self._read_failed(gpu, MIG_GPM_NOTE, f"GPM set-up of MIG instance {gi}", exc)
        pair = self._mig_gpm[key]
        if pair is None:
            return {}
        try:
            got = pair.advance()
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired):
            raise
        except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
            pair.free()
            del self._mig_gpm[key]
            return None
        except _missing(nv) as exc:
            pair.free()
            self._mig_gpm[key] = None
            self._unsupported.setdefault(MIG_GPM_NOTE, set()).add(gpu.id)
            log.info("%s: no %s for instance %d: %s", gpu.id, MIG_GPM_NOTE, gi,
                     type(exc).__name__)
            return {}
        except nv.NVMLError as exc:
            self._read_failed(gpu, MIG_GPM_NOTE, f"GPM of MIG instance {gi}", exc)
            return {}
        return {} if got is None else self._gpm_values(gpu, got, "GPM per MIG instance")

    def _forget_instances(self, gpu: GpuInfo, kept: set) -> None:
        """Free the GPM buffers of this GPU's instances that are no longer there."""
        for key in [k for k in self._mig_gpm if k[0] == gpu.id and k not in kept]:
            pair = self._mig_gpm.pop(key)
            if pair is not None:
                pair.free()

    def _processes(self, gpu: GpuInfo) -> list[dict] | None:
        nv = self._nv
        try:
            running = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
        except nv.NVMLLibraryMismatchError:   # driver older than the binding's _v3
            running = nv.nvmlDeviceGetComputeRunningProcesses_v2(gpu.handle)
        except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission):
            self._unsupported.setdefault("compute processes", set()).add(gpu.id)
            return None
        utils = {}
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle,
                                                         self._last_util_ts.get(gpu.id, 0))
            for s in samples:
                utils[s.pid] = s
                self._last_util_ts[gpu.id] = max(self._last_util_ts.get(gpu.id, 0), s.timeStamp)
        except nv.NVMLError_NotFound:
            pass   # no process ran since the last sample: that is not an error
        except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission):
            self._unsupported.setdefault("process utilisation", set()).add(gpu.id)
        rows = []
        for p in running:
            try:
                start_time: int | None = process_key(p.pid, self.proc_root).start_time
            except NoSuchProcess:   # gone already, or in a pid namespace we cannot see
                start_time = None
            u = utils.get(p.pid)
            instance = getattr(p, "gpuInstanceId", None)
            rows.append({"pid": p.pid, "start_time": start_time,
                         "used_memory_mib": None if p.usedGpuMemory is None
                         else p.usedGpuMemory / MIB,
                         "sm_util": u and u.smUtil, "mem_util": u and u.memUtil,
                         "enc_util": u and u.encUtil, "dec_util": u and u.decUtil,
                         "gpu_instance": None if instance in (None, NO_INSTANCE_ID)
                         else int(instance)})
        return rows

    def _wait_for_xids(self) -> None:
        try:
            self._xid_loop()
        except Exception as exc:  # noqa: BLE001 - said in status, the samples go on
            log.exception("NVML Xid thread failed")
            self._xid_note = f"no Xid events: the Xid thread failed: {exc!r}"

    def _xid_loop(self) -> None:
        nv = self._nv
        by_handle: dict[object, GpuInfo] = {}
        gpu: GpuInfo | None
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._xid_note = f"no Xid events: {exc}"
            return
        for gpu in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError,
                                            event_set)
                by_handle[_handle_key(gpu.handle)] = gpu
            except nv.NVMLError as exc:   # NOT_SUPPORTED leaves the set usable
                self._xid_note = f"no Xid events on {gpu.id}: {exc}"
        try:
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(event_set, XID_WAIT_MS)
                except nv.NVMLError_Timeout:
                    continue
                except nv.NVMLError as exc:
                    self._xid_note = f"Xid wait failed: {exc}"
                    self._stop.wait(1.0)
                    continue
                gpu = by_handle.get(_handle_key(data.device))
                if gpu is not None:
                    self._xids.put(GpuXid(ts=now_ns(), gpu_id=gpu.id, xid=int(data.eventData),
                                          source="nvml", simulated=False,
                                          detail="NVML XidCriticalError event"))
        finally:
            nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(XID_WAIT_MS / 1000 + 1)
        for pair in [*self._gpm.values(), *self._mig_gpm.values()]:
            if pair is not None:
                pair.free()   # before nvmlShutdown, which would make the frees fail
        self._gpm, self._mig_gpm = {}, {}
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
            self._nv = None


def _handle_key(handle: Any) -> object:
    """NVML handles are ctypes pointers: equal devices, distinct Python objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle
