"""The cron source with the real cron daemon: a job from /etc/cron.d fires at the next
minute, its execution is read from the journal and tied to the job's process."""

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.errors import NoSuchProcess
from gpuwhy.probes.cron.source import run_cron_source
from gpuwhy.proc import read_stat
from gpuwhy.store import open_store
from gpuwhy.store.source_cursors import cursor_reader

from .conftest import cron_gone

pytestmark = [pytest.mark.root, pytest.mark.slow]
SOCKET = Path("/run/systemd/journal/socket")
DEV_LOG = Path("/dev/log")


@pytest.fixture
def journald():
    started = None
    if not (SOCKET.exists() and subprocess.run(["pgrep", "-x", "systemd-journal"],
                                               capture_output=True).returncode == 0):
        Path("/run/systemd/journal").mkdir(parents=True, exist_ok=True)
        started = subprocess.Popen(["/lib/systemd/systemd-journald"], start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not SOCKET.exists():
            assert started.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    linked = False
    if not DEV_LOG.exists() and not DEV_LOG.is_symlink():
        DEV_LOG.symlink_to("/run/systemd/journal/dev-log")     # so cron's syslog() reaches it
        linked = True
    yield
    if linked:
        DEV_LOG.unlink()
    if started is not None:
        started.terminate()
        started.wait(10)


@pytest.fixture
def cron_daemon(journald):
    assert cron_gone(), "a cron daemon already runs: this test starts its own with -L 15"
    process = subprocess.Popen(["cron", "-f", "-L", "15"], start_new_session=True)
    yield process
    process.terminate()
    process.wait(10)
    # and what it started in its session (a job it began as it was stopped), so that the
    # next test that runs its own cron finds none
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    assert cron_gone(), "cron processes outlived the test's daemon"


@pytest.fixture
def cron_job():
    marker = f"gpuwhy-cron-test-{os.urandom(4).hex()}"
    path = Path("/etc/cron.d") / marker
    path.write_text(f"# written by gpuwhy's test suite; removed when the test ends\n"
                    f"* * * * * root sleep 40; : {marker}\n")
    path.chmod(0o644)
    # cron reloads /etc/cron.d when its mtime differs from the one it read last, to the
    # second: a daemon started in the same second as this write would never see the job
    # (CI found that). An mtime no earlier read can have had makes the change certain.
    later = time.time() + 2
    for changed in (path, path.parent):
        os.utime(changed, (later, later))
    yield marker
    path.unlink(missing_ok=True)
    # Stop what cron started for the job (its own session) and cron's child waiting on it.
    for job_pid in _pids_running(marker):
        try:
            cron_child = read_stat(job_pid)[1]
            os.killpg(os.getpgid(job_pid), signal.SIGTERM)
            if read_stat(cron_child)[0] == "cron":
                os.kill(cron_child, signal.SIGTERM)
        except (OSError, NoSuchProcess):
            continue


def _pids_running(marker):
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_a_cron_d_job_execution_is_seen_and_tied_to_its_process(tmp_config, cron_daemon,
                                                                  cron_job):
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    stop = threading.Event()
    correlator = threading.Thread(target=Correlator(tmp_config, db, subscriber).run,
                                  args=(stop,), daemon=True)
    correlator.start()
    source = threading.Thread(target=run_cron_source, args=(tmp_config, stop), daemon=True,
                              kwargs={"cursors": cursor_reader(tmp_config["store.path"])})
    source.start()
    try:
        deadline = time.monotonic() + 75
        row = None
        while row is None:
            assert time.monotonic() < deadline, "no cron execution of the job in 75 s"
            time.sleep(0.5)
            row = db.execute("select job_pid, job_start_time, cron_pid, user, command, ts "
                             "from cron_runs where phase = 'started' and command like ?",
                             [f"%{cron_job}%"]).fetchone()
        job_pid, job_start_time, cron_pid, user, command, ts = row
        # The job still sleeps: its /proc entry is the process cron started for it.
        comm, ppid, start_time = read_stat(job_pid)
        cmdline = Path(f"/proc/{job_pid}/cmdline").read_bytes()
        scheduled = db.execute("select schedule, user from cron_jobs where command like ?",
                               [f"%{cron_job}%"]).fetchone()
    finally:
        stop.set()
        source.join(5)
        correlator.join(5)
        subscriber.close()
        db.close()
    assert user == "root" and cron_job in command
    assert job_start_time == start_time                    # the (pid, start_time) key
    assert cron_job.encode() in cmdline
    # Ancestry goes through cron: the job's parent is the cron child that logged the line.
    assert ppid == cron_pid
    assert read_stat(ppid)[0] == "cron"
    assert abs(ts - time.time_ns()) < 90 * 1_000_000_000
    assert scheduled == ("* * * * *", "root")
