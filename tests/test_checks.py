"""`gpuwhy check`/`baseline` pieces without privilege: expectations over in-memory signals,
baseline comparison, environment detection, JUnit output, charts, and usage errors."""

import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from gpuwhy.app.checks import baseline
from gpuwhy.app.checks.environment import process_libraries, versions_from_libraries
from gpuwhy.app.checks.expectations import canonical, evaluate, parse
from gpuwhy.app.checks.output import write_junit
from gpuwhy.app.cli import cli
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.events import DriverCallStats, GpuSample, GpuSeen, GpuXid, SchedStats
from gpuwhy.identity import ProcessKey
from gpuwhy.rules import model as m
from gpuwhy.rules.parser import RuleSyntaxError
from gpuwhy.webui.reports.svg import line_chart, nice_ceiling

S = NS_PER_SECOND
T0 = 1_800_000_000 * S
GPU = "GPU-11111111-2222-3333-4444-555555555555"
PROC = ProcessKey(4242, 777)


def _signals(sm_active: float = 0.8, xids: int = 0, seconds: int = 10,
             sleep_share: float = 0.1, calls_per_s: int = 40) -> MemorySignals:
    signals = MemorySignals()
    signals.add(GpuSeen(ts=T0, gpu_id=GPU, uuid=GPU, index=0, minor=0,
                        pci_bus_id="0000:18:00.0", model="NVIDIA H100 80GB HBM3",
                        source="sim", simulated=True))
    for i in range(seconds * 5):                       # 5 Hz
        ts = T0 + i * S // 5
        signals.add(GpuSample(ts=ts, gpu_id=GPU, source="sim", simulated=True, fields={
            "sm_active": sm_active + (0.01 if i % 2 else -0.01), "mem_util": 30.0 + i % 10,
            "gpu_util": 90.0, "temp_c": 60.0}))
    for i in range(seconds):
        ts = T0 + i * S
        on = int((1 - sleep_share) * S)
        signals.add(SchedStats(ts=ts, process=PROC, interval_ns=S, worker_processes=0,
                               own={"on_cpu_ns": on, "runqueue_ns": 0, "sleep_ns": S - on,
                                    "blocked_ns": 0}, workers={}))
        signals.add(DriverCallStats(ts=ts, process=PROC, path="/dev/nvidiactl",
                                    device="nvidiactl", ops=[
            {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 0, "sub_name": "",
             "count": calls_per_s * (i + 1), "errors": 0, "latency_sum_ns": 0,
             "latency_max_ns": 0, "bytes": 0, "latency_log2": []}]))
    for i in range(xids):
        signals.add(GpuXid(ts=T0 + (3 + i) * S, gpu_id=GPU, source="sim", simulated=True,
                           xid=79, detail="fell off the bus"))
    return signals


def _end(seconds: int = 10) -> int:
    return T0 + seconds * S - S // 5


def test_short_names_and_windowless_aggregates_are_rewritten():
    assert canonical("sm_active") == "gpu.sm_active"
    assert canonical("copy_util") == "gpu.mem_copy_util"
    assert canonical("proc.sleep_frac") == "proc.sleep_frac"
    assert canonical("launch_rate") == "cuda.launch_rate"
    node = parse("mean(sm_active) >= 0.6", window_ns=5 * S)
    assert isinstance(node, m.Cmp)
    assert node.left.func == "mean"
    assert node.left.args[0].name == "gpu.sm_active" and node.left.args[0].kind == "signal"
    assert node.left.args[1] == m.Dur(5 * S)
    explicit = parse("p95(gpu.mem_copy_util, 2s) <= 0.8")
    assert explicit.left.args[1].ns == 2 * S     # a window that was given is kept
    xid = parse("count(xid) == 0")
    assert xid.left.func == "max"
    assert [c.args[0].name for c in xid.left.args] == ["journal.xid", "gpu.xid"]


@pytest.mark.parametrize("text, column, words", [
    ("mean(sm_active) >= ", 19, "unexpected end"),
    ("mean(sm_activ) > 1", 6, "did you mean"),
    ("bogus(sm_active) > 1", 1, "unknown function"),
    ("mean(sm_active) >> 1", 18, "unexpected"),
])
def test_bad_expectations_say_where(text, column, words):
    with pytest.raises(RuleSyntaxError) as err:
        parse(text)
    assert err.value.column == column
    assert words in err.value.message


def test_expectations_pass_fail_and_no_data_with_observed_values():
    signals = _signals(sm_active=0.8, xids=2)
    results = evaluate(["mean(sm_active) >= 0.6", "mean(sm_active) >= 0.9",
                        "count(xid) == 0", "p95(copy_util) <= 0.8",
                        "mean(proc.sleep_frac) < 0.5", "rate(ioctls) > 30",
                        "mean(gpu.power_w) < 500"],
                       signals, Scope(GPU, PROC), T0, _end())
    by = {r.expectation: r for r in results}
    assert by["mean(sm_active) >= 0.6"].passed is True
    assert by["mean(sm_active) >= 0.6"].observed == pytest.approx(0.8, abs=0.011)
    assert by["mean(sm_active) >= 0.9"].passed is False
    assert by["count(xid) == 0"].passed is False and by["count(xid) == 0"].observed == 2
    assert by["p95(copy_util) <= 0.8"].observed == pytest.approx(0.39)
    assert by["mean(proc.sleep_frac) < 0.5"].observed == pytest.approx(0.1)
    assert by["rate(ioctls) > 30"].observed == pytest.approx(40.0)
    power = by["mean(gpu.power_w) < 500"]
    assert power.passed is None and power.outcome == "no data"
    assert "gpu.power_w" in power.missing


def test_the_window_is_the_watch_not_everything_kept():
    signals = _signals(xids=1)      # the Xid is at T0 + 3 s
    late = evaluate(["count(xid) == 0"], signals, Scope(GPU, PROC), T0 + 4 * S, _end())
    assert late[0].passed is True and late[0].observed == 0


def test_baseline_flags_only_moves_in_the_bad_direction():
    scope = Scope(GPU, PROC)
    healthy = baseline.capture(_signals(sm_active=0.85, sleep_share=0.05), scope, T0, _end())
    starved = baseline.capture(_signals(sm_active=0.3, sleep_share=0.7, calls_per_s=15),
                               scope, T0, _end())
    better = baseline.capture(_signals(sm_active=0.95, sleep_share=0.0, calls_per_s=60),
                              scope, T0, _end())
    assert set(healthy["gpu.sm_active"]) == {"p5", "p50", "p95", "mean", "n"}
    assert healthy["proc.ioctl.total/s"]["value"] == pytest.approx(40.0)
    flagged = {(c.figure, c.stat) for c in baseline.compare(healthy, starved, 0.1) if c.flagged}
    assert ("gpu.sm_active", "p50") in flagged
    assert ("proc.sleep_frac", "mean") in flagged
    assert ("proc.ioctl.total/s", "value") in flagged
    assert not any(f == "gpu.temp_c" for f, _ in flagged)          # unchanged
    assert not any(f == "gpu.mem_copy_util" for f, _ in flagged)   # no good direction
    assert not [c for c in baseline.compare(healthy, better, 0.1) if c.flagged]
    assert not [c for c in baseline.compare(healthy, healthy, 0.0) if c.flagged]


def test_environment_from_mapped_libraries(tmp_path):
    torch = tmp_path / "venv/lib/python3.11/site-packages/torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "version.py").write_text("__version__ = '2.3.1+cu121'\ncuda: Optional[str] = "
                                      "'12.1'\ngit_version = 'x'\n")
    maps = tmp_path / "proc/4242/maps"
    maps.parent.mkdir(parents=True)
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        f"7f01-7f02 r-xp 00000000 08:01 2 {torch}/lib/libtorch_cuda.so\n"
        "7f02-7f03 r-xp 00000000 08:01 3 /opt/cuda/lib64/libcudart.so.12.4.127\n"
        "7f03-7f04 r-xp 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n"
        "7f05-7f06 rw-p 00000000 00:00 0\n")
    libraries = process_libraries(4242, str(tmp_path / "proc"))
    assert len(libraries) == 3
    assert versions_from_libraries(libraries) == {
        "torch": "2.3.1+cu121", "torch_cuda": "12.1", "cuda_runtime": "12.4.127",
        "cuda_driver_lib": "550.54.15"}
    assert process_libraries(999999, str(tmp_path / "proc")) == []


def test_junit_report_has_one_case_per_expectation(tmp_path):
    path = tmp_path / "check.xml"
    write_junit(path, "gpuwhy check", [("mean(sm_active) >= 0.6", True, "observed 0.8"),
                                       ("count(xid) == 0", False, "observed 2 <&>"),
                                       ("mean(power) < 1", None, "no data")], 3.0)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = suite.findall("testcase")
    assert cases[0].find("failure") is None
    assert cases[1].find("failure").get("message") == "observed 2 <&>"
    assert cases[2].find("failure").get("type") == "no data"


def test_chart_escapes_labels_and_breaks_on_gaps():
    svg = str(line_chart("<b>t</b>", "%", [("<script>x</script>", [(T0, 1.0), (T0 + S, 2.0),
                                                                    (T0 + 2 * S, None),
                                                                    (T0 + 3 * S, 3.0),
                                                                    (T0 + 4 * S, 4.0)])],
                         T0, T0 + 4 * S, [(T0 + S, "<img src=x>")]))
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg
    assert svg.count("<polyline") == 2           # the gap splits the line
    assert nice_ceiling(0.97) == 1 and nice_ceiling(573) == 1000 and nice_ceiling(0) == 1


@pytest.mark.parametrize("args", [
    ["check", "--expect", "mean(sm_active) > 0.5", "--duration", "1"],          # no target
    ["check", "--expect", "mean(sm_activ) > 0.5", "--pid", "1"],                # bad name
    ["check", "--expect", "mean(sm_active) > 0.5", "--pid", "1", "--cmd", "true"],
    ["check", "--pid", "1"],                                                    # no --expect
    ["report"],                                                                 # no subject
    ["report", "--process", "nope"],
])
def test_usage_errors_exit_2(args, tmp_config):
    result = CliRunner().invoke(cli, args, env={"GPUWHY_DB": tmp_config["store.path"]})
    assert result.exit_code == 2, result.output


def test_environment_errors_exit_2(tmp_path):
    env = {"GPUWHY_DB": str(tmp_path / "none.db")}
    runner = CliRunner()
    result = runner.invoke(cli, ["check", "--source", "service", "--pid", "1", "--duration",
                                 "1", "--expect", "count(xid) == 0"], env=env)
    assert result.exit_code == 2 and "no gpuwhy service" in result.output
    for args in (["baseline", "show", "nope"], ["baseline", "delete", "nope"],
                 ["baseline", "compare", "nope", "--pid", "1"]):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 2 and "no baseline named 'nope'" in result.output
    result = runner.invoke(cli, ["baseline", "list"], env=env)
    assert result.exit_code == 0 and "no baselines" in result.output
