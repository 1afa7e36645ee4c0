"""The Python stack sampler: where the processes behind a host-side answer spend their time.

It samples only the processes the service names in its targets file
(:func:`gpuwhy.pystacks.read_targets`: processes bound to a GPU whose answer is host-side),
and their child processes (DataLoader workers), every ``stacks.interval_ms`` until the
target's window ends or the service drops it (the answer cleared). Each target is sampled by
one ``py-spy record --nonblocking`` child: py-spy reads the interpreter's memory with
process_vm_readv and never stops the target (no ptrace stop, no signal, no injected code),
and reaches a container's files through /proc/PID/root. When the child ends, its
speedscope output (JSON: nothing a frame's name holds can forge a line) is folded into a
bounded aggregate (:class:`gpuwhy.pystacks.Aggregate`) and published as one
``python_stacks`` event; the samples themselves never leave this process.
docs/decisions/0018-python-stacks-sampler.md says why py-spy, and what it costs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.errors import BusError, GpuwhyError
from gpuwhy.events import Event, PythonStacks, SourceHealth
from gpuwhy.identity import ProcessKey
from gpuwhy.proc import NoSuchProcess, process_key
from gpuwhy.pystacks import (
    Aggregate,
    Frame,
    Target,
    TargetsRefused,
    escape,
    fold,
    read_targets,
)

if TYPE_CHECKING:
    from gpuwhy.bus import Publisher

log = logging.getLogger(__name__)

STEP_SECONDS = 0.5           # how often the targets file and the children are looked at
IDLE_SECONDS = 2.0           # ... while nothing is sampled: an idle host wakes us rarely
STOP_SECONDS = 5.0           # a py-spy asked to stop (SIGINT) that has not written by then
MAX_OUTPUT_BYTES = 64 << 20  # a speedscope file larger than this is not read
MAX_ERROR_CHARS = 300
# py-spy runs that failed one after another, for any reason, before the heartbeat says
# degraded: one failure is a target that exited mid-run or a torn read; three in a row is a
# sampler that samples nothing (an interpreter py-spy does not support, a broken binary)
FAILURES_DEGRADE = 3
MAX_WINDOW_SECONDS = 3600    # a run's longest window, whatever the file says
# A window's first py-spy run lasts this long and is published at once (``final`` false),
# so that the answer has its stacks seconds after it forms (issue #57: within 10 s), not
# at the end of a 30 s window; a second run samples the rest, and its event (the whole
# window, cumulative) replaces the first in the store. A shorter window is one run.
FIRST_RUN_SECONDS = 5
# The sampler's heartbeat (``source_health``, source ``stacks``): every HEALTH_EVERY_S, at
# once when a subscriber (re)connects, and when its state changes; gpuwhy.stalls holds the
# same period, after three of which a silent sampler is called stalled.
SOURCE = "stacks"
HEALTH_EVERY_S = 5.0
MAX_DETAIL_CHARS = 600
# py-spy's words when the kernel refused to let it read a target's memory (no
# CAP_SYS_PTRACE over it, Yama's ptrace_scope, a seccomp or LSM rule): a fault of the
# sampler's setup, not of the target
_DENIED = re.compile(r"permission denied|operation not permitted|\bEPERM\b", re.I)
_PROFILE = re.compile(r"^Process (\d+) Thread (\d+)\b")
_MARK = re.compile(r"^(?:process \d+:|thread \(\d+\))")


def find_py_spy() -> str | None:
    """The py-spy installed beside this Python (the venv's bin), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("py-spy", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


@dataclass
class Run:
    """One py-spy child sampling one target: the window's first run, or the one that
    samples the rest of it (``so_far``: what the first one sampled)."""

    target: Target
    process: subprocess.Popen
    output: str
    errors: str
    started: int                    # when this run's py-spy started
    window_started: int             # when the window's first one did
    last: bool                      # this run ends the window
    so_far: Aggregate | None = None
    rounds_so_far: int = 0
    stopping_since: float | None = None


def namespace_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """The pid of ``pid`` in its own innermost PID namespace (``NSpid``'s last field): py-spy
    names a containerised process's threads by their ids in there."""
    try:
        with open(f"{proc_root}/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_speedscope(data: bytes, target: ProcessKey,
                     start_time_of: Callable[[int], int],
                     main_tids: Callable[[int], set[int]] = lambda pid: {pid},
                     aggregate: Aggregate | None = None, offset: float = 0.0,
                     ) -> tuple[Aggregate, int]:
    """py-spy's speedscope output as a bounded aggregate and the sampling rounds it holds.
    A profile is one thread: ``Process PID Thread TID "name"``; a process's main thread is
    the one whose id is in ``main_tids(PID)`` (its pid, and its pid in its own namespace),
    ``main`` for the target, ``workers`` for a child process; every other thread is
    ``threads``. ``aggregate``: add to this one (a window's earlier run); ``offset``: the
    seconds from the window's start to this run's, for each sample's second."""
    body = json.loads(data)
    frames = [f if isinstance(f, dict) else {} for f in body.get("shared", {}).get("frames", [])]
    table = [Frame(str(f.get("file") or ""), f.get("line"), str(f.get("name") or ""))
             for f in frames]
    # py-spy's own frames for --subprocesses and --threads (a process's command line, a
    # thread's id): the role says as much, and a command line is no code
    marks = {i for i, f in enumerate(table) if not f.file and _MARK.match(f.function)}
    aggregate = Aggregate() if aggregate is None else aggregate
    rounds = 0
    processes: dict[int, tuple[int, set[int]]] = {}     # each process read from /proc once
    for profile in body.get("profiles", []):
        found = _PROFILE.match(str(profile.get("name", "")))
        if found is None:
            aggregate.dropped["unnamed_profiles"] += 1
            continue
        pid, tid = int(found.group(1)), int(found.group(2))
        if pid not in processes:
            processes[pid] = (target.start_time if pid == target.pid else start_time_of(pid),
                              main_tids(pid))
        start, mains = processes[pid]
        if tid not in mains:
            role = "threads"                     # any other thread, the target's or a worker's
        else:
            role = "main" if pid == target.pid else "workers"
        samples = profile.get("samples", [])
        if pid == target.pid and role == "main":
            rounds = max(rounds, len(samples))
        folded: dict[tuple[int, ...], str] = {}
        # py-spy keeps a thread's samples in order, each with its weight (the seconds it
        # stands for): their running sum is when each was taken, from the window's start
        weights = profile.get("weights") or []
        at = float(profile.get("startValue") or 0.0) + offset
        for index, sample in enumerate(samples):
            second = int(at) if index < len(weights) else None
            if index < len(weights):
                at += float(weights[index])
            key = tuple(sample)
            stack = folded.get(key)
            if stack is None:
                stack, cut = fold(table[i] for i in key
                                  if 0 <= i < len(table) and i not in marks)
                folded[key] = stack
                if cut:
                    aggregate.dropped["stacks_cut"] += 1
            aggregate.add(pid, start, role, stack or "(no Python frame)", second=second)
    return aggregate, rounds


class StackSampler:
    """Starts, stops and reads one py-spy child per target of the targets file; call
    :meth:`step` every STEP_SECONDS and :meth:`close` at the end."""

    def __init__(self, targets_path: str, publish: Callable[[Event], object],
                 interval_ms: int = 100, proc_root: str = "/proc",
                 py_spy: str | None = None, clock: Callable[[], int] = now_ns):
        self.targets_path = targets_path
        self.publish = publish
        self.interval_ms = interval_ms
        self.proc_root = proc_root
        self.py_spy = py_spy or find_py_spy()
        self.clock = clock
        self.runs: dict[tuple[str, int, int], Run] = {}
        self.done: set[tuple[str, int, int]] = set()
        self.workdir = tempfile.mkdtemp(prefix="gpuwhy-stacks-")
        self.counters = {"runs": 0, "published": 0, "samples": 0, "refused_targets": 0,
                         "gone": 0, "errors": 0, "denied": 0}
        self.last_refusal = ""
        self.targets_now = 0           # the targets file's live targets, at the last step
        self.last_error = ""           # the last failed run's, "pid N: why" (escaped)
        self.denied = False            # the last run that ended was refused reading memory
        self.failed_in_a_row = 0       # runs that failed since the last one that sampled

    @property
    def rate(self) -> int:
        """Samples a second, as py-spy takes it (a whole number, at least 1)."""
        return max(1, round(1000 / self.interval_ms))

    def _targets(self) -> list[Target]:
        try:
            targets = read_targets(self.targets_path)
        except TargetsRefused as exc:
            if str(exc) != self.last_refusal:
                log.warning("stack sampler: %s; sampling nothing", exc)
                self.last_refusal = str(exc)
            self.counters["refused_targets"] += 1
            return []
        self.last_refusal = ""
        return targets

    def step(self) -> None:
        """Stop the runs whose target was dropped or whose window ended, publish the runs
        that ended, start a run for each new target (once per target and answer)."""
        now = self.clock()
        wanted = {t.key: t for t in self._targets() if t.until > now}
        self.targets_now = len(wanted)
        for key, run in list(self.runs.items()):
            if (key not in wanted or run.target.until <= now) and run.stopping_since is None:
                self._stop(run)
            if run.process.poll() is not None:
                self._finish(key, run)
            elif run.stopping_since is not None and \
                    time.monotonic() - run.stopping_since > STOP_SECONDS:
                run.process.kill()
                run.process.wait()
                self._finish(key, run)
        self.done &= set(wanted) | set(self.runs)    # forget answers that are gone
        for key, target in wanted.items():
            if key not in self.runs and key not in self.done:
                self._start(target, now)

    def _stop(self, run: Run) -> None:
        run.stopping_since = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            run.process.send_signal(signal.SIGINT)     # py-spy writes what it has, then ends

    def _start(self, target: Target, now: int) -> None:
        self.done.add(target.key)
        try:
            if process_key(target.pid, self.proc_root).start_time != target.start_time:
                raise NoSuchProcess(target.pid)        # the pid was reused: not ours
        except (NoSuchProcess, OSError, ValueError, IndexError):
            self.counters["gone"] += 1
            return
        if self.py_spy is None:
            self._publish_error(target, now, "py-spy is not installed (pip install py-spy)")
            return
        self._spawn(target, now, now)

    def _spawn(self, target: Target, now: int, window_started: int,
               so_far: Aggregate | None = None, rounds_so_far: int = 0) -> None:
        """Start a py-spy run for ``target``: the window's first (FIRST_RUN_SECONDS at most),
        or, given what it sampled, the rest of the window."""
        if self.py_spy is None:        # said on the answer by _start
            return
        seconds = min(MAX_WINDOW_SECONDS, max(1, math.ceil((target.until - now) / 1e9)))
        last = so_far is not None or seconds <= FIRST_RUN_SECONDS + 1
        if not last:
            seconds = FIRST_RUN_SECONDS
        name = f"{target.pid}-{target.start_time}-{len(self.runs)}-{self.counters['runs']}"
        output = os.path.join(self.workdir, f"{name}.json")
        errors = os.path.join(self.workdir, f"{name}.err")
        command = [self.py_spy, "record", "--nonblocking", "--idle", "--threads",
                   "--subprocesses", "--format", "speedscope", "--rate", str(self.rate),
                   "--duration", str(seconds), "--output", output, "--pid", str(target.pid)]
        with open(errors, "wb") as err:
            try:
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=err,
                                           close_fds=True)
            except OSError as exc:
                self._publish_error(target, window_started, f"cannot run py-spy: {exc.strerror}")
                return
        # The sampler gives way to the work it watches.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid, 10)
        self.counters["runs"] += 1
        self.runs[target.key] = Run(target, process, output, errors, started=now,
                                    window_started=window_started, last=last, so_far=so_far,
                                    rounds_so_far=rounds_so_far)

    def _finish(self, key: tuple[str, int, int], run: Run) -> None:
        del self.runs[key]
        target = run.target
        started = run.window_started
        try:
            size = os.path.getsize(run.output)
        except OSError:
            size = -1
        try:
            if size < 0:
                self._publish_error(target, started, self._error_text(run), run)
                return
            if size > MAX_OUTPUT_BYTES:
                self._publish_error(target, started,
                                    f"py-spy wrote {size} bytes, more than {MAX_OUTPUT_BYTES}",
                                    run)
                return
            with open(run.output, "rb") as file:
                data = file.read(MAX_OUTPUT_BYTES + 1)
            try:
                aggregate, rounds = parse_speedscope(
                    data, ProcessKey(target.pid, target.start_time), self._start_time,
                    self._main_tids, aggregate=run.so_far,
                    offset=(run.started - run.window_started) / 1e9)
            except (ValueError, TypeError, AttributeError) as exc:
                self._publish_error(target, started, f"unreadable py-spy output: {exc}", run)
                return
            self.counters["samples"] += rounds
            self.denied = False
            self.failed_in_a_row = 0
            rounds += run.rounds_so_far
            now = self.clock()
            # the first run ended on its own and the window goes on: say what it found now,
            # sample the rest
            more = not run.last and run.stopping_since is None and \
                target.until - now > 1e9 and self._same_process(target)
            self.publish(PythonStacks(
                ts=now, process=ProcessKey(target.pid, target.start_time),
                gpu_id=target.gpu_id, finding_id=target.finding_id, rule_id=target.rule_id,
                started=started, interval_ms=self.interval_ms, samples=rounds,
                stacks=aggregate.rows(), final=not more, dropped=dict(aggregate.dropped)))
            self.counters["published"] += 1
            if more:
                self._spawn(target, now, started, aggregate, rounds)
        finally:
            for path in (run.output, run.errors):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _error_text(self, run: Run) -> str:
        try:
            with open(run.errors, "rb") as file:
                file.seek(max(0, os.path.getsize(run.errors) - 2000))
                tail = file.read().decode("utf-8", "replace")
        except OSError:
            tail = ""
        lines = [line for line in tail.splitlines() if line.startswith("Error")]
        return escape(lines[-1] if lines else f"py-spy exited with status "
                      f"{run.process.returncode} and wrote nothing", MAX_ERROR_CHARS)

    def _main_tids(self, pid: int) -> set[int]:
        inner = namespace_pid(pid, self.proc_root)
        return {pid} if inner is None else {pid, inner}

    def _start_time(self, pid: int) -> int:
        try:
            return process_key(pid, self.proc_root).start_time
        except (NoSuchProcess, OSError, ValueError, IndexError):
            return 0         # a worker gone before the window ended: its samples stay

    def _same_process(self, target: Target) -> bool:
        try:
            return process_key(target.pid, self.proc_root).start_time == target.start_time
        except (NoSuchProcess, OSError, ValueError, IndexError):
            return False

    def _publish_error(self, target: Target, started: int, error: str,
                       run: Run | None = None) -> None:
        """Say why sampling failed; a window's second run that failed keeps what the first
        one sampled (its event replaces the first's in the store)."""
        self.counters["errors"] += 1
        self.failed_in_a_row += 1
        self.denied = bool(_DENIED.search(error))
        self.counters["denied"] += int(self.denied)
        self.last_error = f"pid {target.pid}: {error}"
        log.warning("stack sampler: pid %d: %s", target.pid, error)
        so_far = run.so_far if run is not None else None
        self.publish(PythonStacks(
            ts=self.clock(), process=ProcessKey(target.pid, target.start_time),
            gpu_id=target.gpu_id, finding_id=target.finding_id, rule_id=target.rule_id,
            started=started, interval_ms=self.interval_ms,
            samples=run.rounds_so_far if run is not None and so_far is not None else 0,
            stacks=so_far.rows() if so_far is not None else [], final=True, error=error,
            dropped=dict(so_far.dropped) if so_far is not None else {}))

    def health(self) -> SourceHealth:
        """The sampler's heartbeat: ``ok`` while it samples or waits for targets (idle is
        no fault: no host-side answer holds); ``degraded`` without py-spy, while the targets
        file is refused, when its last run was refused reading the target's memory (a
        ptrace refusal), or when FAILURES_DEGRADE runs in a row failed for any other reason
        (one failure is a target that exited mid-run); counters: the targets now, the
        py-spy runs going, and totals."""
        state, notes = "ok", []
        if self.py_spy is None:
            state = "degraded"
            notes.append("py-spy is not installed (pip install py-spy): nothing is sampled")
        if self.last_refusal:
            state = "degraded"
            notes.append(f"targets file refused: {escape(self.last_refusal, 200)}")
        if self.denied:
            state = "degraded"
            notes.append(f"reading a target's memory was refused (ptrace): {self.last_error}")
        elif self.failed_in_a_row >= FAILURES_DEGRADE:
            state = "degraded"
            notes.append(f"the last {self.failed_in_a_row} py-spy runs failed, none sampled: "
                         f"{self.last_error}")
        elif self.last_error:
            notes.append(f"last error: {self.last_error}")
        if self.runs:
            doing = f"sampling {len(self.runs)} of {self.targets_now} targets"
        elif self.targets_now:
            doing = f"{self.targets_now} targets, each sampled for its window or gone"
        else:
            doing = "idle: no target (no host-side answer holds)"
        totals = (f"{self.counters['published']} windows published, "
                  f"{self.counters['samples']} samples, {self.counters['errors']} errors")
        detail = "; ".join([doing, totals, *notes])     # each part escaped where untrusted
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[:MAX_DETAIL_CHARS - 1] + "…"
        return SourceHealth(ts=self.clock(), source=SOURCE, state=state, detail=detail,
                            counters={"targets": self.targets_now, "sampling": len(self.runs),
                                      **self.counters})

    def close(self) -> None:
        """Stop every run, publish what each sampled, remove the working directory."""
        for run in self.runs.values():
            if run.stopping_since is None:
                self._stop(run)
        deadline = time.monotonic() + STOP_SECONDS
        for key, run in list(self.runs.items()):
            try:
                run.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait()
            self._finish(key, run)
        shutil.rmtree(self.workdir, ignore_errors=True)


CAP_SYS_PTRACE = 19


def may_read_other_processes(proc_root: str = "/proc") -> bool:
    """Whether this process may read other users' processes' memory: CAP_SYS_PTRACE in its
    effective set (py-spy, its child, inherits the same). Root holds it, unless it was
    taken away: uid 0 alone (a container's `serve`, every capability dropped) is not
    enough, and its py-spy would fail on every answer."""
    try:
        with open(f"{proc_root}/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def run_stack_sampler(config: Config, stop: threading.Event, alone: bool = False) -> None:
    """The sampler as a source: publish ``python_stacks`` events until ``stop`` is set.
    Does nothing when ``stacks.enabled`` is false, or without the privilege to read other
    processes (said once: the unprivileged service of the systemd split). ``alone``: the
    sampler is the whole process (`gpuwhy probes --only stacks`,
    systemd/gpuwhy-stacks.service), for which no privilege is an error (GpuwhyError)."""
    if not config["stacks.enabled"]:
        if alone:
            log.warning("stack sampler: stacks.enabled is false: nothing to sample")
        return
    if not may_read_other_processes():
        if alone:
            why = ("the stack sampler needs CAP_SYS_PTRACE (or root) to read other "
                   "processes' memory; systemd/gpuwhy-stacks.service grants it")
            _say_failed(config, why)
            raise GpuwhyError(why)
        log.info("stack sampler: no CAP_SYS_PTRACE here: Python stacks are not sampled by "
                 "this process (under systemd, gpuwhy-stacks.service samples them)")
        return
    from gpuwhy.bus import Publisher

    publisher = Publisher(config["bus.endpoint"], src="stacks")
    sampler = StackSampler(config["stacks.targets_path"], publisher.publish,
                           interval_ms=config["stacks.interval_ms"],
                           proc_root=config["probes.proc_root"])
    if alone:
        log.info("stack sampler: sampling the processes %s names, at %d samples a second",
                 config["stacks.targets_path"], sampler.rate)
    try:
        _sample_until(stop, sampler, publisher)
    finally:
        sampler.close()
        publisher.close()


def _sample_until(stop: threading.Event, sampler: StackSampler, publisher: Publisher) -> None:
    """Step the sampler (every STEP_SECONDS while it samples, IDLE_SECONDS while not) and
    publish its heartbeat every HEALTH_EVERY_S, at once when a subscriber (re)connects (the
    beat it missed) or the state changes, until ``stop`` is set."""
    next_step = next_health = time.monotonic()
    said = ""
    while True:
        now = time.monotonic()
        if now >= next_step:
            sampler.step()
            next_step = now + (STEP_SECONDS if sampler.runs else IDLE_SECONDS)
        health = sampler.health()
        if publisher.poll_subscriptions() or health.state != said or now >= next_health:
            publisher.publish(health)
            said, next_health = health.state, now + HEALTH_EVERY_S
        if stop.wait(max(0.0, min(next_step, next_health) - time.monotonic())):
            return


def _say_failed(config: Config, why: str) -> None:
    """Publish the sampler's last heartbeat, ``failed`` and why, before it stops (its unit
    then stays failed; `gpuwhy status` says why instead of a sampler gone quiet)."""
    from gpuwhy.bus import Publisher

    try:
        publisher = Publisher(config["bus.endpoint"], src=SOURCE)
    except BusError:
        return
    try:
        publisher.wait_for_subscriber(1.0)
        publisher.publish(SourceHealth(ts=now_ns(), source=SOURCE, state="failed",
                                       detail=why))
    finally:
        publisher.close()
