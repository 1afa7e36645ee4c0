"""Watch a process (or run a command) for a while, through the service or a private pipeline.

With the service running (its correlator reports to ``store.path``), the watch only reads
that store over the window. Otherwise it starts the probes, sources and correlator itself
(the demo's :class:`Pipeline`) on a store and bus in a temporary folder. Either way, what
is watched ends up as a window ``[start, end]``, a process key and a GPU, read through
:class:`StoreSignals`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import click

from gpuwhy.app.checks.environment import process_libraries
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import Config
from gpuwhy.correlator.rules.signals import Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.errors import GpuwhyError, NoSuchProcess
from gpuwhy.identity import ProcessKey
from gpuwhy.proc import process_key, read_stat
from gpuwhy.store.queries import gpu_named, gpu_of_process, gpus, has_gpu_samples
from gpuwhy.text import printable as escaped

MAX_SHOWN = 80
LOOK_SECONDS = 1.0   # how often the process's call counts and mapped libraries are read


class EnvironmentProblem(click.ClickException):
    """The watch cannot run here (no service and no privilege, a process that is gone):
    exit status 2, like a usage error, so that CI tells it from a failed expectation."""

    exit_code = 2


@dataclass(frozen=True)
class Target:
    """What to watch: a running process, a command to run, and/or a GPU."""

    pid: int | None = None
    argv: tuple[str, ...] = ()
    gpu: str | None = None

    def describe(self) -> str:
        if self.argv:
            return "command " + printable(" ".join(self.argv))
        if self.pid is not None:
            return f"pid {self.pid}"
        return f"GPU {self.gpu}"


def printable(text: str, limit: int = MAX_SHOWN) -> str:
    """Untrusted text for one terminal line: control characters shown escaped, bounded."""
    return escaped(text, limit)


@dataclass
class Watched:
    """The outcome of a watch: where its data is, and over which window."""

    mode: str                       # "service" or "standalone"
    store_path: str
    start: int
    end: int
    process: ProcessKey | None
    gpu_id: str | None
    exit_code: int | None = None
    libraries: list[str] = field(default_factory=list)
    signals: StoreSignals | None = field(default=None, repr=False)
    db: object = field(default=None, repr=False)

    @property
    def scope(self) -> Scope:
        return Scope(self.gpu_id or "", self.process)

    def describe(self) -> dict:
        return {"mode": self.mode, "store": self.store_path, "start": self.start,
                "end": self.end, "seconds": round((self.end - self.start) / NS_PER_SECOND, 1),
                "process": str(self.process) if self.process else None, "gpu": self.gpu_id,
                "exit_code": self.exit_code}


def service_running(config: Config) -> bool:
    """True when the service's correlator reports to ``store.path`` (`gpuwhy status`)."""
    from gpuwhy.app.status import collect_status

    if not Path(config["store.path"]).exists():
        return False
    parts = collect_status(config)["parts"]
    return any(p["part"] == "correlator" and p["state"] == "ok" for p in parts)


def private_config(config: Config, work: Path) -> Config:
    """The private pipeline's: its own store and bus, the kernel log from now on, and no
    journal alerts (a watch's incidents are its own business, not the host's)."""
    return config.replace({"store.path": str(work / "check.db"),
                           "bus.endpoint": f"ipc://{work}/bus.sock", "klog.start": "now",
                           "correlator.alerts": False})


class Watch:
    """``with Watch(...) as w: watched = w.run()``; progress lines go to ``progress``."""

    def __init__(self, config: Config, target: Target, duration: float, source: str = "auto",
                 progress: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.config, self.target, self.duration = config, target, duration
        self.source, self.progress, self.clock = source, progress, clock
        self.stack = contextlib.ExitStack()
        self.mode = "service"
        self.store_path = config["store.path"]
        self.child: subprocess.Popen | None = None
        self.process: ProcessKey | None = None
        self.libraries: list[str] = []

    def __enter__(self) -> Watch:
        try:
            self._open()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write(f"gpuwhy: {text}\n")
            self.progress.flush()

    def _open(self) -> None:
        running = self.source != "standalone" and service_running(self.config)
        if self.source == "service" and not running:
            raise EnvironmentProblem(f"no gpuwhy service reports to {self.store_path} "
                                     "(`gpuwhy status`); start it or use --source standalone")
        if not running:
            self._start_pipeline()
        if self.target.argv:
            self._start_command()
        elif self.target.pid is not None:
            try:
                self.process = process_key(self.target.pid)
            except NoSuchProcess:
                raise EnvironmentProblem(f"no process {self.target.pid}") from None

    def _start_pipeline(self) -> None:
        from gpuwhy.app.service import Pipeline, PipelineError

        if os.geteuid() != 0:
            raise EnvironmentProblem("no gpuwhy service is running and a standalone watch "
                                     "loads the eBPF probes: run as root, or start "
                                     "`gpuwhy up` and watch through it")
        work = Path(tempfile.mkdtemp(prefix="gpuwhy-check-"))
        self.stack.callback(shutil.rmtree, work, ignore_errors=True)
        config = private_config(self.config, work)
        self.mode, self.store_path = "standalone", config["store.path"]
        self._say(f"no service running: starting probes and sources (store {self.store_path})")
        try:
            pipe = Pipeline(config)
        except GpuwhyError as exc:
            raise EnvironmentProblem(str(exc)) from None
        self.stack.callback(pipe.close)
        try:
            pipe.start()
        except PipelineError as exc:
            raise EnvironmentProblem(str(exc)) from None
        self._wait_for_gpus(5.0)

    def _wait_for_gpus(self, timeout: float) -> None:
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            with contextlib.suppress(GpuwhyError):
                with contextlib.closing(self.reader()) as db:
                    if has_gpu_samples(db):
                        return
            time.sleep(0.1)

    def _start_command(self) -> None:
        try:
            # its own process group: the watch ends the command's workers with it; its
            # output goes to stderr, so that stdout holds only the verdict (--json)
            self.child = subprocess.Popen(list(self.target.argv), start_new_session=True,
                                          stdout=sys.stderr)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot run {printable(self.target.argv[0])}: "
                                     f"{exc.strerror}") from None
        self.stack.callback(self._stop_child)
        try:
            self.process = ProcessKey(self.child.pid, read_stat(self.child.pid)[2])
        except NoSuchProcess:   # it exited at once; its pid alone is all there is
            self.process = None

    def _stop_child(self) -> None:
        """SIGTERM to the command's process group (it and the workers it left), then wait."""
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signal.SIGTERM)
        try:
            self.child.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()

    def reader(self):  # noqa: ANN201
        from gpuwhy.store import open_store

        return open_store(self.store_path, readonly=True)

    def _alive(self) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        if self.process is None:
            return True
        try:
            return read_stat(self.process.pid)[2] == self.process.start_time
        except (NoSuchProcess, OSError):
            return False

    def run(self) -> Watched:
        """Watch for the duration or until the process exits; then let the store catch up."""
        start_ns, started = now_ns(), self.clock()
        every = max(0.5, float(self.config["checks.progress_seconds"]))
        next_note = next_look = started
        db = self.reader()
        self.stack.callback(db.close)
        signals = StoreSignals(db)
        while True:
            elapsed = self.clock() - started
            if elapsed >= self.duration or not self._alive():
                break
            if self.process is not None and self.clock() >= next_look:
                signals.begin(now_ns())   # a snapshot of the cumulative driver-call counts
                signals.call_rows(self.process, 0, now_ns())
                self.libraries = process_libraries(self.process.pid) or self.libraries
                next_look += LOOK_SECONDS
            if self.clock() >= next_note:
                self._say(f"[{elapsed:5.1f}s / {self.duration:.0f}s, "
                          f"{max(0.0, self.duration - elapsed):.0f}s left] watching "
                          f"{self.target.describe()} ({self.mode})")
                next_note += every
            time.sleep(min(0.2, max(0.01, self.duration - elapsed)))
        end_ns = now_ns()
        exit_code = self.child.poll() if self.child is not None else None
        if exit_code is not None:
            self._say(f"the command exited with status {exit_code} after "
                      f"{(end_ns - start_ns) / NS_PER_SECOND:.1f}s")
        self._settle(end_ns)
        signals.begin(now_ns())
        if self.process is not None:
            signals.call_rows(self.process, 0, now_ns())
        return Watched(self.mode, self.store_path, start_ns, end_ns, self.process,
                       self._gpu(db), exit_code, self.libraries, signals, db)

    def _settle(self, end_ns: int) -> None:
        """Wait until the store holds a GPU sample from after the window (the writer
        flushes in batches), at most ``checks.settle_seconds``."""
        deadline = self.clock() + float(self.config["checks.settle_seconds"])
        while self.clock() < deadline:
            with contextlib.closing(self.reader()) as db:
                if has_gpu_samples(db, since=end_ns):
                    return
            time.sleep(0.1)

    def _gpu(self, db) -> str | None:  # noqa: ANN001
        """The GPU watched: --gpu, else the process's binding, else NVML's process list,
        else the only GPU there is."""
        if self.target.gpu:
            return gpu_named(db, self.target.gpu)
        if self.process is not None:
            held = gpu_of_process(db, self.process)
            if held is not None:
                return held
        known = gpus(db)
        return known[0]["id"] if len(known) == 1 else None
