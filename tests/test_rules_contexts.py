"""`gpu.contexts`: how many processes hold a context on a GPU, from NVML's compute-process
list when the source sends one (stored: the service's path), else from device files."""

from __future__ import annotations

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import Envelope, GpuProcesses, GpuSeen, ProcessExited, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store, streams
from gpuwhy.store.writer import StoreWriter

S = NS_PER_SECOND
UUID = "GPU-00000000-1111-2222-3333-444444444444"
A, B = ProcessKey(100, 5), ProcessKey(200, 7)


def _write(db, *events):
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])


def test_the_stored_process_list_is_the_latest_recent_one_of_living_processes(tmp_path):
    db = open_store(tmp_path / "c.db")
    t0 = 1_764_000_000 * S
    assert streams.listed_processes_on(db, UUID, t0) is None          # no list: unknown
    row = {"used_memory_mib": 900, "sm_util": 10, "mem_util": 1, "enc_util": 0, "dec_util": 0}
    _write(db, GpuSeen(ts=t0, gpu_id=UUID, source="nvml", simulated=False, uuid=UUID),
           ProcessSeen(ts=t0, process=A, comm="python"),
           ProcessSeen(ts=t0, process=B, comm="python"),
           GpuProcesses(ts=t0, gpu_id=UUID, source="nvml", processes=[
               {"pid": A.pid, "start_time": A.start_time, **row}]),
           GpuProcesses(ts=t0 + S, gpu_id=UUID, source="nvml", processes=[
               {"pid": p.pid, "start_time": p.start_time, **row} for p in (A, B)]))
    listed = streams.listed_processes_on(db, UUID, t0)
    assert sorted((r["pid"], r["start_time"]) for r in listed) == [(100, 5), (200, 7)]
    assert streams.listed_processes_on(db, UUID, t0 + 2 * S) is None  # not recent any more
    _write(db, ProcessExited(ts=t0 + 2 * S, process=B, exit_code=0))
    assert [r["pid"] for r in streams.listed_processes_on(db, UUID, t0)] == [100]
    db.close()
