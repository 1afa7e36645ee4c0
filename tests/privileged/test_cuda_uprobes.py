"""The CUDA uprobes, for real, on stand-in libcuda/libcudart built here (tests/replay/fakecuda*):
every figure of known calls, the kill switch, the build-id allow-list, automatic detach."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.probes.cuda.libraries import build_id
from gpuwhy.proc import process_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "replay"))
import fakecuda  # noqa: E402

pytestmark = pytest.mark.root
INT3 = 0xCC
MIB = 1 << 20


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return fakecuda.build(tmp_path_factory.mktemp("fakecuda"))


class Program:
    """cudaprog, holding a look-alike device file: a GPU process for fdtrack."""

    def __init__(self, built, device: Path):
        device.touch()
        self.proc = subprocess.Popen([str(built["prog"]), str(device)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = json.loads(self.proc.stdout.readline())["pid"]
        self.key = process_key(self.pid)
        self.addrs = self.ask("addrs")

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def first_byte(self, function: str) -> int:
        with open(f"/proc/{self.pid}/mem", "rb") as mem:
            mem.seek(self.addrs[function])
            return mem.read(1)[0]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(10)


@pytest.fixture
def program(built, tmp_config):
    made = []

    def start():
        made.append(Program(built, Path(tmp_config["probes.device_glob"]).parent / "nvidiactl"))
        return made[-1]
    yield start
    for one in made:
        one.close()


def cuda_config(tmp_config, tmp_path, built, **extra):
    ids = ",".join(build_id(built[name]) for name in ("libcuda", "libcudart"))
    return tmp_config.replace({"probes.cuda_uprobes": True,
                               "probes.cuda_allowed_build_ids": ids,
                               "probes.cuda_control_dir": str(tmp_path / "ctl"),
                               "probes.cuda_slow_call_ms": 5.0,
                               "probes.cuda_big_copy_bytes": MIB,
                               "probes.error_events_per_second": 100000, **extra})


def libraries(pipe, pid, state):
    return pipe.query("select json_extract(body, '$.path'), json_extract(body, '$.build_id'), "
                      "json_extract(body, '$.reason') from events where kind = 'cuda_library' "
                      "and pid = ? and json_extract(body, '$.state') = ?", [pid, state])


def wait_attached(pipe, prog, count=2):
    rows = pipe.wait_for("select count(*) from events where kind = 'cuda_library' and pid = ? "
                         "and json_extract(body, '$.state') = 'attached'", [prog.pid],
                         lambda r: r[0][0] >= count, timeout=90)
    assert rows[0][0] == count, libraries(pipe, prog.pid, "refused") or \
        libraries(pipe, prog.pid, "failed")


def totals(pipe, prog):
    """Every cuda_stats row of the program, summed (detail JSON merged)."""
    rows = pipe.query("select calls, errors, detail, traced_since_start from cuda_stats "
                      "where pid = ? and start_time = ?", [prog.pid, prog.key.start_time])
    sums = {"calls": 0, "errors": 0, "rows": len(rows), "since_start": {r[3] for r in rows}}
    merged: dict = {}
    for calls, errors, detail, _ in rows:
        sums["calls"] += calls
        sums["errors"] += errors
        _merge(merged, json.loads(detail))
    sums.update(merged)
    return sums


def _merge(into, part):
    for key, value in part.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        elif isinstance(value, list):
            into[key] = [a + b for a, b in zip(into.get(key, [0] * len(value)), value, strict=True)]
        else:
            into[key] = into.get(key, 0) + value


def wait_calls(pipe, prog, calls):
    pipe.wait_for("select coalesce(sum(calls), 0) from cuda_stats where pid = ?", [prog.pid],
                  lambda r: r[0][0] >= calls, timeout=15)
    return totals(pipe, prog)


def test_every_count_size_direction_and_blocked_time_of_a_process_started_before(
        pipeline_for, tmp_config, tmp_path, built, program):
    prog = program()                           # running before gpuwhy starts
    expected_result = prog.ask("round")        # untraced: the reference results
    pipe = pipeline_for(cuda_config(tmp_config, tmp_path, built))
    wait_attached(pipe, prog)
    assert prog.first_byte("cuStreamSynchronize") == INT3
    assert prog.first_byte("cudaMemcpy") == INT3
    assert prog.first_byte("cuDriverGetVersion") != INT3        # not traced
    rounds = [prog.ask("round") for _ in range(2)]
    assert rounds == [expected_result] * 2     # the probes change nothing the program sees
    got = wait_calls(pipe, prog, 88)
    n = 2
    assert got["calls"] == 44 * n              # outermost calls only: runtime->driver once
    assert got["errors"] == 1 * n              # the failed 2^50-byte allocation
    assert got["since_start"] == {0}           # found by the start-up scan
    assert got["launches"] == {"cuLaunchKernel": 3 * n, "cuLaunchKernelEx": 1 * n,
                               "cudaLaunchKernel": 5 * n, "cudaLaunchKernelExC": 1 * n}
    grid = [0] * 32
    grid[3], grid[4], grid[8], grid[9] = 3 * n, 1 * n, 5 * n, 1 * n    # 8, 27, 256, 1000 blocks
    assert got["grid_log2"] == grid
    block = [0] * 16
    block[7], block[8], block[9] = 4 * n, 1 * n, 5 * n   # 128, 256, 512 = dim3(32, 8, 2) threads
    assert got["block_log2"] == block
    copies = got["copies"]
    assert {d: (c["count"], c["bytes"]) for d, c in copies.items()} == {
        "htod": (5 * n, (65536 + MIB + 524288 + 200000 + 4096) * n),
        "dtoh": (3 * n, (300000 + 4000 + 100000) * n),
        "dtod": (1 * n, 1000 * n), "htoh": (1 * n, 1000 * n), "unknown": (1 * n, 5000 * n)}
    assert (copies["htod"]["pinned_bytes"], copies["htod"]["pageable_bytes"]) == \
        ((65536 + 524288 + 4096) * n, (MIB + 200000) * n)
    assert (copies["dtoh"]["pinned_bytes"], copies["dtoh"]["pageable_bytes"]) == \
        ((4000 + 100000) * n, 300000 * n)
    assert copies["htod"]["async_count"] == 2 * n and copies["dtoh"]["async_count"] == 1 * n
    sleeps_ms = {"cuStreamSynchronize": (2, 20), "cuCtxSynchronize": (1, 30),
                 "cuEventSynchronize": (1, 10), "cudaDeviceSynchronize": (1, 30),
                 "cudaStreamSynchronize": (1, 20), "cudaEventSynchronize": (1, 10)}
    for api, (count, ms) in sleeps_ms.items():
        sync = got["syncs"][api]
        assert sync["count"] == count * n, api
        floor = count * n * ms * 1_000_000
        assert floor <= sync["blocked_ns"] <= floor + count * n * 50_000_000, (api, sync)
    assert sum(got["sync_log2"]) == 7 * n
    assert got["memory"] == {"allocs": 2 * n, "alloc_bytes": 4 * MIB * n, "frees": 2 * n,
                             "free_bytes": 4 * MIB * n, "host_allocs": 2 * n,
                             "host_alloc_bytes": (2 * MIB + 512 * 1024) * n,
                             "host_frees": 3 * n, "registers": 1 * n,
                             "register_bytes": MIB * n}
    calls = pipe.query("select api, reasons, bytes, direction, host, ret from cuda_calls "
                       "where pid = ?", [prog.pid])
    slow_syncs = [c for c in calls if "slow" in c[1] and c[0] in sleeps_ms]
    assert sorted({c[0] for c in slow_syncs}) == sorted(sleeps_ms) and len(slow_syncs) == 7 * n
    assert [c for c in calls if "error" in c[1]] == [("cuMemAlloc_v2", "error", 0, None, None,
                                                      2)] * n
    big = sorted((c[0], c[2], c[3], c[4]) for c in calls if "big" in c[1])
    assert big == sorted([("cuMemAlloc_v2", MIB, None, None), ("cudaMalloc", 3 * MIB, None, None),
                          ("cuMemHostAlloc", 2 * MIB, None, None),
                          ("cuMemcpyHtoD_v2", MIB, "htod", "pageable")] * n)
    # The same figures reach the process's timeline second by second (the correlator).
    [timeline] = pipe.query(
        "select sum(cuda_launches), sum(cuda_syncs), sum(cuda_sync_ms), sum(cuda_htod_bytes), "
        "sum(cuda_dtoh_bytes), sum(cuda_pageable_bytes), sum(cuda_allocs), sum(cuda_frees) "
        "from process_seconds where pid = ? and start_time = ?", [prog.pid, prog.key.start_time])
    blocked_ms = sum(s["blocked_ns"] for s in got["syncs"].values()) / 1e6
    [(graphs,)] = pipe.query("select sum(graph_launches) from cuda_stats where pid = ?",
                             [prog.pid])
    assert timeline[:2] == (10 * n + graphs, 7 * n)
    assert timeline[2] == pytest.approx(blocked_ms)
    assert timeline[3:] == ((65536 + MIB + 524288 + 200000 + 4096) * n,
                            (300000 + 4000 + 100000) * n, (MIB + 200000 + 300000) * n,
                            4 * n, 2 * n)


def test_kill_switch_detaches_within_a_second_and_the_program_runs_on_unharmed(
        pipeline_for, tmp_config, tmp_path, built, program):
    config = cuda_config(tmp_config, tmp_path, built)
    pipe = pipeline_for(config)
    prog = program()                           # started after gpuwhy: seen opening the device
    wait_attached(pipe, prog)
    prog.proc.stdin.write("loop\n")
    prog.proc.stdin.flush()
    wait_calls(pipe, prog, 44)
    assert prog.first_byte("cuStreamSynchronize") == INT3
    gone_after = []

    def watch():
        started = time.monotonic()
        while time.monotonic() - started < 5:
            if prog.first_byte("cuStreamSynchronize") != INT3 and \
                    prog.first_byte("cudaMemcpy") != INT3:
                gone_after.append(time.monotonic() - started)
                return
            time.sleep(0.005)
    watcher = threading.Thread(target=watch)
    watcher.start()
    result = CliRunner().invoke(cli, ["cuda", "disable", "--reason", "test"],
                                env={"GPUWHY_CUDA_CONTROL_DIR": config["probes.cuda_control_dir"]})
    watcher.join()
    assert result.exit_code == 0, result.output
    assert "cuda uprobes off: detached" in result.output, result.output
    assert gone_after and gone_after[0] < 1.0, gone_after
    time.sleep(1.5)                            # a flush or two: nothing counted any more
    before = totals(pipe, prog)["calls"]
    time.sleep(1.5)
    assert totals(pipe, prog)["calls"] == before
    assert prog.proc.poll() is None
    done = prog.ask("stop")
    assert done["rounds"] >= 3 and done["mismatches"] == 0, done
    detached = libraries(pipe, prog.pid, "detached")
    assert len(detached) == 2 and all("kill switch: test" in r[2] for r in detached)
    status = CliRunner().invoke(cli, ["cuda", "status"], env={
        "GPUWHY_CUDA_CONTROL_DIR": config["probes.cuda_control_dir"]})
    assert "kill switch: test" in status.output and "off, 0 uprobes" in status.output

    result = CliRunner().invoke(cli, ["cuda", "enable"], env={
        "GPUWHY_CUDA_CONTROL_DIR": config["probes.cuda_control_dir"]})
    assert "kill switch cleared" in result.output
    wait_attached(pipe, prog, count=4)         # attached again
    assert prog.first_byte("cuStreamSynchronize") == INT3
    time.sleep(0.5)
    before = totals(pipe, prog)["calls"]
    # The same worker thread goes on: the call it was in when the switch was set never
    # returned through the probes; it must not hide its next calls.
    prog.proc.stdin.write("loop\n")
    prog.proc.stdin.flush()
    time.sleep(1.0)
    again = prog.ask("stop")
    rounds = again["rounds"] - done["rounds"]
    assert rounds >= 2 and again["mismatches"] == 0, again
    assert wait_calls(pipe, prog, before + 44 * rounds)["calls"] == before + 44 * rounds


def test_a_library_whose_build_id_is_not_allowed_is_left_alone(
        pipeline_for, tmp_config, tmp_path, built, program):
    runtime_only = build_id(built["libcudart"])
    pipe = pipeline_for(cuda_config(tmp_config, tmp_path, built,
                                    **{"probes.cuda_allowed_build_ids": runtime_only}))
    prog = program()
    wait_attached(pipe, prog, count=1)
    refused = pipe.wait_for("select 1 from events where kind = 'cuda_library' and pid = ? and "
                            "json_extract(body, '$.state') = 'refused'", [prog.pid], bool)
    assert refused
    (path, found, reason), = libraries(pipe, prog.pid, "refused")
    assert path == str(built["libcuda"]) and found == build_id(built["libcuda"])
    assert "not in probes.cuda_allowed_build_ids" in reason
    assert prog.first_byte("cuStreamSynchronize") != INT3      # libcuda: untouched
    assert prog.first_byte("cudaMemcpy") == INT3               # libcudart: traced
    prog.ask("round")
    got = wait_calls(pipe, prog, 20)
    assert got["launches"] == {"cuLaunchKernel": 0, "cuLaunchKernelEx": 0,
                               "cudaLaunchKernel": 5, "cudaLaunchKernelExC": 1}
    assert got["calls"] == 20                  # the runtime calls of one round
    assert got["syncs"]["cuStreamSynchronize"]["count"] == 0
    assert got["syncs"]["cudaStreamSynchronize"]["count"] == 1


def test_a_process_whose_probe_cost_passes_the_limit_is_detached(
        pipeline_for, tmp_config, tmp_path, built, program):
    pipe = pipeline_for(cuda_config(tmp_config, tmp_path, built,
                                    **{"probes.cuda_max_overhead_pct": 0.0001}))
    costly = program()
    wait_attached(pipe, costly)
    costly.ask("round")
    rows = pipe.wait_for("select json_extract(body, '$.reason') from events where pid = ? "
                         "and kind = 'cuda_library' and json_extract(body, '$.state') = "
                         "'detached'", [costly.pid], lambda r: len(r) == 2)
    assert len(rows) == 2 and all("probes.cuda_max_overhead_pct" in r[0] for r in rows)
    assert costly.first_byte("cuStreamSynchronize") != INT3
    assert costly.ask("round")["rc_sum"] == 2


def test_too_many_probe_errors_set_the_kill_switch(pipeline_for, tmp_config, tmp_path, built,
                                                   program):
    config = cuda_config(tmp_config, tmp_path, built,
                         **{"probes.cuda_max_errors_per_second": 10})
    pipe = pipeline_for(config)
    erring = program()
    wait_attached(pipe, erring)
    assert erring.ask("bad 500") == {"rc_sum": 500}     # a NULL config the probe cannot read
    kill_file = Path(config["probes.cuda_control_dir"], "cuda.disabled")
    deadline = time.monotonic() + 10
    while not kill_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "probes.cuda_max_errors_per_second" in json.loads(kill_file.read_text())["reason"]
    deadline = time.monotonic() + 2
    while erring.first_byte("cuLaunchKernel") == INT3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert erring.first_byte("cuLaunchKernel") != INT3
