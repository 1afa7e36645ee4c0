"""The real probe pipeline (probes -> bus -> correlator -> store) for privileged tests."""

import subprocess
import threading
import time

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.privileged import run_probes
from gpuwhy.store import open_store


class Pipeline:
    """probes -> bus -> correlator -> store, all real, in threads of this process."""

    def __init__(self, config):
        self.config = config
        self.stop = threading.Event()
        self.loaded = threading.Event()
        self.db = open_store(config["store.path"])
        self.subscriber = Subscriber(config["bus.endpoint"])
        self.correlator = Correlator(config, self.db, self.subscriber)
        self.errors = []
        self.threads = [threading.Thread(target=self.correlator.run, args=(self.stop,)),
                        threading.Thread(target=self._probe)]

    def _probe(self):
        try:
            run_probes(self.config, self.stop, self.loaded)
        except Exception as exc:  # surfaced by start()
            self.errors.append(exc)
            self.loaded.set()

    def start(self):
        for thread in self.threads:
            thread.start()
        assert self.loaded.wait(60) and not self.errors, self.errors

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(15)
        self.subscriber.close()

    def reader(self):
        return open_store(self.config["store.path"], readonly=True)

    def query(self, sql, params=()):
        with self.reader() as db:
            return db.execute(sql, params).fetchall()

    def wait_for(self, sql, params, predicate, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            rows = self.query(sql, params)
            if predicate(rows) or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)


@pytest.fixture
def pipeline_for():
    """pipeline_for(config) -> a started Pipeline, closed after the test."""
    made = []

    def start(config):
        pipe = Pipeline(config)
        made.append(pipe)
        pipe.start()
        return pipe
    yield start
    for pipe in made:
        pipe.close()


@pytest.fixture
def probe_config(tmp_config):
    """tmp_config with every failed or large call reported (no rate limit in the way)."""
    return tmp_config.replace({"probes.error_events_per_second": 1_000_000})


# --- shared by the correlator's privileged tests ---
@pytest.fixture
def system_journald():
    """A running systemd-journald with /dev/log linked: the host's, or one started (and
    stopped) here."""
    import subprocess
    from pathlib import Path

    socket, dev_log = Path("/run/systemd/journal/socket"), Path("/dev/log")
    syslog_socket = Path("/run/systemd/journal/dev-log")
    started, linked = None, False
    if not (socket.exists() and subprocess.run(["pgrep", "-x", "systemd-journal"],
                                               capture_output=True).returncode == 0):
        Path("/run/systemd/journal").mkdir(parents=True, exist_ok=True)
        # a socket file left by a journald stopped earlier would pass for the new one's
        socket.unlink(missing_ok=True)
        syslog_socket.unlink(missing_ok=True)
        started = subprocess.Popen(["/lib/systemd/systemd-journald"], start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not (socket.exists() and syslog_socket.exists()):
            assert started.poll() is None, "systemd-journald exited"
            assert time.monotonic() < deadline, "systemd-journald did not come up"
            time.sleep(0.05)
    if not dev_log.exists() and not dev_log.is_symlink():
        dev_log.symlink_to("/run/systemd/journal/dev-log")
        linked = True
    yield
    if linked:
        dev_log.unlink()
    if started is not None:
        started.terminate()
        started.wait(10)


@pytest.fixture
def kernel_log_store(tmp_config):
    """The real correlator writing tmp_config's store in a thread; yields a read-only
    connection: polling through the writer's own would hold its lock and slow it down."""
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    stop = threading.Event()
    thread = threading.Thread(target=Correlator(tmp_config, db, subscriber).run, args=(stop,),
                              daemon=True)
    thread.start()
    reader = open_store(tmp_config["store.path"], readonly=True)
    yield reader
    stop.set()
    thread.join(5)
    subscriber.close()
    reader.close()
    db.close()


def cron_gone(seconds: float = 30.0) -> bool:
    """Whether no cron process is left within ``seconds``: a job a cron daemon started
    before it was stopped keeps a cron child waiting on it until the job ends."""
    deadline = time.monotonic() + seconds
    while subprocess.run(["pgrep", "-x", "cron"], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
