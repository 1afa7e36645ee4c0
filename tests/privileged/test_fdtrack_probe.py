"""The real fdtrack probe, loaded into the kernel, against replayed CUDA driver traffic."""

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from gpuwhy.nvioctl import iowr
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

STATS_SQL = ("select path, cmd, sub, count, errors, bytes from driver_call_stats "
             "where pid = ? and start_time = ?")


def _stats(rows):
    return {f"{path}|{cmd}|{sub}": {"count": count, "errors": errors, "bytes": nbytes}
            for path, cmd, sub, count, errors, nbytes in rows}


def _wait_exact(pipe, key, expected):
    rows = pipe.wait_for(STATS_SQL, [key.pid, key.start_time],
                         lambda r: _stats(r) == expected, timeout=30)
    assert _stats(rows) == expected
    return rows


def test_startup_traffic_from_two_processes_and_threads_is_decoded_exactly(
        pipeline_for, probe_config, replay):
    pipe = pipeline_for(probe_config)
    first, second = replay.start(rounds=3, threads=3), replay.start(rounds=5, threads=2)
    reports = {}
    try:
        for proc in (first, second):
            report = json.loads(proc.stdout.readline())
            reports[report["pid"]] = report
        keys = {pid: process_key(pid) for pid in reports}
        threads = {pid: len(report["tids"]) for pid, report in reports.items()}
        for pid, report in reports.items():
            _wait_exact(pipe, keys[pid], report["expected"])
            key = keys[pid]
            fds = pipe.query("select device, how from device_fds where pid = ? and "
                             "start_time = ? and closed_at is null order by device",
                             [key.pid, key.start_time])
            assert fds == [("nvidia-uvm", "open"), ("nvidiaN", "open"), ("nvidiactl", "open")]
            calls = pipe.wait_for(
                "select op, sub, sub_name, version, gpu_ids, bytes, reasons, tid, status, nr "
                "from driver_calls where pid = ? and start_time = ?",
                [key.pid, key.start_time], lambda r, n=threads[pid]: len(r) >= 12 * n)
            by_op = {}
            for row in calls:
                by_op.setdefault((row[0], row[1]), []).append(row)
            versions = by_op[("NV_ESC_CHECK_VERSION_STR", 0)]
            assert {r[3] for r in versions} == {report["version"]}
            attach = by_op[("NV_ESC_ATTACH_GPUS_TO_FD", 0)]
            assert [json.loads(r[4]) for r in attach] == [report["gpu_ids"]] * len(attach)
            # the XFER-wrapped control is decoded as the RM_CONTROL inside it
            inner = by_op[("NV_ESC_RM_CONTROL", 0x215)]
            assert {r[2] for r in inner} == {"NV0000_CTRL_CMD_GPU_ATTACH_IDS"}
            assert all("notable" in r[6] for r in inner)
            heap = by_op[("NV_ESC_RM_VID_HEAP_CONTROL", 2)]
            assert {(r[5], "big" in r[6]) for r in heap} == {(1 << 30, True)}
            # every call on a plain file fails with ENOTTY: failed calls are reported too
            no_memory = [r for r in by_op[("NV_ESC_RM_ALLOC", 0x40)] if r[8] == 0x51]
            assert no_memory and all("error" in r[6] for r in no_memory)
            assert {r[7] for r in calls} <= set(report["tids"])
            args = pipe.query("select op, nr, size, arg0, arg1, bytes from driver_calls "
                              "where pid = ? and start_time = ?", [key.pid, key.start_time])
            decoded = {row[0]: row[1:] for row in args}
            assert decoded["NV_ESC_RM_FREE"] == (0x29, 16, 9, 0, 0)          # hObjectOld
            assert decoded["NV_ESC_RM_MAP_MEMORY"] == (0x4E, 56, 7, 2 << 20, 2 << 20)
            assert decoded["NV_ESC_REGISTER_FD"] == (0xC9, 4, 3, 0, 0)       # the ctl fd
            assert decoded["UVM_CREATE_EXTERNAL_RANGE"] == (73, 0, 1 << 40, 4 << 20,
                                                            4 << 20)
            assert decoded["NV_ESC_ATTACH_GPUS_TO_FD"][:2] == (0xD4, 32)
            rounds_times_threads = next(iter(report["expected"].values()))["count"]
            assert len(versions) == rounds_times_threads
    finally:
        for proc in (first, second):
            proc.communicate("\n", timeout=10)
    for key in keys.values():
        rows = pipe.wait_for("select exited_at, exit_code from processes where pid = ? and "
                             "start_time = ?", [key.pid, key.start_time],
                             lambda r: r and r[0][0] is not None and r[0][1] is not None)
        assert rows[0][0] is not None and rows[0][1] == 0


def test_startup_scan_finds_devices_opened_before_gpuwhy(pipeline_for, probe_config, replay):
    proc = replay.start(rounds=1)
    try:
        pid = json.loads(proc.stdout.readline())["pid"]   # its files are open now
        key = process_key(pid)
        pipe = pipeline_for(probe_config)
        rows = pipe.wait_for(
            "select path, how from device_fds where pid = ? and start_time = ?",
            [key.pid, key.start_time], lambda r: len(r) == 3)
        assert sorted(rows) == sorted((f"{replay.directory}/{name}", "scan")
                                      for name in ("nvidiactl", "nvidia0", "nvidia-uvm"))
    finally:
        proc.communicate("\n", timeout=10)


def test_only_paths_matching_the_whole_glob_are_tracked(pipeline_for, tmp_config, tmp_path):
    devices = tmp_path / "dev"
    pipe = pipeline_for(tmp_config.replace({"probes.device_glob": f"{devices}/nvidia[0-9]"}))
    me = process_key(os.getpid())
    # nvidiactl passes the in-kernel prefix test but not the glob; other fails both
    with open(devices / "nvidia0", "w"), open(devices / "nvidiactl", "w"), \
            open(devices / "other", "w"):
        pipe.wait_for("select path from device_fds where pid = ? and start_time = ?",
                      [me.pid, me.start_time], lambda r: len(r) >= 1)
        time.sleep(0.5)
        rows = pipe.query("select path from device_fds where pid = ? and start_time = ?",
                          [me.pid, me.start_time])
    assert rows == [(f"{devices}/nvidia0",)]
    health = pipe.wait_for("select counters from source_health where source = 'fdtrack'",
                           [], lambda r: r and json.loads(r[0][0])["filtered"] >= 1)
    assert json.loads(health[0][0])["filtered"] >= 1


FD_GAME = r"""
import ctypes, fcntl, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
directory, control = sys.argv[1], int(sys.argv[2])
buf = ctypes.create_string_buffer(32)
def call(fd, n):
    for _ in range(n):
        libc.ioctl(fd, control, ctypes.addressof(buf))
ctl = os.open(directory + "/nvidiactl", os.O_RDWR)      # Python adds O_CLOEXEC
gpu = os.open(directory + "/nvidia0", os.O_RDWR)
copy = os.dup(ctl)                                     # dup (Python: close-on-exec)
os.dup2(ctl, 40)                                       # dup2 to a chosen number: inheritable
clo = fcntl.fcntl(gpu, fcntl.F_DUPFD_CLOEXEC, 50)      # F_DUPFD_CLOEXEC
os.set_inheritable(copy, True)                         # ioctl(FIONCLEX): no longer cloexec
call(ctl, 1); call(copy, 2); call(40, 3); call(clo, 4)
os.close(gpu)
child = os.fork()
if child == 0:
    call(copy, 5)                                                   # inherited fd
    # exec: ctl, copy and 40 survive (no O_CLOEXEC), clo does not
    os.execv(sys.executable, [sys.executable, "-c",
             "import ctypes,sys; l=ctypes.CDLL(None); b=ctypes.create_string_buffer(32);"
             f"[l.ioctl({copy}, {control}, b) for _ in range(7)]; sys.stdin.readline()"])
print(json.dumps({"pid": os.getpid(), "child": child, "ctl": ctl, "copy": copy, "clo": clo}),
      flush=True)
sys.stdin.readline()
"""


def test_fds_are_followed_through_dup_fork_exec_and_close(pipeline_for, probe_config, replay):
    pipe = pipeline_for(probe_config)
    devices = replay.directory
    for name in ("nvidiactl", "nvidia0"):
        (devices / name).touch()
    control = iowr(0x2A, 32)
    proc = subprocess.Popen([sys.executable, "-c", FD_GAME, str(devices), str(control)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        parent, child = process_key(info["pid"]), process_key(info["child"])
        ctl, copy, clo = info["ctl"], info["copy"], info["clo"]
        fds_sql = ("select fd, path, how, closed_at is null from device_fds where pid = ? "
                   "and start_time = ? order by fd, opened_at")
        rows = pipe.wait_for(fds_sql, [parent.pid, parent.start_time], lambda r: len(r) == 5)
        path_ctl, path_gpu = f"{devices}/nvidiactl", f"{devices}/nvidia0"
        gpu_fd = next(r[0] for r in rows if r[1] == path_gpu and r[2] == "open")
        assert sorted(rows) == sorted([
            (ctl, path_ctl, "open", 1), (gpu_fd, path_gpu, "open", 0),
            (copy, path_ctl, "dup", 1), (40, path_ctl, "dup", 1), (clo, path_gpu, "dup", 1)])
        counts = pipe.wait_for(STATS_SQL, [parent.pid, parent.start_time],
                               lambda r: _stats(r).get(f"{path_ctl}|{control}|0", {}).get(
                                   "count") == 6)
        stats = _stats(counts)
        assert stats[f"{path_ctl}|{control}|0"]["count"] == 1 + 2 + 3
        assert not [k for k in stats if k.split("|")[1] in ("21584", "21585")]  # FIO(N)CLEX
        assert stats[f"{path_gpu}|{control}|0"]["count"] == 4
        # the child inherited the parent's fds at fork; exec closed the close-on-exec one
        child_rows = pipe.wait_for(fds_sql, [child.pid, child.start_time],
                                   lambda r: len(r) == 4 and sum(x[3] for x in r) == 2)
        assert {(r[0], r[2], r[3]) for r in child_rows} == {
            (ctl, "fork", 0), (copy, "fork", 1), (40, "fork", 1), (clo, "fork", 0)}
        child_counts = pipe.wait_for(STATS_SQL, [child.pid, child.start_time],
                                     lambda r: _stats(r).get(f"{path_ctl}|{control}|0", {})
                                     .get("count") == 12)
        assert _stats(child_counts)[f"{path_ctl}|{control}|0"]["count"] == 5 + 7
    finally:
        os.kill(info["child"], 9)
        proc.communicate("\n", timeout=10)


def _pid_after(target):
    """Make the next fork get ``target`` as its pid (ns_last_pid), as pid reuse would."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(target - 1))


def test_a_reused_pid_is_a_different_process(pipeline_for, probe_config, replay):
    pipe = pipeline_for(probe_config)
    first = replay.start(rounds=1)
    report = json.loads(first.stdout.readline())
    pid = report["pid"]
    key_one = process_key(pid)
    first.communicate("\n", timeout=10)
    pipe.wait_for("select exited_at from processes where pid = ? and start_time = ?",
                  [pid, key_one.start_time], lambda r: r and r[0][0] is not None)
    time.sleep(0.02)          # a start time is in 10 ms ticks: make the next one differ
    for _ in range(20):       # another process may take the pid first: try again
        _pid_after(pid)
        second = replay.start(rounds=2)
        report_two = json.loads(second.stdout.readline())
        if report_two["pid"] == pid:
            break
        second.communicate("\n", timeout=10)
    else:
        pytest.fail(f"could not get pid {pid} again")
    try:
        key_two = process_key(pid)
        assert key_two != key_one
        _wait_exact(pipe, key_two, report_two["expected"])
        _wait_exact(pipe, key_one, report["expected"])     # the first one's figures are intact
        rows = pipe.query("select start_time, exited_at is null from processes where pid = ? "
                          "order by start_time", [pid])
        assert rows == [(key_one.start_time, 0), (key_two.start_time, 1)]
    finally:
        second.communicate("\n", timeout=10)


def test_failed_calls_are_sent_one_by_one_within_one_budget_for_the_host(
        pipeline_for, tmp_config, replay):
    """Every call of the replay fails (ENOTTY on look-alike files), from four threads on
    every CPU: at most the budget a second is stored one by one, for the whole host (a
    budget per CPU let each CPU send as many), and every call is still counted."""
    budget = 10
    pipe = pipeline_for(tmp_config.replace({"probes.error_events_per_second": budget,
                                            "probes.repeat_seconds": 0}))
    proc = replay.start(rounds=200, threads=4)
    try:
        report = json.loads(proc.stdout.readline())
        key = process_key(report["pid"])
        _wait_exact(pipe, key, report["expected"])
        calls = sum(v["count"] for v in report["expected"].values())
        assert sum(v["errors"] for v in report["expected"].values()) == calls > 100 * budget
        # notable calls (the version check, attaching GPUs...) are always sent: not these
        sent = pipe.wait_for("select ts from driver_calls where pid = ? and start_time = ? "
                             "and reasons = 'error'", [key.pid, key.start_time],
                             lambda r: len(r) >= budget)
        # the budget's seconds are the probe's clock's (CLOCK_MONOTONIC), the stored times
        # realtime: a constant apart
        offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - \
            time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        per_second = Counter((ts - offset) // 1_000_000_000 for (ts,) in sent)
        assert sum(per_second.values()) >= budget
        # a CPU that checks at the same moment as another may let one more through
        assert max(per_second.values()) <= budget + 2, per_second
        assert os.cpu_count() > 1, "one CPU cannot tell a host budget from a per-CPU one"
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_a_failure_repeated_is_stored_once_a_window_and_every_call_counted(
        pipeline_for, probe_config, replay):
    """Every call of the replay fails the same way, round after round: each kind of failure
    (process, file, command, sub-operation, result) is stored once per repeat window, the
    statistics still count every call, and the probe's health says how many it held back.
    A notable call (the version check, attaching GPUs) is not held back."""
    pipe = pipeline_for(probe_config)           # the budget out of the way; repeats: 10 s
    started = time.monotonic()
    proc = replay.start(rounds=200, threads=4)
    try:
        report = json.loads(proc.stdout.readline())
        key = process_key(report["pid"])
        _wait_exact(pipe, key, report["expected"])
        elapsed = time.monotonic() - started
        expected = report["expected"]
        failing = {k for k, v in expected.items() if v["errors"]}

        def stored(rows):      # by path|cmd|sub, as the statistics are; with each call's fd
            kinds = [(f"{p}|{c}|{s}", (fd, st, r)) for p, fd, c, s, st, r in rows]
            return ([(k, detail) for k, detail in kinds if "notable" not in detail[2]],
                    Counter(k for k, detail in kinds if "notable" in detail[2]))

        rows = pipe.wait_for("select path, fd, cmd, sub, status, reasons from driver_calls "
                             "where pid = ? and start_time = ?", [key.pid, key.start_time],
                             lambda r: {k for k, _ in stored(r)[0]} | set(stored(r)[1])
                             >= failing)
        repeatable, notable = stored(rows)
        by_kind = Counter(kind for kind, _ in repeatable)
        assert set(by_kind) | set(notable) == failing and len(by_kind) >= 3
        assert notable and min(notable.values()) > 100     # not held back as repeats
        # the same kind, the same fd and result: once a window
        assert max(Counter(repeatable).values()) <= 1 + int(elapsed // 10), repeatable
        held = sum(expected[kind]["errors"] for kind in by_kind) - len(repeatable)
        assert held > 100 * len(repeatable)
        # what the probe held back: all but the stored ones, of those that reached it (this
        # burst from four threads overfills the ring buffer: the rest are counted as lost)
        counted = pipe.wait_for(
            "select json_extract(counters, '$.repeated_calls_counted'), "
            "json_extract(counters, '$.records') from source_health "
            "where source = 'fdtrack'", [], lambda r: r and r[0][0] > 50 * len(repeatable))
        assert held >= counted[0][0] > 50 * len(repeatable)
        # told in the kernel: the calls held back never reached user space as records
        # (those that did are the calls stored, notable ones included, and a few opens)
        # (the probes read a burst at a bounded pace, probes/privileged.py: the last records
        # read may still be on their way to the store)
        rows = pipe.wait_for("select path, fd, cmd, sub, status, reasons from driver_calls "
                             "where pid = ? and start_time = ?", [key.pid, key.start_time],
                             lambda r: counted[0][1] - len(r) < counted[0][0] / 10, timeout=10)
        repeatable, notable = stored(rows)
        beyond_stored = counted[0][1] - sum(notable.values()) - len(repeatable)
        assert beyond_stored < counted[0][0] / 10, (counted, sum(notable.values()))
    finally:
        proc.stdin.close()
        proc.wait(10)


PAGE_END_CHILD = r"""
import ctypes, mmap, os, struct, sys
from gpuwhy.app.demo.replay import send_ioctl
from gpuwhy.nvioctl import iowr
libc = ctypes.CDLL(None, use_errno=True)
page = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(area))
assert libc.mprotect(ctypes.c_void_p(base + page), page, 0) == 0   # PROT_NONE
fd = os.open(sys.argv[1], os.O_RDWR)
struct.pack_into("<i", area, page - 4, 7)           # NV_ESC_REGISTER_FD's one field, last
params = (ctypes.c_char * 4).from_buffer(area, page - 4)
send_ioctl(fd, iowr(0xC9, 4), params)
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def test_a_struct_at_the_end_of_a_mapping_is_decoded_field_by_field(
        pipeline_for, probe_config, replay):
    """The probe reads the start of a call's parameters in one go (a fixed prefix). A short
    struct that ends where the mapping ends makes that read fail: its fields are then read
    one by one, not lost."""
    pipe = pipeline_for(probe_config)
    device = replay.directory / "nvidia0"
    device.touch()
    proc = subprocess.Popen([sys.executable, "-c", PAGE_END_CHILD, str(device)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        key = process_key(int(proc.stdout.readline()))
        rows = pipe.wait_for("select op, size, arg0 from driver_calls where pid = ? and "
                             "start_time = ?", [key.pid, key.start_time], lambda r: r)
        assert rows == [("NV_ESC_REGISTER_FD", 4, 7)]
    finally:
        proc.communicate("\n", timeout=10)


def test_a_tail_call_that_does_not_load_fails_the_load_with_its_name(tmp_config, monkeypatch):
    from gpuwhy.errors import ProbeLoadError
    from gpuwhy.probes import fdtrack

    monkeypatch.setitem(fdtrack.ENTER_TAILS, "ENTER_INHERIT", b"no_such_program")
    probe = fdtrack.FdTrackProbe(tmp_config, lambda event: None)
    with pytest.raises(ProbeLoadError) as failed:
        probe.load()
    assert "tail call ENTER_INHERIT" in str(failed.value)
    probe.close()


def test_a_process_seen_carries_only_the_recorded_environment(pipeline_for, probe_config,
                                                              replay):
    """The probes (root) read the process's environment: the variables of
    probes.environment it has set reach processes.env, and no other."""
    pipe = pipeline_for(probe_config.replace({"probes.environment":
                                              "CUDA_LAUNCH_BLOCKING,NCCL_DEBUG"}))
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1", "GPUWHY_TEST_SECRET": "not-recorded"}
    env.pop("NCCL_DEBUG", None)
    proc = subprocess.Popen([*replay.command, str(replay.directory), "--rounds", "1",
                             "--threads", "1", "--hold"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        key = process_key(json.loads(proc.stdout.readline())["pid"])
        rows = pipe.wait_for("select env from processes where pid = ? and start_time = ?",
                             [key.pid, key.start_time], lambda r: r and r[0][0] is not None)
        assert rows and json.loads(rows[0][0]) == {"CUDA_LAUNCH_BLOCKING": "1"}
    finally:
        proc.communicate("\n", timeout=10)
