#!/usr/bin/env python3
"""bench: every performance figure of gpuwhy in one table, beside its reference and its goal.

USAGE: sudo .venv/bin/python scripts/bench.py [--quick] [--only NAME[,NAME...]]
                                              [--json FILE|-] [--write-md FILE]
       (or `sudo gpuwhy bench ...`, the same)

Runs the per-component benchmarks of scripts/ (imported, not copied) and this one's own
whole-sidecar figure, and prints one markdown table: each figure's median over repeated
runs with its min and max, its reference where there is one (no probes, strace, the seed
tool's figures), the ratio to it, the goal and a pass/miss mark. --json writes every figure
(and each run's raw results) as JSON ('-': to stdout, after the table); --write-md writes
BENCHMARKS.md (the table, the date, the machine, its load average, and what each figure
means). Benchmarks (--only takes these names):

  probes      P1 ns added per traced NVIDIA ioctl / untraced ioctl / other syscall, vs
              no probes and strace -f; the floor of each attachment (bare programs on
              syscall tracepoints, raw tracepoints, kprobes, fentry);
              P2 pipe ping-pong slowdown on one CPU (tracked and other processes), beside
              the floor of the probes' tracepoints (bare programs)
  sidecar     P3 `gpuwhy up` steady-state CPU % and memory (RSS, anonymous), per process
              and in total: 8 simulated GPUs / 16 processes, the seed's 1 GPU / 3, and
              an idle host's 2 GPUs and no GPU process (CPU only, goal <= 0.3 %);
              each case's memory touched a second and this machine's charge for a
              page left a second (beside one read at once); the probes' anonymous
              memory before and after malloc_trim(0)
  gpu         the GPU source's CPU share (8 simulated GPUs at 1 Hz), a part of P3
  correlator  P4 sustained bus -> correlator -> store events/s and losses;
              P7 kernel Xid line -> stored incident and -> journal alert
  cron        P7 cron `nvidia-smi -r` -> complete causal chain (waits for a cron minute)
  store       P5 bytes per GPU-day of raw samples and rollups; P6 p95 of incident list,
              reset history, 1-hour process timeline on a 7-day, 8-GPU store
  rules       rules evaluation cost, % of one core (30 rules, 8 GPUs, 32 processes);
              rows the rules hold between rounds after 35 and 70 minutes
  answers     A the right first answer: `gpuwhy rules eval` over the built-in corpus
              (accuracy on faults, false alarms on healthy hosts, time to answer)
  webui       GPU chart API latency over 7 days of samples
  mcp         M p50/p95 of each `gpuwhy mcp` tool call (the SDK's in-process client) on a
              7-day, 8-GPU store
  otlp        O OTLP export's CPU, % of a core at 10 s (8 GPUs, 64 processes), beside a
              /metrics render of the same store; CPU per incident log record
  engines     E the engines source (issue #59): 4 stand-in inference engines found in /proc
              and scraped every 5 s, % of one core, beside the source as it was
  storm       P3 the probes' peak RSS under 10 M notable driver calls, beside its RSS before
  cuda        CUDA uprobes: ns added per traced CUDA call
  stacks      S the Python stack sampler (issue #57; root: py-spy reads other processes),
              windows unsampled and sampled alternated: the sampled program's slowdown
              (a CPU-bound loop, a DataLoader-like loop), py-spy's CPU per sampled
              process, seconds to the first stacks

Root is needed for probes, sidecar, storm, cron, cuda and the Xid latency (eBPF, /dev/kmsg,
/etc/cron.d); without it they are listed as not run. --quick runs smaller sizes and
fewer repeats (each benchmark's QUICK line below says which) and leaves out cron, the
only one that must wait for a cron minute (name it in --only to run it anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

Figures = list[dict]


def figure(fid: str, name: str, unit: str, values: list[float], *, goal: str | None = None,
           goal_value: float | None = None, higher_is_better: bool = False,
           judged: str = "median", reference: str | None = None,
           reference_value: float | None = None, note: str = "") -> dict:
    """One row: the median [min, max] of ``values``, the ratio to the reference, the goal.

    ``judged`` is the statistic compared with the goal ("median", "p95" or "max")."""
    values = [float(v) for v in values]
    row = {"id": fid, "name": name, "unit": unit, "runs": len(values),
           "median": statistics.median(values), "min": min(values), "max": max(values),
           "reference": reference, "reference_value": reference_value, "ratio": None,
           "goal": goal, "goal_value": goal_value, "judged": judged, "pass": None,
           "note": note}
    if judged == "p95":
        row["p95"] = sorted(values)[min(len(values) - 1, int(0.95 * len(values)))]
    if reference_value:
        row["ratio"] = row["median"] / reference_value
    if goal_value is not None:
        value = row[judged]
        row["pass"] = value >= goal_value if higher_is_better else value <= goal_value
    return row


def paired(after: list[float], before: list[float]) -> list[float]:
    """Differences run by run (the i-th run with probes minus the i-th without)."""
    return [a - b for a, b in zip(after, before, strict=True)]


# --- P1, P2 -------------------------------------------------------------------------------
def bench_probes(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 3 runs of 100,000 ioctls and 10,000 round trips (full: 5 runs, 1,000,000 and
    100,000; strace half as many runs)."""
    import bench_attach
    import bench_probes

    repeat, n_ioctl, n_pingpong = (3, 100_000, 10_000) if quick else (5, 1_000_000, 100_000)
    raw = bench_probes.run(repeat, n_ioctl, n_pingpong)
    rows = []
    for fid, name, key in (("P1", "added per traced NVIDIA ioctl", "tracked ioctl"),
                           ("P1", "added per untraced ioctl", "untracked ioctl"),
                           ("P1", "added per other syscall (getppid)", "getppid")):
        r = raw[key]
        strace = r.get("strace")
        rows.append(figure(
            fid, name, "ns", paired(r["probes_runs"], r["none_runs"]),
            goal=f"≤ {bench_probes.GOALS[key]}", goal_value=bench_probes.GOALS[key],
            reference="strace -f added" if strace else None,
            reference_value=strace - r["none"] if strace else None,
            note=f"no probes {r['none']:.0f} ns per call"))
    raw["attachments"] = floors = bench_attach.run(3 if quick else 5,
                                                    100_000 if quick else 300_000)
    for variant, label in bench_attach.VARIANTS.items():
        found = floors[variant]
        name = f"floor, bare programs: {label}"
        if "refused" in found:
            rows.append(_not_run("P1", name, f"the kernel refuses it ({found['refused']})"))
            continue
        for case, against in (("ioctl", "ioctl"), ("getppid", "other syscall")):
            base = floors["baseline"][case]
            rows.append(figure("P1", f"{name}, per {against}", "ns",
                               [ns - base for ns in found["runs"][case]],
                               note="fdtrack's choice" if variant == bench_attach.CHOSEN
                               else ""))
    for key, name, goal in zip(bench_probes.PINGPONGS,
                               ("ping-pong slowdown, 2 of 10 tracked processes",
                                "ping-pong slowdown, 2 other processes"), (2.0, None),
                               strict=True):
        r = raw[key]
        slowdown = [100 * (p / n - 1)
                    for p, n in zip(r["probes_runs"], r["none_runs"], strict=True)]
        floor = [100 * (f / n - 1) for f, n in zip(r["floor_runs"], r["none_runs"], strict=True)]
        rows.append(figure(
            "P2", f"{name}, one CPU", "%", slowdown,
            goal=f"≤ {goal:g}" if goal else None, goal_value=goal,
            reference="floor: bare programs on the probes' tracepoints",
            reference_value=statistics.median(floor),
            note=f"round trip {r['none']:.0f} ns without probes, {r['probes']:.0f} ns with, "
                 f"{r['floor']:.0f} ns with the floor's"))
    return rows, raw


# --- P3 -----------------------------------------------------------------------------------
# The seed tool's figures, given by the issue: bcc alone on this kind of machine.
SEED_BCC = {"rss_mb": 131.0, "compiler_libs_mb": 83.0, "anon_mb": 19.0}


CHURN_RATE = 20.0     # short-lived host processes a second: health checks, scripts, agents


def churn_rows(churn: dict, case: str) -> Figures:
    """P3 with a host's short-lived processes, against the windows between without them."""
    rate = statistics.median(churn["processes_per_s"])
    quiet = statistics.median(churn["quiet_pct"])
    added = [(busy - calm) * 1e4 / got for busy, calm, got in
             zip(churn["churn_pct"], churn["quiet_pct"], churn["processes_per_s"], strict=True)]
    return [
        figure("P3", f"CPU, whole sidecar, with {rate:.0f} short-lived host processes a second "
               f"(`sh -c true`) ({case})", "% of one core", churn["churn_pct"],
               reference="the windows between, without", reference_value=quiet),
        figure("P3", "  added per short-lived host process (its exec, fork and exit seen, "
               "sent and stored)", "µs of CPU", added,
               note="window by window: (with − without) ÷ processes a second")]


SETTLE_S = 600.0      # the rules' windows and the store's caches fill for minutes
IDLE_HOST = (2, 0)    # GPUs, GPU processes: a host between jobs (issue #23: ≤ 0.3 %)


def settled_rows(settled: dict, case: str, goals: dict, churn: dict | None) -> Figures:
    """P3's memory goals read again once the service's memory has levelled (``churn``: the
    short-lived processes' windows run meanwhile, if any)."""
    settled = dict(settled)
    busy = f"; {churn['rate']:g} short-lived processes a second for " \
        f"{len(churn['churn_pct'])} windows of it" if churn else ""
    minutes = settled.pop("after_s") / 60
    rows = []
    for key, name in (("anon_mb", "anonymous memory"), ("rss_mb", "RSS")):
        total = sum(m[key] for m in settled.values())
        rows.append(figure(
            "P3", f"{name}, total, after {minutes:.0f} minutes ({case})", "MB", [total],
            goal=f"≤ {goals[key]:g}", goal_value=goals[key],
            note=", ".join(f"{role.split(' ')[0]} {m[key]:.1f}" for role, m in settled.items())
            + busy))
    return rows


def pace_rows(result: dict, case: str) -> Figures:
    """The memory the sidecar touched a second, and what this machine charged for a page
    left a second, beside a page read a moment ago: on a VM whose host reclaims idle guest
    memory the second is tens of times the first, and P3's CPU follows it."""
    touched = result["touched_mb_per_s"]
    total = [sum(values) for values in zip(*touched.values(), strict=True)]
    pace = result["pace"]
    return [
        figure("P3", f"  memory touched a second, total ({case})", "MB", total,
               note=", ".join(f"{role.split(' ')[0]} {statistics.median(values):.1f}"
                              for role, values in touched.items())),
        figure("P3", f"  this machine: CPU to read a page left {pace[0]['gap_s']:g} s, "
               f"before and after the windows ({case})", "µs",
               [p["cold_us_per_page"] for p in pace], reference="a page read just before",
               reference_value=statistics.median(p["hot_us_per_page"] for p in pace))]


def bench_sidecar(quick: bool) -> tuple[Figures, dict]:
    """QUICK: the 8-GPU case only, 3 windows of 3 s after 6 s (full: the 8-GPU, 1-GPU and
    idle-host cases, 6 windows of 10 s after 30 s, and the 8-GPU case's memory again after
    SETTLE_S)."""
    import subprocess

    import bench_sidecar

    sizes = dict(warmup=6.0, windows=3, window=3.0) if quick else \
        dict(warmup=30.0, windows=6, window=10.0)
    cases = [(8, 16)] if quick else [(8, 16), (1, 3), IDLE_HOST]
    goals = bench_sidecar.GOALS
    rows, raw = [], {}
    for gpus, processes in cases:
        busy = (gpus, processes) != IDLE_HOST
        result = bench_sidecar.run(gpus, processes, **sizes,
                                   churn_rate=CHURN_RATE if gpus > 1 and busy else 0.0,
                                   settle=SETTLE_S if gpus > 1 and busy and not quick else 0.0)
        raw[f"{gpus}x{processes}"] = result
        case = f"{gpus} GPU{'s' if gpus > 1 else ''} × {result['fields']} fields, " + \
            (f"{processes} processes" if busy else "no GPU process: an idle host")
        per = result["per_process"]
        total, probes = per["total"], per.get("probes")
        cpu_goal = goals["cpu_pct"] if busy else goals["idle_cpu_pct"]
        rows.append(figure("P3", f"CPU, whole sidecar ({case})", "% of one core",
                           total["cpu_pct"], goal=f"≤ {cpu_goal:g}", goal_value=cpu_goal))
        rows += pace_rows(result, case)
        if not busy:     # its memory is the 1-GPU case's: only the CPU has a goal of its own
            rows += [figure("P3", f"  {role}: CPU", "% of one core", figures["cpu_pct"])
                     for role, figures in per.items() if role != "total"]
            continue
        if result["churn"]:
            rows += churn_rows(result["churn"], case)
        if result["settled"]:
            rows += settled_rows(result["settled"], case, goals, result["churn"])
        rows.append(figure("P3", f"anonymous memory, total ({case})", "MB", total["anon_mb"],
                           goal=f"≤ {goals['anon_mb']:g}", goal_value=goals["anon_mb"]))
        rows.append(figure("P3", f"RSS, total ({case})", "MB", total["rss_mb"],
                           goal=f"≤ {goals['rss_mb']:g}", goal_value=goals["rss_mb"]))
        for role, figures in per.items():
            if role == "total":
                continue
            seed = role == "probes"
            rows.append(figure("P3", f"  {role}: CPU", "% of one core", figures["cpu_pct"]))
            rows.append(figure(
                "P3", f"  {role}: anonymous", "MB", figures["anon_mb"],
                reference="seed: bcc alone, after malloc_trim" if seed else None,
                reference_value=SEED_BCC["anon_mb"] if seed else None))
            rows.append(figure(
                "P3", f"  {role}: RSS", "MB", figures["rss_mb"],
                reference="seed: bcc alone, probes compiled" if seed else None,
                reference_value=SEED_BCC["rss_mb"] if seed else None,
                note=f"of which {statistics.median(figures['compiler_libs_mb']):.0f} MB clean "
                     f"LLVM/clang/bcc file pages" if seed else ""))
        if probes is None:
            raise RuntimeError("no probes process under gpuwhy up")
        big = bench_sidecar.BIG_HOST_CPUS
        rows.append(figure(
            "P3", f"  probes: kernel memory of their BPF maps and programs ({case})", "MB",
            probes["bpf_kernel_mb"],
            note=f"on {bench_sidecar.possible_cpus()} possible CPUs; "
                 f"{statistics.median(probes['bpf_kernel_mb_big_host']):.0f} MB with {big}, "
                 f"computed: per-CPU maps hold a value for each"))
    threads = 50 if quick else 100
    raw["thread_flush"] = {}
    for busy, what in ((threads, "every thread waking every 50 ms"),
                       (threads // 10, f"{threads // 10} of each {threads} waking every "
                                       f"50 ms, the others asleep")):
        out = subprocess.run([sys.executable, str(HERE / "bench_sidecar.py"), "--thread-flush",
                              "--processes", "8", "--threads", str(threads),
                              "--busy", str(busy)],
                             capture_output=True, text=True, check=True).stdout
        flush = raw["thread_flush"][busy] = json.loads(out.splitlines()[-1])
        rows.append(figure(
            "P3", f"probes: the scheduler's flush, 8 processes × {threads} threads, {what}",
            "ms", [flush["ms_a_flush"]],
            note=f"{flush['us_a_thread']:.1f} µs a watched thread, once a second; P3's "
                 f"stand-ins have one thread each, a real GPU process tens to hundreds"))
    out = subprocess.run([sys.executable, str(HERE / "bench_sidecar.py"), "--probes-memory"],
                         capture_output=True, text=True, check=True).stdout
    trim = json.loads(out.splitlines()[-1])
    raw["probes_memory"] = trim
    rows.append(figure(
        "P3", "probes alone: anonymous after malloc_trim(0)", "MB",
        [trim["after malloc_trim"]["anon_mb"]], reference="before the trim",
        reference_value=trim["loaded"]["anon_mb"],
        note=f"RSS {trim['loaded']['rss_mb']:.0f} -> {trim['after malloc_trim']['rss_mb']:.0f} "
             f"MB; bcc import alone {trim['import bcc']['rss_mb']:.0f} MB RSS"))
    return rows, raw


def threads_profile(raw: dict) -> str:
    """P3's thread-by-thread table (bench_sidecar.threads_table), a column pair per case in
    the order they ran; '' when the sidecar benchmark did not run."""
    import bench_sidecar

    cases = {("idle host" if (case["gpus"], case["processes"]) == IDLE_HOST
              else f"{case['gpus']}×{case['processes']}"): case["threads"]
             for case in raw.get("sidecar", {}).values() if "threads" in case}
    return bench_sidecar.threads_table(cases) if cases else ""


def bench_gpu(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 1 run of 3 s (full: 3 runs of 10 s)."""
    import bench_gpu_sources

    runs = [bench_gpu_sources.run(8, 3.0 if quick else 10.0, 1.0)
            for _ in range(1 if quick else 3)]
    fields = runs[0]["fields"]
    return [figure("P3", f"  GPU source alone, 8 GPUs × {fields} fields at 1 Hz", "% of one core",
                   [r["share_pct"] for r in runs],
                   note=f"one round {statistics.median(r['round_s'] for r in runs) * 1e3:.1f} "
                        f"ms; dropped {sum(r['dropped'] for r in runs)}")], {"runs": runs}


# --- P4, P7 -------------------------------------------------------------------------------
def bench_correlator(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 1 run of 20,000 events each way, 5 Xid lines (full: 3 runs of 200,000, 30
    lines)."""
    import bench_correlator

    total, repeats = (20_000, 1) if quick else (200_000, 3)
    runs, floors = bench_correlator.paired(total, repeats)
    singles = [bench_correlator.throughput(total, batch=1) for _ in range(repeats)]
    single_rate = statistics.median(r["rate"] for r in singles)
    rows = [
        # issue #23: judged against the floor measured beside it, the same machine and load
        figure("P4", "correlator's pace against the floor beside it (batch messages)",
               "× floor", [r["rate"] / f["rate"] for r, f in zip(runs, floors, strict=True)],
               goal=f"≥ {bench_correlator.GOAL_FLOOR_RATIO:g}",
               goal_value=bench_correlator.GOAL_FLOOR_RATIO, higher_is_better=True,
               note="pair by pair, side by side: events/s through the correlator ÷ the "
                    "floor's"),
        figure("P4", "bus -> correlator -> store (probes' batch messages, 256 events)",
               "events/s", [r["rate"] for r in runs],
               reference="a message per event", reference_value=single_rate,
               note=f"{total:,} events a run; correlator thread busy "
                    f"{statistics.median(r['busy'] for r in runs):.0%}"),
        figure("P4", "  same, a message per event", "events/s", [r["rate"] for r in singles]),
        figure("P4", "  floor: bus receive + decode + one executemany'd events row an "
               "event, no correlator", "events/s", [r["rate"] for r in floors],
               note="the least a correlator on this bus and Python's sqlite3 does; "
                    f"busy {statistics.median(r['busy'] for r in floors):.0%}"),
        figure("P4", "events lost (bus gaps + rejected + unaccounted)", "events",
               [r["lost_gap"] + r["rejected"] + max(0, r["unwritten"] - r["lost_gap"])
                for r in runs + singles], goal="0", goal_value=0),
    ]
    raw: dict = {"throughput": runs, "throughput_single": singles, "floor": floors}
    if os.geteuid() == 0:
        lines = 5 if quick else 30
        latency = bench_correlator.latency(lines)
        raw["latency"] = latency
        goal = bench_correlator.GOAL_P95_S
        for key, name in (("to_store", "Xid line -> stored incident"),
                          ("to_journal", "Xid line -> journal alert")):
            rows.append(figure("P7", name, "s", latency[key], goal=f"p95 ≤ {goal:g}",
                               goal_value=goal, judged="p95", note=f"{lines} lines"))
    else:
        rows.append(_not_run("P7", "Xid line -> stored incident / journal alert", "needs root"))
    return rows, raw


def bench_cron(quick: bool) -> tuple[Figures, dict]:
    """QUICK: as full (1 run in quick, 2 in full): each waits for the next cron minute."""
    from gpuwhy.app.demo.scenarios import play
    from gpuwhy.config import load_config

    runs = []
    for _ in range(1 if quick else 2):
        work = Path(tempfile.mkdtemp(prefix="gpuwhy-bench-cron-"))
        watcher = ChainWatcher(work / "demo.db")
        watcher.start()
        with contextlib.redirect_stdout(io.StringIO()):
            # the job fires at the next minute boundary, up to 60 s away: a 30 s timeout
            # failed every run started after the boundary's 30th second
            incident = play(load_config(environ={}), "cron-reset", keep=False, timeout=90,
                            work=work)
        watcher.stop()
        if incident is None or watcher.result is None:
            raise RuntimeError("the cron reset produced no complete chain")
        runs.append(watcher.result)
    return [
        figure("P7", "cron nvidia-smi -r: reset call -> complete chain cron job, command, "
               "driver call, reset", "s", [r["reset_to_chain_s"] for r in runs],
               goal="≤ 1", goal_value=1.0,
               note=f"the cron job started "
                    f"{statistics.median(r['cron_to_reset_s'] for r in runs):.2f} s before "
                    f"the reset call"),
    ], {"runs": runs}


class ChainWatcher:
    """Polls a store until one GPU-reset incident has every link of the cron chain, and
    notes (realtime) when it was complete."""

    CAUSE = {"cron_job", "command", "driver_call", "gpu_reset"}

    def __init__(self, path: Path):
        self.path = path
        self.result: dict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _links(self) -> dict[str, int]:
        from gpuwhy.store import open_store

        if not self.path.exists():
            return {}
        db = open_store(self.path, readonly=True)
        try:
            rows = db.execute(
                "select l.kind, l.ts from incident_links l join incidents i on i.id = "
                "l.incident_id where i.kind = 'gpu_reset' and l.incident_id = (select "
                "incident_id from incident_links where kind = 'cron_job' limit 1)").fetchall()
        except Exception:  # noqa: BLE001 - tables not there yet
            rows = []
        finally:
            db.close()
        return dict(rows)

    def _watch(self) -> None:
        while not self._stop.is_set():
            links = self._links()
            if self.CAUSE <= links.keys():
                reset = links["driver_call"]
                self.result = {"reset_to_chain_s": (time.time_ns() - reset) / 1e9,
                               "cron_to_reset_s": (reset - links["cron_job"]) / 1e9}
                return
            self._stop.wait(0.05)


# --- P5, P6, rules, web view, CUDA --------------------------------------------------------
def bench_store(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 8 GPUs × 0.1 day (full: 8 GPUs × 7 days): P6 is then far from its size."""
    import bench_store

    days = 0.1 if quick else 7.0
    r = bench_store.run(gpus=8, days=days)
    mb = 1e6
    rows = [
        figure("P5", "raw samples, 25 budget fields, compact schema", "MB per GPU-day",
               [r["samples_25_per_gpu_day"] / mb], goal="≤ 10", goal_value=10.0,
               reference="GPU-sources schema (all fields)",
               reference_value=r["samples_before_per_gpu_day"] / mb),
        figure("P5", f"raw samples, all {r['fields']} fields, as stored", "MB per GPU-day",
               [r["raw_per_gpu_day"] / mb], note=f"{r['packed_per_gpu_day'] / mb:.2f} after "
                                                 "VACUUM"),
        figure("P5", "one-minute rollups", "MB per GPU-day", [r["rollups_per_gpu_day"] / mb]),
    ]
    for name, label in (("incident list (50 newest)", "incident list"),
                        ("reset history (all)", "reset history"),
                        ("1-hour process timeline", "1-hour process timeline")):
        times = r["latencies_ms"][name]
        rows.append(figure("P6", f"{label}, {r['gpus']} GPUs × {days:g} days", "ms", times,
                           goal="p95 ≤ 100", goal_value=100.0, judged="p95"))
    return rows, r


def bench_rules(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 360 s of data (full: 600 s)."""
    import bench_rules

    seconds, interval = (360, 10) if quick else (600, 10)
    r = bench_rules.run(rules=30, seconds=seconds, interval=interval)
    rows = []
    for name, costs in r["costs"].items():
        rows.append(figure(
            "R", f"rules evaluation, {r['rules']} rules, signals from {name}", "% of one core",
            [100 * c / interval for c in costs], goal=f"≤ {bench_rules.GOAL_PCT:g}",
            goal_value=bench_rules.GOAL_PCT,
            note=f"every {interval} s; {len(costs)} rounds; {r['instances']} instances"))
    h = bench_rules.held(70, interval)
    (half, half_rows), (end, end_rows) = h["held"].items()
    rows.append(figure(
        "R", f"rows the rules hold between rounds after {end} min, every shipped rule "
        f"({h['rules']}), signals from store", "rows", [end_rows],
        reference=f"after {half} min", reference_value=half_rows,
        note="the same once the longest window asked is full: held by the windows, not by "
             "the time since start"))
    r["held"] = h
    return rows, r


def bench_answers(quick: bool) -> tuple[Figures, dict]:
    """QUICK: every third scenario of the built-in corpus (full: all of it)."""
    from gpuwhy.app.demo.corpus import corpus, write_corpus
    from gpuwhy.app.rules_eval_cli import evaluate_case, ranking, read_corpus, summary
    from gpuwhy.rules.loader import load_rules

    names = [s.name for s in corpus()]
    if quick:
        names = names[::3]
    started = time.monotonic()
    rules, (how, rank) = load_rules(), ranking()
    with tempfile.TemporaryDirectory(prefix="gpuwhy-bench-corpus-") as scratch:
        write_corpus(Path(scratch), names)
        outcomes = [evaluate_case(case, rules, rank) for case in read_corpus(Path(scratch))]
    total = summary(outcomes, how, time.monotonic() - started)
    faults = f"{total['hits']}/{total['faults']} faults"
    rows = [figure("A", "top answer right (`gpuwhy rules eval`)", "% of faults",
                   [100 * (total["accuracy"] or 0)], goal="≥ 95", goal_value=95.0,
                   higher_is_better=True,
                   note=f"{faults}; {len(total['not_evaluable'])} not evaluable (env())"),
            figure("A", "healthy hosts with a warning-or-worse finding", "hosts",
                   [total["false_alarms"]], goal="0", goal_value=0.0,
                   note=f"of {total['healthy']}")]
    # capture seconds from the fault's onset until the right answer led, per kind of cause:
    # a failure that begins with a kernel-log line (an Xid at its declared onset) should be
    # answered within seconds, causes read from rates and counters within minutes
    def logged(case: object) -> bool:
        return case.group in ("failures", "driver_stack") and case.onset_s > 0

    for label, wanted, goal in (("rate causes", False, 300.0), ("Xid and log causes", True, 10.0)):
        after = [max(0.0, o.time_to_answer_s - o.case.onset_s) for o in outcomes
                 if o.hit and o.time_to_answer_s is not None and logged(o.case) == wanted]
        if after:
            rows.append(figure("A", f"time to the right answer after the onset, {label}",
                               "s of capture", after, goal=f"max ≤ {goal:g}", goal_value=goal,
                               judged="max",
                               note=f"{len(after)} hits; max {max(after):.0f} s; every 10 s "
                                    f"round; replay took {total['elapsed_s']:.0f} s"))
    return rows, total


def bench_webui(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 2 GPUs × 0.1 day, 10 calls each (full: 8 GPUs × 7 days, 20 calls)."""
    import bench_webui

    days = 0.1 if quick else 7.0
    r = bench_webui.run(gpus=2 if quick else 8, days=days, runs=10 if quick else 20)
    rows = []
    for url in ("/api/gpus/<gpu>/series?range=7d", "/api/gpus/<gpu>/series?range=24h",
                "/api/gpus/<gpu>/series?range=1h"):
        call = r["calls"][url]
        rows.append(figure("W", f"GET {url}, {days:g} days stored", "ms",
                           [call["p95_ms"]], goal="p95 ≤ 250", goal_value=250.0,
                           note=f"{call['points']} points; median {call['median_ms']:.1f} ms; "
                                f"raw rows {r['raw_rows']:,}"))
    for name in ("7d", "1h"):
        page, live = r["calls"][f"page {name}"], r["calls"][f"live {name}"]
        rows.append(figure("W", f"GPU page load, range {name} (HTML + series + events), "
                           f"{days:g} days stored", "ms", [page["p95_ms"]], goal="p95 ≤ 300",
                           goal_value=300.0, note=f"median {page['median_ms']:.1f} ms"))
        rows.append(figure("W", f"GPU page live update, range {name} (new buckets + events)",
                           "ms", [live["p95_ms"]], goal="p95 ≤ 50", goal_value=50.0,
                           note=f"median {live['median_ms']:.1f} ms"))
    for name in ("7d", "6h"):
        page, live = r["calls"][f"overview {name}"], r["calls"][f"overview live {name}"]
        rows.append(figure("W", f"overview load, heatmap range {name} (HTML + heatmap), "
                           f"{r['gpus']} GPUs × {days:g} days stored", "ms", [page["p95_ms"]],
                           goal="p95 ≤ 300", goal_value=300.0,
                           note=f"median {page['median_ms']:.1f} ms"))
        rows.append(figure("W", f"overview live update, range {name} (new minutes + cards)",
                           "ms", [live["p95_ms"]], goal="p95 ≤ 50", goal_value=50.0,
                           note=f"median {live['median_ms']:.1f} ms"))
    m = r["metrics"] = bench_webui.metrics_scrape(runs=20 if quick else 50)
    rows.append(figure("W", f"GET /metrics, {m['gpus']} GPUs × {m['processes']} processes",
                       "ms", [m["p95_ms"]], goal="p95 ≤ 20", goal_value=20.0,
                       note=f"{m['series']} series, {m['bytes']:,} bytes; "
                            f"median {m['median_ms']:.1f} ms"))
    return rows, r


def bench_mcp(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 8 GPUs × 0.1 day, 10 calls per tool (full: 8 GPUs × 7 days, 20 calls)."""
    import bench_mcp

    days = 0.1 if quick else 7.0
    r = bench_mcp.run(gpus=8, days=days, runs=10 if quick else 20)
    rows = [figure("M", f"MCP tool call: {label}, {r['gpus']} GPUs × {days:g} days", "ms",
                   call["times_ms"], goal=f"p95 ≤ {bench_mcp.GOAL_MS:g}",
                   goal_value=bench_mcp.GOAL_MS, judged="p95",
                   note=f"answer {call['bytes']:,} bytes")
            for label, call in r["calls"].items()]
    why = r["why_cli"]
    rows.append(figure("A", f"`gpuwhy why --json` (a process: start, rules, store read), "
                       f"{r['gpus']} GPUs × {days:g} days", "ms", why["times_ms"],
                       goal="p95 ≤ 500", goal_value=500.0, judged="p95",
                       note=f"answer {why['bytes']:,} bytes"))
    return rows, r


def bench_otlp(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 10 exports (full: 30), 8 GPUs × 64 processes both."""
    import bench_otlp

    r = bench_otlp.run(gpus=8, processes=64, runs=10 if quick else 30)
    scrape = statistics.median(r["scrape_cpu_ms"])
    rows = [figure("O", f"OTLP metrics export, {r['gpus']} GPUs × {r['processes']} processes "
                   f"({r['points']} points), % of one core at otlp.interval = 10 s", "%",
                   [ms / 10_000 * 100 for ms in r["export_cpu_ms"]], goal="≤ 0.1",
                   goal_value=0.1, reference="a /metrics render of the same store",
                   reference_value=scrape / 10_000 * 100,
                   note=f"CPU median {r['export_cpu_ms_median']:.1f} ms an export, "
                        f"{r['read_cpu_ms']:.1f} ms of it reading the families"),
            figure("O", "OTLP log record (an incident change), feed read to POST", "µs",
                   [r["log_record_cpu_us"]], note=f"{r['records']} records")]
    return rows, r


def bench_engines(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 3 runs of 20 rounds (full: 7 of 40)."""
    import bench_engines

    from gpuwhy.probes.engines.netns import can_enter

    # with CAP_SYS_ADMIN (root), four more engines each in a network namespace of its own
    netns = can_enter() and bool(shutil.which("unshare")) and bool(shutil.which("ip"))
    r = bench_engines.measure(rounds=20 if quick else 40, runs=3 if quick else 7,
                              netns=netns)
    bodies = ", ".join(f"{k.split('.')[0]} {v / 1024:.0f} KiB" for k, v in
                       r["bodies_bytes"].items())
    narrow = r["narrow parse only"]
    rows = [figure("E", f"engines source, 4 engines found and scraped every "
                   f"{bench_engines.INTERVAL_S:g} s ({bodies}; {r['processes']} processes)",
                   "% of one core", r["after"]["runs_pct"], goal=f"≤ {bench_engines.GOAL_PCT}",
                   goal_value=bench_engines.GOAL_PCT,
                   reference="the source as it was (every line parsed, every command line "
                             "read each round, a timer thread a scrape)",
                   reference_value=r["before"]["pct_of_core"],
                   note=f"narrow parse alone {narrow['pct_of_core']:.3f} %; parse "
                        f"{r['before']['parse_ms_per_round']:.2f} → "
                        f"{r['after']['parse_ms_per_round']:.2f} ms a round")]
    if netns:
        rows.append(figure(
            "E", "engines source, the same 4 engines each in a network namespace of its "
            "own, scraped through it (every arm's discovery reads all 8)", "% of one core",
            r[bench_engines.NETNS]["runs_pct"], goal=f"≤ {bench_engines.GOAL_PCT}",
            goal_value=bench_engines.GOAL_PCT, reference="the 4 in gpuwhy's namespace",
            reference_value=r["after"]["pct_of_core"]))
    return rows, r


def bench_storm(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 2 M notable driver calls (full: 10 M)."""
    import bench_storm

    r = bench_storm.run(calls=2_000_000 if quick else 10_000_000)
    rows = [figure("P3", f"probes peak RSS under a storm of {r['calls']:,} notable driver "
                   f"calls (nobody reading the bus)", "MB", [r["peak_mb"]],
                   goal=f"≤ {r['goal_mb']}", goal_value=float(r["goal_mb"]),
                   reference="the same process before the storm",
                   reference_value=r["baseline_mb"],
                   note=f"read {r['records']:,}, dropped and counted {r['dropped']:,}; "
                        f"every call accounted: {r['all_accounted']}")]
    return rows, r


def bench_cuda(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 2 runs of 10,000 calls (full: 5 runs of 200,000)."""
    import bench_cuda_uprobes

    r = bench_cuda_uprobes.run(10_000 if quick else 200_000, 2 if quick else 5)
    base, on = r["no probes"], r["cuda uprobes"]
    rows = []
    for label, key in bench_cuda_uprobes.ROWS:
        rows.append(figure("C", f"added per {label}", "ns",
                           paired(on[f"{key}_runs"], base[f"{key}_runs"]),
                           note=f"no probes {base[key]:.0f} ns"))
    return rows, r


def bench_stacks(quick: bool) -> tuple[Figures, dict]:
    """QUICK: 3 sampled windows of 8 s per program (full: 6 of 10 s)."""
    import bench_stacks

    r = bench_stacks.run(pairs=3 if quick else 6, window=8.0 if quick else 10.0)
    rows = []
    for kind, label, processes in (("cpu", "a CPU-bound Python loop", 1),
                                   ("loader", "a DataLoader-like loop (2 workers)", 3)):
        k = r[kind]
        per_cpu = k["slowdown_per_cpu_pct"]
        rows.append(figure(
            "S", f"slowdown of {label}, sampled at {1000 // k['interval_ms']}/s", "%",
            k["slowdown_pct"], goal=f"≤ {bench_stacks.SLOWDOWN_GOAL_PCT:g}",
            goal_value=bench_stacks.SLOWDOWN_GOAL_PCT,
            note=f"unsampled {statistics.median(k['off']):,.0f} steps/s; per CPU second of "
                 f"the program {statistics.median(per_cpu):+.2f} % "
                 f"[{min(per_cpu):+.1f} – {max(per_cpu):+.1f}]"))
        tree = statistics.median(k["spy_cpu_pct"])
        rows.append(figure(
            "S", f"py-spy CPU per sampled process, {label}", "% of one core",
            [v / processes for v in k["spy_cpu_pct"]],
            goal=f"≤ {bench_stacks.CPU_GOAL_PCT:g}", goal_value=bench_stacks.CPU_GOAL_PCT,
            note=f"{processes} processes: {tree:.2f} % for the tree" if processes > 1 else ""))
        rows.append(figure(
            "S", f"first stacks after the answer formed, {label}", "s", k["first_stacks_s"],
            goal=f"max ≤ {bench_stacks.FIRST_STACKS_GOAL_S:g}",
            goal_value=bench_stacks.FIRST_STACKS_GOAL_S, judged="max"))
    idle = r["cpu"]["idle_sampler_cpu_pct"] + r["loader"]["idle_sampler_cpu_pct"]
    rows.append(figure("S", "the sampler while no answer holds (no py-spy runs)",
                       "% of one core", idle, goal="≈ 0", goal_value=0.05,
                       note="its own process: a look at the targets file every 2 s"))
    return rows, r


def _not_run(fid: str, name: str, why: str) -> dict:
    return {"id": fid, "name": name, "unit": "", "runs": 0, "not_run": why}


BENCHMARKS: dict[str, tuple[Callable[[bool], tuple[Figures, dict]], bool]] = {
    # name: (function, needs root)
    "probes": (bench_probes, True),
    "sidecar": (bench_sidecar, True),
    "gpu": (bench_gpu, False),
    "correlator": (bench_correlator, False),
    "store": (bench_store, False),
    "rules": (bench_rules, False),
    "answers": (bench_answers, False),
    "webui": (bench_webui, False),
    "mcp": (bench_mcp, False),
    "otlp": (bench_otlp, False),
    "engines": (bench_engines, False),
    "storm": (bench_storm, True),
    "cuda": (bench_cuda, True),
    "stacks": (bench_stacks, True),
    "cron": (bench_cron, True),
}
FULL_ONLY = {"cron"}


# --- output -------------------------------------------------------------------------------
def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(rows: Figures) -> str:
    lines = ["| | figure | unit | median [min – max] | runs | reference | ratio | goal | |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "not_run" in row or "error" in row:
            why = row.get("not_run") or f"ERROR: {row['error']}"
            lines.append(f"| {row['id']} | {row['name']} | | not run: {why} | | | | | |")
            continue
        value = f"{_number(row['median'])} [{_number(row['min'])} – {_number(row['max'])}]"
        if "p95" in row:
            value += f", p95 {_number(row['p95'])}"
        reference = row["reference"] or ""
        if row["reference_value"] is not None:
            reference += f": {_number(row['reference_value'])}"
        ratio = f"{row['ratio']:.2f}×" if row["ratio"] is not None else ""
        mark = {True: "pass", False: "**miss**", None: ""}[row["pass"]]
        name = row["name"] + (f" ({row['note']})" if row["note"] else "")
        lines.append(f"| {row['id']} | {name} | {row['unit']} | {value} | {row['runs']} | "
                     f"{reference} | {ratio} | {row['goal'] or ''} | {mark} |")
    return "\n".join(lines)


def machine() -> dict:
    from gpuwhy.probes.fdtrack import bpf_stats_enabled

    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": model,
            "virtual": " hypervisor" in cpuinfo or "hypervisor" in cpuinfo.split(),
            "kernel": platform.release(), "python": platform.python_version(),
            "bpf_stats_enabled": bpf_stats_enabled(),
            "gpu": Path("/dev/nvidia0").exists(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                / 2**30, 1)}


def other_sidecars() -> list[str]:
    """gpuwhy services or probes already running: their probes fire on every ioctl too."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        words = process.info["cmdline"] or []
        if any(w.endswith("gpuwhy") for w in words[:3]) or "gpuwhy" in words[:3]:
            if {"up", "serve", "probes"} & set(words[1:4]):
                found.append(f"{process.info['pid']}: {' '.join(words)[:120]}")
    return found


def run(names: list[str], quick: bool) -> dict:
    started = time.monotonic()
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "quick": quick, "machine": machine(), "load_before": os.getloadavg(),
            "other_sidecars": other_sidecars()}
    rows: Figures = []
    raw: dict = {}
    durations: dict[str, float] = {}
    for name in names:
        function, needs_root = BENCHMARKS[name]
        began = time.monotonic()
        print(f"# {name} ...", file=sys.stderr, flush=True)
        if needs_root and os.geteuid() != 0:
            rows.append(_not_run(name, name, "needs root"))
            continue
        try:
            figures, raw[name] = function(quick)
            for row in figures:
                row["benchmark"] = name
            rows += figures
        except Exception as exc:  # noqa: BLE001 - one failing benchmark must not hide the rest
            traceback.print_exc()
            rows.append({"id": name, "name": name, "unit": "", "runs": 0, "benchmark": name,
                         "error": f"{type(exc).__name__}: {exc}"})
        durations[name] = time.monotonic() - began
        print(f"# {name}: {durations[name]:.0f} s", file=sys.stderr, flush=True)
    meta.update(load_after=os.getloadavg(), seconds=time.monotonic() - started,
                durations=durations)
    return {"meta": meta, "figures": rows, "raw": raw}


def describe(meta: dict) -> str:
    m = meta["machine"]
    return (f"{meta['date']}, {'quick' if meta['quick'] else 'full'} run of "
            f"{meta['seconds'] / 60:.1f} min on {m['cpus']} CPUs ({m['cpu_model']}), "
            f"{'VM' if m['virtual'] else 'bare metal'}, {m['memory_gib']} GiB, Linux "
            f"{m['kernel']}, {'a GPU' if m['gpu'] else 'no GPU'}; load average "
            f"{meta['load_before'][0]:.2f} at the start, {meta['load_after'][0]:.2f} at the end"
            + (f"; {len(meta['other_sidecars'])} other gpuwhy process(es) were running "
               f"(their probes are in every figure, baselines included)"
               if meta["other_sidecars"] else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes, fewer repeats: about 11 minutes on 2 CPUs")
    parser.add_argument("--only", help=f"comma-separated: {', '.join(BENCHMARKS)}")
    parser.add_argument("--json", help="write the results as JSON here ('-': stdout)")
    parser.add_argument("--write-md", type=Path, help="write BENCHMARKS.md here")
    args = parser.parse_args()
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in names if name not in BENCHMARKS]
        if unknown:
            parser.error(f"unknown benchmark {', '.join(unknown)}; "
                         f"choose from {', '.join(BENCHMARKS)}")
    else:
        names = [name for name in BENCHMARKS if not (args.quick and name in FULL_ONLY)]
    # One private folder for every benchmark's files (some keep theirs), removed at the end.
    tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="bench-run-")
    try:
        results = run(names, args.quick)
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    text = table(results["figures"])
    threads = threads_profile(results["raw"])
    print(f"{describe(results['meta'])}\n\n{text}" + (f"\n\n{threads}" if threads else ""))
    if args.json == "-":
        print(json.dumps(results, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.write_md:
        from bench_notes import benchmarks_md

        existing = args.write_md.read_text() if args.write_md.exists() else None
        args.write_md.write_text(benchmarks_md(describe(results["meta"]), text, existing,
                                               threads))
    failed = [row for row in results["figures"] if "error" in row]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
