"""Run gpuwhy's parts together: correlator and web view in threads, probes as a child process.

The probes need privilege and the rest does not, so they never share a process: `up`
starts `gpuwhy probes` as a child and runs the unprivileged parts here. Shutdown order
(SIGTERM or SIGINT): stop the probes (they flush their last counts), let the correlator
drain the bus and write its last batch, then stop the web server.

The probes child dies with the service, however the service ends (SIGKILL included): it
asks the kernel for SIGKILL when its parent goes (gpuwhy.lifeline). A probes process that
an earlier service left running anyway (it could not arm that) is stopped at start-up,
before it can publish its events a second time alongside the new one.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from gpuwhy.app.otlp import start_otlp
from gpuwhy.boot import host_boot_id
from gpuwhy.bus import Publisher, Subscriber
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.correlator.alertmanager import AlertmanagerPusher
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.errors import ConfigError, GpuwhyError
from gpuwhy.events import SourceHealth
from gpuwhy.lifeline import PARENT_PID_ENV, child_environment
from gpuwhy.memory import release_freed_memory
from gpuwhy.sdnotify import Notifier
from gpuwhy.store import open_store
from gpuwhy.threads import Thread

if TYPE_CHECKING:
    from gpuwhy.app.otlp_export import OtlpExporter
    from gpuwhy.webui.server import WebServer

log = logging.getLogger(__name__)

PROBE_STOP_TIMEOUT = 3.0
SOURCE_STOP_TIMEOUT = 2.0
# seconds between looks at the threads and the probes: the watchdog's pings are due every
# WatchdogSec/2 (15 s as shipped), and a part that stopped is said within this
WATCH_EVERY = 5.0
# seconds between giving the heap the threads freed back to the kernel (0.1-0.3 ms each):
# glibc keeps it, and a long-running service's churn (rounds, batches, pages) leaves a MB
RELEASE_EVERY = 60.0

SourceRunner = Callable[[Config, threading.Event], None]


def resuming(run: Callable[..., None]) -> SourceRunner:
    """A log source's runner handed the store's cursors: the source resumes where the store
    says it stopped (sources do not read the store themselves)."""
    from gpuwhy.store.source_cursors import cursor_reader

    def runner(config: Config, stop: threading.Event) -> None:
        run(config, stop, cursors=cursor_reader(config["store.path"]))
    runner.__name__ = run.__name__
    return runner


def unprivileged_sources(config: Config) -> dict[str, SourceRunner]:
    """The sources that run inside the unprivileged service, by name.

    Each runner connects its own Publisher to ``config["bus.endpoint"]`` and publishes
    until the event it is given is set; it must return within SOURCE_STOP_TIMEOUT then.
    """
    sources: dict[str, SourceRunner] = {}
    # --- GPU source ---
    from gpuwhy.probes.gpu.runner import run_gpu_source

    sources["gpu"] = run_gpu_source
    # --- kernel log and cron sources ---
    from gpuwhy.probes.cron.source import run_cron_source
    from gpuwhy.probes.klog.source import run_klog_source

    sources["klog"] = resuming(run_klog_source)
    sources["cron"] = resuming(run_cron_source)
    # --- inference engines (vLLM, SGLang, TGI, Triton): found in /proc, /metrics scraped ---
    from gpuwhy.probes.engines.source import run_engine_source

    sources["engines"] = run_engine_source
    # --- rules ---
    from gpuwhy.correlator.rules.runner import run_rules

    sources["rules"] = run_rules
    # --- Python stack sampler (docs/decisions/0018-python-stacks-sampler.md): whom to
    # sample, decided from the store; the sampler runs here only with CAP_SYS_PTRACE (as in
    # `gpuwhy up` run as root), and says so once and stops without it ---
    from gpuwhy.app.stack_targets import run_stack_targets
    from gpuwhy.probes.stack_sampler import run_stack_sampler

    sources["stack_targets"] = run_stack_targets
    sources["stacks"] = run_stack_sampler
    return sources


def check_bind_address(host: str, auth_token: str = "") -> None:
    """Loopback addresses always; any other only with a token, which the web view then asks
    of every request (gpuwhy.webui.auth)."""
    if host == "localhost" or auth_token:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"refusing to serve the web view on {host!r} without authentication; "
                          "set GPUWHY_AUTH_TOKEN (web.auth_token), or use 127.0.0.1 (and an "
                          "SSH tunnel)", key="web.host")


def gpu_devices_present(pattern: str = "/dev/nvidia[0-9]*") -> bool:
    return bool(glob.glob(pattern))


def orphaned_probes(endpoints: set[str]) -> list[tuple[psutil.Process, int]]:
    """Probes processes an earlier service started for one of ``endpoints`` and left behind,
    with that service's pid: they carry its ``GPUWHY_PARENT_PID`` marker and that pid is no
    longer their parent.

    Only the marker counts (not a command line or GPUWHY_BUS alone): probes run by systemd,
    a DaemonSet or by hand are nobody's orphans. Processes whose environment this user may
    not read are passed over.
    """
    found = []
    for process in psutil.process_iter(["ppid", "cmdline"]):
        try:
            if "probes" not in (process.info["cmdline"] or []):
                continue
            environ = process.environ()
        except (psutil.Error, OSError):
            continue
        parent = environ.get(PARENT_PID_ENV, "")
        if (parent.isdigit() and environ.get("GPUWHY_BUS") in endpoints
                and process.info["ppid"] != int(parent) and process.pid != os.getpid()):
            found.append((process, int(parent)))
    return found


def stop_orphaned_probes(endpoints: set[str], timeout: float = PROBE_STOP_TIMEOUT) -> int:
    """Stop (SIGTERM, SIGKILL after ``timeout`` s) every :func:`orphaned_probes` process,
    saying so once each; returns how many. Raises GpuwhyError when one cannot be stopped:
    the service would store its events twice."""
    found = orphaned_probes(endpoints)
    orphans = [process for process, _ in found]
    for process, parent in found:
        log.warning("stopping probes process %d, left behind by an earlier gpuwhy service "
                    "(pid %d, no longer its parent) and publishing on %s: its events would "
                    "be stored twice", process.pid, parent, " ".join(sorted(endpoints)))
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            raise GpuwhyError(f"probes process {process.pid}, left behind by an earlier "
                              f"gpuwhy service, publishes on this bus and cannot be stopped "
                              f"by this user: `kill {process.pid}` as root, then start "
                              "again") from None
    _, alive = psutil.wait_procs(orphans, timeout)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout)
    return len(orphans)


class Service:
    """Correlator + web view (+ the probes child when ``with_probes``)."""

    def __init__(self, config: Config, with_probes: bool = True, config_path: str | None = None,
                 shutdown: threading.Event | None = None,
                 sources: dict[str, SourceRunner] | None = None):
        check_bind_address(config["web.host"], config["web.auth_token"])
        self.config = config
        self.with_probes = with_probes
        self.config_path = config_path
        self.shutdown = shutdown or threading.Event()   # set by signal handlers
        self.sources = unprivileged_sources(config) if sources is None else sources
        self._sources_stop = threading.Event()
        self._correlator_stop = threading.Event()
        self.db = open_store(config["store.path"], cache_kib=config["store.cache_kib"])
        self.subscriber = Subscriber(config["bus.endpoint"], hwm=config["bus.hwm"])
        # Before our own probes start: an orphan would publish every event a second time.
        # After the bind, so that both spellings of the endpoint are known (a child is given
        # the bound one); what the orphan publishes until it is stopped is stored once.
        stop_orphaned_probes({config["bus.endpoint"], self.subscriber.endpoint})
        self.correlator = Correlator(config, self.db, self.subscriber,
                                     host_boot=host_boot_id(config["probes.proc_root"]))
        self._pusher_stop = threading.Event()
        self.pusher: AlertmanagerPusher | None = None
        if config["alertmanager.url"]:     # an output of its own: its own store connection
            self.pusher = AlertmanagerPusher(config, open_store(config["store.path"]))
        self.otlp: OtlpExporter | None = None     # started by start() when an endpoint is set
        from gpuwhy.webui.server import make_web_server

        self.web: WebServer = make_web_server(config)
        from gpuwhy.app.mcp_http import mount  # /mcp: the SDK is loaded at its first use only

        self.mcp = mount(self.web.wsgi_app, config)
        self.probes: subprocess.Popen | None = None
        self._probes_owner: threading.Thread | None = None
        self._probes_reaped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._source_threads: list[threading.Thread] = []
        self.notifier = Notifier.from_environment()   # systemd Type=notify; no-op otherwise

    @property
    def url(self) -> str:
        return f"http://{self.config['web.host']}:{self.web.server_port}"

    def start(self) -> None:
        if not gpu_devices_present():
            log.warning("!!! no NVIDIA GPU device (/dev/nvidia0...) on this host: the gpu "
                        "source says in `gpuwhy status` what it uses instead")
        parts = [("correlator", self._run_correlator), ("web", self.web.serve_forever)]
        if self.pusher is not None:
            parts.append(("alertmanager", self._run_pusher))
        thread: threading.Thread
        for name, target in parts:
            thread = Thread(target=target, name=f"gpuwhy-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._source_threads = [
            Thread(target=self._run_source, args=(name, runner),
                   name=f"gpuwhy-source-{name}", daemon=True)
            for name, runner in self.sources.items()]
        for thread in self._source_threads:
            thread.start()
        if self.with_probes:
            self._start_probes()
        self.otlp = start_otlp(self.config)     # None, importing no SDK, without an endpoint
        log.info("gpuwhy is up: web view at %s, bus at %s", self.url, self.subscriber.endpoint)
        self.notifier.ready(f"web view at {self.url}")

    def _run_source(self, name: str, runner: SourceRunner) -> None:
        try:
            runner(self.config, self._sources_stop)
        except Exception as exc:  # noqa: BLE001 - a crashed source is reported, the rest runs on
            log.exception("source %s failed; gpuwhy runs on without it", name)
            publisher = Publisher(self.subscriber.endpoint, src=f"service:{name}")
            publisher.wait_for_subscriber(1.0)
            publisher.publish(SourceHealth(ts=now_ns(), source=name, state="failed",
                                           detail=f"{type(exc).__name__}: {exc}"))
            publisher.close()

    def _run_correlator(self) -> None:
        try:
            self.correlator.run(self._correlator_stop)
        finally:
            self.subscriber.close()
            self.db.close()

    def _run_pusher(self) -> None:
        assert self.pusher is not None
        try:
            self.pusher.run(self._pusher_stop)
        finally:
            self.pusher.db.close()

    def probes_command(self) -> list[str]:
        """The probes child's command line: `gpuwhy [--config PATH] probes`."""
        command = [sys.executable, "-m", "gpuwhy"]
        if self.config_path:
            command += ["--config", self.config_path]
        return [*command, "probes"]

    def _start_probes(self) -> None:
        """Start the probes child from a thread kept until :meth:`stop` has reaped it.

        The child's parent-death signal (gpuwhy.lifeline) comes when the *thread* that forked
        it ends, not the process: forked by whichever thread called start() (a test's, a
        short-lived one), the probes would be killed when that thread returned.
        """
        command = self.probes_command()
        env = child_environment({**os.environ, "GPUWHY_BUS": self.subscriber.endpoint})
        started = threading.Event()
        failed: list[BaseException] = []

        def own() -> None:
            try:
                self.probes = subprocess.Popen(command, env=env)
            except BaseException as exc:  # noqa: BLE001 - raised again by start()
                failed.append(exc)
                return
            finally:
                started.set()
            self._probes_reaped.wait()

        self._probes_owner = Thread(target=own, name="gpuwhy-probes-owner", daemon=True)
        self._probes_owner.start()
        started.wait()
        if failed:
            raise failed[0]

    def probes_state(self) -> str:
        if self.probes is None:
            return "not started"
        code = self.probes.poll()
        return "running" if code is None else f"exited with status {code}"

    def wait(self) -> None:
        """Block until ``shutdown`` is set (a signal handler sets it), watching the threads
        and the probes each WATCH_EVERY (the watchdog's pings) and giving the heap freed
        since back to the kernel each RELEASE_EVERY."""
        reported = False
        release_at = time.monotonic() + RELEASE_EVERY
        while not self.shutdown.wait(WATCH_EVERY):
            if time.monotonic() >= release_at:
                release_freed_memory()
                release_at = time.monotonic() + RELEASE_EVERY
            stopped = [t.name for t in self._threads if not t.is_alive()]
            self.notifier.alive(not stopped, f"{', '.join(stopped)} stopped")
            if self.probes is not None and self.probes.poll() is not None and not reported:
                log.error("the probes process %s; gpuwhy runs on without it",
                          self.probes_state())
                reported = True

    def stop(self) -> None:
        """Sources and probes stop together (their last events still reach the store), then
        the correlator drains the bus and writes its last batch, then the web view."""
        self.shutdown.set()
        self.notifier.stopping()
        self._sources_stop.set()
        # the probes process while it runs, else None
        running = self.probes if self.probes is not None and self.probes.poll() is None \
            else None
        if running is not None:
            running.terminate()
        deadline = time.monotonic() + SOURCE_STOP_TIMEOUT
        for thread in self._source_threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if running is not None:
            try:
                running.wait(PROBE_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.warning("the probes did not stop within %s s: killed", PROBE_STOP_TIMEOUT)
                running.kill()
                running.wait()
        self._probes_reaped.set()     # the owner thread may end: nothing left to kill
        if self._probes_owner is not None:
            self._probes_owner.join()
        self._correlator_stop.set()
        deadline = time.monotonic() + PROBE_STOP_TIMEOUT
        for thread in self._threads:
            if thread.name == "gpuwhy-correlator":
                thread.join(max(0.0, deadline - time.monotonic()))
        # after the correlator's last batch: the pusher takes in what it resolved (a push in
        # flight ends within alertmanager.timeout; what is not sent stays owed in the store)
        self._pusher_stop.set()
        for thread in self._threads:
            if thread.name == "gpuwhy-alertmanager":
                thread.join(max(0.0, deadline - time.monotonic())
                            + self.config["alertmanager.timeout"])
        if self.otlp is not None:    # after the last batch: its changes go out, or are counted
            self.otlp.stop()
            self.otlp.db.close()
        self.web.shutdown()
        self.web.server_close()
        self.mcp.close()

class PipelineError(GpuwhyError):
    """A part of an in-process pipeline failed to start."""


class Pipeline:
    """Probes, GPU source, kernel-log and cron sources, correlator: threads of ONE process, on
    a private bus and store (`gpuwhy check` without a service, `gpuwhy demo`). Needs root."""

    def __init__(self, config: Config):
        self.config = config
        self.stop = threading.Event()
        self.loaded = threading.Event()
        self.db = open_store(config["store.path"], cache_kib=config["store.cache_kib"])
        self.subscriber = Subscriber(config["bus.endpoint"], hwm=config["bus.hwm"])
        self.correlator = Correlator(config, self.db, self.subscriber,
                                     host_boot=host_boot_id(config["probes.proc_root"]))
        self.errors: list[BaseException] = []
        runners = {"probes": self._probes, **unprivileged_sources(config)}
        self.threads = [Thread(target=self.correlator.run, args=(self.stop,),
                               name="pipeline-correlator", daemon=True)]
        self.threads += [Thread(target=self._guard, args=(name, runner),
                                name=f"pipeline-{name}", daemon=True)
                         for name, runner in runners.items()]

    def _probes(self, config: Config, stop: threading.Event) -> None:
        from gpuwhy.probes.privileged import run_probes

        run_probes(config, stop, self.loaded)

    def _guard(self, name: str, runner: Callable) -> None:
        try:
            runner(self.config, self.stop)
        except Exception as exc:  # noqa: BLE001 - reported by start()
            self.errors.append(exc)
            self.loaded.set()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
        if not self.loaded.wait(90) or self.errors:
            raise PipelineError(f"the pipeline did not start: {self.errors}")

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)
        self.subscriber.close()
        self.db.close()

    def reader(self):  # noqa: ANN201
        return open_store(self.config["store.path"], readonly=True)
