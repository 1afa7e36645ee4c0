"""Every kind of reset sign through the real correlator: the incidents (``/resets``'s
source), the ``gpu_reset_history`` view and the rules' streams (live and from the store)
count the same resets; requests, a GPU that needs one, its return and a cron job that only
changes the power limit are never counted as one (gpuwhy/reset.py)."""

from __future__ import annotations

import dataclasses

from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import CronExecution, DriverCall, GpuState
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.identity import ProcessKey
from gpuwhy.nvioctl import RM_CONTROLS
from gpuwhy.reset import (
    BACK_STATES,
    NEEDED_STATES,
    RESET_CONTROLS,
    RESET_REQUEST_CONTROLS,
    RESET_STATES,
)
from gpuwhy.store.queries import gpu_events, reset_history

from .conftest import UUID0

CRON, SMI, POWER = ProcessKey(300, 2000), ProcessKey(301, 2001), ProcessKey(400, 3000)
MARK = next(n for n, name in RM_CONTROLS.items() if name == RESET_REQUEST_CONTROLS[0])


def _events(h) -> list:
    mark = dict(gpu_id=UUID0, source="sim", simulated=True)
    cron = [CronExecution(ts=h.at(t), cursor=f"cron-{t}", phase="started", user="root",
                          command=command, job_pid=key.pid, job_start_time=key.start_time,
                          gpu_action=gpu_action(command))
            for t, key, command in ((5, POWER, "nvidia-smi -pl 300"),
                                    (10, CRON, "nvidia-smi -r -i 0"))]
    request = DriverCall(ts=h.at(10.5), process=SMI, tid=SMI.pid, fd=3, path="/dev/nvidia0",
                         device="nvidiaN", cmd=0xC020462A, nr=0x2A, size=32,
                         op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0, sub=MARK,
                         sub_name=RESET_REQUEST_CONTROLS[0], reasons=["notable"])
    return [h.gpu(0), *cron,
            h.process(10, CRON, "sh", cgroup="/system.slice/cron.service"),
            h.process(10.2, SMI, "nvidia-smi", ppid=CRON.pid, cgroup="/system.slice/cron.service"),
            h.exec_(10.2, SMI, "/usr/bin/nvidia-smi", ppid=CRON.pid), request,
            dataclasses.replace(h.reset_call(11, SMI, path="/dev/nvidia0"), device="nvidiaN"),
            GpuState(ts=h.at(12), state=RESET_STATES[0], detail="reset", **mark),
            GpuState(ts=h.at(17), state=BACK_STATES[0], detail="back", **mark),
            # a second, later reset the GPU source alone saw, after it needed one
            GpuState(ts=h.at(300), state=NEEDED_STATES[1], detail="needs one", **mark),
            GpuState(ts=h.at(301), state=RESET_STATES[0], detail="reset", **mark),
            GpuState(ts=h.at(306), state=BACK_STATES[0], detail="back", **mark)]


def test_every_reader_counts_the_same_resets(harness):
    h = harness
    events = _events(h)
    h.feed(*events)
    h.feed(h.sample(400, 50))
    rows = h.db.execute("select ts, what, source, reset from gpu_reset_history "
                        "order by ts").fetchall()
    resets = [r[0] for r in rows if r[3] == "reset"]
    assert resets == [h.at(11), h.at(12), h.at(301)]
    assert [r[1] for r in rows if r[3] == "request"] == [
        "cron: nvidia-smi -r: GPU reset", f"driver call {RESET_REQUEST_CONTROLS[0]}"]
    assert not [r for r in rows if "power" in r[1]]           # not a reset of any kind
    # The incidents (what /resets and `gpuwhy resets` list): one per reset.
    history = sorted(reset_history(h.db), key=lambda r: r["at"])
    assert [r["at"] for r in history] == [h.at(11), h.at(301)]
    assert any(RESET_CONTROLS[0] in step for step in history[0]["by"])
    # The GPU page's marks.
    marks = gpu_events(h.db, UUID0, h.at(0), h.at(400))["resets"]
    assert [m["ts"] for m in marks] == resets
    # The rules, live and from the store.
    live = MemorySignals()
    live.feed(events)
    store = StoreSignals(h.db)
    store.begin(h.at(400))
    scope = Scope(UUID0)
    for signals in (live, store):
        seen = sorted(ts for stream in ("gpu.state", "driver.call")
                      for ts, row in signals.events(scope, stream, h.at(0), h.at(400))
                      if row["reset"] == "reset")
        assert seen == resets
        assert [ts for ts, row in signals.events(scope, "cron.run", h.at(0), h.at(400))
                if row["reset"] == "request"] == [h.at(10)]

