"""The engines source: find inference engines, scrape their /metrics, publish engine samples.

Every ``INTERVAL_S`` it looks through /proc again (an engine started after gpuwhy is found at
the next round) and scrapes every engine found and every endpoint named in
``engines.endpoints``, in parallel, each scrape bounded as the dcgm-exporter's is: a total
time limit (a timer shuts the socket down, however slowly the target trickles), a cap on the
body, and more: no redirect is followed, no proxy is used (loopback only), the status line
and headers are http.client's to bound. A target that is slow, huge, garbage or redirects
fails its own scrape and marks this source ``degraded`` with its reason; the others are
published as usual. An engine is scraped on the first of its listening ports that answers
with its metrics (the port its command line names, then its default, then the others; at
most ``MAX_PORT_TRIES``); a port that did not is tried again only after ``RETRY_S``.

An engine in another network namespace (a container with its own network, a pod) is scraped
on its own loopback through that namespace when gpuwhy holds CAP_SYS_ADMIN: the socket is
made inside it (:mod:`gpuwhy.probes.engines.netns`), the scrape bounded as any other. Without
the capability it is reported in the health with what to do, and not scraped.

Unprivileged (the shipped unit), an engine of another user has its ports matched by number
and owner (:mod:`gpuwhy.probes.engines.discover`): the health says so for each, as
information, not as a fault; a port of another process of the same user that serves no
engine metrics is refused by the probing below like any other port. An engine recognised
but with no port found for longer than the finder's RESCAN_S is named in the health too (at
most MAX_NOTES of them, logged once each), without degrading it: it may still be loading.

What an endpoint serves is untrusted: parsed by the bounded parser, only known names kept,
reasons shown after :func:`gpuwhy.text.printable`, values finite or dropped.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gpuwhy import __version__
from gpuwhy.bus import Publisher
from gpuwhy.clock import now_ns
from gpuwhy.config import Config, environment_names
from gpuwhy.errors import NoSuchProcess
from gpuwhy.events import EngineSample, Event, SourceHealth
from gpuwhy.identity import GpuIdentity, ProcessKey
from gpuwhy.probes.engines import metric_names as metrics
from gpuwhy.probes.engines.discover import Engine, Finder
from gpuwhy.probes.engines.netns import NamespaceError, Namespaces, can_enter
from gpuwhy.probes.gpu.scrape import Deadline
from gpuwhy.proc import read_process
from gpuwhy.text import printable

# Who reads an engine's /metrics, as its operator sees it in an access log: gpuwhy, and which
# process (two gpuwhy instances on one host are two scrapers, each with its own rates)
USER_AGENT = f"gpuwhy/{__version__} (engines source; pid {os.getpid()})"

log = logging.getLogger(__name__)

SOURCE = "engines"
INTERVAL_S = 5.0          # a round: discovery and one scrape of every engine
TIMEOUT_S = 2.0           # one scrape, connect to last byte
MAX_BODY = 8 << 20        # bytes (vLLM with every histogram: a few hundred KB)
MAX_PORT_TRIES = 4        # ports of one engine tried for its metrics
RETRY_S = 60.0            # before a port that gave no metrics is tried again
MAX_ENDPOINTS = 64        # engines and named endpoints scraped in one round
MAX_REASON = 200
MAX_NOTES = 8             # engines told about in the health as information (the rest counted)


class ScrapeError(Exception):
    """One scrape failed; the message says why in one line."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# makes the unconnected TCP socket of an address family (AF_INET, AF_INET6) for a scrape
SocketFactory = Callable[[int], socket.socket]


class _MadeSocketConnection(http.client.HTTPConnection):
    """An HTTPConnection on a socket that ``factory`` makes (in an engine's network
    namespace): connect() only connects it, to the numeric loopback address it was given (no
    name is resolved)."""

    def __init__(self, host: str, port: int, timeout: float, factory: SocketFactory):
        super().__init__(host, port, timeout=timeout)
        self._factory = factory

    def connect(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = self._factory(family)
        try:
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect((self.host, self.port))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def get(url: str, seconds: float = TIMEOUT_S, max_bytes: int = MAX_BODY,
        socket_factory: SocketFactory | None = None) -> bytes:
    """The body of a plain-HTTP GET of ``url`` on loopback, within ``seconds`` in all and
    ``max_bytes`` at most; no redirect followed, no proxy used. With ``socket_factory`` the
    socket is the one it makes (an engine's network namespace's: :mod:`netns`), and the host
    must be a numeric loopback address. Raises :class:`ScrapeError`."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not is_loopback(parts.hostname):
        raise ScrapeError(f"{url}: only http:// on a loopback address is scraped")
    if socket_factory is not None and parts.hostname == "localhost":
        # a name would be resolved in gpuwhy's namespace, for a socket of another
        raise ScrapeError(f"{url}: a socket made elsewhere needs a numeric loopback address")
    deadline = Deadline(seconds)
    started = time.monotonic()
    failure: str | None = None
    body = b""
    with deadline:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80,
                                                timeout=seconds) if socket_factory is None \
            else _MadeSocketConnection(parts.hostname, parts.port or 80, seconds,
                                       socket_factory)
        try:
            connection.connect()
            deadline.watch(connection.sock)
            connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query
                                                             else ""),
                               headers={"Accept": "text/plain", "User-Agent": USER_AGENT})
            response = connection.getresponse()
            if 300 <= response.status < 400:
                failure = f"{url} answered a redirect (HTTP {response.status}): not followed"
            elif response.status != 200:
                failure = f"{url} answered HTTP {response.status}"
            else:
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    failure = f"{url}: body larger than {max_bytes} bytes " \
                              f"(Content-Length {declared})"
                else:
                    body = response.read(max_bytes + 1)
                    if len(body) > max_bytes:
                        failure = f"{url}: body larger than {max_bytes} bytes"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            failure = f"cannot scrape {url}: {exc.__class__.__name__} {exc}"
        finally:
            connection.close()
    if deadline.expired or time.monotonic() - started >= seconds:
        raise ScrapeError(f"scrape of {url} took longer than {seconds:g} s")
    if failure is not None:
        raise ScrapeError(printable(failure, MAX_REASON))
    return body


def guess_engine(text: str) -> str | None:
    """The engine whose names a body holds (for an endpoint named without its engine)."""
    for name, spec in metrics.SPECS.items():
        if any(f"\n{prefix}" in text or text.startswith(prefix) for prefix in spec.prefixes):
            return name
    return None


@dataclass
class Target:
    """One endpoint scraped round after round, and what its last scrape left."""

    url: str
    engine: str | None
    process: ProcessKey | None = None
    members: list[ProcessKey] = field(default_factory=list)
    gpu_minors: list[int] = field(default_factory=list)
    netns: str = ""          # the engine's network namespace, entered for the socket
    netns_error: str = ""    # why its last socket could not be made there
    batch_limit: int | None = None   # as the engine's command line sets it (discover.py)
    previous: metrics.Parsed | None = None
    previous_at: float = 0.0
    error: str = ""
    skipped: int = 0


def parse_endpoints(text: str) -> list[tuple[str | None, str]]:
    """``engines.endpoints``: comma-separated ``URL`` or ``ENGINE=URL`` entries."""
    out: list[tuple[str | None, str]] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, eq, url = entry.partition("=")
        if eq and name in metrics.SPECS and "://" not in name:
            out.append((name, url.strip()))
        else:
            out.append((None, entry))
    return out[:MAX_ENDPOINTS]


class EngineSource:
    """Rounds of discovery and scrapes; ``round()`` returns the events to publish."""

    def __init__(self, endpoints: str = "", proc_root: str = "/proc",
                 timeout: float = TIMEOUT_S, max_body: int = MAX_BODY,
                 enter_netns: bool | None = None, environment: frozenset[str] = frozenset()):
        """``enter_netns``: scrape engines in other network namespaces through them; None:
        when this process holds CAP_SYS_ADMIN (:func:`netns.can_enter`). ``environment``:
        the variables its ProcessSeen events carry, where this user may read them."""
        self.proc_root, self.timeout, self.max_body = proc_root, timeout, max_body
        self.environment = environment
        self.named = [Target(url, engine) for engine, url in parse_endpoints(endpoints)]
        self.targets: dict[ProcessKey, Target] = {}     # found engines, by process
        self.engines: list[Engine] = []
        self.refused: dict[tuple[ProcessKey, int], float] = {}   # port gave no metrics: when
        self.seen: set[ProcessKey] = set()
        self.counters: dict[str, int] = {"rounds": 0, "scrapes": 0, "scrape_errors": 0,
                                         "samples": 0, "skipped_lines": 0}
        self.notes: list[str] = []
        # information on engines, not faults: ports matched by owner, engines with no port
        self.info: list[str] = []
        self.told: set[ProcessKey] = set()       # engines with no port already logged
        # engines in another namespace whose socket could not be made there: why
        self.entry_errors: dict[ProcessKey, str] = {}
        if enter_netns is None:
            enter_netns = can_enter()
        # gpuwhy's own network namespace held open from the start: the way back
        self.namespaces: Namespaces | None = None
        if enter_netns:
            try:
                self.namespaces = Namespaces(proc_root)
            except OSError as exc:      # no /proc/thread-self: no way back, so never out
                log.warning("engines in other network namespaces will not be scraped: "
                            "cannot hold gpuwhy's own (%s)", exc)
                enter_netns = False
        self.finder = Finder(proc_root, enter_netns=enter_netns)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpuwhy-engines")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.namespaces is not None:
            self.namespaces.close()

    def discover(self) -> list[Event]:
        """Look through /proc; ProcessSeen for the processes newly found."""
        self.engines = self.finder.find()
        found = {e.process: e for e in self.engines}
        for key in [k for k in self.targets if k not in found]:
            del self.targets[key]                          # gone
        self.notes = [f"{e.engine} pid {e.process.pid}: {e.note}" for e in self.engines
                      if e.note]
        unattributed = self.finder.unattributed
        # the engines not scraped first: the likelier to be acted on
        info = [f"{name} pid {key.pid}: {why}" for name, key, why in unattributed] + \
            [f"{e.engine} pid {e.process.pid}: {e.info}" for e in self.engines if e.info]
        self.info = info[:MAX_NOTES] + ([f"and {len(info) - MAX_NOTES} more engine(s) "
                                         "told about"] if len(info) > MAX_NOTES else [])
        for name, key, why in unattributed:
            if key not in self.told:
                log.info("engine %s pid %d not scraped: %s", name, key.pid, why)
        self.told = {key for _, key, _ in unattributed}
        events: list[Event] = []
        ts = now_ns()
        for engine in self.engines:
            target = self.targets.get(engine.process)
            if target is not None:
                target.members, target.gpu_minors = engine.members, engine.gpu_minors
                target.batch_limit = engine.batch_limit
                target.netns = engine.netns
            for key in [engine.process, *engine.members]:
                if key not in self.seen:
                    try:
                        seen = read_process(key.pid, ts, self.proc_root, self.environment)
                    except (NoSuchProcess, OSError):
                        continue
                    if seen.process == key:
                        self.seen.add(key)
                        events.append(seen)
        if len(self.seen) > 4096:
            self.seen = {k for e in self.engines for k in (e.process, *e.members)}
        return events

    def _candidates(self, engine: Engine, now: float) -> list[str]:
        """The URLs to try for an engine not yet scraped: its reachable ports in order."""
        urls = []
        for port in engine.ports:
            if now - self.refused.get((engine.process, port), -RETRY_S) < RETRY_S:
                continue
            host = engine.listeners[port].host
            if host:
                host = f"[{host}]" if ":" in host else host
                urls.append((port, f"http://{host}:{port}/metrics"))
        return [u for _, u in urls[:MAX_PORT_TRIES]]

    def _scrape(self, target: Target) -> tuple[Target, metrics.Parsed | None, str]:
        factory: SocketFactory | None = None
        if target.netns:
            if self.namespaces is None or target.process is None:
                return target, None, f"{target.url}: in another network namespace, not entered"
            factory = functools.partial(self._socket_in, target)
        try:
            text = get(target.url, self.timeout, self.max_body, factory) \
                .decode("utf-8", "replace")
        except ScrapeError as exc:
            return target, None, str(exc)
        engine = target.engine or guess_engine(text)
        if engine is None:
            return target, None, printable(f"{target.url}: no engine metrics in the body",
                                           MAX_REASON)
        try:
            parsed = metrics.parse(engine, text)
        except ValueError as exc:
            return target, None, printable(f"{target.url}: not Prometheus text ({exc})",
                                           MAX_REASON)
        if not parsed.names:
            return target, None, printable(f"{target.url}: no {engine} metrics in the body",
                                           MAX_REASON)
        target.engine = engine
        return target, parsed, ""

    def _socket_in(self, target: Target, family: int) -> socket.socket:
        """A socket made in the target engine's network namespace (:mod:`netns`)."""
        assert self.namespaces is not None and target.process is not None
        try:
            sock = self.namespaces.socket_in(target.process, target.netns, family)
        except NamespaceError as exc:
            target.netns_error = printable(str(exc), MAX_REASON)
            raise
        target.netns_error = ""
        return sock

    def round(self) -> list[Event]:
        """One round: discovery, then every target scraped (in parallel)."""
        self.counters["rounds"] += 1
        events = self.discover()
        now = time.monotonic()
        jobs: list[Target] = list(self.named)
        for engine in self.engines:
            if engine.note:
                continue
            target = self.targets.get(engine.process)
            if target is not None:
                jobs.append(target)
                continue
            for url in self._candidates(engine, now):     # probing: each port a try
                jobs.append(Target(url, engine.engine, engine.process, engine.members,
                                   engine.gpu_minors, engine.netns,
                                   batch_limit=engine.batch_limit))
        jobs = jobs[:MAX_ENDPOINTS]
        results = list(self._pool.map(self._scrape, jobs))
        ts = now_ns()
        done = time.monotonic()
        probed: set[ProcessKey] = set()
        for target, parsed, error in results:
            self.counters["scrapes"] += 1
            process = target.process
            probing = process is not None and self.targets.get(process) is not target \
                and target not in self.named
            if parsed is None:
                if probing and process is not None:      # (probing says so; mypy cannot)
                    port = urlsplit(target.url).port or 80
                    self.refused[(process, port)] = done
                    if target.netns_error:          # not the port's fault: said in health
                        self.entry_errors[process] = target.netns_error
                    continue          # one port of several: not an error of the engine yet
                self.counters["scrape_errors"] += 1
                target.error = error
                continue
            if probing and process is not None:
                if process in probed:
                    continue                    # another port answered first
                probed.add(process)
                self.targets[process] = target
                self.entry_errors.pop(process, None)
            target.error = ""
            target.skipped += parsed.skipped
            self.counters["skipped_lines"] += parsed.skipped
            values = metrics.values(target.engine or "", parsed, target.previous,
                                    done - target.previous_at)
            target.previous, target.previous_at = parsed, done
            if target.batch_limit is not None:      # the command line's, not the metrics'
                values["batch_limit"] = float(target.batch_limit)
            gpus = list(parsed.gpu_ids) or [GpuIdentity(minor=m).id for m in target.gpu_minors]
            events.append(EngineSample(
                ts=ts, engine=target.engine or "", endpoint=target.url, process=process,
                version=metrics.dialect(target.engine or "", parsed),
                processes=list(target.members), gpu_ids=gpus, values=values))
            self.counters["samples"] += 1
        self.refused = {k: t for k, t in self.refused.items() if done - t < RETRY_S}
        live = {e.process for e in self.engines}
        self.entry_errors = {k: v for k, v in self.entry_errors.items() if k in live}
        return events

    def health(self) -> SourceHealth:
        targets = [*self.named, *self.targets.values()]
        errors = [t.error for t in targets if t.error]
        unscraped = [e for e in self.engines if not e.note and e.process not in self.targets]
        through = [t for t in self.targets.values() if t.netns and t.process is not None]
        entry = [f"ERROR: {e.engine} pid {e.process.pid}: {self.entry_errors[e.process]}"
                 for e in unscraped if e.process in self.entry_errors]
        parts = [f"{len(self.targets)} engine(s) found and scraped"] + (
            [f"{len(through)} of them through their network namespace (" + ", ".join(
                f"{t.engine} pid {t.process.pid if t.process else '?'} in {t.netns}"
                for t in through) + ")"] if through else []) + (
            [f"{len(self.named)} endpoint(s) named"] if self.named else []) + (
            [f"{len(unscraped)} engine(s) with no metrics port found yet"] if unscraped
            else []) + entry + self.notes + [f"ERROR: {e}" for e in errors] + self.info
        # self.info is information (how ports were matched, engines not listening yet):
        # never a fault of its own
        state = "degraded" if errors or unscraped or self.notes else "ok"
        return SourceHealth(ts=now_ns(), source=SOURCE, state=state,
                            detail=printable("; ".join(parts), 2000),
                            counters={**self.counters, "engines": len(self.engines),
                                      **({"netns_sockets": self.namespaces.entered,
                                          "netns_stuck": self.namespaces.stuck}
                                         if self.namespaces is not None else {})})


def run_engine_source(config: Config, stop: threading.Event) -> None:
    """The ``engines`` runner of :func:`gpuwhy.app.service.unprivileged_sources`."""
    publisher = Publisher(config["bus.endpoint"], src=SOURCE, hwm=config["bus.hwm"])
    source = EngineSource(config["engines.endpoints"], config["probes.proc_root"],
                          environment=environment_names(config["probes.environment"]))
    try:
        publisher.wait_for_subscriber(1.0)
        while not stop.is_set():
            started = time.monotonic()
            try:
                events = source.round()
            except Exception:  # noqa: BLE001 - a bug must not end the source; said in health
                log.exception("engines source round failed")
                events = []
                source.counters["round_failures"] = source.counters.get("round_failures", 0) + 1
            with publisher.batched():
                for event in events:
                    publisher.publish(event)
            publisher.publish(source.health())
            stop.wait(max(0.0, INTERVAL_S - (time.monotonic() - started)))
    finally:
        source.close()
        publisher.close()
