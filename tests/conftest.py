"""Shared fixtures; and the rule that root tests run (never skip) when the suite runs as root.

Tests marked ``kmsg`` write marked test lines into the host's real kernel log; as root they
run by default. ``GPUWHY_TEST_KMSG=0`` excludes them (a host whose kernel log must stay
clean): the one skip of a root test the guard below accepts, because it was asked for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.config import load_config
from gpuwhy.store import open_store

# Every gpuwhy the suite starts (in this process or a child) takes the suite's own marked
# kernel-log lines; a service started outside it ignores them (setting klog.test_lines).
os.environ.setdefault("GPUWHY_KLOG_TEST_LINES", "true")

REPO = Path(__file__).resolve().parent.parent
IS_ROOT = os.geteuid() == 0
KMSG_EXCLUDED = os.environ.get("GPUWHY_TEST_KMSG") == "0"
KMSG_EXCLUDED_REASON = "GPUWHY_TEST_KMSG=0: tests that write the host kernel log are excluded"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("kmsg") and KMSG_EXCLUDED:
        pytest.skip(KMSG_EXCLUDED_REASON)
    if item.get_closest_marker("root") and not IS_ROOT:
        pytest.skip("needs root (eBPF, /dev/kmsg, journald or cron); run the suite as root")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    excluded = KMSG_EXCLUDED and item.get_closest_marker("kmsg")
    if IS_ROOT and report.skipped and item.get_closest_marker("root") and not excluded:
        # As root nothing excuses a root test from running: a skip here would hide a broken
        # eBPF/journald/cron path behind a green run.
        report.outcome = "failed"
        report.longrepr = f"root test skipped while running as root: {report.longrepr}"


@pytest.fixture
def installed():
    """installed(NAME) -> the program's path; a test whose program scripts/setup.sh installs
    fails when it is missing (a skip would hide a set-up that no longer installs it)."""
    def find(name: str) -> str:
        path = shutil.which(name)
        if path is None:
            pytest.fail(f"{name} is not installed: scripts/setup.sh installs it (Debian's "
                        "prometheus and prometheus-alertmanager packages)", pytrace=False)
        return path
    return find


@pytest.fixture
def recorder():
    """A local HTTP server keeping what is POSTed to it (tests/peers.py), closed after."""
    from .peers import Recorder

    made = Recorder()
    yield made
    made.close()


@pytest.fixture
def tmp_config(tmp_path: Path):
    """A config whose store, bus and device files all live under tmp_path."""
    devices = tmp_path / "dev"
    devices.mkdir()
    environ = {
        "GPUWHY_DB": str(tmp_path / "gpuwhy.db"),
        "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock",
        "GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*",
        "GPUWHY_POLL_INTERVAL": "0.2",
        "GPUWHY_FLUSH_INTERVAL": "0.1",
        "GPUWHY_KLOG_TEST_LINES": "true",       # the suite's marked kernel lines count here
    }
    return load_config(environ=environ)


@pytest.fixture
def db(tmp_path: Path):
    database = open_store(tmp_path / "test.db")
    yield database
    database.close()


class Replay:
    """Runs `python -m gpuwhy.app.demo.standin replay` against a folder of look-alike device
    files."""

    command = (sys.executable, "-m", "gpuwhy.app.demo.standin", "replay")

    def __init__(self, directory: Path):
        self.directory = directory

    def start(self, rounds: int = 1, threads: int = 1) -> subprocess.Popen:
        return subprocess.Popen([*self.command, str(self.directory),
                                 "--rounds", str(rounds), "--threads", str(threads), "--hold"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def replay(tmp_config) -> Replay:
    return Replay(Path(tmp_config["probes.device_glob"]).parent)
