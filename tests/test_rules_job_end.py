"""G-JOB-END through the real engine: a job that ends cleanly leaves its GPU idle, and that
idle is no finding; a job killed or failing keeps its symptoms; one GPU's job ending says
nothing about another GPU."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from gpuwhy import severity as sev
from gpuwhy.app.demo.synthetic_signals import BASE_TS, NS, Synthetic, run
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import (
    CudaStats,
    DeviceOpened,
    DriverCallStats,
    Envelope,
    GpuSample,
    ProcessExited,
    ProcessSeen,
    SchedStats,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

RULES = load_rules()
R14 = next(rule for rule in RULES if rule.id == "R14_bursty_utilisation")
END_S = 480           # minute 8 of 12
DURATION_S = 720
# What a GPU reports once its job is gone: nothing runs, its memory is free.
IDLE_AFTER = {"gpu_util": 0.0, "mem_util": 0.0, "gr_engine_active": 0.0, "sm_active": 0.0,
              "sm_occupancy": 0.0, "tensor_active": 0.0, "dram_active": 0.0, "fp16_active": 0.0,
              "fp32_active": 0.0, "pcie_tx_bytes_per_s": 1e6, "pcie_rx_bytes_per_s": 1e6,
              "nvlink_tx_bytes_per_s": 0.0, "nvlink_rx_bytes_per_s": 0.0, "power_w": 70.0,
              "sm_clock_mhz": 345.0, "fb_used_mib": 0.0, "pstate": 8.0}
SIGKILL = 9


def bursty(t: float) -> dict:
    return {"gpu_util": 98.0 if t % 10 < 3 else 2.0}


@dataclass
class JobEnd(Synthetic):
    """A Synthetic host whose job on some GPUs ends: ``ends`` maps a GPU index to (second,
    exit_code, signal); from then on its process reports nothing and the GPU is idle.
    ``per_gpu`` changes one GPU's healthy values (as ``gpu`` does for all)."""

    ends: dict[int, tuple[int, int | None, int | None]] = field(default_factory=dict)
    per_gpu: dict[int, object] = field(default_factory=dict)

    def _sample(self, g: int, t: float, ts: int, totals: dict) -> GpuSample:
        sample = super()._sample(g, t, ts, totals)
        fields = dict(sample.fields)
        if g in self.per_gpu:
            change = self.per_gpu[g]
            fields.update(change(t) if callable(change) else change)
        if g in self.ends and t > self.ends[g][0]:
            fields.update(IDLE_AFTER)
        return dataclasses.replace(sample, fields={k: float(v) for k, v in fields.items()})

    def events(self) -> list:
        gone = {self.process(g, 0): BASE_TS + end * NS for g, (end, _, _) in self.ends.items()}
        out = [e for e in super().events()
               if not (isinstance(e, (SchedStats, DriverCallStats, CudaStats))
                       and e.process in gone and e.ts > gone[e.process])]
        for g, (end, code, signal) in self.ends.items():
            out.append(ProcessExited(ts=BASE_TS + end * NS, process=self.process(g, 0),
                                     exit_code=code, signal=signal))
        out.sort(key=lambda e: e.ts)
        return out


def warning_or_worse(findings: list) -> list:
    return [f for f in findings if f.state == "firing"
            and sev.rank(f.severity) >= sev.rank("warning")]


def test_a_well_fed_job_that_exits_0_leaves_no_finding():
    spec = JobEnd(duration_s=DURATION_S, ends={0: (END_S, 0, None)})
    findings, engine = run(spec, RULES)
    assert warning_or_worse(findings) == [], [(f.rule_id, f.ts) for f in findings]
    assert [f for f in findings if f.state == "firing"] == []
    [r14] = [s for s in engine.status() if s["rule_id"] == R14.id]
    assert r14["status"] == "suppressed" and r14["detail"].startswith("G-JOB-END")


@pytest.mark.parametrize("code, signal", [(None, SIGKILL), (137, None), (1, None)])
def test_a_job_killed_or_failing_keeps_its_symptom(code, signal):
    spec = JobEnd(duration_s=DURATION_S, ends={0: (END_S, code, signal)})
    findings, engine = run(spec, RULES)
    bursts = [f for f in warning_or_worse(findings) if f.rule_id == R14.id]
    assert bursts, engine.status()
    assert bursts[0].ts > BASE_TS + END_S * NS and bursts[0].severity == "warning"


def test_a_monitor_exiting_0_after_a_killed_job_is_no_job_end():
    spec = JobEnd(duration_s=DURATION_S, ends={0: (END_S, None, SIGKILL)})
    smi = ProcessKey(31_337, 900_000)
    spec.extra = [(END_S + 20, ProcessSeen(ts=0, process=smi, comm="nvidia-smi",
                                           cmdline="nvidia-smi -q")),
                  (END_S + 20, DeviceOpened(ts=0, process=smi, fd=3, path="/dev/nvidia0",
                                            device="nvidiaN", minor=0)),
                  (END_S + 40, ProcessExited(ts=0, process=smi, exit_code=0))]
    findings, _ = run(spec, [R14])
    assert [f for f in warning_or_worse(findings) if f.rule_id == R14.id]


def test_a_finding_firing_before_the_clean_end_is_cleared_at_it():
    spec = JobEnd(duration_s=DURATION_S, gpu=bursty, ends={0: (END_S, 0, None)})
    findings, engine = run(spec, [R14])
    firing = [f for f in findings if f.state == "firing"]
    cleared = [f for f in findings if f.state == "cleared"]
    assert firing and all(f.ts <= BASE_TS + END_S * NS for f in firing)
    assert len(cleared) == 1 and cleared[0].finding_id == firing[0].finding_id
    assert BASE_TS + END_S * NS < cleared[0].ts <= BASE_TS + (END_S + R14.every_ns // NS) * NS
    assert engine.status()[0]["status"] == "suppressed"


def test_one_gpu_ending_its_job_does_not_silence_a_starved_job_on_another():
    spec = JobEnd(duration_s=DURATION_S, gpus=2, per_gpu={0: bursty},
                  ends={1: (END_S, 0, None)})
    findings, engine = run(spec, RULES)
    gpu0, gpu1 = spec.gpu_id(0), spec.gpu_id(1)
    starved = [f for f in findings if f.rule_id == R14.id and f.gpu_id == gpu0]
    assert [f.state for f in starved] == ["firing"]             # fires, and is never cleared
    assert starved[0].severity == "warning"
    assert [f for f in warning_or_worse(findings) if f.gpu_id == gpu1] == []
    statuses = {s["gpu_id"]: s for s in engine.status() if s["rule_id"] == R14.id}
    assert statuses[gpu0]["status"] == "firing"
    assert statuses[gpu1]["detail"].startswith("G-JOB-END")


def test_the_guard_reads_the_exit_from_the_store(tmp_path):
    """The same ends, written by the real StoreWriter as they happen and read back by
    StoreSignals between the writes, as the service does."""
    def store_run(code: int | None, signal: int | None) -> list:
        path = tmp_path / f"job-{code}-{signal}.db"
        db = open_store(path)
        reader = open_store(path, readonly=True)
        try:
            writer = StoreWriter(db)
            engine = Engine([R14], StoreSignals(reader), interval_ns=10 * NS)
            events = JobEnd(duration_s=DURATION_S, ends={0: (END_S, code, signal)}).events()
            found, i = [], 0
            for t in range(10, DURATION_S + 1, 10):
                now = BASE_TS + t * NS
                batch = []
                while i < len(events) and events[i].ts <= now:
                    batch.append(Envelope("test", i, events[i]))
                    i += 1
                assert writer.write_batch(batch) == len(batch)
                found += engine.evaluate(now)
            return found
        finally:
            reader.close()
            db.close()

    assert warning_or_worse(store_run(0, None)) == []
    assert warning_or_worse(store_run(None, SIGKILL))
