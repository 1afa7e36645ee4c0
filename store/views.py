"""The views people query: reset history, incidents and their chains, Xids per GPU per day,
GPU time per process/container/tag, per-process GPU timelines, samples in their units.

Each view is plain SQL over the tables, so ``sqlite3`` and ``sqlite-utils`` answer the
common questions without knowing how the tables store things. Times: ``ts`` columns are
ns since the epoch (the tables' unit), ``time`` columns the same instant as UTC text.
A later migration may drop and re-create a view (``drop_views`` then ``create_views``);
``VIEWS_V1`` is what migration m603 created and is never edited.
"""

from __future__ import annotations

from sqlite_utils import Database

from gpuwhy.reset import (
    BACK_STATES,
    NEEDED_LOG_KINDS,
    NEEDED_STATES,
    RESET_ACTION_SUFFIX,
    RESET_CONTROLS,
    RESET_LOG_KINDS,
    RESET_REQUEST_CONTROLS,
    RESET_STATES,
    sql_case,
    sql_names,
)
from gpuwhy.store.samples import STORAGE, STORAGE_V1, rollups_view_sql, samples_view_sql
from gpuwhy.text import sql_utc

_NOW_NS = "(CAST(strftime('%s', 'now') AS INTEGER) * 1000000000)"
# The last component of a cgroup path: the container scope, pod container or unit.
_CONTAINER = ("nullif(replace(p.cgroup, rtrim(p.cgroup, replace(p.cgroup, '/', '')), ''), '')")
_RESET_CONTROLS = sql_names(RESET_CONTROLS + RESET_REQUEST_CONTROLS)
_TRAILING_NUMBER = "CAST(replace(d.path, rtrim(d.path, '0123456789'), '') AS INTEGER)"
# A driver call on a node that names no GPU (the control node /dev/nvidiactl) is about
# the GPUs its process had bound at the call, as the incidents take them
# (gpuwhy.store.gpu_bindings.gpus_of): a row per GPU, one NULL row when it had none.
_CALLER_BINDINGS = ("LEFT JOIN gpu_bindings b ON d.device != 'nvidiaN' AND b.pid = d.pid "
                    "AND b.start_time = d.start_time AND b.since <= d.ts "
                    "AND (b.until IS NULL OR b.until >= d.ts)")
# In process_gpu_timeline the binding's since/until are kept off the samples' time index
# (unary +): the index then serves the caller's own `ts` range, which is what a timeline
# query asks for; otherwise SQLite scans from the start of a days-long binding.

VIEWS_V1: dict[str, str] = {
    "gpu_samples": samples_view_sql("gpu_samples", STORAGE_V1),
    "gpu_rollups": rollups_view_sql("gpu_rollups", STORAGE_V1),
    "gpu_reset_history": f"""CREATE VIEW gpu_reset_history AS
SELECT x.ts, {sql_utc('x.ts')} AS time, x.gpu_id, g.uuid, g.gpu_index, x.what, x.source,
       x.pid, x.start_time, x.comm, x.detail
FROM (
  SELECT e.ts, e.gpu_id, 'gpu ' || json_extract(e.body, '$.state') AS what,
         'gpu source' AS source, NULL AS pid, NULL AS start_time, NULL AS comm,
         json_extract(e.body, '$.detail') AS detail
  FROM events e WHERE e.kind = 'gpu_state'
  UNION ALL
  SELECT k.ts, k.gpu_id, CASE k.kind WHEN 'xid' THEN 'xid ' || k.xid
                                     ELSE replace(k.kind, '_', ' ') END,
         'kernel log', k.pid, NULL, k.name, k.message
  FROM kernel_log k
  WHERE k.kind IN ('fallen_off_bus', 'rm_init_failed')
     OR (k.kind = 'xid'
         AND k.xid IN (SELECT code FROM xid_codes WHERE gpu_reset OR reboot OR code = 154))
  UNION ALL
  SELECT d.ts, (SELECT id FROM gpus WHERE d.device = 'nvidiaN' AND minor = {_TRAILING_NUMBER}),
         'driver call ' || d.sub_name, 'driver call', d.pid, d.start_time, p.comm, d.path
  FROM driver_calls d LEFT JOIN processes p ON p.pid = d.pid AND p.start_time = d.start_time
  WHERE d.sub_name IN {_RESET_CONTROLS}
  UNION ALL
  SELECT c.ts, NULL, 'cron: ' || c.gpu_action, 'cron', c.job_pid, c.job_start_time, c.user,
         c.command
  FROM cron_runs c WHERE c.gpu_action IS NOT NULL AND c.phase = 'started'
) x LEFT JOIN gpus g ON g.id = x.gpu_id""",
    "incident_list": f"""CREATE VIEW incident_list AS
SELECT i.id, {sql_utc('i.opened_at', 's')} AS opened,
       {sql_utc('i.closed_at', 's')} AS closed, i.kind, i.severity, i.state,
       i.count, i.gpu_id, g.uuid, g.gpu_index, i.pid, i.start_time, i.title, i.summary,
       (SELECT count(*) FROM incident_links l WHERE l.incident_id = i.id) AS links,
       i.opened_at, i.closed_at
FROM incidents i LEFT JOIN gpus g ON g.id = i.gpu_id""",
    "incident_chains": f"""CREATE VIEW incident_chains AS
SELECT i.id AS incident_id, i.kind AS incident_kind, i.severity, i.gpu_id, i.title,
       {sql_utc('i.opened_at', 's')} AS opened, l.seq AS step, l.kind,
       l.ts, {sql_utc('l.ts')} AS time, l.summary, l.evidence, l.confidence, l.pid,
       l.start_time, p.comm, i.opened_at
FROM incidents i
JOIN incident_links l ON l.incident_id = i.id
LEFT JOIN processes p ON p.pid = l.pid AND p.start_time = l.start_time""",
    "xids_per_gpu_day": """CREATE VIEW xids_per_gpu_day AS
WITH x AS (
  SELECT date(ts / 1e9, 'unixepoch') AS day, gpu_id, xid, 1 AS klog, 0 AS src
  FROM kernel_log WHERE kind = 'xid'
  UNION ALL
  SELECT date(ts / 1e9, 'unixepoch'), gpu_id, json_extract(body, '$.xid'), 0, 1
  FROM events WHERE kind = 'gpu_xid'
)
SELECT x.day, x.gpu_id, g.uuid, g.gpu_index, x.xid,
       max(sum(x.klog), sum(x.src)) AS count,
       sum(x.klog) AS kernel_log_count, sum(x.src) AS gpu_source_count,
       c.title, c.severity, c.gpu_reset, c.reboot
FROM x LEFT JOIN gpus g ON g.id = x.gpu_id LEFT JOIN xid_codes c ON c.code = x.xid
GROUP BY x.day, x.gpu_id, x.xid""",
    "gpu_time_by_process": f"""CREATE VIEW gpu_time_by_process AS
SELECT b.pid, b.start_time, p.comm, p.tag, {_CONTAINER} AS container, p.cgroup,
       b.gpu_id, g.uuid, g.gpu_index, count(*) AS bindings,
       {sql_utc('min(b.since)', 's')} AS first_bound,
       {sql_utc('max(coalesce(b.until, p.exited_at, ' + _NOW_NS + '))',
             's')} AS last_bound,
       round(sum(coalesce(b.until, p.exited_at, {_NOW_NS}) - b.since) / 1e9, 1)
         AS gpu_seconds
FROM gpu_bindings b
LEFT JOIN processes p ON p.pid = b.pid AND p.start_time = b.start_time
LEFT JOIN gpus g ON g.id = b.gpu_id
GROUP BY b.pid, b.start_time, b.gpu_id""",
    "gpu_time_by_container": """CREATE VIEW gpu_time_by_container AS
SELECT coalesce(container, '(none)') AS container, count(DISTINCT pid || '-' || start_time)
       AS processes, count(DISTINCT gpu_id) AS gpus, round(sum(gpu_seconds), 1) AS gpu_seconds,
       round(sum(gpu_seconds) / 3600, 3) AS gpu_hours
FROM gpu_time_by_process GROUP BY 1""",
    "gpu_time_by_tag": """CREATE VIEW gpu_time_by_tag AS
SELECT coalesce(nullif(tag, ''), '(none)') AS tag, count(DISTINCT pid || '-' || start_time)
       AS processes, count(DISTINCT gpu_id) AS gpus, round(sum(gpu_seconds), 1) AS gpu_seconds,
       round(sum(gpu_seconds) / 3600, 3) AS gpu_hours
FROM gpu_time_by_process GROUP BY 1""",
    "process_gpu_timeline": f"""CREATE VIEW process_gpu_timeline AS
SELECT b.pid, b.start_time, p.comm, b.gpu_id, g.uuid, g.gpu_index, s.ts, {sql_utc('s.ts')} AS time,
       s.gpu_util, s.mem_util, s.sm_active_bp / 10000.0 AS sm_active,
       s.tensor_active_bp / 10000.0 AS tensor_active, s.dram_active_bp / 10000.0 AS dram_active,
       s.fb_used_mib, s.power_mw / 1000.0 AS power_w, s.temp_c, s.sm_clock_mhz,
       s.pcie_tx_kib_per_s * 1024 AS pcie_tx_bytes_per_s,
       s.pcie_rx_kib_per_s * 1024 AS pcie_rx_bytes_per_s, s.clocks_event_reasons
FROM gpu_bindings b
JOIN gpus g ON g.id = b.gpu_id
JOIN gpu_sample_data s ON s.gpu = g.gpu_key AND +s.ts >= b.since
                      AND (b.until IS NULL OR +s.ts < b.until) AND s.instance = ''
LEFT JOIN processes p ON p.pid = b.pid AND p.start_time = b.start_time""",
}




def reset_history_sql() -> str:
    """``gpu_reset_history`` as of m109: every sign of a reset with its class in ``reset``
    (``reset``, ``request``, ``needed``, ``back``: gpuwhy/reset.py), built from the lists
    in gpuwhy/reset.py when the view is created, so the view, the incidents, ``/resets``
    and the rules count the same resets. Cron runs are only the ones that reset a GPU. A
    driver call on ``/dev/nvidiaN`` names that GPU; one on the control node (no minor) names
    the GPUs its process had bound at the call (a row per GPU, NULL when none), as the
    correlator's reset incidents do. A store whose view predates this gets it from the
    migration that re-creates the view (m109)."""
    states = {"reset": RESET_STATES, "needed": NEEDED_STATES, "back": BACK_STATES}
    state = "json_extract(e.body, '$.state')"
    assert "'" not in RESET_ACTION_SUFFIX
    suffix = f"'{RESET_ACTION_SUFFIX}'"
    return f"""CREATE VIEW gpu_reset_history AS
SELECT x.ts, {sql_utc('x.ts')} AS time, x.gpu_id, g.uuid, g.gpu_index, x.what, x.source,
       x.pid, x.start_time, x.comm, x.detail, x.reset
FROM (
  SELECT e.ts, e.gpu_id, 'gpu ' || {state} AS what,
         'gpu source' AS source, NULL AS pid, NULL AS start_time, NULL AS comm,
         json_extract(e.body, '$.detail') AS detail, {sql_case(state, states)} AS reset
  FROM events e
  WHERE e.kind = 'gpu_state' AND {state} IN {sql_names(RESET_STATES + NEEDED_STATES
                                                         + BACK_STATES)}
  UNION ALL
  SELECT k.ts, k.gpu_id, CASE k.kind WHEN 'xid' THEN 'xid ' || k.xid
                                     ELSE replace(k.kind, '_', ' ') END,
         'kernel log', k.pid, NULL, k.name, k.message,
         CASE WHEN k.kind IN {sql_names(RESET_LOG_KINDS)} THEN 'reset' ELSE 'needed' END
  FROM kernel_log k
  WHERE k.kind IN {sql_names(RESET_LOG_KINDS + NEEDED_LOG_KINDS)}
     OR (k.kind = 'xid'
         AND k.xid IN (SELECT code FROM xid_codes WHERE gpu_reset OR reboot OR code = 154))
  UNION ALL
  SELECT r.ts, r.gpu_id, r.what, r.source, r.pid, r.start_time, r.comm, r.detail, r.reset
  FROM (
    SELECT DISTINCT d.id, d.ts,
           CASE WHEN d.device = 'nvidiaN'
                THEN (SELECT id FROM gpus WHERE minor = {_TRAILING_NUMBER})
                ELSE b.gpu_id END AS gpu_id,
           'driver call ' || d.sub_name AS what, 'driver call' AS source, d.pid,
           d.start_time, p.comm, d.path AS detail,
           {sql_case('d.sub_name', {"reset": RESET_CONTROLS,
                                    "request": RESET_REQUEST_CONTROLS})} AS reset
    FROM driver_calls d
    LEFT JOIN processes p ON p.pid = d.pid AND p.start_time = d.start_time
    {_CALLER_BINDINGS}
    WHERE d.sub_name IN {_RESET_CONTROLS}
  ) r
  UNION ALL
  SELECT c.ts, NULL, 'cron: ' || c.gpu_action, 'cron', c.job_pid, c.job_start_time, c.user,
         c.command, 'request'
  FROM cron_runs c
  WHERE c.phase = 'started' AND substr(c.gpu_action, -{len(RESET_ACTION_SUFFIX)}) = {suffix}
) x LEFT JOIN gpus g ON g.id = x.gpu_id"""


# The views as the latest migration left them (m105, then m109, re-created
# gpu_reset_history; m111 and m112 the sample views with their new columns).
SAMPLE_VIEWS: dict[str, str] = {"gpu_samples": samples_view_sql("gpu_samples", STORAGE),
                                "gpu_rollups": rollups_view_sql("gpu_rollups", STORAGE)}
VIEWS: dict[str, str] = {**VIEWS_V1, "gpu_reset_history": reset_history_sql(), **SAMPLE_VIEWS}


def create_views(db: Database, views: dict[str, str] = VIEWS_V1) -> None:
    for sql in views.values():
        db.execute(sql)


def drop_views(db: Database, views: dict[str, str] = VIEWS_V1) -> None:
    for name in views:
        db.execute(f"DROP VIEW IF EXISTS {name}")
