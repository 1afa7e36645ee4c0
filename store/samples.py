"""How GPU samples are stored: one integer column per field, in a unit chosen per field.

A sample's fields arrive in the units of docs/gpu-fields.md (floats). The table
``gpu_sample_data`` keeps each one as an integer in the column's own unit (``power_mw``,
``sm_active_bp``, ``pcie_tx_kib_per_s``): SQLite stores small integers in 0–6 bytes where a
REAL always takes 8, and the precision kept is still finer than what NVML and DCGM
measure. The view ``gpu_samples`` turns them back into the fields' names and units, so
people query the view and never the scales.

``STORAGE_V1`` is frozen: migration m601 built the tables from it. A change of unit is a
new migration with a new constant, never an edit of this one. ``STORAGE_M111`` is what
migration m111 added (PCIe link, NVLink errors, pending row remap), ``STORAGE_M112`` what
m112 added (the NVLink fabric's state and health); ``STORAGE`` is every column the latest
migration left, the one the writer, the rollups and the views use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuwhy.text import sql_utc


@dataclass(frozen=True)
class Stored:
    """Field ``field`` lives in column ``column`` as ``round(value * scale)``."""

    field: str
    column: str
    scale: float
    rollup: str   # "gauge": min/mean/max/p95 per minute; "max": the largest; "or": bitwise OR

    def encode(self, value: float) -> int:
        return round(value * self.scale)

    def decode_sql(self, expression: str) -> str:
        """SQL giving the field in its own unit from ``expression`` in the column's unit."""
        if self.scale == 1:
            return expression
        if self.scale < 1:
            return f"{expression} * {round(1 / self.scale)}"
        return f"{expression} / {float(self.scale)!r}"


def _same(field: str, rollup: str = "gauge") -> Stored:
    return Stored(field, field, 1, rollup)


def _ratio(field: str) -> Stored:
    return Stored(field, f"{field}_bp", 10_000, "gauge")   # basis points: 1/10000 of 1


def _rate(field: str) -> Stored:
    return Stored(field, field.replace("_bytes_per_s", "_kib_per_s"), 1 / 1024, "gauge")


STORAGE_V1: tuple[Stored, ...] = (
    _same("gpu_util"), _same("mem_util"), _same("enc_util"), _same("dec_util"),
    _same("sm_clock_mhz"), _same("mem_clock_mhz"), _same("clocks_event_reasons", "or"),
    _same("pstate", "max"), _same("temp_c"), _same("mem_temp_c"),
    Stored("power_w", "power_mw", 1000, "gauge"),
    Stored("power_limit_w", "power_limit_mw", 1000, "max"),
    Stored("energy_mj", "energy_j", 1 / 1000, "max"),
    Stored("power_violation_ns", "power_violation_ms", 1 / 1_000_000, "max"),
    Stored("thermal_violation_ns", "thermal_violation_ms", 1 / 1_000_000, "max"),
    _same("fb_total_mib", "max"), _same("fb_used_mib"), _same("pcie_replays", "max"),
    _rate("pcie_tx_bytes_per_s"), _rate("pcie_rx_bytes_per_s"),
    _rate("nvlink_tx_bytes_per_s"), _rate("nvlink_rx_bytes_per_s"),
    _same("ecc_sbe_volatile", "max"), _same("ecc_dbe_volatile", "max"),
    _same("retired_pages_sbe", "max"), _same("retired_pages_dbe", "max"),
    _same("row_remap_uncorrectable", "max"), _same("row_remap_correctable", "max"),
    _same("row_remap_failed", "max"),
    _ratio("gr_engine_active"), _ratio("sm_active"), _ratio("sm_occupancy"),
    _ratio("tensor_active"), _ratio("dram_active"), _ratio("fp64_active"),
    _ratio("fp32_active"), _ratio("fp16_active"),
)
# Frozen like STORAGE_V1: the columns m111 added. Every one keeps a minute's largest value:
# for the link's current generation and width that says whether it reached the slot's max
# in that minute (an idle GPU's Gen1 is no news; a link that never trains up is), and a
# gauge's ``_max`` rollup column would collide with ``pcie_link_gen_max``'s own.
STORAGE_M111: tuple[Stored, ...] = (
    _same("pcie_link_gen", "max"), _same("pcie_link_width", "max"),
    _same("pcie_link_gen_max", "max"), _same("pcie_link_width_max", "max"),
    _same("nvlink_crc_flit_errors", "max"), _same("nvlink_crc_data_errors", "max"),
    _same("nvlink_replay_errors", "max"), _same("nvlink_recovery_errors", "max"),
    _same("row_remap_pending", "max"),
)
# Frozen: the columns m112 added, the NVLink fabric's state and health summary (codes,
# gpufields.FABRIC_STATES and FABRIC_HEALTH). A minute keeps its largest code, as the flags
# above do: a minute in which a Failure (4) was read shows 4, never a mean of codes.
STORAGE_M112: tuple[Stored, ...] = (
    _same("fabric_state", "max"), _same("fabric_health", "max"),
)
STORAGE: tuple[Stored, ...] = STORAGE_V1 + STORAGE_M111 + STORAGE_M112
BY_FIELD: dict[str, Stored] = {s.field: s for s in STORAGE}
GAUGE_STATS = ("min", "mean", "max", "p95")


def encode_fields(fields: Mapping[str, float], columns: set[str]) -> dict[str, int]:
    """The sample's fields as ``{column: stored integer}``, for the columns the table has
    (a field the store does not know yet is left out, as before)."""
    plan = _plan_for(columns)
    row = {}
    for name, value in fields.items():
        target = plan.get(name)
        if target is not None and value is not None:
            row[target[0]] = round(value * target[1])
    return row


_last_plan: tuple[set[str] | None, dict[str, tuple[str, float]]] = (None, {})


def _plan_for(columns: set[str]) -> dict[str, tuple[str, float]]:
    global _last_plan
    if _last_plan[0] is not columns:     # the writer passes the same set every time
        _last_plan = (columns, {s.field: (s.column, s.scale) for s in STORAGE
                                if s.column in columns})
    return _last_plan[1]


def rollup_columns(stored: Stored) -> list[str]:
    """Columns of ``gpu_rollup_data`` for one field: four for a gauge, one otherwise."""
    if stored.rollup == "gauge":
        return [f"{stored.column}_{stat}" for stat in GAUGE_STATS]
    return [stored.column]


def samples_view_sql(name: str = "gpu_samples",
                     storage: tuple[Stored, ...] = STORAGE) -> str:
    """CREATE VIEW for the raw samples with the GPU's ids and every field in its unit."""
    fields = ",\n  ".join(f"{s.decode_sql('s.' + s.column)} AS {s.field}" for s in storage)
    return (f"CREATE VIEW {name} AS SELECT\n  s.ts, "
            f"{sql_utc('s.ts')} AS time,\n"
            f"  g.id AS gpu_id, g.uuid, g.gpu_index, s.instance,\n  {fields}\n"
            f"FROM gpu_sample_data s JOIN gpus g ON g.gpu_key = s.gpu")


def rollups_view_sql(name: str = "gpu_rollups",
                     storage: tuple[Stored, ...] = STORAGE) -> str:
    """CREATE VIEW for the one-minute rollups, fields in their units (``<field>_<stat>``)."""
    parts = []
    for s in storage:
        if s.rollup == "gauge":
            parts += [f"{s.decode_sql(f'r.{s.column}_{stat}')} AS {s.field}_{stat}"
                      for stat in GAUGE_STATS]
        else:
            parts.append(f"{s.decode_sql('r.' + s.column)} AS {s.field}")
    fields = ",\n  ".join(parts)
    return (f"CREATE VIEW {name} AS SELECT\n  r.minute, "
            f"{sql_utc('r.minute', 'min')} AS time,\n"
            f"  g.id AS gpu_id, g.uuid, g.gpu_index, r.instance, r.samples,\n  {fields}\n"
            f"FROM gpu_rollup_data r JOIN gpus g ON g.gpu_key = r.gpu")
