"""A store filled from a simulator scenario through the real correlator (StoreWriter and
incident decisions), shared by the web tests: two SIMULATED GPUs for ten minutes, a training
job whose name is HTML, a cron job that resets GPU 0 under it, an Xid line with HTML in it,
scheduler and driver-call statistics, and a rule finding."""

from __future__ import annotations

import dataclasses
import itertools
import types
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import load_config
from gpuwhy.correlator.alerts import Alerter
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.events import (
    CronExecution,
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    Envelope,
    GpuProcesses,
    KernelLogRecord,
    ProcessExec,
    ProcessSeen,
    PythonStacks,
    RuleFinding,
    SchedStats,
)
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.identity import ProcessKey
from gpuwhy.nvioctl import RM_CONTROLS
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.reset import BIF_RESET, RESET_CONTROLS, RESET_REQUEST_CONTROLS
from gpuwhy.store import open_store

S = NS_PER_SECOND
SECONDS = 600
RESET_AT = 420                     # the simulator's GPU 0 goes into reset here
EVIL_NAME = "<img src=x onerror=alert(1)>"
XID_MESSAGE = ("Xid (PCI:0000:28:00): 13, pid=5151, name=python, "
               "<b>bold</b><script>alert('xid')</script>")
TRAIN = ProcessKey(4242, 1000)     # on GPU 0, named EVIL_NAME
OTHER = ProcessKey(5151, 1100)     # on GPU 1
CRON_JOB, SMI = ProcessKey(300, 2000), ProcessKey(301, 2001)
TOKEN = "s3cret-token"
MARK_FOR_RESET = next(n for n, name in RM_CONTROLS.items() if name == RESET_REQUEST_CONTROLS[0])


@dataclasses.dataclass
class Scenario:
    config: object
    t0: int
    gpu_ids: list[str]
    path: Path

    def at(self, seconds: float) -> int:
        return self.t0 + int(seconds * S)


def _host_events(sc: Scenario, t: int) -> list:
    at = sc.at(t)
    out: list = []
    if t == 1:
        out += [ProcessSeen(ts=at, process=TRAIN, comm=EVIL_NAME,
                            cmdline="python train.py --name '<script>alert(2)</script>'",
                            exe="/usr/bin/python3", ppid=1, uid=0,
                            cgroup="/system.slice/docker-abc123.scope", tag="<b>team-a</b>",
                            container_id="abc123"),
                DeviceOpened(ts=at, process=TRAIN, fd=5, path="/dev/nvidia0", device="nvidiaN",
                             minor=0),
                ProcessSeen(ts=at, process=OTHER, comm="python", cmdline="python eval.py",
                            exe="/usr/bin/python3", ppid=1, uid=1000,
                            cgroup="/user.slice/session-1.scope", tag="team-b"),
                DeviceOpened(ts=at, process=OTHER, fd=5, path="/dev/nvidia1", device="nvidiaN",
                             minor=1)]
    if t % 10 == 0:
        calls = t * 40
        out.append(DriverCallStats(ts=at, process=TRAIN, path="/dev/nvidiactl",
                                   device="nvidiactl", ops=[
            {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 0x20800110,
             "sub_name": "NV2080_CTRL_CMD_GPU_GET_INFO", "count": calls, "errors": t // 100,
             "latency_sum_ns": calls * 4000, "latency_max_ns": 90_000, "bytes": 0,
             "latency_log2": []}]))
        out.append(GpuProcesses(ts=at, gpu_id=sc.gpu_ids[0], source="sim",
                                processes=[{"pid": TRAIN.pid, "start_time": TRAIN.start_time,
                                            "used_memory_mib": 30000, "sm_util": 70}]))
    if t >= 2:
        starved = 200 <= t < 300
        out.append(SchedStats(ts=at, process=TRAIN, interval_ns=S, worker_processes=4,
                              own={"on_cpu_ns": 300_000_000, "runqueue_ns": 20_000_000,
                                   "sleep_ns": 600_000_000, "blocked_ns": 80_000_000},
                              workers={"on_cpu_ns": 900_000_000 if not starved else 100_000_000,
                                       "runqueue_ns": 50_000_000,
                                       "blocked_ns": 700_000_000 if starved else 10_000_000}))
    if t == RESET_AT - 5:
        out += [CronExecution(ts=at, cursor="cron-1", phase="started", user="root",
                              command="nvidia-smi -r -i 0", job_pid=CRON_JOB.pid,
                              job_start_time=CRON_JOB.start_time,
                              gpu_action=gpu_action("nvidia-smi -r -i 0")),
                ProcessSeen(ts=at, process=CRON_JOB, comm="sh", cmdline="sh -c nvidia-smi -r",
                            exe="/bin/sh", ppid=1, uid=0, cgroup="/system.slice/cron.service")]
    if t == RESET_AT - 4:
        out += [ProcessSeen(ts=at, process=SMI, comm="nvidia-smi", cmdline="nvidia-smi -r -i 0",
                            exe="/usr/bin/nvidia-smi", ppid=CRON_JOB.pid, uid=0,
                            cgroup="/system.slice/cron.service"),
                ProcessExec(ts=at, process=SMI, filename="/usr/bin/nvidia-smi",
                            ppid=CRON_JOB.pid),
                DriverCall(ts=sc.at(t + 0.5), process=SMI, tid=SMI.pid, fd=3,
                           path="/dev/nvidia0", device="nvidiaN", cmd=0xC020462A, nr=0x2A,
                           size=32, op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0,
                           sub=BIF_RESET, sub_name=RESET_CONTROLS[0], reasons=["notable"]),
                # Asks for a later reset: listed by the view as a request, never as a reset.
                DriverCall(ts=sc.at(t + 0.25), process=SMI, tid=SMI.pid, fd=3,
                           path="/dev/nvidia0", device="nvidiaN", cmd=0xC020462A, nr=0x2A,
                           size=32, op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0,
                           sub=MARK_FOR_RESET, sub_name=RESET_REQUEST_CONTROLS[0],
                           reasons=["notable"])]
    if t == 500:
        out.append(KernelLogRecord(ts=at, cursor="k1", origin="journald", boot_id="b",
                                   record_kind="xid", message=XID_MESSAGE, xid=13,
                                   pci="0000:28:00", pid=OTHER.pid, name="python",
                                   line="NVRM: " + XID_MESSAGE))
    if t == 250:
        out.append(RuleFinding(
            ts=at, finding_id="R02:x:4242", rule_id="R02_input_io_bound",
            title="Input pipeline starves the GPU <i>(test)</i>", severity="warn",
            state="firing", gpu_id=sc.gpu_ids[0], process=TRAIN, window_start=sc.at(200),
            window_end=at, evidence={"gpu_idle_share": 0.55, "workers_blocked_share": 0.7,
                                     "note": "<script>alert(3)</script>"},
            root_cause="DataLoader workers are blocked on I/O while the GPU waits.",
            fixes=["Raise num_workers", "Use pin_memory=True"], verify="GPU idle share < 0.2"))
    if t == 280:    # the stack sampler's window on that finding: a function named in markup
        out.append(PythonStacks(
            ts=at, process=TRAIN, gpu_id=sc.gpu_ids[0], finding_id="R02:x:4242",
            rule_id="R02_input_io_bound", started=sc.at(250), interval_ms=100, samples=300,
            stacks=[{"pid": TRAIN.pid, "start_time": TRAIN.start_time, "role": "main",
                     "stack": f"train.py:88 <module>;train.py:95 {EVIL_NAME}", "count": 200},
                    {"pid": TRAIN.pid, "start_time": TRAIN.start_time, "role": "main",
                     "stack": "train.py:88 <module>;waiting on a lock", "count": 100}]))
    return out


def build(directory: Path) -> Scenario:
    """Play the scenario into ``directory/gpuwhy.db`` through the real correlator."""
    config = load_config(environ={"GPUWHY_DB": str(directory / "gpuwhy.db"),
                                  "GPUWHY_BUS": f"ipc://{directory}/bus.sock",
                                  "GPUWHY_AUTH_TOKEN": TOKEN})
    db = open_store(config["store.path"])
    subscriber = Subscriber(config["bus.endpoint"])
    correlator = Correlator(config, db, subscriber,
                            Alerter(config["correlator.url"], send=lambda *a, **k: None))
    correlator.wall_clock = lambda: None        # event time only, like a replay
    sim = SimulatedGpus(count=2, scenario="gpu-reset", seed=7, event_after=RESET_AT)
    gpus = sim.open()
    sc = Scenario(config, now_ns() - (SECONDS + 60) * S, [g.id for g in gpus],
                  directory / "gpuwhy.db")
    seq = itertools.count()
    try:
        batch = [gpu.seen(sc.at(0), "sim", True) for gpu in gpus]
        for t in range(SECONDS):
            batch += [dataclasses.replace(e, ts=sc.at(t)) for e in sim.read()]
            batch += _host_events(sc, t)
            if t % 20 == 19:
                correlator.pending = [Envelope("test", next(seq), e) for e in batch]
                correlator._last_decide = 0.0
                correlator.flush()
                assert not correlator.store_error, correlator.store_error
                batch = []
    finally:
        subscriber.close()
        db.close()
    return sc


def arrive(config, events, endpoint: str, *, event_time: bool = False) -> None:
    """Events through the real correlator, in one batch, into the store ``config`` names;
    ``event_time``: decided on the events' own times only, like a replay."""
    db = open_store(config["store.path"])
    subscriber = Subscriber(endpoint)
    try:
        correlator = Correlator(config, db, subscriber,
                                Alerter(config["correlator.url"], send=lambda *a, **k: None))
        if event_time:
            correlator.wall_clock = lambda: None
        correlator.pending = [Envelope("test", n, e) for n, e in enumerate(events, 1)]
        correlator._last_decide = 0.0
        correlator.flush()
        assert not correlator.store_error, correlator.store_error
    finally:
        subscriber.close()
        db.close()


@pytest.fixture
def served(browser, scenario, tmp_path):
    """A page in the browser and a server of this test's own copy of the scenario's store
    (it changes it), refreshed each second."""
    from .test_browser import LiveServer, Watched
    from .test_browser_incidents import _own_copy

    path, config = _own_copy(scenario, tmp_path)
    live = LiveServer(config)
    watched = Watched(browser)
    try:
        yield types.SimpleNamespace(config=config, path=path, url=live.url, page=watched.page,
                                    problems=watched.problems)
    finally:
        watched.close()
        live.close()


@pytest.fixture(scope="session")
def scenario(tmp_path_factory) -> Scenario:
    return build(tmp_path_factory.mktemp("webscenario"))


CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright. No skip when it is missing: CI installs it
    (scripts/setup.sh), so its absence is a failure to fix, not a reason to pass."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (scripts/setup.sh does)"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()
