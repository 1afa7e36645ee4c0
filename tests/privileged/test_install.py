"""scripts/install.sh --mode standalone into a temporary root: the installed services run,
`gpuwhy status` says healthy, a second install changes nothing, --uninstall leaves nothing."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _install(*args):
    result = subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _exec_start(unit: Path) -> list[str]:
    line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if "venv" not in p.parts}


class NotifySocket:
    """A stand-in for systemd's end of $NOTIFY_SOCKET: reads every message as it comes (as
    PID 1 does; a sender blocks once a datagram socket's small queue is full)."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        while not self._stop.is_set():
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def wait_for(self, prefix: str, timeout: float, after: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(t >= after and m.startswith(prefix) for t, m in list(self.messages)):
                return True
            time.sleep(0.1)
        return False

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def work():
    """A directory of our own: pytest's tmp_path can be pruned by another pytest session
    started meanwhile on the same machine, and this test runs for a while."""
    path = Path(tempfile.mkdtemp(prefix="gpuwhy-install-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _stop(process, timeout=30):
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def test_install_run_status_reinstall_uninstall(work):
    tmp_path = work
    root = tmp_path / "root"
    root.mkdir()
    out = _install("--mode", "standalone", "--root", str(root))

    # --- what it laid out, and said ---------------------------------------------------
    gpuwhy = root / "opt/gpuwhy/venv/bin/gpuwhy"
    config = root / "etc/gpuwhy/config.toml"
    units = root / "etc/systemd/system"
    assert gpuwhy.exists() and (root / "var/lib/gpuwhy").is_dir()
    assert (units / "gpuwhy.service").exists() and (units / "gpuwhy-probes.service").exists()
    assert _exec_start(units / "gpuwhy-stacks.service") == [
        str(gpuwhy), "--config", str(config), "probes", "--only", "stacks"]
    assert (units / "gpuwhy-kmsg.socket").read_bytes() == \
        (REPO / "systemd/gpuwhy-kmsg.socket").read_bytes()
    assert (root / "usr/lib/systemd/catalog/gpuwhy.catalog").read_bytes() == \
        (REPO / "systemd/gpuwhy.catalog").read_bytes()
    assert f"wrote {config}" in out
    assert "systemd is not PID 1" in out and "systemctl enable --now gpuwhy.service" in out
    assert "not creating users" in out
    assert "gpuwhy check-env" in out and "no NVIDIA driver" in out
    serve = _exec_start(units / "gpuwhy.service")
    probes = _exec_start(units / "gpuwhy-probes.service")
    assert serve == [str(gpuwhy), "--config", str(config), "serve"]
    assert probes == [str(gpuwhy), "--config", str(config), "probes"]
    # the installed venv sees the distribution's bcc (system site-packages)
    subprocess.run([str(gpuwhy.parent / "python"), "-c", "import bcc"], check=True)
    # the installed units still verify (paths rewritten to the temporary root)
    verify = subprocess.run(["systemd-analyze", "verify", "gpuwhy.service",
                             "gpuwhy-probes.service", "gpuwhy-stacks.service",
                             "gpuwhy-kmsg.socket"], cwd=units,
                            capture_output=True, text=True)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr

    # --- run the two installed commands as systemd would, and ask `gpuwhy status` ------
    port = _free_port()
    config.write_text(config.read_text().replace("port = 8000", f"port = {port}"))
    notify_path = tmp_path / "notify.sock"
    notify = NotifySocket(notify_path)
    log = open(tmp_path / "services.log", "w+")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWHY_")}
    started = [subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**env, "NOTIFY_SOCKET": str(notify_path),
                                     "WATCHDOG_USEC": "1000000"})]
    try:
        assert notify.wait_for("READY=1", 60), notify.messages
        started.append(subprocess.Popen(probes, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=tmp_path, env=env))
        deadline = time.monotonic() + 120      # bcc compiles the probes: slow on a busy host
        while True:
            status = subprocess.run([str(gpuwhy), "--config", str(config), "status", "--json"],
                                    capture_output=True, text=True, timeout=60)
            parts = {p["part"]: p["state"] for p in json.loads(status.stdout)["parts"]}
            if status.returncode == 0 and parts.get("fdtrack") == "ok" or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.5)
        log.seek(0)
        assert status.returncode == 0 and parts.get("fdtrack") == "ok", \
            status.stdout + log.read()[-5000:]
        assert parts["web"] == parts["correlator"] == "ok"
        text = subprocess.run([str(gpuwhy), "--config", str(config), "status"],
                              capture_output=True, text=True)
        assert text.returncode == 0
        assert text.stdout.startswith(f"gpuwhy healthy (store {root}/var/lib/gpuwhy/gpuwhy.db)")
        assert notify.wait_for("WATCHDOG=1", 10, after=time.monotonic()), notify.messages
    finally:
        codes = []
        for process in reversed(started):
            try:
                codes.append(_stop(process))
            except subprocess.TimeoutExpired:
                codes.append("killed after 30 s")
    stopping = notify.wait_for("STOPPING=1", 1)
    notify.close()
    log.seek(0)
    output = log.read()
    assert codes == [0] * len(started), output
    assert stopping and "Traceback" not in output

    # --- a second install keeps the edited config and changes nothing else -------------
    before = _tree(root)
    again = _install("--mode", "standalone", "--root", str(root))
    assert f"kept {config}" in again and "venv" in again and "exists" in again
    after = _tree(root)
    assert {k for k in after if k not in before} <= {"run", "run/gpuwhy"}
    changed = [k for k in before if before[k] != after.get(k) and not k.startswith("var/")]
    assert changed == [], changed
    assert f"port = {port}" in config.read_text()

    # --- uninstall: nothing left under the root ---------------------------------------
    gone = _install("--uninstall", "--root", str(root))
    assert "gpuwhy is uninstalled" in gone
    assert list(root.iterdir()) == [], sorted(str(p) for p in root.rglob("*"))
    assert re.search(r"removed .*/opt/gpuwhy \(venv\)", gone)
