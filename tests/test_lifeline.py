"""Children die with their parent (gpuwhy.lifeline), and the service stops the probes an
earlier one left behind (gpuwhy.app.service.stop_orphaned_probes). Real child processes; no root
needed (prctl(PR_SET_PDEATHSIG) is unprivileged, and a process may read its own children's
environment)."""

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from gpuwhy.app.service import Service
from gpuwhy.lifeline import PARENT_PID_ENV, child_environment, die_with_parent_named_in

ARMED_CHILD = ("from gpuwhy.lifeline import die_with_parent_named_in\n"
               "print(die_with_parent_named_in(), flush=True)\n"
               "import time; time.sleep(60)\n")


def _armed_child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ARMED_CHILD], env=child_environment(),
                            stdout=subprocess.PIPE, text=True)


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_an_armed_child_lives_while_the_thread_that_started_it_runs():
    child = _armed_child()
    try:
        assert child.stdout.readline().strip() == str(os.getpid())
        time.sleep(0.3)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_an_armed_child_is_killed_when_the_thread_that_started_it_ends():
    # Why the service starts its probes from a thread of its own: the kernel's "parent" is
    # the thread that forked, and the process running on does not keep the child alive.
    started = []

    def start() -> None:
        child = _armed_child()
        started.append(child)
        # Armed. A thread that ended before would hand the child, unsignalled, to another
        # thread of this process: it would live on.
        child.stdout.readline()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    [child] = started
    assert child.wait(timeout=5) == -9


def test_a_child_whose_parent_died_before_it_armed_refuses_to_start_the_probes():
    env = {**os.environ, PARENT_PID_ENV: str(_dead_pid())}
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "probes"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "which is gone" in result.stderr and "not starting the probes" in result.stderr


def test_without_the_marker_nothing_is_armed():
    environ = {"PATH": "/bin"}
    assert die_with_parent_named_in(environ) is None
    assert die_with_parent_named_in({PARENT_PID_ENV: "x"}) is None


def _fake_probes(parent: int | None, bus: str) -> subprocess.Popen:
    """A process that looks like a probes child to the start-up check: 'probes' in its
    command line, the marker naming ``parent`` (None: this test process, its real parent)."""
    env = {**os.environ, "GPUWHY_BUS": bus}
    env = child_environment(env) if parent is None else {**env, PARENT_PID_ENV: str(parent)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "probes"],
                            env=env)


@pytest.fixture
def fakes():
    made = []
    yield made
    for process in made:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_the_service_stops_probes_an_earlier_service_left_behind(tmp_config, fakes, caplog):
    bus = tmp_config["bus.endpoint"]
    orphan = _fake_probes(_dead_pid(), bus)
    someone_elses = _fake_probes(_dead_pid(), "ipc:///tmp/gpuwhy-another-bus.sock")
    still_parented = _fake_probes(None, bus)       # its service (this process) runs
    fakes += [orphan, someone_elses, still_parented]
    time.sleep(0.5)                                # let them exec: the check reads /proc
    caplog.set_level(logging.WARNING, logger="gpuwhy.app.service")
    service = Service(tmp_config.replace({"web.port": 0}), with_probes=False, sources={})
    try:
        service.start()
        orphan.wait(timeout=5)                     # (reaped by the check: our child)
        assert someone_elses.poll() is None and still_parented.poll() is None
        said = [r.getMessage() for r in caplog.records if "left behind" in r.getMessage()]
        assert len(said) == 1 and f"probes process {orphan.pid}," in said[0]
    finally:
        service.stop()


class _StandInProbes(Service):
    """The service with a stand-in for its probes child: armed as the probes arm, it writes
    the parent it will die with to ``armed`` and sleeps."""

    def __init__(self, config, armed):
        super().__init__(config, with_probes=True, sources={})
        self.armed = armed

    def probes_command(self):
        code = ("import sys, time\nfrom gpuwhy.lifeline import die_with_parent_named_in\n"
                "parent = die_with_parent_named_in()\n"
                "open(sys.argv[1], 'w').write(str(parent))\ntime.sleep(60)\n")
        return [sys.executable, "-c", code, str(self.armed)]


def test_the_probes_live_on_when_the_thread_that_started_the_service_ends(tmp_config,
                                                                           tmp_path):
    armed = tmp_path / "armed"
    service = _StandInProbes(tmp_config.replace({"web.port": 0}), armed)

    def start() -> None:
        service.start()
        # Until the child armed: had this thread forked it, its end would now kill it (an
        # end before the arming would hand the child to another thread, unsignalled).
        deadline = time.monotonic() + 30
        while not (armed.exists() and armed.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        starter = threading.Thread(target=start)
        starter.start()
        starter.join()
        assert armed.read_text() == str(os.getpid())
        time.sleep(0.5)
        assert service.probes_state() == "running"
    finally:
        service.stop()
    assert service.probes.returncode == -15          # stopped by stop(), not by the kernel


def test_a_service_started_by_a_harness_stops_cleanly_when_the_harness_goes(tmp_path):
    """A benchmark or demo that starts `gpuwhy up`/`serve` and is killed: the service is
    sent SIGTERM by the kernel and stops as on any SIGTERM, instead of running on (with
    its probes attached, it taxed every ioctl of the host until someone noticed)."""
    from .peers import SimulatedHost

    host = SimulatedHost(tmp_path)
    started = []

    def harness() -> None:
        # the harness's thread that starts the service, ending as a killed harness would
        host.env = child_environment(host.env)
        started.append(host.serve())
        host.gpus()                       # serving: the signal is armed by now

    thread = threading.Thread(target=harness)
    thread.start()
    thread.join()
    [service] = started
    assert service.wait(timeout=30) == 0
    log = host.logs[-1].read_text()
    assert "SIGTERM received: stopping" in log and "stopped cleanly" in log, log[-2000:]
