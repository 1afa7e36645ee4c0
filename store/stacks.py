"""Read the Python stacks the stack sampler stored: per finding, per GPU, per process.

The read API of the ``python_stacks`` table (store/migrations.py ``m120``) for `gpuwhy why`,
the web view's ``/api/.../stacks``, the incident page, the GPU page's links and the report:
each row's folded stacks decoded, most samples first, with
:func:`gpuwhy.pystacks.top_frames` ready to say them; and the GPU's idle and busy seconds
over a sampled window.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.pystacks import clean_rows, summary_line, top_frames

Row = dict[str, Any]
MAX_ROWS = 50


def python_stacks(db: Database, *, finding_id: str | None = None, gpu_id: str | None = None,
                  process: ProcessKey | None = None, since: int | None = None,
                  until: int | None = None, limit: int = MAX_ROWS) -> list[Row]:
    """Stored stack aggregates, newest first, of a finding, a GPU or a sampled process, whose
    window ``[started, ts]`` overlaps ``[since, until]`` (all given filters apply): each row
    with ``stacks`` (a list of ``{pid, start_time, role, stack, count}``, most samples
    first), ``dropped`` (a dict), ``top`` (per role, the top frames with their shares) and
    ``summary`` (one line). [] on a store without the table."""
    if not db["python_stacks"].exists():
        return []
    where: list[str] = []
    params: list[Any] = []
    if finding_id is not None:
        where.append("finding_id = ?")
        params.append(finding_id)
    if gpu_id is not None:
        where.append("gpu_id = ?")
        params.append(gpu_id)
    if process is not None:
        where.append("pid = ? and start_time = ?")
        params += [process.pid, process.start_time]
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("started <= ?")
        params.append(until)
    sql = ("select * from python_stacks" + (" where " + " and ".join(where) if where else "")
           + " order by ts desc limit ?")
    rows = db.execute_returning_dicts(sql, [*params, max(1, min(int(limit), 1000))])
    return [_decoded(row) for row in rows]


MAX_PROCESSES = 64      # processes one GPU's newest stacks are looked up for


def newest_by_process(db: Database, gpu_id: str, processes: Iterable[ProcessKey]
                      ) -> dict[ProcessKey, Row]:
    """The newest stored stacks of each of ``processes`` (at most MAX_PROCESSES) sampled
    while bound to ``gpu_id``, decoded as :func:`python_stacks` decodes them; a process
    never sampled there is left out. {} on a store without the table."""
    wanted = set(list(processes)[:MAX_PROCESSES])
    if not wanted or not db["python_stacks"].exists():
        return {}
    # which window is newest, per process, from the (gpu_id, ts) index alone; then only
    # those rows are read whole (their stacks are the large part)
    newest = db.execute(
        "select pid, start_time, max(ts) from python_stacks where gpu_id = ? "
        "group by pid, start_time", [gpu_id]).fetchall()
    out: dict[ProcessKey, Row] = {}
    for pid, start_time, ts in newest:
        key = ProcessKey(pid, start_time)
        if key not in wanted:
            continue
        rows = db.execute_returning_dicts(
            "select * from python_stacks where gpu_id = ? and ts = ? and pid = ? and "
            "start_time = ? limit 1", [gpu_id, ts, pid, start_time])
        if rows:
            out[key] = _decoded(rows[0])
    return out


def _decoded(row: Row) -> Row:
    """A stored row with its stacks cleaned (most samples first), ``dropped`` a dict,
    ``final`` a bool, ``top`` and ``summary`` (gpuwhy.pystacks)."""
    row["stacks"] = clean_rows(_json(row["stacks"], []))
    row["dropped"] = _json(row["dropped"], {})
    row["final"] = bool(row["final"])
    row["top"] = top_frames(row["stacks"])
    row["summary"] = summary_line(row["stacks"])
    return row


IDLE_BELOW = 10.0       # gpu_util (%) under which a GPU second counts as idle


def gpu_idle_by_second(db: Database, gpu_id: str, since: int, until: int,
                       idle_below: float = IDLE_BELOW) -> dict[int, bool]:
    """What the whole GPU did in each second of ``[since, until]`` that it has a sample of:
    second since ``since`` -> True when idle (``gpu_util`` under ``idle_below`` %), False
    when busy (samples without a utilisation are left out)."""
    rows = db.execute(
        "select ts, gpu_util from gpu_samples where gpu_id = ? and instance = '' and "
        "ts between ? and ? and gpu_util is not null order by ts",
        [gpu_id, since, until]).fetchall()
    return {(ts - since) // NS_PER_SECOND: util < idle_below for ts, util in rows}


def folded_text(row: Row) -> str:
    """A row's stacks as folded text, ``stack count`` per line (what flame-graph tools
    read), the role and process first: ``workers;4242;dataset.py:41 load 17``."""
    return "".join(f"{s['role']};{s['pid']};{s['stack']} {s['count']}\n" for s in row["stacks"])


def _json(text: str | None, empty: Any) -> Any:
    try:
        value = json.loads(text or "null")
    except ValueError:
        return empty
    return value if isinstance(value, type(empty)) else empty
