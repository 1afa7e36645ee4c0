"""The scheduler probe watches a serving engine's frontend, a process that is no child of the
GPU process (vLLM V1: the API server is EngineCore's parent), and its engine loop, the
process between the engine and the GPU processes (vLLM V1's EngineCore above its
tensor-parallel workers), and says the busiest thread of each apart from the GPU process's
own threads and workers, for the first GPU process watched; once that one is gone, for
another of the engine's."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

# A GPU process stand-in: a worker child, both asleep.
GPU = "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\ntime.sleep(3600)\n"
# The EngineCore stand-in: two GPU processes under it, its main thread spinning (the
# scheduler's busy loop).
CORE = f"""
import subprocess, sys
gpus = [subprocess.Popen([sys.executable, "-c", {GPU!r}]) for _ in range(2)]
print(*(g.pid for g in gpus), flush=True)
while True:
    pass
"""
# The API server stand-in, run as `python -m vllm.entrypoints.openai.api_server` (what
# commandline.recognise calls vLLM): EngineCore under it, a thread spinning (the asyncio loop
# tokenising), and, on a line on stdin, a child forked (after the watch began).
SERVER = f"""
import subprocess, sys, threading
core = subprocess.Popen([sys.executable, "-c", {CORE!r}], stdout=subprocess.PIPE)
gpus = core.stdout.readline().split()
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print(*(int(g) for g in gpus), flush=True)
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print(child.pid, flush=True)
sys.stdin.readline()
"""


def _has_child(pid: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            return
        time.sleep(0.02)
    raise AssertionError(f"{pid} forked no worker")


def test_the_frontends_and_engine_loops_busiest_threads_are_said_apart(tmp_config, tmp_path):
    from gpuwhy.probes.sched import SchedProbe

    module = tmp_path / "vllm" / "entrypoints" / "openai"
    module.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", module):
        (folder / "__init__.py").write_text("")
    (module / "api_server.py").write_text(SERVER)
    published = []
    probe = SchedProbe(tmp_config, published.append)
    probe.load()
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
                              cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        first, second = map(int, server.stdout.readline().split())
        for pid in (first, second):
            _has_child(pid, time.monotonic() + 10)
        probe.watch(process_key(first))     # the second is its frontend's, for now
        probe.watch(process_key(second))    # a GPU process of its own: no one's frontend
        server.stdin.write(b"\n")
        server.stdin.flush()
        server.stdout.readline()            # forked by the frontend: the kernel flags it
        time.sleep(0.3)
        probe.flush()
        published.clear()
        for _ in range(3):
            time.sleep(0.3)
            probe.flush()
        watched = published[:]
        os.kill(first, signal.SIGKILL)
        time.sleep(0.1)
        probe.unwatch(first)
        gone = len(published)
        time.sleep(0.3)
        probe.flush()
        taken_over = [e for e in published[gone:] if e.process.pid == second]
    finally:
        probe.close()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert taken_over and taken_over[0].frontend["busiest_on_cpu_ns"] > 0, taken_over
    assert taken_over[0].engine_loop["busiest_on_cpu_ns"] > 0, taken_over
    by_pid = {}
    for event in watched:
        by_pid.setdefault(event.process.pid, []).append(event)
    assert len(by_pid[first]) == 3 and len(by_pid[second]) == 3
    assert all(e.frontend is None and e.engine_loop is None for e in by_pid[second])
    ours = by_pid[first]
    # the API server and its late child; EngineCore apart, as the engine loop
    assert all(e.frontend["processes"] == 2 for e in ours), [e.frontend for e in ours]
    assert all(e.engine_loop["processes"] == 1 for e in ours), [e.engine_loop for e in ours]
    total = sum(e.interval_ns for e in ours)
    for side in ("frontend", "engine_loop"):
        figures = [getattr(e, side) for e in ours]
        busiest = sum(f["busiest_on_cpu_ns"] for f in figures) / total
        # a busy host may give a spinning thread less than a core
        assert busiest > 0.3, (side, figures)
        assert busiest >= 0.9 * sum(f["on_cpu_ns"] for f in figures) / total, (side, figures)
    # the GPU process's own threads and its worker: asleep, one worker, as without it
    for events in by_pid.values():
        assert all(e.worker_processes == 1 for e in events)
        assert sum(e.own["on_cpu_ns"] + e.workers["on_cpu_ns"] for e in events) / total < 0.06
