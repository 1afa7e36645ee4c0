"""Read-side queries shared by the web view and the CLI."""

from __future__ import annotations

import json

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey


def processes_holding_devices(db: Database, include_exited: bool = False) -> list[dict]:
    """Processes with their device fds and ioctl counts, busiest first.

    Each row: pid, start_time, key, comm, cmdline, tag, exited_at, devices (open fds:
    path, device, fd, scanned), ioctl_total, ioctls (path, cmd, name, count).
    """
    where = "" if include_exited else "where p.exited_at is null"
    rows = db.execute_returning_dicts(f"""
        select p.pid, p.start_time, p.comm, p.cmdline, p.tag, p.cgroup, p.exited_at,
               p.first_seen, p.last_seen
        from processes p {where}
        order by p.first_seen
    """)
    result = []
    for row in rows:
        key = [row["pid"], row["start_time"]]
        devices = db.execute_returning_dicts(
            "select path, device, minor, fd, how, scanned, opened_at from device_fds "
            "where pid = ? and start_time = ? and closed_at is null order by fd", key)
        ioctls = db.execute_returning_dicts(
            "select path, device, cmd, op as name, sum(count) as count, sum(errors) as errors, "
            "sum(latency_sum_ns) as latency_sum_ns, max(latency_max_ns) as latency_max_ns, "
            "sum(bytes) as bytes from driver_call_stats where pid = ? and start_time = ? "
            "group by path, cmd order by count desc", key)
        if not devices and not ioctls and not include_exited:
            continue
        result.append({**row, "key": str(ProcessKey(*key)), "devices": devices,
                       "ioctls": ioctls, "ioctl_total": sum(i["count"] for i in ioctls)})
    result.sort(key=lambda r: -r["ioctl_total"])
    return result


def source_health(db: Database) -> list[dict]:
    """Every source's last heartbeat, counters decoded."""
    rows = db.execute_returning_dicts(
        "select source, state, detail, counters, last_seen from source_health order by source")
    for row in rows:
        row["counters"] = json.loads(row["counters"] or "{}")
    return rows
