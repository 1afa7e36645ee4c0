"""Process seconds through the real correlator and store: scheduler time and, with the CUDA
uprobes on, launches, syncs, copies and allocations per second."""

import dataclasses

from gpuwhy.correlator.rules.synthetic import Synthetic
from gpuwhy.events import CudaStats, SchedStats
from gpuwhy.identity import ProcessKey

TRAINER = ProcessKey(4242, 1000)


def cuda_seconds(h, values: dict, seconds: list[float]) -> list[CudaStats]:
    template = next(e for e in Synthetic(duration_s=1, cuda=values).events()
                    if isinstance(e, CudaStats))
    return [dataclasses.replace(template, ts=h.at(t), process=TRAINER) for t in seconds]


def test_a_process_second_adds_up_its_scheduler_and_cuda_intervals(harness):
    h = harness
    half = {"on_cpu_ns": 450_000_000, "sleep_ns": 50_000_000}
    h.feed(h.process(0.1, TRAINER, "python3"),     # the probes flush every 0.5 s
           *(SchedStats(ts=h.at(t), process=TRAINER, interval_ns=5 * 10**8, own=half,
                        workers={"on_cpu_ns": 500_000_000}) for t in (1.2, 1.7)))
    # two intervals ending in the same second add up; the next second has its own
    h.feed(*cuda_seconds(h, {"launches": 3000, "syncs": 20, "sync_frac": 0.25,
                             "htod_bytes": 4e8, "dtoh_bytes": 1e8, "pageable_frac": 0.5,
                             "allocs": 7, "frees": 6}, [1.2, 1.9, 2.5]))
    rows = h.db.execute(
        "select second - ?, on_cpu_ms, sleep_ms, workers_on_cpu_ms, cuda_launches, cuda_syncs, "
        "cuda_sync_ms, cuda_htod_bytes, cuda_dtoh_bytes, cuda_pageable_bytes, cuda_allocs, "
        "cuda_frees "
        "from process_seconds where pid = ? order by second",
        [h.t0 // 10**9, TRAINER.pid]).fetchall()
    assert rows == [(1, 900.0, 100.0, 1000.0, 6000, 40, 500.0, 8e8, 2e8, 5e8, 14, 12),
                    (2, None, None, None, 3000, 20, 250.0, 4e8, 1e8, 2.5e8, 7, 6)]
