"""`gpuwhy probes` as gpuwhy-probes.service runs it: a non-root user holding only the
unit's capabilities loads every probe and reads other users' processes; without
CAP_SYS_PTRACE it cannot see their fds, without CAP_DAC_READ_SEARCH it cannot read tracefs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.caps import CAPABILITY_BITS, PROBE_CAPABILITIES
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

NOBODY = 65534
REPLAY = (sys.executable, "-m", "gpuwhy.app.demo.standin", "replay")


def _host_bounding_set() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapBnd in /proc/self/status")


def _unit_capabilities() -> list[str]:
    """The unit's capabilities, every one of which this host can grant (the unit no longer
    holds CAP_SYS_RESOURCE, which this VM's root lacks: the probes load without it)."""
    bounding = _host_bounding_set()
    usable = [c for c in PROBE_CAPABILITIES if bounding >> CAPABILITY_BITS[c] & 1]
    assert usable == list(PROBE_CAPABILITIES)
    return usable


@pytest.fixture
def world(tmp_path):
    """A directory nobody can reach, look-alike devices, and a root process holding them
    with a GPUWHY_TAG in its environment."""
    base = Path(tempfile.mkdtemp(prefix="gpuwhy-caps-test-"))
    base.chmod(0o755)
    devices = base / "dev"
    devices.mkdir()
    replay = subprocess.Popen([*REPLAY, str(devices), "--rounds", "1", "--hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "GPUWHY_TAG": "caps-test"})
    pid = json.loads(replay.stdout.readline())["pid"]
    yield base, devices, process_key(pid)
    replay.communicate("\n", timeout=10)
    shutil.rmtree(base, ignore_errors=True)


def _run_probes_as_nobody(base: Path, devices: Path, capabilities: list[str],
                          seconds: float = 60) -> tuple[dict, str]:
    """Run `gpuwhy probes` as nobody with ``capabilities``; collect what reaches the bus."""
    endpoint = f"ipc://{base}/bus-{len(capabilities)}-{time.monotonic_ns()}.sock"
    subscriber = Subscriber(endpoint)
    Path(endpoint.removeprefix("ipc://")).chmod(0o666)   # the unit's group access, here
    caps = ",".join("+" + c.removeprefix("CAP_").lower() for c in capabilities)
    env = {"PATH": os.environ["PATH"], "GPUWHY_BUS": endpoint,
           "GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*", "GPUWHY_DB": f"{base}/unused.db",
           "GPUWHY_POLL_INTERVAL": "0.2"}
    probes = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}",
         f"--bounding-set=-all,{caps}", "--no-new-privs",
         sys.executable, "-m", "gpuwhy", "probes"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=base)
    seen: dict = {"health": {}, "devices": set(), "tags": {}}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and probes.poll() is None:
            envelope = subscriber.receive(timeout=0.2)
            if envelope is None:
                continue
            event = envelope.event
            if event.kind == "source_health":
                seen["health"][event.source] = event.state
            elif event.kind == "device_opened":
                seen["devices"].add((event.process, event.path))
            elif event.kind == "process_seen" and event.tag:
                seen["tags"][event.process] = event.tag
            if {"fdtrack", "lifecycle", "sched"} <= set(seen["health"]) and \
                    len(seen["devices"]) >= 3:
                break
            if {"fdtrack", "lifecycle", "sched"} <= set(seen["health"]) and \
                    time.monotonic() > deadline - seconds + 15:
                break      # loaded and scanned a while ago: nothing more is coming
    finally:
        subscriber.close()
        if probes.poll() is None:
            probes.send_signal(signal.SIGTERM)
        output = probes.communicate(timeout=30)[0]
    return seen, output


def test_the_units_capabilities_are_enough_and_each_proc_one_is_needed(world):
    base, devices, holder = world
    capabilities = _unit_capabilities()

    seen, output = _run_probes_as_nobody(base, devices, capabilities)
    assert seen["health"] == {"fdtrack": "ok", "lifecycle": "ok", "sched": "ok"}, output
    assert {path for key, path in seen["devices"] if key == holder} == {
        f"{devices}/nvidiactl", f"{devices}/nvidia0", f"{devices}/nvidia-uvm"}, output
    assert seen["tags"].get(holder) == "caps-test", output   # root's /proc/PID/environ

    without_ptrace = [c for c in capabilities if c != "CAP_SYS_PTRACE"]
    seen, output = _run_probes_as_nobody(base, devices, without_ptrace)
    assert seen["health"].get("fdtrack") == "ok", output
    assert not any(key == holder for key, _ in seen["devices"]), output
    assert holder not in seen["tags"]

    without_dac = [c for c in capabilities if c != "CAP_DAC_READ_SEARCH"]
    seen, output = _run_probes_as_nobody(base, devices, without_dac, seconds=30)
    assert "fdtrack" not in seen["health"] and "tracefs" in output, output
