"""The decide stage on constructed events through the real writer and store: Xid with and
without a pid, PID reuse, dedup of bursts, Xid 45 and escalation, late events, the reset
chain from a cron job, stalls, deaths, rule findings, GPU identity join."""

import json

from gpuwhy.events import CronExecution, RuleFinding, SchedStats
from gpuwhy.identity import ProcessKey
from gpuwhy.journal import CHANGE_MESSAGE_IDS, MESSAGE_IDS
from gpuwhy.store.queries import list_incidents

from .conftest import PCI0, UUID0

TRAINER = ProcessKey(4242, 1000)
OTHER = ProcessKey(5151, 1100)


def bound_gpu(h, *keys):
    """A GPU seen by the source, busy, with ``keys`` holding /dev/nvidia0."""
    h.feed(h.gpu(0), *(h.process(0.1, k, f"train{k.pid}") for k in keys),
           *(h.opened(0.2, k) for k in keys), h.sample(0.5, 95.0))


def test_xid_with_a_pid_links_to_that_process_only(harness):
    h = harness
    bound_gpu(h, TRAINER, OTHER)
    h.feed(h.xid(1.0, 13, pid=TRAINER.pid, name="train4242"))
    [incident] = h.incidents("xid")
    assert (incident["gpu_id"], incident["pid"], incident["start_time"]) == \
        ("GPU-00000000-1111-2222-3333-444444444444", TRAINER.pid, TRAINER.start_time)
    assert incident["severity"] == "error" and "Xid 13" in incident["title"]
    processes = [(link["pid"], link["start_time"]) for link in h.links(incident["id"])
                 if link["kind"] == "process"]
    assert processes == [(TRAINER.pid, TRAINER.start_time)]
    [alert] = h.alerts
    assert h.incidents("xid")[0]["alerted_at"] is not None
    assert alert["GPUWHY_INCIDENT_ID"] == str(incident["id"])
    assert alert["PID"] == str(TRAINER.pid) and alert["GPU_PCI"] == "0000:18:00"
    assert alert["GPU_UUID"] == incident["gpu_id"] and alert["PRIORITY"] == "3"


def test_xid_without_a_pid_links_to_the_processes_bound_at_that_time(harness):
    h = harness
    bound_gpu(h, TRAINER, OTHER)
    late = ProcessKey(6000, 1200)      # binds after the Xid: not hit by it
    h.feed(h.xid(2.0, 31))
    h.feed(h.process(3.0, late, "late"), h.opened(3.1, late))
    h.feed(h.sample(3.5, 90.0))
    [incident] = h.incidents("xid")
    assert incident["pid"] is None
    hit = {(link["pid"], link["start_time"]) for link in h.links(incident["id"])
           if link["kind"] == "process"}
    assert hit == {(TRAINER.pid, TRAINER.start_time), (OTHER.pid, OTHER.start_time)}


def test_a_reused_pid_is_not_mixed_up(harness):
    h = harness
    old = ProcessKey(7777, 500)
    new = ProcessKey(7777, 900)          # same pid, started after the old one exited
    h.feed(h.gpu(0), h.process(0.1, old, "old"), h.opened(0.2, old), h.sample(0.3, 90.0))
    h.feed(h.xid(1.0, 13, pid=7777, name="old"))
    h.feed(h.exited(2.0, old), h.process(3.0, new, "new"), h.opened(3.1, new))
    h.feed(h.xid(4.0, 43, pid=7777, name="new"))
    first, second = h.incidents("xid")
    assert (first["pid"], first["start_time"]) == (7777, 500)
    assert (second["pid"], second["start_time"]) == (7777, 900)


def test_a_burst_of_the_same_xid_is_one_incident_with_a_count(harness):
    h = harness
    bound_gpu(h, TRAINER)
    h.feed(*(h.xid(1.0 + n * 0.1, 13, pid=TRAINER.pid) for n in range(5)))
    h.feed(h.xid(2.0, 13, pid=TRAINER.pid))
    [incident] = h.incidents("xid")
    assert incident["count"] == 6
    assert len(h.alerts) == 1


def test_xid_45_points_to_the_earlier_xid_and_repeats_after_a_reset_escalate(harness):
    h = harness
    bound_gpu(h, TRAINER)
    h.feed(h.reset_call(1.0, TRAINER))
    h.feed(h.xid(2.0, 48))
    h.feed(h.xid(3.0, 45))
    xid48, xid45 = h.incidents("xid")
    kinds = [link["kind"] for link in h.links(xid45["id"])]
    assert kinds[0] == "earlier_xid" and "escalation" in kinds
    earlier = h.links(xid45["id"])[0]
    assert json.loads(earlier["evidence"])["incident"] == xid48["id"]


def test_late_events_within_the_lag_land_in_the_right_chain(harness):
    h = harness
    h.feed(h.gpu(0), h.sample(0.0, 95.0))
    job = ProcessKey(300, 2000)
    smi = ProcessKey(301, 2001)
    # The reset's driver call arrives first; who ran it (cron, the exec, the process
    # facts) arrives later, out of order, within the lag.
    h.feed(h.process(0.9, smi, "nvidia-smi", ppid=300), h.opened(0.95, smi),
           h.reset_call(1.0, smi))
    [reset] = h.incidents("gpu_reset")
    assert [link["kind"] for link in h.links(reset["id"])] == ["operator_command",
                                                               "driver_call", "gpu_reset"]
    h.feed(h.process(0.5, job, "sh", ppid=1), h.exec_(0.8, smi, "/usr/bin/nvidia-smi", 300),
           CronExecution(ts=h.at(0.5), cursor="cron1", phase="started", user="root",
                         command="nvidia-smi -r", job_pid=300, job_start_time=2000,
                         cron_pid=299, gpu_action="nvidia-smi -r: GPU reset"),
           src="late-source")
    links = h.links(reset["id"])
    assert [link["kind"] for link in links] == ["cron_job", "command", "driver_call",
                                                "gpu_reset"]
    assert (links[0]["pid"], links[0]["start_time"]) == (300, 2000)
    assert links[1]["ts"] == h.at(0.8) and (links[1]["pid"], links[2]["pid"]) == (301, 301)


def test_events_later_than_the_lag_are_counted_and_still_stored(harness):
    h = harness
    lag = h.config["correlator.lag_seconds"]
    h.correlator.wall_clock = lambda: h.t0      # live: the wall clock bounds the watermark
    h.feed(h.gpu(0), h.sample(0.0, 95.0))
    h.feed(h.sample(-(lag + 10), 95.0), h.sample(-(lag / 2), 95.0), src="slow-source")
    h.feed(h.sample(lag + 60, 95.0), src="fast-clock")
    counters = h.correlator.counters()
    assert counters["late_beyond_lag:slow-source"] == 1
    assert counters["reordered:slow-source"] == 2 and counters["clock_ahead:fast-clock"] == 1
    assert h.db.execute("select count(*) from gpu_samples").fetchone()[0] == 4


def test_cron_reset_chain_reaches_the_stalled_process(harness):
    h = harness
    stall_s = h.config["correlator.stall_seconds"]
    job, smi = ProcessKey(300, 2000), ProcessKey(301, 2001)
    bound_gpu(h, TRAINER)
    h.feed(CronExecution(ts=h.at(1.0), cursor="cron1", phase="started", user="root",
                         command="/usr/bin/nvidia-smi -r", job_pid=300, job_start_time=2000,
                         gpu_action="nvidia-smi -r: GPU reset"),
           h.process(1.0, job, "sh"), h.process(1.1, smi, "nvidia-smi", ppid=300),
           h.exec_(1.1, smi, "/usr/bin/nvidia-smi", 300), h.opened(1.2, smi),
           h.reset_call(1.3, smi))
    for second in range(2, int(stall_s) + 4):
        h.feed(h.sample(second, 0.0),
               SchedStats(ts=h.at(second), process=TRAINER, interval_ns=10**9,
                          own={"on_cpu_ns": 900_000_000, "sleep_ns": 100_000_000},
                          workers={}))
    [reset] = h.incidents("gpu_reset")
    [stall] = h.incidents("process_stall")
    links = h.links(reset["id"])
    assert [link["kind"] for link in links] == ["cron_job", "command", "driver_call",
                                                "gpu_reset", "process_stall"]
    assert [(link["pid"], link["start_time"]) for link in links] == [
        (300, 2000), (301, 2001), (301, 2001), (None, None), (4242, 1000)]
    # the driver call's step is dated when the call was made: its return less its latency
    assert links[2]["ts"] == h.at(1.3) - 5000 and links[4]["ts"] == stall["opened_at"] == h.at(2)
    assert "on-CPU busy" in stall["summary"]
    assert reset["gpu_id"] == stall["gpu_id"] == "GPU-00000000-1111-2222-3333-444444444444"
    # One incident per cause: the stall is the reset's link, not an incident or alert
    assert [a["GPUWHY_KIND"] for a in h.alerts] == ["gpu_reset"]
    assert stall["cause_id"] == reset["id"]
    assert [i["id"] for i in list_incidents(h.db)] == [reset["id"]]


def test_a_death_after_an_xid_is_its_effect(harness):
    h = harness
    bound_gpu(h, TRAINER)
    h.feed(h.xid(1.0, 79))
    h.feed(h.exited(2.0, TRAINER, signal=6))
    [lost] = h.incidents("gpu_lost")
    [death] = h.incidents("process_exit")
    assert death["pid"] == TRAINER.pid and lost["severity"] == "critical"
    assert "process_exit" in [link["kind"] for link in h.links(lost["id"])]


def test_device_opened_before_the_gpu_is_known_is_rekeyed_to_its_uuid(harness):
    h = harness
    h.feed(h.process(0.0, TRAINER, "train"), h.opened(0.1, TRAINER))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [("minor:0",)]
    h.feed(h.gpu(0.5))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [
        ("GPU-00000000-1111-2222-3333-444444444444",)]
    aliases = dict(h.db.execute("select alias, gpu_id from gpu_aliases").fetchall())
    assert set(aliases) == {"uuid:GPU-00000000-1111-2222-3333-444444444444",
                            "pci:0000:18:00", "index:0", "minor:0"}


def test_a_gpu_learned_again_moves_rows_only_once_a_weaker_name_got_some(harness):
    """Its source re-sends a GPU every minute: with every alias known and nothing stored
    under a weaker name, nothing is re-keyed (three of those tables have no gpu_id index:
    each re-keying scanned every event and process second kept). A weaker name that came
    back since (a source that does not tell the minor, then a device file opened) is."""
    h = harness
    h.feed(h.gpu(0.0))
    run = []
    h.db.conn.set_trace_callback(run.append)
    h.feed(h.gpu(60.0))
    h.db.conn.set_trace_callback(None)
    assert run and not [sql for sql in run if sql.startswith("update") and "set gpu_id" in sql]
    h.db.execute("update gpus set minor = null")      # known by a source that tells no minor
    h.db.execute("delete from gpu_aliases where alias = 'minor:0'")
    h.db.conn.commit()
    h.feed(h.process(61.0, TRAINER, "train"), h.opened(61.1, TRAINER))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [("minor:0",)]
    h.feed(h.gpu(120.0))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [(UUID0,)]
    assert h.db.execute("select count(*) from gpus where id = 'minor:0'").fetchone() == (0,)


def finding(h, t, state="firing", severity="warning", shadow=False):
    return RuleFinding(ts=h.at(t), finding_id="f-1", rule_id="input-starved",
                       title="Input pipeline starves the GPU", severity=severity, state=state,
                       gpu_id="GPU-00000000-1111-2222-3333-444444444444", process=TRAINER,
                       window_start=h.at(1), window_end=h.at(5),
                       evidence={"gpu_util_mean": 31.0}, root_cause="too few workers",
                       fixes=["raise num_workers"], verify="gpu_util > 80", shadow=shadow)


def test_a_rule_finding_becomes_an_incident_with_its_evidence(harness):
    h = harness
    bound_gpu(h, TRAINER)
    h.feed(finding(h, 5))
    [incident] = h.incidents("rule_finding")
    # dated when its condition held (no `since` sent: the finding's time), not at the
    # evaluation window's start (h.at(1))
    assert (incident["pid"], incident["opened_at"]) == (TRAINER.pid, h.at(5))
    link, process = h.links(incident["id"])
    assert (process["kind"], process["pid"]) == ("process", TRAINER.pid)
    evidence = json.loads(link["evidence"])
    assert evidence["evidence"] == {"gpu_util_mean": 31.0}
    assert evidence["fixes"] == ["raise num_workers"] and evidence["rule_id"] == "input-starved"
    assert h.alerts[0]["MESSAGE_ID"] == "edb02d46c3fc48debfc0880a04139975"
    h.feed(h.sample(200, 95.0))                         # time passes: it stays open
    assert h.incidents("rule_finding")[0]["state"] == "open"
    h.feed(finding(h, 300, severity="error"))           # escalation: same incident, worse
    h.feed(finding(h, 400, state="cleared"))
    [incident] = h.incidents("rule_finding")
    assert (incident["severity"], incident["state"], incident["resolution"],
            incident["closed_at"]) == ("error", "resolved", "recovered", h.at(400))
    # one alert when it opened, one journal entry when it was resolved
    assert [(a["MESSAGE_ID"], a.get("GPUWHY_CHANGE")) for a in h.alerts] == [
        (MESSAGE_IDS["rule_finding"], None),
        (CHANGE_MESSAGE_IDS["resolved"], "resolved")]
    assert h.alerts[1]["GPUWHY_RESOLUTION"] == "recovered"


def test_a_shadow_finding_opens_no_incident(harness):
    harness.feed(finding(harness, 5, shadow=True))
    assert harness.incidents() == [] and harness.alerts == []


def test_process_timeline_at_one_second(harness):
    from gpuwhy.events import DriverCallStats, GpuProcesses
    from gpuwhy.store.process_seconds import gpu_timeline, process_timeline

    h = harness
    bound_gpu(h, TRAINER)

    def stats(t, count):
        return DriverCallStats(ts=h.at(t), process=TRAINER, path="/dev/nvidiactl",
                               device="nvidiactl",
                               ops=[{"cmd": 1, "sub": 2, "op": "NV_ESC_RM_CONTROL",
                                     "sub_name": "NV2080_CTRL_CMD_X", "count": count,
                                     "errors": 0, "latency_sum_ns": 0, "latency_max_ns": 0,
                                     "bytes": 0, "latency_log2": []}])
    h.feed(stats(1.2, 100), stats(2.2, 250), h.sample(1.0, 90.0), h.sample(2.0, 40.0),
           SchedStats(ts=h.at(2.1), process=TRAINER, interval_ns=10**9,
                      own={"on_cpu_ns": 300_000_000, "blocked_ns": 600_000_000},
                      workers={"on_cpu_ns": 2 * 10**9}, worker_processes=4),
           GpuProcesses(ts=h.at(2.0), gpu_id="GPU-00000000-1111-2222-3333-444444444444",
                        source="nvml", processes=[{"pid": 4242, "start_time": 1000,
                                                   "used_memory_mib": 1024, "sm_util": 37}]))
    seconds = process_timeline(h.db, TRAINER, h.at(0), h.at(3))
    by_second = {row["second"] - h.t0 // 10**9: row for row in seconds}
    assert by_second[1]["ioctls"] == 100 and by_second[2]["ioctls"] == 150
    assert json.loads(by_second[2]["ioctl_ops"]) == {"NV2080_CTRL_CMD_X": 150}
    assert by_second[2]["on_cpu_ms"] == 300 and by_second[2]["blocked_ms"] == 600
    assert by_second[2]["workers_on_cpu_ms"] == 2000 and by_second[2]["sm_util"] == 37
    assert by_second[1]["gpu_util"] == 90.0 and by_second[2]["gpu_util"] == 40.0
    gpu = gpu_timeline(h.db, "GPU-00000000-1111-2222-3333-444444444444", h.at(0.9), h.at(3))
    assert [row["gpu_util"] for row in gpu] == [90.0, 40.0]


def test_the_drivers_gpu_table_joins_minor_pci_and_uuid(tmp_config):
    from pathlib import Path

    from gpuwhy.identity import GpuIdentity
    from gpuwhy.probes.gpu.source import proc_identities

    root = Path(__file__).resolve().parent.parent / "data" / "proc-nvidia"
    assert proc_identities(str(root)) == [GpuIdentity(
        uuid="GPU-5f3c6a1e-0d2b-4f7e-9a51-3c2d1e0f9b87", pci_bus_id="0000:3b:00.0", minor=3)]
    assert proc_identities(str(root / "nothing")) == []


def test_a_device_file_binds_to_the_uuid_the_driver_lists(make_harness, tmp_config):
    from pathlib import Path

    from gpuwhy.probes.gpu.source import driver_gpu_events

    root = Path(__file__).resolve().parent.parent / "data" / "proc-nvidia"
    h = make_harness(tmp_config.replace({"probes.proc_root": str(root)}))
    # what the GPU source publishes from the driver's table, before any counters source opens
    h.feed(*driver_gpu_events(h.at(0), str(root)), src="gpu")
    h.feed(h.process(0, TRAINER, "train"), h.opened(0.1, TRAINER, minor=3))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [
        ("GPU-5f3c6a1e-0d2b-4f7e-9a51-3c2d1e0f9b87",)]
    h.feed(h.xid(1.0, 31, pci="0000:3b:00"))
    assert h.incidents("xid")[0]["gpu_id"] == "GPU-5f3c6a1e-0d2b-4f7e-9a51-3c2d1e0f9b87"


def test_a_stall_after_a_gpu_reset_dates_from_the_reset_even_once_the_gpu_is_back(harness):
    """The simulator (like NVML) goes silent while resetting and reports an idle GPU after:
    the idle stretch began when it went silent, not at its first sample after coming back."""
    from gpuwhy.events import GpuState

    from .conftest import UUID0

    h = harness
    stall_s = h.config["correlator.stall_seconds"]
    bound_gpu(h, TRAINER)
    h.feed(h.sample(1.0, 97.0))
    h.feed(GpuState(ts=h.at(1.5), gpu_id=UUID0, state="resetting", detail="reset", source="t",
                    simulated=False),
           GpuState(ts=h.at(1.6), gpu_id=UUID0, state="back", detail="done", source="t",
                    simulated=False),
           h.sample(1.7, 0.0))
    for second in range(2, int(stall_s) + 4):
        h.feed(h.sample(second, 0.0))
    [reset] = h.incidents("gpu_reset")
    [stall] = h.incidents("process_stall")
    assert stall["opened_at"] == h.at(1.5)
    assert [link["kind"] for link in h.links(reset["id"])] == ["gpu_reset", "process_stall"]


def test_a_stall_that_comes_back_reopens_its_incident_once_and_stops_counting(harness):
    """Busy again closes a stall; idle again within the dedup gap is the same incident,
    reopened, counted once: not a merge on every stall check while it lasts (a closed
    stall that was merged into, and never reopened, counted two merges a second)."""
    h = harness
    stall_s = int(h.config["correlator.stall_seconds"])
    bound_gpu(h, TRAINER)
    second = 1
    for _ in range(stall_s + 2):                       # the first stall
        h.feed(h.sample(second, 0.0))
        second += 1
    assert [i["state"] for i in h.incidents("process_stall")] == ["open"]
    h.feed(h.sample(second, 96.0))                     # busy again: over
    second += 1
    assert [(i["state"], i["resolution"]) for i in h.incidents("process_stall")] == \
        [("resolved", "recovered")]
    merged_before = h.correlator.builder.merged
    for _ in range(stall_s + 30):                      # idle again, for a long while
        h.feed(h.sample(second, 0.0))
        second += 1
    [stall] = h.incidents("process_stall")
    assert stall["state"] == "open" and stall["closed_at"] is None
    assert stall["count"] == 2
    assert h.correlator.builder.merged - merged_before == 1


def test_an_xid_incident_names_each_faulting_process_and_a_storm_only_its_first_few(harness):
    """Programs gpuwhy never saw (no probes) that fault on one GPU: the Xid incident's chain
    names each pid the driver named, merged repeats too; a storm of 300 lines from 300 pids
    names the first eight and counts them all (no chain rebuilt per line)."""
    from gpuwhy.correlator.chains import MAX_NAMED

    h = harness
    h.feed(h.gpu(0))
    h.feed(h.xid(1, 43, pid=101, name="train"), h.xid(2, 43, pid=202, name="eval"))
    incident = h.incidents("xid")[0]
    named = [(link["pid"], link["summary"]) for link in h.links(incident["id"])
             if link["kind"] == "process"]
    assert named == [(101, "the Xid line names pid 101 (train)"),
                     (202, "the Xid line names pid 202 (eval)")]
    for n in range(300):
        h.feed(h.xid(3 + n / 100, 43, pid=1000 + n, name="storm"))
    incident = h.incidents("xid")[0]
    assert incident["count"] == 302
    assert len(json.loads(incident["details"])["named"]) == MAX_NAMED
    pids = [link["pid"] for link in h.links(incident["id"]) if link["kind"] == "process"]
    assert pids == [101, 202, *range(1000, 1000 + MAX_NAMED - 2)]


def test_a_second_faulting_process_the_probes_saw_is_held_by_its_key(harness):
    """Two programs fault on one GPU, both seen by the probes: the merged Xid incident holds
    both by (pid, start), so each program's own page shows it; a monitor on the GPU, there
    the whole time, is in it nowhere."""
    h = harness
    first, second, monitor = ProcessKey(101, 5_000), ProcessKey(202, 6_000), ProcessKey(7, 1)
    h.feed(h.gpu(0), h.process(0, monitor, "nv-hostengine"), h.opened(0, monitor))
    for key, comm in ((first, "train"), (second, "eval")):
        h.feed(h.process(0.5, key, comm), h.opened(0.5, key))
    h.feed(h.xid(1, 43, pid=101, name="train", pci=PCI0),
           h.xid(2, 43, pid=202, name="eval", pci=PCI0))
    [incident] = h.incidents("xid")
    held = set(h.db.execute("select pid, start_time from incident_processes where "
                            "incident_id = ?", [incident["id"]]).fetchall())
    assert held == {(101, 5_000), (202, 6_000)}


def _r36_finding(h) -> RuleFinding:
    """R36's finding on GPU 0 at 3 s (scope gpu: it names no process)."""
    return RuleFinding(ts=h.at(3), finding_id="R36:g", rule_id="R36_app_fault_xid13_31_43",
                       title="Application fault on the GPU (Xid 13, 31, 43)",
                       severity="warning", state="firing", gpu_id=UUID0, process=None,
                       window_start=h.at(1), window_end=h.at(3), evidence={"xid43": 1.0},
                       root_cause="an application fault", fixes=["restart it"], verify="",
                       rule_kind="cause")


def test_a_gpu_wide_finding_about_an_application_fault_joins_the_xid(harness):
    """R36 (scope gpu) reads the Xid lines themselves: its finding, which names no process,
    is part of the process-naming Xid's incident, not an incident of its own. A finding of
    another process on the GPU is not that Xid's."""
    h = harness
    faulting, other = ProcessKey(101, 5_000), ProcessKey(303, 7_000)
    h.feed(h.gpu(0))
    for key, comm in ((faulting, "train"), (other, "serve")):
        h.feed(h.process(0.5, key, comm), h.opened(0.5, key))
    h.feed(h.xid(1, 43, pid=101, name="train", pci=PCI0))
    [xid] = h.incidents("xid")
    h.feed(_r36_finding(h))
    h.feed(RuleFinding(ts=h.at(4), finding_id="R14:g", rule_id="R14_low_sm",
                       title="Low SM activity", severity="warning", state="firing",
                       gpu_id=UUID0, process=other, window_start=h.at(1), window_end=h.at(4),
                       evidence={}, root_cause="", fixes=[], verify=""))
    causes = {i["title"]: i["cause_id"] for i in h.incidents("rule_finding")}
    assert causes == {"Application fault on the GPU (Xid 13, 31, 43)": xid["id"],
                      "Low SM activity": None}


def test_a_device_file_of_a_minor_the_driver_named_binds_to_its_gpu_at_once(harness):
    """The driver's table named minor 0's GPU (its alias is learned) but no GPU row holds the
    minor yet: the device file binds to that GPU, with no row of a GPU named "minor:0"."""
    from gpuwhy.events import DriverGpu

    from .conftest import PCI0, UUID0

    h = harness
    h.feed(DriverGpu(ts=h.at(0), pci_bus_id=PCI0, minor=0, uuid=UUID0), src="gpu")
    h.feed(h.process(1.0, TRAINER, "train"), h.opened(1.1, TRAINER))
    assert h.db.execute("select gpu_id from gpu_bindings").fetchall() == [(UUID0,)]
    assert h.db.execute("select count(*) from gpus where id = 'minor:0'").fetchone() == (0,)


def test_a_finding_found_before_its_xid_is_adopted_when_the_late_line_comes(harness):
    """The kernel-log line came late: the finding it explains opened an incident first;
    the Xid's incident, dated before it, adopts it as a link of its chain."""
    h = harness
    h.feed(h.gpu(0))
    h.feed(_r36_finding(h))
    [finding] = h.incidents("rule_finding")
    assert finding["cause_id"] is None
    opened = h.correlator.builder.opened
    h.feed(h.xid(2, 31, pci=PCI0))
    [xid] = h.incidents("xid")
    assert h.incidents("rule_finding")[0]["cause_id"] == xid["id"]
    assert h.correlator.builder.opened == opened      # one more cause, one incident less
