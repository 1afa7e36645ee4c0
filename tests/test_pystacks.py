"""The Python stacks behind a host-side answer, without root: folding and bounds
(gpuwhy.pystacks), the targets file, the service's choice of targets from a store the real
correlator wrote, the writer and read API, retention, and `gpuwhy why GPU` saying them.
The sampler itself, on real processes, is tests/privileged/test_pystacks_sampler.py."""

from __future__ import annotations

import dataclasses
import os

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.stack_targets import host_side_targets
from gpuwhy.clock import now_ns
from gpuwhy.events import PythonStacks, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.pystacks import (
    MAX_FRAMES,
    MAX_FUNCTION_CHARS,
    MAX_STACKS,
    Aggregate,
    Frame,
    Target,
    TargetsRefused,
    fold,
    host_side,
    read_targets,
    write_targets,
)
from gpuwhy.rules.loader import load_rules
from gpuwhy.store import open_store
from gpuwhy.store.queries import gpu_verdicts
from gpuwhy.store.retention import Windows, prune
from gpuwhy.store.stacks import folded_text, python_stacks

from .correlator.conftest import UUID0, Harness, S

SHIPPED = {rule.id: rule for rule in load_rules()}
STARVED = "R01_input_cpu_bound"
TRAINER = ProcessKey(4242, 1000)
WORKER = ProcessKey(4250, 1010)
LIB = "/usr/lib/python3.11"
T0 = (now_ns() - 600 * S) // S * S


def _frames(*spec: tuple[str, int, str]) -> list[Frame]:
    return [Frame(file, line, function) for file, line, function in spec]


def test_waits_inside_the_interpreter_fold_into_what_the_code_above_waits_on():
    stack, cut = fold(_frames(("/job/train.py", 88, "<module>"),
                              (f"{LIB}/multiprocessing/queues.py", 103, "Queue.get"),
                              (f"{LIB}/multiprocessing/connection.py", 216, "recv_bytes"),
                              (f"{LIB}/threading.py", 327, "Condition.wait")))
    assert (stack, cut) == ("train.py:88 <module>;waiting on multiprocessing queue", False)
    # a user's own threading.py is code, not the interpreter's lock
    mine, _ = fold(_frames(("/job/threading.py", 5, "Condition.wait")))
    assert mine == "threading.py:5 Condition.wait"
    # a library below site-packages keeps its package path
    lib, _ = fold(_frames((f"{LIB}/site-packages/PIL/Image.py", 3236, "open")))
    assert lib == "PIL/Image.py:3236 open"


def test_names_are_escaped_and_every_bound_holds():
    evil = "<b>x</b>\x1b[31m;y\n" + "z" * 500
    stack, _ = fold(_frames(("/job/a.py", 1, "main"), ("/job/a;b\x07.py", 2, evil)))
    frames = stack.split(";")
    assert len(frames) == 2 and stack.isprintable()
    assert frames[1].startswith("a\\x3bb\\x07.py:2 <b>x</b>\\x1b[31m\\x3by\\n")
    assert len(frames[1].split(" ", 1)[1]) == MAX_FUNCTION_CHARS
    deep, cut = fold(_frames(*[("/job/r.py", i, "f") for i in range(500)]))
    assert cut and len(deep.split(";")) == MAX_FRAMES and deep.endswith(";…")
    aggregate = Aggregate()
    for i in range(MAX_STACKS + 50):
        aggregate.add(1, 2, "main", f"s{i}", 2)
    assert len(aggregate.rows()) == MAX_STACKS
    assert aggregate.dropped["stacks_over_limit"] == 100


def test_host_side_answers_are_the_host_starvation_causes_and_unexplained_low_use():
    assert host_side("R01_input_cpu_bound", "host_starvation", "cause")
    assert host_side("R14b_low_gpu_utilisation", "device_efficiency", "symptom",
                     cause_established=False)
    assert not host_side("R14b_low_gpu_utilisation", "device_efficiency", "symptom")
    assert not host_side("R32_xid79_fallen_off_bus", "failures", "cause")


def test_targets_file_round_trips_and_one_others_could_write_is_refused(tmp_path):
    path = str(tmp_path / "targets.json")
    assert read_targets(path) == []
    targets = [Target(1, 2, "gpu", "f", "R01", 3)]
    write_targets(path, targets, 0)
    assert read_targets(path) == targets
    assert os.stat(path).st_mode & 0o777 == 0o640
    os.chmod(path, 0o666)
    with pytest.raises(TargetsRefused, match="another user"):
        read_targets(path)
    os.chmod(path, 0o640)
    os.symlink(path, tmp_path / "link.json")
    with pytest.raises(TargetsRefused):
        read_targets(str(tmp_path / "link.json"))
    (tmp_path / "big.json").write_text(" " * 70_000)
    os.chmod(tmp_path / "big.json", 0o600)
    with pytest.raises(TargetsRefused, match="larger"):
        read_targets(str(tmp_path / "big.json"))


def _stacks_event(finding_id: str, ts: int) -> PythonStacks:
    rows = ([{"pid": TRAINER.pid, "start_time": TRAINER.start_time, "role": "main",
              "stack": "train.py:80 <module>;train.py:88 <module>;waiting on multiprocessing "
                       "queue", "count": 71},
             {"pid": TRAINER.pid, "start_time": TRAINER.start_time, "role": "main",
              "stack": "train.py:80 <module>;train.py:95 step", "count": 29}]
            + [{"pid": WORKER.pid, "start_time": WORKER.start_time, "role": "workers",
                "stack": "worker.py:9 loop;dataset.py:41 load", "count": 64},
               {"pid": WORKER.pid, "start_time": WORKER.start_time, "role": "workers",
                "stack": "worker.py:9 loop;dataset.py:50 decode", "count": 36},
               # from a hostile sender: no known role, a control character
               {"pid": 1, "start_time": 1, "role": "root", "stack": "x", "count": 5},
               {"pid": 1, "start_time": 1, "role": "threads", "stack": "a\x1b[2Jb", "count": 1}])
    return PythonStacks(ts=ts, process=TRAINER, gpu_id=UUID0, finding_id=finding_id,
                        rule_id=STARVED, started=ts - 30 * S, interval_ms=100, samples=300,
                        stacks=rows)


@pytest.fixture
def starved(tmp_config):
    """A store the real correlator wrote: a GPU, a trainer bound to it, R01 firing on it, and
    the stacks the sampler published for that finding."""
    harness = Harness(tmp_config, T0)
    rule, t = SHIPPED[STARVED], harness.at(30)
    finding_id = f"{STARVED}:{UUID0}:-:{t}"
    try:
        harness.feed(harness.gpu(0))
        harness.feed(*(harness.sample(t, 20.0) for t in range(3, 9)))
        harness.feed(harness.process(1, TRAINER, "python"), harness.opened(1, TRAINER))
        harness.feed(dataclasses.replace(harness.process(2, WORKER, "pt_data_worker"),
                                         ppid=TRAINER.pid))
        harness.feed(RuleFinding(
            ts=t, finding_id=finding_id, rule_id=STARVED, title=rule.title,
            severity="warning", state="firing", gpu_id=UUID0, process=TRAINER,
            window_start=t - rule.window_ns, window_end=t, evidence={"workers_cpu": 0.97},
            fixes=["Raise num_workers"], verify="gpu.util rises", group=rule.group, since=t,
            processes=[TRAINER], rule_kind=rule.kind, explains=list(rule.explains)))
        harness.feed(_stacks_event(finding_id, harness.at(60)))
    finally:
        harness.close()
    return tmp_config, finding_id


def test_the_service_names_the_bound_processes_of_a_host_side_answer_for_its_window(starved):
    config, finding_id = starved
    db = open_store(config["store.path"], readonly=True)
    try:
        verdicts = gpu_verdicts(db, SHIPPED)
        seen: dict[str, int] = {}
        now = now_ns()
        targets = host_side_targets(db, verdicts, SHIPPED, seen, now, 30 * S)
        assert [(t.pid, t.start_time, t.finding_id, t.until) for t in targets] == [
            (TRAINER.pid, TRAINER.start_time, finding_id, now + 30 * S)]
        # the window runs from when the answer was first seen, not from each look
        assert host_side_targets(db, verdicts, SHIPPED, seen, now + 10 * S, 30 * S)[0].until \
            == now + 30 * S
        assert host_side_targets(db, verdicts, SHIPPED, seen, now + 31 * S, 30 * S) == []
        # an answer that no longer leads is forgotten
        assert host_side_targets(db, [], SHIPPED, seen, now, 30 * S) == [] and seen == {}
    finally:
        db.close()


def test_stored_stacks_are_cleaned_read_back_said_by_why_and_pruned(starved):
    config, finding_id = starved
    db = open_store(config["store.path"], readonly=True)
    try:
        [row] = python_stacks(db, finding_id=finding_id)
        assert python_stacks(db, gpu_id="another") == []
    finally:
        db.close()
    assert {(s["role"], s["stack"]) for s in row["stacks"]} >= {
        ("workers", "worker.py:9 loop;dataset.py:41 load"), ("threads", "a\\x1b[2Jb")}
    assert all(s["role"] != "root" for s in row["stacks"])
    assert row["summary"] == ("main thread 71 % in train.py:88 <module>, waiting on "
                              "multiprocessing queue; workers 64 % in dataset.py:41 load")
    assert "workers;4250;worker.py:9 loop;dataset.py:41 load 64\n" in folded_text(row)

    result = CliRunner().invoke(cli, ["why", "0"], env={"GPUWHY_DB": config["store.path"]})
    assert result.exit_code == 1, result.output
    assert ("    main thread: 71 % in train.py:88 <module>, waiting on multiprocessing queue; "
            "29 % in train.py:95 step") in result.output
    assert "    workers: 64 % in dataset.py:41 load; 36 % in dataset.py:50 decode" \
        in result.output
    assert "\x1b" not in result.output

    writable = open_store(config["store.path"])
    try:
        prune(writable, Windows(event_days=1), now_ns() + 2 * 86_400 * S)
        assert python_stacks(writable) == []
    finally:
        writable.close()


def test_py_spy_output_is_read_by_structure_and_its_own_frames_are_left_out():
    import json

    from gpuwhy.probes.stack_sampler import parse_speedscope

    frames = [{"name": "process 10:\"python train.py\"", "file": "", "line": 0},
              {"name": "thread (10): MainThread", "file": "", "line": 0},
              {"name": "<module>", "file": "/job/train.py", "line": 88},
              {"name": "load", "file": "/job/dataset.py", "line": 41},
              {"name": "Queue.get", "file": f"{LIB}/queue.py", "line": 180}]
    body = {"shared": {"frames": frames}, "profiles": [
        {"name": "Process 10 Thread 10 \"MainThread\"", "samples": [[0, 1, 2, 4]] * 3},
        {"name": "Process 10 Thread 11 \"pin_memory\"", "samples": [[2, 4, 99]]},
        {"name": "Process 12 Thread 1 \"MainThread\"", "samples": [[2, 3]] * 2},
        {"name": "Process 12\nThread 12", "samples": [[3]]}]}
    aggregate, rounds = parse_speedscope(
        json.dumps(body).encode(), ProcessKey(10, 500), lambda pid: 600,
        main_tids=lambda pid: {pid, 1})        # pid 12 is pid 1 in its own namespace
    assert rounds == 3 and aggregate.dropped == {"unnamed_profiles": 1}
    assert aggregate.rows() == [
        {"pid": 10, "start_time": 500, "role": "main",
         "stack": "train.py:88 <module>;waiting on queue.Queue", "count": 3},
        {"pid": 10, "start_time": 500, "role": "threads",
         "stack": "train.py:88 <module>;waiting on queue.Queue", "count": 1},
        {"pid": 12, "start_time": 600, "role": "workers",
         "stack": "train.py:88 <module>;dataset.py:41 load", "count": 2}]


def test_samples_line_up_with_the_gpus_seconds_and_hostile_seconds_are_dropped():
    import json

    from gpuwhy.probes.stack_sampler import parse_speedscope
    from gpuwhy.pystacks import clean_rows, split_by_gpu

    frames = [{"name": "step", "file": "/job/train.py", "line": 7},
              {"name": "wait", "file": "/job/train.py", "line": 9}]
    body = {"shared": {"frames": frames}, "profiles": [
        {"name": "Process 10 Thread 10 \"MainThread\"", "startValue": 0.0,
         "samples": [[0], [0], [1], [1], [1]], "weights": [0.5, 0.5, 0.5, 0.5, 0.5]}]}
    aggregate, _ = parse_speedscope(json.dumps(body).encode(), ProcessKey(10, 500),
                                    lambda pid: 0)
    rows = aggregate.rows()
    assert [(r["stack"], r["seconds"]) for r in rows] == [
        ("train.py:9 wait", [[1, 2], [2, 1]]), ("train.py:7 step", [[0, 2]])]
    assert clean_rows(rows) == rows
    split = split_by_gpu(rows, {0: False, 1: True})        # no sample of second 2
    assert [(r["stack"], r["count"]) for r in split["idle"]] == [("train.py:9 wait", 2)]
    assert [(r["stack"], r["count"]) for r in split["busy"]] == [("train.py:7 step", 2)]
    for hostile in ([[1, 99]], [[-1, 1]], [[1, True]], "x", [[1, 1, 1]], [[10**6, 1]]):
        [kept] = clean_rows([{**rows[0], "seconds": hostile}])
        assert "seconds" not in kept


FAKE_PY_SPY = '''#!{python}
"""Stands in for py-spy record: writes one sample a second of its --duration at once and
exits; fails, writing nothing, when the file named by FAIL_AFTER holds a count at 0."""
import json, os, sys
args = sys.argv
seconds, output = int(args[args.index("--duration") + 1]), args[args.index("--output") + 1]
pid = args[args.index("--pid") + 1]
calls = "{calls}"
done = int(open(calls).read()) if os.path.exists(calls) else 0
open(calls, "w").write(str(done + 1))
if done >= {fail_after}:
    sys.stderr.write("Error: the process went away\\n")
    sys.exit(1)
frames = [{{"name": "step", "file": "/job/train.py", "line": 7 + done}}]
json.dump({{"shared": {{"frames": frames}}, "profiles": [{{
    "name": f"Process {{pid}} Thread {{pid}} \\"MainThread\\"", "startValue": 0.0,
    "samples": [[0]] * seconds, "weights": [1.0] * seconds}}]}}, open(output, "w"))
'''


@pytest.mark.parametrize("fail_after", [2, 1])
def test_a_window_publishes_its_first_seconds_at_once_then_the_whole_window(tmp_path,
                                                                           fail_after):
    """The first run (FIRST_RUN_SECONDS) is published not final, the second adds the rest
    of the window (its seconds after the first's) and ends it; a second run that fails
    keeps what the first sampled, with the error."""
    import sys
    import time

    from gpuwhy.probes.stack_sampler import FIRST_RUN_SECONDS, StackSampler
    from gpuwhy.proc import process_key
    from gpuwhy.pystacks import Target, write_targets

    spy = tmp_path / "py-spy"
    spy.write_text(FAKE_PY_SPY.format(python=sys.executable, calls=tmp_path / "calls",
                                      fail_after=fail_after))
    spy.chmod(0o755)
    me = process_key(os.getpid())
    path = str(tmp_path / "targets.json")
    write_targets(path, [Target(me.pid, me.start_time, "g", "f", STARVED,
                                now_ns() + 20 * S)], now_ns())
    events: list[PythonStacks] = []
    sampler = StackSampler(path, events.append, py_spy=str(spy))
    try:
        deadline = time.monotonic() + 20
        while not (events and events[-1].final) and time.monotonic() < deadline:
            sampler.step()
            time.sleep(0.05)
    finally:
        sampler.close()
    first, whole = events
    assert not first.final and first.samples == FIRST_RUN_SECONDS and first.error == ""
    assert [r["stack"] for r in first.stacks] == ["train.py:7 step"]
    assert whole.final and whole.started == first.started
    if fail_after == 1:
        assert "went away" in whole.error and whole.stacks == first.stacks
        assert whole.samples == first.samples
        return
    # the fake ends at once: the second run asks for what is left of the 20 s window
    assert whole.error == "" and first.samples + 14 <= whole.samples <= first.samples + 20
    stacks = {r["stack"]: r for r in whole.stacks}
    assert stacks["train.py:7 step"] == first.stacks[0]
    # the second run's seconds count from the window's start: here the fake's first run
    # took no time, so they start at 0 again; parse_speedscope is given the offset
    assert stacks["train.py:8 step"]["count"] == whole.samples - first.samples
    from gpuwhy.probes.stack_sampler import parse_speedscope

    body = ('{"shared": {"frames": [{"name": "f", "file": "/a.py", "line": 1}]}, "profiles": '
            '[{"name": "Process 1 Thread 1", "samples": [[0], [0]], "weights": [1, 1]}]}')
    shifted, _ = parse_speedscope(body.encode(), ProcessKey(1, 2), lambda pid: 0,
                                  offset=float(FIRST_RUN_SECONDS))
    assert shifted.rows()[0]["seconds"] == [[FIRST_RUN_SECONDS, 1], [FIRST_RUN_SECONDS + 1, 1]]


DENIED_PY_SPY = '''#!{python}
import sys
sys.stderr.write("Error: Permission Denied: Try running again with elevated permissions\\n")
sys.exit(1)
'''


def _sampler_with(tmp_path, script: str):
    """A sampler whose py-spy is ``script`` (a stand-in that fails as py-spy does), its
    targets file in a folder of its own, and the events it publishes."""
    import sys

    from gpuwhy.probes.stack_sampler import StackSampler

    spy = tmp_path / "py-spy"
    spy.write_text(script.format(python=sys.executable))
    spy.chmod(0o755)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = str(folder / "targets.json")
    events: list[PythonStacks] = []
    return path, events, StackSampler(path, events.append, py_spy=str(spy))


def test_the_samplers_heartbeat_says_idle_sampling_refused_and_counts(tmp_path):
    """Its health: ok and idle with no target; degraded, saying so, when the kernel refused
    it a target's memory (py-spy's "Permission Denied": a ptrace refusal) or the targets
    file is one it must not trust; its counters the targets, runs and errors."""
    import time

    from gpuwhy.probes.stack_sampler import SOURCE
    from gpuwhy.proc import process_key

    path, events, sampler = _sampler_with(tmp_path, DENIED_PY_SPY)
    try:
        sampler.step()
        idle = sampler.health()
        assert (idle.source, idle.state) == (SOURCE, "ok") and "idle" in idle.detail
        assert idle.counters["targets"] == 0 and idle.counters["errors"] == 0
        me = process_key(os.getpid())
        write_targets(path, [Target(me.pid, me.start_time, "g", "f", STARVED,
                                    now_ns() + 20 * S)], now_ns())
        sampler.step()
        busy = sampler.health()
        assert busy.state == "ok" and busy.counters["sampling"] == 1
        assert "sampling 1 of 1 targets" in busy.detail
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            sampler.step()
            time.sleep(0.05)
        refused = sampler.health()
        assert refused.state == "degraded" and "refused (ptrace)" in refused.detail
        assert f"pid {me.pid}: Error: Permission Denied" in refused.detail
        assert (refused.counters["errors"], refused.counters["denied"]) == (1, 1)
        os.chmod(path, 0o666)          # anyone could name whose memory it reads
        sampler.step()
        untrusted = sampler.health()
        assert untrusted.state == "degraded" and "targets file refused" in untrusted.detail
        assert untrusted.counters["refused_targets"] == 1 and untrusted.counters["targets"] == 0
    finally:
        sampler.close()
    assert [e.error for e in events] == ["Error: Permission Denied: Try running again with "
                                         "elevated permissions"]


UNSUPPORTED_PY_SPY = '''#!{python}
import sys
sys.stderr.write("Error: Failed to find python version from target process\\n")
sys.exit(1)
'''


def test_the_heartbeat_turns_degraded_after_failures_in_a_row_not_after_one(tmp_path):
    """A failure that is no ptrace refusal (an interpreter py-spy cannot read) leaves the
    sampler ok once, a target may have exited mid-run; FAILURES_DEGRADE in a row, and
    nothing sampled between, is a sampler that samples nothing: degraded, saying why."""
    import time

    from gpuwhy.probes.stack_sampler import FAILURES_DEGRADE
    from gpuwhy.proc import process_key

    path, events, sampler = _sampler_with(tmp_path, UNSUPPORTED_PY_SPY)
    me = process_key(os.getpid())
    states = []
    try:
        for n in range(1, FAILURES_DEGRADE + 1):     # one answer after another, each failing
            write_targets(path, [Target(me.pid, me.start_time, "g", f"f{n}", STARVED,
                                        now_ns() + 20 * S)], now_ns())
            deadline = time.monotonic() + 10
            while len(events) < n and time.monotonic() < deadline:
                sampler.step()
                time.sleep(0.05)
            states.append(sampler.health().state)
        last = sampler.health()
    finally:
        sampler.close()
    assert [e.error for e in events] == ["Error: Failed to find python version from target "
                                         "process"] * FAILURES_DEGRADE
    assert states == ["ok"] * (FAILURES_DEGRADE - 1) + ["degraded"]
    assert f"the last {FAILURES_DEGRADE} py-spy runs failed" in last.detail
    assert "refused (ptrace)" not in last.detail
