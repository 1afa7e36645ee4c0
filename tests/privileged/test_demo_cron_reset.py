"""`gpuwhy demo cron-reset` end to end, all real but the GPU: cron runs a stand-in
`nvidia-smi -r` from /etc/cron.d, the eBPF probes see its exec and its BIF_RESET driver call,
journald carries its NVRM line and cron's log, the stand-in reset strikes the simulated GPU
(a strike file: it goes silent, then idle), and the
correlator builds cron_job -> command -> driver_call -> gpu_reset -> process_stall with the
right pids, GPU and times, and logs the alerts to the journal.

Writes a (marked) line into the host kernel log (excluded with GPUWHY_TEST_KMSG=0).
Waits for cron's next minute: up to ~90 s.
"""

import json
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuwhy.app.demo.scenarios import play
from gpuwhy.app.demo.standin import DEMO_MARK
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.correlator.alerts import MESSAGE_IDS
from gpuwhy.errors import StoreError
from gpuwhy.store import open_store

from .conftest import cron_gone

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.kmsg]
CHAIN = ["cron_job", "command", "driver_call", "gpu_reset", "process_stall"]


def rows(db, sql, params=()):
    cursor = db.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def journal_entries(since_ns, **match):
    args = ["journalctl", "--no-pager", "-o", "json", f"--since=@{since_ns // NS_PER_SECOND}"]
    args += [f"{k}={v}" for k, v in match.items()]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_cron_reset_chain_end_to_end_with_its_journal_alerts(tmp_config, tmp_path,
                                                             system_journald):
    assert cron_gone(), "a cron daemon already runs: the demo starts its own with -L 15"
    work = tmp_path / "demo"
    started_ns = now_ns()
    result = {}
    runner = threading.Thread(target=lambda: result.update(
        incident=play(tmp_config, "cron-reset", keep=True, timeout=100, work=work)))
    runner.start()
    store = work / "demo.db"
    complete_at = None
    while runner.is_alive():                  # note when the whole chain first shows up
        if complete_at is None and store.exists():
            try:
                with open_store(store, readonly=True) as db:
                    kinds = [r[0] for r in db.execute(
                        "select l.kind from incident_links l join incidents i on "
                        "i.id = l.incident_id where i.kind = 'gpu_reset' and "
                        "l.kind != 'rule_finding' order by l.seq")]
            except (sqlite3.Error, StoreError):       # created but not migrated yet
                kinds = []
            if kinds == CHAIN:
                complete_at = now_ns()
        time.sleep(0.1)
    runner.join()
    assert not list(Path("/etc/cron.d").glob("gpuwhy-demo-*")), "the cron entry was left"
    incident_id = result["incident"]
    assert incident_id is not None and complete_at is not None

    db = open_store(store, readonly=True)
    [incident] = rows(db, "select * from incidents where id = ?", [incident_id])
    links = rows(db, "select * from incident_links where incident_id = ? order by seq",
                 [incident_id])
    # the rules' findings on the same reset (R40 the cron job, R40b a reset under load, once
    # the rules have run) are more links of this incident, not incidents of their own
    findings = [link for link in links if link["kind"] == "rule_finding"]
    assert all(json.loads(link["evidence"])["rule_id"] in (
        "R40_operator_or_cron_intervention", "R40b_gpu_reset_under_load") for link in findings)
    assert not db.execute("select 1 from incidents where kind = 'rule_finding' and "
                          "cause_id is null").fetchone()
    links = [link for link in links if link["kind"] != "rule_finding"]
    assert [link["kind"] for link in links] == CHAIN
    cron, command, call, reset, stall = links
    # The right pids: the job cron logged, the process that exec'd the stand-in nvidia-smi
    # and sent the reset, the training process that held the GPU.
    [run] = rows(db, "select * from cron_runs where phase = 'started' and command like ?",
                 [f"%{work}/bin/nvidia-smi -r%"])
    assert (cron["pid"], cron["start_time"]) == (run["job_pid"], run["job_start_time"])
    [exec_event] = rows(db, "select * from events where kind = 'process_exec' and body like "
                            "'%/bin/nvidia-smi%'")
    assert (command["pid"], command["start_time"]) == \
        (exec_event["pid"], exec_event["start_time"]) == (call["pid"], call["start_time"])
    [reset_call] = rows(db, "select * from driver_calls where sub_name = "
                            "'NV0080_CTRL_CMD_BIF_RESET'")
    assert (reset_call["pid"], reset_call["start_time"]) == (call["pid"], call["start_time"])
    trainers = rows(db, "select pid, start_time from gpu_bindings where gpu_id = ? and "
                        "pid != ?", [incident["gpu_id"], call["pid"]])
    assert len(trainers) == 1
    assert [(t["pid"], t["start_time"]) for t in trainers] == \
        [(stall["pid"], stall["start_time"])]
    # The right GPU: the simulator's GPU 0, known to the device files by minor 0.
    minor0 = db.execute("select gpu_id from gpu_aliases where alias = 'minor:0'").fetchone()[0]
    assert incident["gpu_id"] == minor0 == call["gpu_id"] and minor0.startswith("GPU-")
    # The right times, in order, each from its evidence row.
    assert cron["ts"] == run["ts"] and command["ts"] == exec_event["ts"]
    # the call's step is dated when it was made (its return less its latency), so that it
    # comes before the reset it caused; the reset and the incident at its return
    assert call["ts"] == reset_call["ts"] - reset_call["latency_ns"]
    assert reset_call["ts"] == incident["opened_at"] == reset["ts"]
    assert cron["ts"] <= command["ts"] <= call["ts"]
    assert call["ts"] <= stall["ts"] < call["ts"] + 5 * NS_PER_SECOND
    assert abs(cron["ts"] - started_ns) < 100 * NS_PER_SECOND
    # Built within 5 s of the last event it needs (the stall is due stall_seconds after the
    # GPU went idle).
    last_needed = stall["ts"] + int(4.0 * NS_PER_SECOND)
    assert complete_at - last_needed < 5 * NS_PER_SECOND, (complete_at - last_needed) / 1e9
    # The stand-in's kernel-log line is stored, marked as demo traffic.
    lines = [r[0] for r in db.execute("select line from kernel_log where kind = 'gpu_uuid'")]
    assert lines and all(DEMO_MARK in line for line in lines)
    db.close()

    # The alerts are in the journal with their fields.
    [alert] = [e for e in journal_entries(started_ns, MESSAGE_ID=MESSAGE_IDS["gpu_reset"])
               if e.get("GPUWHY_URL", "").endswith(f"/incidents/{incident_id}")
               and e.get("GPU_UUID") == minor0][-1:]
    assert alert["GPUWHY_INCIDENT_ID"] == str(incident_id)
    assert alert["GPU_PCI"] == "0000:18:00" and alert["PRIORITY"] == "2"
    # One incident per cause: the trainer's stall is the reset's link, not an alert of its own
    stall_alerts = journal_entries(started_ns, MESSAGE_ID=MESSAGE_IDS["process_stall"],
                                   PID=str(stall["pid"]))
    assert stall_alerts == []
