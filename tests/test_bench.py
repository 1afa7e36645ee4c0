"""The benchmark suite: its JSON and table (not its timings), `gpuwhy bench`, malloc_trim."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.memory import release_freed_memory

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "scripts" / "bench.py"
sys.path.insert(0, str(REPO / "scripts"))

import bench  # noqa: E402
import bench_sidecar  # noqa: E402

FIGURE_KEYS = {"id", "name", "unit", "runs", "median", "min", "max", "reference",
               "reference_value", "ratio", "goal", "goal_value", "judged", "pass", "note",
               "benchmark"}


def test_quick_run_of_one_benchmark_writes_figures_and_meta(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--only", "gpu",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    meta = results["meta"]
    assert meta["quick"] is True
    assert meta["machine"]["cpus"] == os.cpu_count()
    assert len(meta["load_before"]) == 3 and set(meta["durations"]) == {"gpu"}
    [row] = results["figures"]
    assert FIGURE_KEYS <= row.keys()
    assert row["id"] == "P3" and row["benchmark"] == "gpu" and row["unit"] == "% of one core"
    assert row["runs"] == 1
    for key in ("median", "min", "max"):
        assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] >= 0
    assert row["min"] <= row["median"] <= row["max"]
    [run] = results["raw"]["gpu"]["runs"]
    assert run["gpus"] == 8 and run["fields"] >= 25
    assert run["received"] > 0 and run["dropped"] == 0
    # the table on stdout: one line per figure, under the description of the run
    assert "quick run" in done.stdout and ("no GPU" in done.stdout or "a GPU" in done.stdout)
    assert "| P3 |" in done.stdout and "GPU source alone" in done.stdout


def test_unknown_benchmark_is_refused_with_the_names() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--only", "gpu,nope"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown benchmark nope" in done.stderr and "sidecar" in done.stderr


def test_gpuwhy_bench_runs_the_script() -> None:
    result = CliRunner().invoke(cli, ["bench", "--only", "nope"])
    assert result.exit_code == 2


@pytest.mark.parametrize(("values", "goal", "higher", "judged", "expected"), [
    ([1.0, 2.0, 3.0], 2.0, False, "median", True),
    ([1.0, 2.5, 3.0], 2.0, False, "median", False),
    ([100.0, 90.0, 120.0], 100.0, True, "median", True),
    ([0.1] * 19 + [5.0], 1.0, False, "median", True),
    ([0.1] * 18 + [5.0, 5.0], 1.0, False, "p95", False),
])
def test_figure_judges_its_goal(values: list[float], goal: float, higher: bool, judged: str,
                                expected: bool) -> None:
    row = bench.figure("X", "x", "s", values, goal=f"≤ {goal}", goal_value=goal,
                       higher_is_better=higher, judged=judged)
    assert row["pass"] is expected
    assert row["min"] == min(values) and row["max"] == max(values)


def test_figure_ratio_and_table_rows() -> None:
    row = bench.figure("P1", "added per ioctl", "ns", [100.0, 120.0, 110.0],
                       reference="strace added", reference_value=1000.0, goal="≤ 400",
                       goal_value=400.0)
    assert row["ratio"] == pytest.approx(0.11)
    text = bench.table([row, bench._not_run("P7", "cron chain", "needs root"),
                        {"id": "P4", "name": "x", "unit": "", "runs": 0, "error": "Boom: no"}])
    lines = text.splitlines()
    assert len(lines) == 5
    assert "110.0 [100.0 – 120.0]" in lines[2] and "0.11×" in lines[2] and "pass" in lines[2]
    assert "not run: needs root" in lines[3] and "ERROR: Boom: no" in lines[4]


def test_memory_reads_smaps_rollup() -> None:
    figures = bench_sidecar.memory(os.getpid())
    assert figures["rss_mb"] > figures["anon_mb"] > 0
    assert figures["private_dirty_mb"] > 0


def test_release_freed_memory_gives_heap_pages_back() -> None:
    release_freed_memory()      # what earlier tests freed would otherwise be reused here
    before = bench_sidecar.memory(os.getpid())["anon_mb"]
    blocks = [bytes(2000) for _ in range(40_000)]       # ~80 MB of malloc'ed blocks
    kept = blocks[::16]                                  # holes glibc keeps by itself
    del blocks
    held = bench_sidecar.memory(os.getpid())["anon_mb"]
    release_freed_memory()
    after = bench_sidecar.memory(os.getpid())["anon_mb"]
    assert held - before > 50
    assert held - after > 40, (before, held, after)
    assert len(kept) == 2500


def test_bpf_stats_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gpuwhy.probes.privileged import warn_if_bpf_stats_enabled

    sysctl = tmp_path / "bpf_stats_enabled"
    sysctl.write_text("1\n")
    assert warn_if_bpf_stats_enabled(sysctl) is True
    assert "kernel.bpf_stats_enabled=1" in caplog.text
    caplog.clear()
    sysctl.write_text("0\n")
    assert warn_if_bpf_stats_enabled(sysctl) is False
    assert warn_if_bpf_stats_enabled(tmp_path / "missing") is False
    assert caplog.text == ""


def test_rules_benchmark_measures_rules_the_synthetic_host_feeds() -> None:
    import bench_rules

    rules = bench_rules.measured_rules(30)
    assert len(rules) == 30
    assert not [r.id for r in rules if any(s.startswith("cuda.") for s in r.requires)]


def test_fdtrack_health_says_when_the_kernel_times_every_probe_run(
        tmp_config, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwhy.probes import fdtrack

    probe = fdtrack.FdTrackProbe(tmp_config, lambda event: None)
    monkeypatch.setattr(probe, "counters", lambda: {"dropped_ringbuf": 0})   # no maps loaded
    monkeypatch.setattr(fdtrack, "bpf_stats_enabled", lambda: True)
    health = probe.health()
    assert health.state == "ok" and "kernel.bpf_stats_enabled=1" in health.detail
    monkeypatch.setattr(fdtrack, "bpf_stats_enabled", lambda: False)
    assert "bpf_stats" not in probe.health().detail


def test_cpu_seconds_counts_children_that_have_exited() -> None:
    """A helper the sidecar starts and waits for (systemd-analyze) is its cost too."""
    before = bench_sidecar.cpu_seconds(os.getpid())
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                    "while time.process_time() < end: pass"], check=True)
    spent = bench_sidecar.cpu_seconds(os.getpid()) - before
    assert 0.25 < spent < 2.0, spent


def test_cpu_seconds_counts_every_live_thread_to_the_nanosecond() -> None:
    before = bench_sidecar.cpu_seconds(os.getpid())
    done, measured = threading.Event(), threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    def worker_spin() -> None:
        spin()
        done.set()
        measured.wait(10)        # alive when measured: an ended thread's count is gone
    worker = threading.Thread(target=worker_spin)
    worker.start()
    spin()
    done.wait(10)
    spent = bench_sidecar.cpu_seconds(os.getpid()) - before
    measured.set()
    worker.join()
    assert 0.39 < spent < 2.0, spent
    assert spent != round(spent, 2)      # not a count of 10 ms ticks


def test_writing_benchmarks_md_replaces_only_the_last_full_run():
    """--write-md on the file as it is keeps what was written by hand after the table (each
    pass's section); a file without the section is written whole."""
    import bench_notes

    existing = ("# Benchmarks\n\nintro\n\n## Last full run\n\nold run.\n\n| old | table |\n\n"
                "## What each figure means\n\nfigures\n\n## A pass (issue #23)\n\nkept\n")
    written = bench_notes.benchmarks_md("new run", "| new | table |", existing)
    assert written.startswith("# Benchmarks\n\nintro\n\n## Last full run\n\nnew run.\n\n"
                              "| new | table |\n\n## What each figure means\n")
    assert written.endswith("## A pass (issue #23)\n\nkept\n")
    assert "old" not in written
    fresh = bench_notes.benchmarks_md("new run", "| new | table |")
    assert fresh.startswith(bench_notes.HEADER) and "## What was not measurable here" in fresh
    assert bench_notes.benchmarks_md("new run", "| t |", "no such section\n") == \
        bench_notes.benchmarks_md("new run", "| t |")


def test_against_compares_the_same_windows_of_two_builds() -> None:
    difference = bench_sidecar.compare([1.0, 0.8, 1.2], [1.1, 1.0, 1.0])
    assert difference["median"] == pytest.approx(-0.1)
    assert difference["mean"] == pytest.approx(-0.1 / 3)
    assert (difference["lower"], difference["windows"]) == (2, 3)
    assert difference["relative"] == pytest.approx(-0.1)
    with pytest.raises(ValueError):          # windows are paired, never matched loosely
        bench_sidecar.compare([1.0], [1.0, 2.0])


def test_against_reads_both_builds_memory_apart_and_tabulates_it() -> None:
    me = os.getpid()
    pids = {("this checkout", "service"): me, ("abc123", "service"): me,
            ("abc123", "probes"): me}
    anon: dict = {"this checkout": {}, "abc123": {}}
    bench_sidecar._read_anon(pids, anon)
    bench_sidecar._read_anon(pids, anon)
    mine = bench_sidecar.memory(me)["anon_mb"]
    assert len(anon["abc123"]["total"]) == 2 and set(anon["this checkout"]) == {
        "service", "total"}
    assert anon["abc123"]["total"][0] == pytest.approx(2 * anon["abc123"]["service"][0])
    assert anon["this checkout"]["service"][0] == pytest.approx(mine, rel=0.5)
    result = {"gpus": 8, "processes": 16, "rounds": 1, "windows": 1, "window_s": 10,
              "warmup_s": 30, "builds": ["this checkout", "abc123"],
              "per_build": {"this checkout": {"total": [1.0]}, "abc123": {"total": [2.0]}},
              "difference": bench_sidecar.compare([1.0], [2.0]), "settle_s": 600,
              "anon_mb": {"windows": {"this checkout": {"total": [70.0, 72.0]},
                                      "abc123": {"total": [75.0, 80.0]}},
                          "settled": {"this checkout": {}, "abc123": {}}}}
    text = bench_sidecar.against_table(result)
    assert "| total | 71.0 [70.0–72.0] | 77.5 [75.0–80.0] |" in text
    assert "anonymous MB after the windows" in text and "10 min after" not in text
    result["anon_mb"]["settled"] = {"this checkout": {"total": [74.0]},
                                    "abc123": {"total": [83.0]}}
    assert "| total | 74.0 [74.0–74.0] | 83.0 [83.0–83.0] |" in \
        bench_sidecar.against_table(result).split("10 min after the start")[1]
    assert "short-lived" not in bench_sidecar.against_table(result)
    result["churn_rate"] = 20.0      # --churn with --against: both sidecars see them
    assert "20 short-lived host processes a second" in bench_sidecar.against_table(result)


def test_a_sidecar_runs_the_build_on_its_pythonpath_even_from_the_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --against puts another build first on PYTHONPATH; `python -m` started from the
    # checkout would put the checkout before it and run this build twice.
    site = tmp_path / "site" / "gpuwhy"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "__main__.py").write_text(
        "import os, sys, time\n"
        "open(os.environ['GPUWHY_DB'] + '.ran', 'w').write(__file__)\n"
        "print('start-up scan done', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n")
    monkeypatch.chdir(REPO)
    sidecar = bench_sidecar.Sidecar(tmp_path / "work", 1, 0)
    sidecar.env["PYTHONPATH"] = str(site.parent)
    sidecar.start(timeout=60)
    try:
        ran = (tmp_path / "work" / "bench.db.ran").read_text()
    finally:
        sidecar.stop()
    assert Path(ran).parent == site


def test_against_refuses_what_names_no_commit() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_sidecar.py"),
                           "--against", "no-such-revision"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "not a commit" in done.stderr and "no-such-revision" in done.stderr
    assert bench_sidecar.resolve_commit("HEAD") == subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
        check=True).stdout.strip()


def test_possible_cpus_reads_the_kernels_ranges(tmp_path):
    ranges = tmp_path / "possible"
    ranges.write_text("0-1,4-7,9\n")
    assert bench_sidecar.possible_cpus(str(ranges)) == 7


def test_the_spawner_starts_short_lived_processes_at_its_rate() -> None:
    with bench_sidecar.Spawner(40.0) as spawner:
        time.sleep(1.0)
    assert 20 <= spawner.started <= 45         # generous: a loaded machine falls behind


def test_churn_and_settled_rows_judge_the_goals_and_say_each_process_cost() -> None:
    churn = {"rate": 20.0, "quiet_pct": [0.8, 0.9], "churn_pct": [1.1, 1.3],
             "processes_per_s": [20.0, 20.0]}
    busy, added = bench.churn_rows(churn, "8 GPUs")
    assert busy["reference_value"] == pytest.approx(0.85) and busy["pass"] is None
    assert added["min"] == pytest.approx(150.0)      # (1.1 − 0.8) % of a core ÷ 20 a second
    assert added["max"] == pytest.approx(200.0)
    settled = {"after_s": 601.0, "service (gpuwhy up)": {"anon_mb": 53.2, "rss_mb": 69.8},
               "probes": {"anon_mb": 37.3, "rss_mb": 55.2}}
    anon, rss = bench.settled_rows(settled, "8 GPUs", bench_sidecar.GOALS, churn)
    assert anon["name"].startswith("anonymous memory, total, after 10 minutes")
    assert anon["median"] == pytest.approx(90.5) and anon["pass"] is False
    assert rss["median"] == pytest.approx(125.0) and rss["pass"] is True
    assert "service 53.2, probes 37.3" in anon["note"]


_READER = """
import sys, time
buf = bytearray(b"\\1" * (int(sys.argv[1]) << 20))
print("ready", flush=True)
while True:
    if sys.argv[2] == "read":
        sum(buf[i] for i in range(0, len(buf), 4096))
    time.sleep(0.05)
"""


@pytest.mark.parametrize("what", ["read", "sleep"])
def test_touched_counts_the_memory_a_process_reads_each_second(what: str) -> None:
    """bench_sidecar.touched: a process reading its 32 MB buffer over and over touches it
    all within the second; one asleep beside the same buffer touches next to nothing."""
    child = subprocess.Popen([sys.executable, "-c", _READER, "32", what],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        [mb] = bench_sidecar.touched({"child": child.pid}, window=1.0).values()
    finally:
        child.kill()
        child.wait()
    if what == "read":
        assert 32 <= mb < 64, mb
    else:
        assert mb < 4, mb


def test_host_pace_and_its_rows_say_what_a_page_left_alone_costs() -> None:
    pace = bench_sidecar.host_pace(gap=0.05, runs=2, pages=64)
    assert pace["gap_s"] == 0.05
    assert pace["cold_us_per_page"] > 0 and pace["hot_us_per_page"] > 0
    result = {"touched_mb_per_s": {"service (gpuwhy up)": [6.0, 8.0, 7.0],
                                   "probes": [1.0, 1.0, 2.0]},
              "pace": [{"gap_s": 1.0, "cold_us_per_page": 20.0, "hot_us_per_page": 0.2},
                       {"gap_s": 1.0, "cold_us_per_page": 10.0, "hot_us_per_page": 0.1}]}
    line = bench_sidecar.pace_line(result)
    # 8 MB a second is 2048 pages; at the worse of the two paces, 20 µs each: 4.1 % of a core
    assert "service 7.0 MB, probes 1.0 MB" in line and "20.00 then 10.00 µs" in line
    assert "up to 4.10 % of a core" in line
    touched, cold = bench.pace_rows(result, "idle")
    assert (touched["median"], touched["min"], touched["max"]) == (9.0, 7.0, 9.0)  # 7, 9, 9
    assert cold["median"] == 15.0 and cold["ratio"] == pytest.approx(15.0 / 0.15)


_THREADS = """
import sys, threading, time
from gpuwhy.threads import Thread
def spin():
    while True:
        sum(range(1000))
def tick():
    while True:
        time.sleep(0.02)
Thread(target=spin, name="gpuwhy-spinner", daemon=True).start()
Thread(target=tick, name="gpuwhy-ticker", daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


def test_thread_profile_says_which_thread_runs_and_which_wakes() -> None:
    """bench_sidecar's thread-by-thread figures: a thread that spins takes most of a core;
    a thread that sleeps 20 ms at a time wakes 50 times a second, and up to three times as
    often counted in switches (each wake-up also waits for the spinner's GIL: 129-160 read
    here); the main thread, asleep, hardly at all. Each by the name gpuwhy gave it in the
    kernel; the table puts the busiest first and totals them."""
    child = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        before = {"service (gpuwhy up)": bench_sidecar.thread_counts(child.pid)}
        time.sleep(1.0)
        after = {"service (gpuwhy up)": bench_sidecar.thread_counts(child.pid)}
    finally:
        child.kill()
        child.wait()
    profile = bench_sidecar.thread_profile(before, after, 1.0)["service (gpuwhy up)"]
    assert {"spinner", "ticker", "python"} <= set(profile)
    assert list(profile)[0] == "spinner"                # sorted by CPU, most first
    assert profile["spinner"]["cpu_pct"] > 20
    assert profile["ticker"]["cpu_pct"] < profile["spinner"]["cpu_pct"] / 4
    assert 25 <= profile["ticker"]["wakeups_per_s"] <= 500
    assert profile["python"]["wakeups_per_s"] < 10
    table = bench_sidecar.threads_table({"busy": {"service (gpuwhy up)": profile},
                                         "idle": {"probes": {"python": {
                                             "cpu_pct": 0.0001, "wakeups_per_s": 3.0}}}})
    lines = table.splitlines()
    assert lines[0] == ("| process | thread | busy % core | busy wake-ups/s | idle % core "
                        "| idle wake-ups/s |")
    assert lines[2].startswith("| service | spinner | ")
    assert not any(line.startswith("| probes |") for line in lines)   # under 0.001 % in both
    assert lines[-1].startswith("| **all** | | **")


def test_benchmarks_md_keeps_the_thread_table_within_the_last_full_run() -> None:
    import bench_notes

    existing = "# Benchmarks\n\n## Last full run\n\nold.\n\n| old |\n\n## A pass\n\nkept\n"
    once = bench_notes.benchmarks_md("run", "| t |", existing, "| thread | table |")
    twice = bench_notes.benchmarks_md("run", "| t |", once, "| thread | table 2 |")
    for written, table in ((once, "| thread | table |"), (twice, "| thread | table 2 |")):
        assert written.count("### Where P3's CPU goes, thread by thread") == 1
        section = written[written.index("## Last full run"):written.index("## A pass")]
        assert section.endswith(f"{table}\n\n")
    assert "table |" not in twice and twice.endswith("## A pass\n\nkept\n")


def test_correlator_pace_is_paired_side_by_side_and_leaves_no_store_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    import bench_correlator

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    order: list[str] = []
    for name in ("throughput", "floor"):
        real = getattr(bench_correlator, name)
        monkeypatch.setattr(bench_correlator, name,
                            lambda total, batch, real=real, name=name:
                            order.append(name) or real(total, batch))
    runs, floors = bench_correlator.paired(3_000, 3)
    # each pair side by side, the one run first in turn: the VM's drift falls on both
    assert order == ["throughput", "floor", "floor", "throughput", "throughput", "floor"]
    assert [r["batch"] for r in runs] == [256] * 3
    # every event written: the publishing child's last messages too (lost at its exit once)
    assert [(r["written"], r["unwritten"]) for r in runs] == [(3_000, 0)] * 3
    assert all(f["received"] == 3_000 and f["rate"] > 0 for f in floors)
    assert list(tmp_path.iterdir()) == []       # every run's store and bus socket removed
