"""`gpuwhy demo SCENARIO`: a GPU incident played on a host without a GPU, with real processes.

The whole pipeline runs for real (eBPF probes, kernel log through journald, cron, bus,
correlator, store) in a private folder; only the GPU side is stood in for: the simulator
gives the counters, look-alike device files take the driver calls. Scenarios:

- ``cron-reset``: a real /etc/cron.d job runs a stand-in ``nvidia-smi -r`` at the next
  minute; it sends the reset's driver calls and writes the NVRM line; the training process
  on that GPU stalls. Chain: cron_job -> command -> driver_call -> gpu_reset -> process_stall.
- ``xid79``: the GPU falls off the bus (an Xid 79 line naming the training process), and
  the training process dies of it.
- ``starved-input``: a training process whose DataLoader worker decodes on the CPU and
  cannot keep up, while the main thread sleeps on the batch queue and the GPU idles most of
  the time; the rules engine's finding (R01, after its warm-up) is the incident.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import click

from gpuwhy.app.demo.standin import DEMO_MARK, write_kmsg
from gpuwhy.config import Config
from gpuwhy.lifeline import child_environment
from gpuwhy.reset import RESET_CONTROLS
from gpuwhy.store.demo_waits import (
    alias_known,
    bound_gpu,
    cron_run_started,
    driver_call_pid,
    gpu_of_minor,
    has_link,
    incident_of_kind,
    recent_figures,
    root_incidents_after,
    rule_finding_incident,
)
from gpuwhy.text import printable

T = TypeVar("T")

if TYPE_CHECKING:      # the pipeline (flask, the correlator) loads when a demo runs
    from sqlite_utils import Database

    from gpuwhy.app.service import Pipeline

SCENARIOS = {"cron-reset": "gpu-reset", "xid79": "xid-79", "starved-input": "input-starved"}
STARVED_RULE = "R01_input_cpu_bound"
TIMEOUTS = {"cron-reset": 150.0, "xid79": 150.0, "starved-input": 420.0}
JOURNALD = "/lib/systemd/systemd-journald"
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
DEV_LOG = Path("/dev/log")
CRON_D = Path("/etc/cron.d")
CRON_SETTLE_S = 10.0


class Progress:
    """One line per step, with the seconds since the demo started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def step(self, text: str) -> None:
        click.echo(f"[{time.monotonic() - self.started:6.1f}s] {text}")


def _running(name: str) -> bool:
    return subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0


@contextlib.contextmanager
def journald(progress: Progress) -> Iterator[None]:
    """systemd-journald, started here (and stopped after) when none runs."""
    started, linked = None, False
    if not (JOURNAL_SOCKET.exists() and _running("systemd-journal")):
        Path("/run/systemd/journal").mkdir(parents=True, exist_ok=True)
        started = subprocess.Popen([JOURNALD], start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: JOURNAL_SOCKET.exists() or started.poll() is not None, 10)
        progress.step(f"started systemd-journald (pid {started.pid}) for the demo")
    if not DEV_LOG.exists() and not DEV_LOG.is_symlink():
        DEV_LOG.symlink_to("/run/systemd/journal/dev-log")
        linked = True
    try:
        yield
    finally:
        if linked:
            DEV_LOG.unlink(missing_ok=True)
        if started is not None:
            started.terminate()
            started.wait(10)


@contextlib.contextmanager
def cron_daemon(progress: Progress) -> Iterator[None]:
    """cron with -L 15 (job pids in its log), started here when none runs."""
    started = None
    if _running("cron"):
        progress.step("using the running cron daemon (it must log with -L 15 for job pids)")
    else:
        started = subprocess.Popen(["cron", "-f", "-L", "15"], start_new_session=True)
        progress.step(f"started cron -f -L 15 (pid {started.pid}) for the demo")
    try:
        yield
    finally:
        if started is not None:
            started.terminate()
            started.wait(10)


def _wait(predicate: Callable[[], T], timeout: float, every: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)




def demo_config(base: Config, scenario: str, work: Path, event_after: float) -> Config:
    """The demo's private pipeline; in ``cron-reset`` the stand-in reset's strike file, not a
    time, makes the simulated GPU reset."""
    devices = work / "dev"
    devices.mkdir(parents=True, exist_ok=True)
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (devices / name).touch()
    return base.replace({
        "store.path": str(work / "demo.db"), "bus.endpoint": f"ipc://{work}/bus.sock",
        "probes.device_glob": f"{devices}/nvidia*", "probes.poll_interval": 0.5,
        "gpu.source": "sim", "gpu.sim_scenario": SCENARIOS[scenario], "gpu.sim_gpus": 2,
        "gpu.sim_event_after": event_after, "klog.backend": "journald", "klog.start": "now",
        "gpu.sim_event_file": str(strike_file(work)) if scenario == "cron-reset" else "",
        "correlator.flush_interval": 0.2, "correlator.stall_seconds": 4.0,
        "correlator.lag_seconds": 3.0,
    })


def strike_file(work: Path) -> Path:
    return work / "sim-reset-now"


def refuse_on_gpu_host(force: bool) -> None:
    from gpuwhy.app.service import gpu_devices_present

    if gpu_devices_present() and not force:
        raise click.ClickException("this host has NVIDIA devices (/dev/nvidia0...): the demo "
                                   "writes kernel-log lines and runs a (stand-in) reset job; "
                                   "pass --force to run it here anyway")
    if os.geteuid() != 0:
        raise click.ClickException("the demo loads eBPF probes, writes /dev/kmsg and "
                                   "/etc/cron.d: run it as root")


def _standin(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwhy.app.demo.standin", *args]


def _read(pipe: Pipeline, query: Callable[[Database], T]) -> T:
    """``query(db)`` on a fresh read-only connection to the pipeline's store."""
    with contextlib.closing(pipe.reader()) as db:
        return query(db)


def _wait_incident(pipe: Pipeline, query: Callable[[Database], int | None],
                   timeout: float) -> int | None:
    return _wait(lambda: _read(pipe, query), timeout, 0.25)


def run_cron_reset(pipe: Pipeline, work: Path, progress: Progress, trainer: int,
                   deadline: float) -> int | None:
    uuid, pci = _read(pipe, lambda db: gpu_of_minor(db, 0)) or (None, None)
    if uuid is None:
        raise click.ClickException("the simulated GPU 0 was not seen")
    smi = work / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text(f"#!{sys.executable}\n# stand-in nvidia-smi of `gpuwhy demo`\n"
                   "import sys\nfrom gpuwhy.app.demo.standin import main\n"
                   "main(['nvidia-smi', *sys.argv[1:]])\n")
    smi.chmod(0o755)
    marker = f"gpuwhy-demo-{os.urandom(4).hex()}"
    # cron reads a changed /etc/cron.d as it wakes at a minute boundary and runs what is due
    # in that minute; written just after a boundary it might wake late and run at once.
    time.sleep(max(0.0, CRON_SETTLE_S - time.time() % 60))
    fires_at = time.time() // 60 * 60 + 60
    job = CRON_D / marker
    job.write_text(f"# written by `gpuwhy demo cron-reset`; removed when the demo ends\n"
                   f"* * * * * root {smi} -r -i 0 --dev {work / 'dev'} --pci {pci} "
                   f"--uuid {uuid} --mark {marker} --strike {strike_file(work)} "
                   f">/dev/null 2>&1\n")
    job.chmod(0o644)
    try:
        progress.step(f"cron job {job} runs the stand-in `nvidia-smi -r -i 0` in "
                      f"{fires_at - time.time():.0f}s")
        ran = _wait(lambda: _read(pipe, lambda db: cron_run_started(db, marker)),
                    deadline - time.monotonic())
        if not ran:
            return None
        progress.step(f"cron ran the job (job pid {ran[0]})")
    finally:
        job.unlink(missing_ok=True)
        progress.step(f"removed {job}")
    call = _wait(lambda: _read(pipe, lambda db: driver_call_pid(db, RESET_CONTROLS[0])), 15)
    if call:
        progress.step(f"the probes saw {RESET_CONTROLS[0]} from pid {call}")
    incident = _wait_incident(pipe, lambda db: incident_of_kind(db, "gpu_reset"), 15)
    if incident is None:
        return None
    progress.step(f"incident {incident}: GPU reset; waiting for the training process "
                  f"(pid {trainer}) to stall")
    _wait(lambda: _read(pipe, lambda db: has_link(db, incident, "process_stall")),
          max(1.0, deadline - time.monotonic()), 0.25)
    return incident


def run_xid79(pipe: Pipeline, trainer_proc: subprocess.Popen, progress: Progress,
              at: float, deadline: float) -> int | None:
    time.sleep(max(0.0, at - time.monotonic()))
    write_kmsg([f"NVRM: Xid (PCI:0000:18:00): 79, pid={trainer_proc.pid}, name=python3, "
                f"GPU has fallen off the bus."])
    progress.step("wrote `NVRM: Xid (PCI:0000:18:00): 79, pid=...` to /dev/kmsg "
                  f"(marked {DEMO_MARK})")
    time.sleep(1.0)
    trainer_proc.send_signal(signal.SIGUSR1)     # CUDA calls now fail: the job dies
    trainer_proc.wait(10)
    progress.step(f"the training process died (exit status {trainer_proc.returncode})")
    incident = _wait_incident(pipe, lambda db: incident_of_kind(db, "gpu_lost"),
                              max(1.0, deadline - time.monotonic()))
    if incident is not None:
        _wait(lambda: _read(pipe, lambda db: has_link(db, incident, "process_exit")), 10, 0.25)
    return incident


def run_starved(pipe: Pipeline, trainer: int, progress: Progress,
                deadline: float) -> int | None:
    """Wait for the rules engine's finding on the cause (R01), saying every 30 s what the
    timeline shows and which findings came on the way (the rules want 2 min of warm-up, then
    R01 2 min of evidence)."""
    progress.step("the rules engine watches it: 2 min of warm-up, then R01 needs 2 min of "
                  "evidence (about 4-5 min in all)")
    told = 0            # the last incident said on the way
    incident = None
    while incident is None and time.monotonic() < deadline:
        incident = _wait_incident(pipe,
                                  lambda db: rule_finding_incident(db, trainer, STARVED_RULE),
                                  min(30.0, max(0.0, deadline - time.monotonic())))
        if incident is None:
            progress.step(_starved_figures(pipe, trainer))
            with contextlib.closing(pipe.reader()) as db:
                rows = root_incidents_after(db, told)
            for told, title in rows:
                progress.step(f"incident {told} on the way: {printable(title)}")
    return incident


def _starved_figures(pipe: Pipeline, trainer: int) -> str:
    """The last 30 s of the process's timeline and its GPU, in words."""
    row = _read(pipe, lambda db: recent_figures(db, trainer, 30))
    if not row or row[1] is None:
        return "no timeline for the process yet"
    util = "?" if row[0] is None else f"{row[0]:.0f}%"
    sleep = "?" if row[2] is None else f"{row[2]:.0%}"
    return (f"last 30 s: GPU util {util} on average; the workers used {row[1]:.2f} cores; the "
            f"main thread slept {sleep} of its time")


def play(base: Config, scenario: str, keep: bool, timeout: float,
         work: Path | None = None) -> int | None:
    """Run the scenario in ``work`` (a new temporary folder by default); returns the id of
    the incident it produced (None if none came in time)."""
    progress = Progress()
    work = work or Path(tempfile.mkdtemp(prefix="gpuwhy-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    start_in = 6.0
    event_after = 24 * 3600.0 if scenario == "cron-reset" else start_in + 6
    config = demo_config(base, scenario, work, event_after)
    progress.step(f"demo {scenario} in {work} (store {config['store.path']})")
    trainer_proc = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(journald(progress))
        if scenario == "cron-reset":
            stack.enter_context(cron_daemon(progress))
        from gpuwhy.app.service import Pipeline, PipelineError

        pipe = Pipeline(config)
        stack.callback(pipe.close)
        try:
            pipe.start()
        except PipelineError as exc:
            raise click.ClickException(str(exc)) from None
        progress.step("probes loaded; simulated GPUs, kernel log and cron are read")
        _wait(lambda: _read(pipe, lambda db: alias_known(db, "minor:0")), 15)
        args = ["train", str(work / "dev"), "--minor", "0"]
        if scenario == "starved-input":
            args += ["--workers", "1", "--starved", "--decode"]
        # child_environment: the stand-in (and its workers) end with the demo, even a killed one
        trainer_proc = subprocess.Popen(_standin(*args), stdout=subprocess.PIPE, text=True,
                                        env=child_environment())
        stack.callback(_stop, trainer_proc)
        trainer = int(cast(IO[str], trainer_proc.stdout).readline())    # stdout=PIPE: set
        progress.step(f"stand-in training process pid {trainer} holds {work}/dev/nvidia0")
        bound = _wait(lambda: _read(pipe, lambda db: bound_gpu(db, trainer)), 15)
        if bound:
            progress.step(f"bound to GPU {bound}")
        deadline = time.monotonic() + timeout
        if scenario == "cron-reset":
            incident = run_cron_reset(pipe, work, progress, trainer, deadline + 60)
        elif scenario == "xid79":
            incident = run_xid79(pipe, trainer_proc, progress, time.monotonic() + start_in,
                                 deadline)
        else:
            incident = run_starved(pipe, trainer, progress, deadline)
        time.sleep(0.5)
        if incident is not None:
            from gpuwhy.app.incidents_cli import print_incident
            from gpuwhy.store.queries import incident_detail

            with contextlib.closing(pipe.reader()) as db:
                # the incident just found in this store: there
                detail = cast(dict[str, Any], incident_detail(db, incident))
            click.echo("")
            print_incident(detail)
    if keep:
        click.echo(f"\nkept {work}: GPUWHY_DB={config['store.path']} gpuwhy incidents")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return incident


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(10)


@click.command()
@click.argument("scenario", type=click.Choice(sorted(SCENARIOS)))
@click.option("--force", is_flag=True, help="Run even on a host with NVIDIA devices.")
@click.option("--keep", is_flag=True, help="Keep the demo's folder and store afterwards.")
@click.option("--timeout", type=float, default=None,
              help="Seconds to wait for the scenario's incident (default: 150; starved-input "
                   "420, for the rule's warm-up).")
@click.pass_context
def demo(ctx: click.Context, scenario: str, force: bool, keep: bool, timeout: float) -> None:
    """Play a GPU incident on a host without a GPU, with real processes, and show its chain.

    Runs the real pipeline (eBPF probes, journald, cron) on a private store, with simulated
    GPU counters and look-alike device files. Every kernel-log line it writes is marked as
    demo traffic; its cron entry is removed when it ends. Needs root.

    \b
    Examples:
      sudo gpuwhy demo cron-reset      # about a minute: cron fires at the next minute
      sudo gpuwhy demo xid79
      sudo gpuwhy demo starved-input   # about 5 minutes: the rule's warm-up and evidence
    """
    refuse_on_gpu_host(force)
    # SIGTERM unwinds like Ctrl-C, so the cron entry, cron and journald started here go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    incident = play(ctx.obj.config(), scenario, keep, timeout or TIMEOUTS[scenario])
    if incident is None:
        raise click.ClickException(f"the {scenario} scenario produced no incident in time")

