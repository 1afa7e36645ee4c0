"""A rule's warm-up reads a process's age from when it started, not from when gpuwhy first
saw it: a job that ran for an hour before gpuwhy started is answered for at once."""

from __future__ import annotations

import os
import time

import psutil

from gpuwhy.app.demo.synthetic_signals import BASE_TS, NS, Synthetic, run
from gpuwhy.proc import read_process
from gpuwhy.rules.parser import parse_rules

[BUSY_CPU] = parse_rules(
    'rule T_busy_cpu { title: "t" scope: process window: 30s warmup: 120s\n'
    '  when: mean(proc.cpu_cores, 30s) > 0.5 for: 20s severity: warning }', "t.rules")
HOT = {"on_cpu": 0.9, "runqueue": 0.0, "sleep": 0.1, "blocked": 0.0, "threads": 4}


def fired_at(spec: Synthetic) -> float | None:
    findings, _ = run(spec, [BUSY_CPU])
    firing = [f for f in findings if f.state == "firing"]
    return (firing[0].ts - BASE_TS) / NS if firing else None


def test_a_process_that_ran_before_gpuwhy_started_is_no_young_process():
    # the condition holds from the first window (30 s) on; 'for: 20s' adds its 20 s
    assert fired_at(Synthetic(duration_s=300, own=HOT, started_s=-3600)) <= 60


def test_a_process_that_starts_now_waits_its_warmup():
    at = fired_at(Synthetic(duration_s=300, own=HOT, started_s=0))
    assert at is not None and at >= 120


def test_a_process_of_unknown_start_is_as_old_as_gpuwhy_has_seen_it():
    at = fired_at(Synthetic(duration_s=300, own=HOT))
    assert at is not None and at >= 120


def test_read_process_gives_when_the_process_started():
    seen = read_process(os.getpid(), ts=time.time_ns())
    created = psutil.Process().create_time()       # from /proc/stat btime, to the second
    assert abs(seen.started_at / 1e9 - created) < 1.5
    assert seen.started_at < time.time_ns()
