"""`gpuwhy up` killed with SIGKILL leaves no probes process behind (gpuwhy.lifeline), and a
service and probes killed together and started again store every process event of the
processes around the restart exactly once (store/writer.py, "process events").

Real processes throughout: `gpuwhy up` as a user runs it, its probes child, and the
processes whose lifecycle is counted, started by the test.
"""

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpuwhy.identity import ProcessKey
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

LIFECYCLE = ("process_forked", "process_exec", "process_exited")


def _wait_until(predicate, timeout, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


PF_EXITING = 0x4      # <linux/sched.h>: set as the kernel starts to end the process


def _running_code(process: psutil.Process) -> bool:
    """Alive and not yet exiting: a killed process runs no code of its own from the moment
    PF_EXITING is set, then the kernel releases its files (its BPF programs' detaches)."""
    if not _alive(process):
        return False
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return not int(fields[6]) & PF_EXITING       # field 9, flags


class Up:
    """`gpuwhy up` on the test's store, bus and device folder; its output in a log file."""

    def __init__(self, config, log: Path):
        env = {**os.environ, "GPUWHY_DB": config["store.path"],
               "GPUWHY_BUS": config["bus.endpoint"],
               "GPUWHY_DEVICE_GLOB": config["probes.device_glob"],
               "GPUWHY_POLL_INTERVAL": "0.2", "GPUWHY_REFRESH": "0.5"}
        self.store = config["store.path"]
        self.log = log
        self.started_ns = time.time_ns()
        with open(log, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "gpuwhy", "up", "--port", "0"],
                                            env=env, stdout=out, stderr=subprocess.STDOUT)

    def query(self, sql, params=()):
        try:
            with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=5) as db:
                return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError:     # not created or migrated yet
            return []

    def wait_ready(self, timeout=120.0):
        """Until this run's lifecycle probe reports: from then on every fork, exec and exit
        is seen."""
        ready = _wait_until(lambda: self.query(
            "select 1 from source_health where source = 'lifecycle' and state = 'ok' and "
            "last_seen >= ?", [self.started_ns]) or self.process.poll() is not None,
            timeout, 0.25)
        assert ready and self.process.poll() is None, self.log.read_text()

    def probes(self) -> psutil.Process:
        [child] = psutil.Process(self.process.pid).children()
        return child

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def ups():
    """Up processes started by a test (and their probes), killed after it."""
    made = []
    yield made
    for up in made:
        children = psutil.Process(up.process.pid).children() if up.process.poll() is None \
            else []
        up.kill()
        for child in children:
            if _alive(child):
                child.kill()


def test_a_killed_service_takes_its_probes_child_with_it(tmp_config, tmp_path, ups):
    up = Up(tmp_config, tmp_path / "up.log")
    ups.append(up)
    up.wait_ready()
    probes = up.probes()
    assert "probes" in probes.cmdline()
    up.process.kill()                 # the service alone
    killed = time.monotonic()
    stopped = _wait_until(lambda: not _running_code(probes), 5, 0.01)
    stopped_after = time.monotonic() - killed
    gone = _wait_until(lambda: not _alive(probes), 10, 0.02)
    gone_after = time.monotonic() - killed
    up.process.wait()
    assert stopped and gone, f"the probes child {probes.pid} outlived its killed service"
    # Killed at once; gone once the kernel has detached its tracepoints, one after the
    # other (a second or two on a small VM, more while it is busy).
    assert stopped_after < 1, f"the probes child ran on {stopped_after:.2f} s"
    assert gone_after < 5, f"the probes child took {gone_after:.1f} s to be gone"


class Watched:
    """A process started by the test, waiting on its stdin; ``device`` open when given."""

    def __init__(self, device: Path | None = None):
        code = "import sys\nf = open(sys.argv[1]) if len(sys.argv) > 1 else None\n" \
               "print('ready', flush=True)\nsys.stdin.readline()\n"
        argv = [sys.executable, "-c", code] + ([str(device)] if device else [])
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout.readline() == "ready\n"
        self.key: ProcessKey = process_key(self.process.pid)
        self.holds_device = device is not None

    def end(self):
        self.process.communicate("\n", timeout=10)


def _stored(up: Up, processes: list[Watched], kinds: tuple[str, ...]) -> bool:
    """Every one of ``kinds`` stored for every process."""
    for watched in processes:
        rows = up.query("select distinct kind from events where pid = ? and start_time = ?",
                        [watched.key.pid, watched.key.start_time])
        if not set(kinds) <= {kind for (kind,) in rows}:
            return False
    return True


def _fds_stored(up: Up, processes: list[Watched], closed: bool = False) -> bool:
    """Every process's device open stored (device_fds: its one home), and closed when
    ``closed``."""
    for watched in processes:
        rows = up.query("select closed_at from device_fds where pid = ? and start_time = ?",
                        [watched.key.pid, watched.key.start_time])
        if not rows or (closed and any(closed_at is None for (closed_at,) in rows)):
            return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["service and probes", "service only"])
def test_killed_and_restarted_store_each_process_event_once(tmp_config, tmp_path, ups, killed):
    device = Path(tmp_config["probes.device_glob"]).parent / "nvidiactl"
    device.write_bytes(b"")
    first = Up(tmp_config, tmp_path / "first.log")
    ups.append(first)
    first.wait_ready()
    across = [Watched(device) for _ in range(3)]      # alive across the restart, holding an fd
    before = [Watched() for _ in range(5)]            # start and end before the kill
    for watched in before:
        watched.end()
    # Stored before the kill: what the dead service had not written yet is lost to any design.
    assert _wait_until(lambda: _stored(first, before, LIFECYCLE) and _stored(
        first, across, ("process_forked", "process_exec")) and _fds_stored(first, across),
        30), first.log.read_text()

    probes = first.probes()
    if killed == "service and probes":
        probes.kill()                                 # SIGKILL, both
    first.process.kill()
    first.process.wait()
    assert _wait_until(lambda: not _alive(probes), 5, 0.02)

    second = Up(tmp_config, tmp_path / "second.log")  # the same store and bus
    ups.append(second)
    second.wait_ready()
    # its start-up scan found the fds held across the restart, and re-sent them on connect
    assert _wait_until(lambda: "start-up scan: 3 open device fds" in second.log.read_text(), 30)
    after = [Watched() for _ in range(5)]
    for watched in after + across:
        watched.end()
    everyone = across + before + after
    assert _wait_until(lambda: _stored(second, everyone, LIFECYCLE) and _fds_stored(
        second, across, closed=True), 30), second.log.read_text()

    # 0 lost: every fork, exec and exit of every process; 0 duplicated: one row per
    # (pid, start_time, kind), the fds re-found by the restarted probes included.
    rows = {}
    for watched in everyone:
        counts = second.query("select kind, count(*) from events where pid = ? and "
                              "start_time = ? group by kind",
                              [watched.key.pid, watched.key.start_time])
        rows[str(watched.key)] = dict(counts)
    for key, counts in rows.items():
        assert {kind: counts.get(kind) for kind in LIFECYCLE} == dict.fromkeys(LIFECYCLE, 1), \
            (key, counts)
        assert all(count == 1 for count in counts.values()), (key, counts)
    for watched in across:
        fds = second.query("select count(*) from device_fds where pid = ? and start_time = ?",
                           [watched.key.pid, watched.key.start_time])
        assert fds == [(1,)], (watched.key, fds)
    assert "Traceback" not in first.log.read_text() + second.log.read_text()
