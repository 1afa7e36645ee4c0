"""The GPU field table: our names and units, keyed on DCGM's numeric field ids.

DCGM renamed most fields in 4.6.0 and dcgm-exporter 4.9 renamed metrics and changed
units; the numeric ids never changed. So every source maps onto the id, and the name
and unit here are ours. docs/gpu-fields.md is :func:`fields_markdown` (a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# DCGM blank sentinels (dcgm_structs.h): BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED.
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0   # 2**47
INT32_SENTINELS = frozenset(range(INT32_BLANK, INT32_BLANK + 4))

# Clock-event (throttle) reason bits of clocks_event_reasons: NVML's
# nvmlClocksEventReason* / DCGM's DCGM_CLOCKS_EVENT_REASON_* (the same values).
THROTTLE_BITS = {"IDLE": 0x1, "APP_CLOCKS": 0x2, "SW_POWER_CAP": 0x4, "HW_SLOWDOWN": 0x8,
                 "SYNC_BOOST": 0x10, "SW_THERMAL": 0x20, "HW_THERMAL": 0x40,
                 "HW_POWER_BRAKE": 0x80}

# The NVLink fabric of NVSwitch boards (HGX/DGX), one coding everywhere: ``fabric_state`` is
# DCGM's dcgmFabricManagerStatus_t (field 170). DCGM derives it from NVML's fabric probe,
# and the NVML source maps NVML's state and status onto it the same way
# (probes/gpu/nvml.py): NOT_SUPPORTED 0, NOT_STARTED 1, IN_PROGRESS 2, COMPLETED with
# NVML_SUCCESS 3, COMPLETED with an error status 4, a state it does not know 5. 5 and 6
# (NvmlTooOld: DCGM and the driver's NVML disagree in version) say nothing about the fabric.
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_SUCCESS, \
    FABRIC_FAILURE, FABRIC_UNRECOGNIZED, FABRIC_NVML_TOO_OLD = range(7)
FABRIC_STATES = {FABRIC_NOT_SUPPORTED: "NotSupported", FABRIC_NOT_STARTED: "NotStarted",
                 FABRIC_IN_PROGRESS: "InProgress", FABRIC_SUCCESS: "Success",
                 FABRIC_FAILURE: "Failure", FABRIC_UNRECOGNIZED: "Unrecognized",
                 FABRIC_NVML_TOO_OLD: "NvmlTooOld"}
# ``fabric_health``: the fabric's health summary, NVML's NVML_GPU_FABRIC_HEALTH_SUMMARY_* and
# DCGM field 175 (the same numbers). Limited capacity: the fabric runs with less bandwidth.
FABRIC_HEALTH_NOT_SUPPORTED, FABRIC_HEALTHY, FABRIC_UNHEALTHY, FABRIC_LIMITED_CAPACITY = \
    range(4)
FABRIC_HEALTH = {FABRIC_HEALTH_NOT_SUPPORTED: "NotSupported", FABRIC_HEALTHY: "Healthy",
                 FABRIC_UNHEALTHY: "Unhealthy", FABRIC_LIMITED_CAPACITY: "LimitedCapacity"}


@dataclass(frozen=True)
class Field:
    """One normalised GPU field. ``exporter`` holds the dcgm-exporter metric names that
    carry it (legacy ≤4.8 name first, then the DCGM 4.6 name); ``low``/``high`` bound the
    plausible values (outside them a value is dropped as garbage, and counted)."""

    name: str
    field_id: int
    unit: str
    nvml: str
    exporter: tuple[str, ...]
    low: float = 0.0
    high: float = math.inf
    profiling: bool = False
    event: bool = False   # reported as an event (gpu_xid), not as a sample column


def _prof(name: str, field_id: int, legacy: str, renamed: str, nvml: str = "-") -> Field:
    return Field(name, field_id, "ratio", nvml, (legacy, renamed), 0.0, 1.0001, profiling=True)


FIELDS: tuple[Field, ...] = (
    Field("gpu_util", 203, "%", "nvmlDeviceGetUtilizationRates().gpu",
          ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"), 0, 100),
    Field("mem_util", 204, "%", "nvmlDeviceGetUtilizationRates().memory",
          ("DCGM_FI_DEV_MEM_COPY_UTIL",), 0, 100),
    Field("enc_util", 206, "%", "nvmlDeviceGetEncoderUtilization()[0]",
          ("DCGM_FI_DEV_ENC_UTIL",), 0, 100),
    Field("dec_util", 207, "%", "nvmlDeviceGetDecoderUtilization()[0]",
          ("DCGM_FI_DEV_DEC_UTIL",), 0, 100),
    Field("sm_clock_mhz", 100, "MHz", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
          ("DCGM_FI_DEV_SM_CLOCK",), 0, 10_000),
    Field("mem_clock_mhz", 101, "MHz", "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
          ("DCGM_FI_DEV_MEM_CLOCK",), 0, 20_000),
    Field("clocks_event_reasons", 112, "bitmask", "nvmlDeviceGetCurrentClocksEventReasons",
          ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), 0, 2**32),
    Field("pstate", 190, "P-state", "nvmlDeviceGetPerformanceState",
          ("DCGM_FI_DEV_PSTATE", "DCGM_FI_DEV_GPU_PSTATE"), 0, 32),
    Field("temp_c", 150, "°C", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
          ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"), -40, 200),
    Field("mem_temp_c", 140, "°C", "-",
          ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"), -40, 200),
    Field("power_w", 155, "W", "nvmlDeviceGetPowerUsage / 1000",
          ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"), 0, 5_000),
    Field("power_limit_w", 164, "W", "nvmlDeviceGetEnforcedPowerLimit / 1000",
          ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS"),
          0, 5_000),
    Field("energy_mj", 156, "mJ", "nvmlDeviceGetTotalEnergyConsumption",
          ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",)),
    Field("power_violation_ns", 240, "ns", "-", ("DCGM_FI_DEV_POWER_VIOLATION",)),
    Field("thermal_violation_ns", 241, "ns", "-", ("DCGM_FI_DEV_THERMAL_VIOLATION",)),
    Field("fb_total_mib", 250, "MiB", "nvmlDeviceGetMemoryInfo_v2().total / 2**20",
          ("DCGM_FI_DEV_FB_TOTAL",), 0, 2**24),
    Field("fb_used_mib", 252, "MiB", "nvmlDeviceGetMemoryInfo_v2().used / 2**20",
          ("DCGM_FI_DEV_FB_USED",), 0, 2**24),
    Field("pcie_replays", 202, "count", "nvmlDeviceGetPcieReplayCounter",
          ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL")),
    # The link's max is what this GPU and its slot can reach (nvmlDeviceGetMaxPcieLinkGeneration,
    # as DCGM reads 235), not the GPU's own (nvmlDeviceGetGpuMaxPcieLinkGeneration): a Gen5 GPU
    # in a Gen4 slot has max 4. An idle GPU drops to Gen1 to save power: current < max then.
    Field("pcie_link_gen", 237, "gen", "nvmlDeviceGetCurrPcieLinkGeneration",
          ("DCGM_FI_DEV_PCIE_LINK_GEN",), 1, 8),
    Field("pcie_link_width", 238, "lanes", "nvmlDeviceGetCurrPcieLinkWidth",
          ("DCGM_FI_DEV_PCIE_LINK_WIDTH",), 1, 32),
    Field("pcie_link_gen_max", 235, "gen", "nvmlDeviceGetMaxPcieLinkGeneration",
          ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",), 1, 8),
    Field("pcie_link_width_max", 236, "lanes", "nvmlDeviceGetMaxPcieLinkWidth",
          ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",), 1, 32),
    Field("pcie_tx_bytes_per_s", 1009, "B/s",
          "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) × 1024",
          ("DCGM_FI_PROF_PCIE_TX_BYTES",), 0, 1e12, profiling=True),
    Field("pcie_rx_bytes_per_s", 1010, "B/s",
          "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES) × 1024",
          ("DCGM_FI_PROF_PCIE_RX_BYTES",), 0, 1e12, profiling=True),
    Field("nvlink_tx_bytes_per_s", 1011, "B/s", "-",
          ("DCGM_FI_PROF_NVLINK_TX_BYTES",), 0, 1e13, profiling=True),
    Field("nvlink_rx_bytes_per_s", 1012, "B/s", "-",
          ("DCGM_FI_PROF_NVLINK_RX_BYTES",), 0, 1e13, profiling=True),
    # Summed over the GPU's active links; a GPU without NVLink has none of them (not zeros).
    Field("nvlink_crc_flit_errors", 409, "count",
          "Σ nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_CRC_FLIT)",
          ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
           "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL")),
    Field("nvlink_crc_data_errors", 419, "count",
          "Σ nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_CRC_DATA)",
          ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
           "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL")),
    Field("nvlink_replay_errors", 429, "count",
          "Σ nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_REPLAY)",
          ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
           "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL")),
    Field("nvlink_recovery_errors", 439, "count",
          "Σ nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_RECOVERY)",
          ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
           "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL")),
    Field("ecc_sbe_volatile", 310, "count",
          "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)",
          ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",)),
    Field("ecc_dbe_volatile", 311, "count",
          "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)",
          ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",)),
    Field("retired_pages_sbe", 390, "count", "-",
          ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL")),
    Field("retired_pages_dbe", 391, "count", "-",
          ("DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL")),
    Field("row_remap_uncorrectable", 393, "count", "nvmlDeviceGetRemappedRows()[1]",
          ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
           "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL")),
    Field("row_remap_correctable", 394, "count", "nvmlDeviceGetRemappedRows()[0]",
          ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL")),
    Field("row_remap_failed", 395, "flag", "nvmlDeviceGetRemappedRows()[3]",
          ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"), 0, 1),
    # A row waits to be remapped: it takes effect only at the next GPU reset.
    Field("row_remap_pending", 396, "flag", "nvmlDeviceGetRemappedRows()[2]",
          ("DCGM_FI_DEV_ROW_REMAP_PENDING",), 0, 1),
    # NVSwitch boards only: CUDA cannot start on a GPU until Fabric Manager has set up its
    # fabric (state Success); a board without NVSwitches reports NotSupported (0). Codes:
    # FABRIC_STATES and FABRIC_HEALTH above. NVML gives the health summary from its v3
    # struct on (R550's v2 has none): with an older driver the field is absent, not 0.
    Field("fabric_state", 170, "code",
          "nvmlDeviceGetGpuFabricInfoV().state, .status (mapped as DCGM maps them)",
          ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS",), 0, 6),
    Field("fabric_health", 175, "code", "nvmlDeviceGetGpuFabricInfoV(v3).healthSummary",
          ("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",), 0, 3),
    Field("xid", 230, "Xid", "nvmlEventSetWait (nvmlEventTypeXidCriticalError)",
          ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"), 0, 2**16, event=True),
    _prof("gr_engine_active", 1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
          "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
          "nvmlGpmMetricsGet(NVML_GPM_METRIC_GRAPHICS_UTIL) / 100"),
    _prof("sm_active", 1002, "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO",
          "nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL) / 100"),
    _prof("sm_occupancy", 1003, "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
    _prof("tensor_active", 1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
          "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
          "nvmlGpmMetricsGet(NVML_GPM_METRIC_ANY_TENSOR_UTIL) / 100"),
    _prof("dram_active", 1005, "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO",
          "nvmlGpmMetricsGet(NVML_GPM_METRIC_DRAM_BW_UTIL) / 100"),
    _prof("fp64_active", 1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO"),
    _prof("fp32_active", 1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO"),
    _prof("fp16_active", 1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO"),
)

BY_ID: dict[int, Field] = {f.field_id: f for f in FIELDS}
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
BY_EXPORTER_NAME: dict[str, Field] = {name: f for f in FIELDS for name in f.exporter}
SAMPLE_FIELDS: tuple[Field, ...] = tuple(f for f in FIELDS if not f.event)
BASIC_IDS: tuple[int, ...] = tuple(f.field_id for f in FIELDS if f.field_id < 1000)
PROFILING_IDS: tuple[int, ...] = tuple(f.field_id for f in FIELDS if f.field_id >= 1000)


def is_blank(value: object) -> bool:
    """True for DCGM's blank / not-found / not-supported / not-permitted sentinels
    (int32, int64 and double forms, and the ``<<<...>>>`` strings) and for NaN."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.startswith("<<<") and ">>>" in value
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= INT64_BLANK or value in INT32_SENTINELS
    if isinstance(value, float):
        return math.isnan(value) or value >= FP64_BLANK or value in INT32_SENTINELS
    return False


def plausible(field: Field, value: float) -> bool:
    """Within the field's physical range (DCGM and exporters have reported GPU temperatures
    of 644245923 °C and utilisations of 4294967295 %: dcgm-exporter #312, DCGM #199)."""
    return field.low <= value <= field.high


def fields_markdown() -> str:
    """The table of docs/gpu-fields.md."""
    lines = ["| our name | DCGM field id | unit | NVML call | dcgm-exporter metric(s) |",
             "|---|---|---|---|---|"]
    for f in FIELDS:
        kind = " (event `gpu_xid`)" if f.event else " (profiling)" if f.profiling else ""
        exporter = ", ".join(f"`{name}`" for name in f.exporter)
        nvml = f"`{f.nvml}`" if f.nvml != "-" else "-"
        lines.append(f"| `{f.name}`{kind} | {f.field_id} | {f.unit} | {nvml} | {exporter} |")
    return "\n".join(lines)
