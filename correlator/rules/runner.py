"""Run the rules engine inside the service: evaluate over the store, publish findings.

One thread (the caller's), with its own read-only connection to the store and its own
publisher on the bus; findings travel the bus like any event, so the correlator writes
them (rule_findings) and turns them into incidents. Overrides are re-read every round.
Shutdown: ``stop`` is set; the loop returns within one interval (at most 1 s of waiting).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from typing import cast

from gpuwhy.bus import Publisher
from gpuwhy.clock import now_ns
from gpuwhy.config import Config, environment_names
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import SourceHealth
from gpuwhy.rules.loader import configured_rule_set
from gpuwhy.store import open_store
from gpuwhy.store.overrides import read_overrides

log = logging.getLogger(__name__)

HEALTH_EVERY = 10.0
SHOWN_PROBLEMS = 3   # rule-file problems named in the health detail (all are counted)


def env_keys(rules: list) -> frozenset[str]:
    """The environment variables the rules read with env("NAME")."""
    from gpuwhy.rules import model as m
    from gpuwhy.rules.model import children

    found: set[str] = set()

    def walk(node: m.Node) -> None:
        if isinstance(node, m.Call) and node.func == "env":
            found.add(cast(m.Str, node.args[0]).value)   # the parser made it a string
        for child in children(node):
            walk(child)

    for rule in rules:
        for node in (rule.when, rule.clear, *rule.guards, *(e for e, _ in rule.escalations),
                     *(n for _, n in rule.evidence), *(f.condition for f in rule.fixes)):
            if node is not None:
                walk(node)
    return frozenset(found)


def unrecorded_env(rules: list, config: Config) -> list[str]:
    """The variables the rules read with env("NAME") that ``probes.environment`` does not
    name: the probes never record them, so those env() calls read nothing."""
    return sorted(env_keys(rules) - environment_names(config["probes.environment"]))


class RulesRunner:
    """Evaluates every ``interval`` s and publishes what the engine finds."""

    def __init__(self, engine: Engine, signals: StoreSignals, publisher: Publisher,
                 interval: float, problems: list[str] | tuple[str, ...] = (),
                 unrecorded: list[str] | tuple[str, ...] = ()):
        self.engine, self.signals, self.publisher = engine, signals, publisher
        self.interval = interval
        # "file:line:col: message" of every rule that did not load: the health names them
        # for as long as the engine runs without them.
        self.problems = list(problems)
        # env("NAME") of a loaded (user) rule that the probes do not record: the health
        # names them, or the rule would be silently blind to them
        self.unrecorded = list(unrecorded)
        self.counters: Counter[str] = Counter()
        self.cpu_seconds = 0.0
        self.error: str | None = None

    def step(self) -> None:
        started = time.process_time()
        try:
            self.engine.set_overrides(read_overrides(self.signals.db))
            findings = self.engine.evaluate(now_ns())
            self.error = None
        except sqlite3.Error as exc:   # the store is busy or being migrated: next round
            self.error = f"store: {exc}"
            self.counters["store_errors"] += 1
            return
        finally:
            self.cpu_seconds += time.process_time() - started
        self.counters["rounds"] += 1
        for finding in findings:
            sent = self.publisher.publish(finding)
            self.counters["published" if sent else "dropped"] += 1
            self.counters[f"{finding.state}"] += 1

    def publish_health(self) -> None:
        states = Counter(s["status"] for s in self.engine.status())
        detail = (f"{len(self.engine.rules)} rules; " +
                  ", ".join(f"{n} {s}" for s, n in sorted(states.items())) +
                  f"; {self.cpu_seconds:.2f} CPU s so far")
        if self.problems:
            shown = [p if len(p) <= 300 else p[:297] + "..."
                     for p in self.problems[:SHOWN_PROBLEMS]]
            more = len(self.problems) - len(shown)
            detail += (f"; {len(self.problems)} broken rule(s) not loaded: " + "; ".join(shown)
                       + (f"; and {more} more (gpuwhy rules lint)" if more else ""))
        if self.unrecorded:
            detail += ("; env() reads variables the probes do not record (add them to "
                       "probes.environment): " + ", ".join(self.unrecorded[:SHOWN_PROBLEMS])
                       + (f" and {len(self.unrecorded) - SHOWN_PROBLEMS} more"
                          if len(self.unrecorded) > SHOWN_PROBLEMS else ""))
        if self.error:
            detail += f"; ERROR: {self.error}"
        self.publisher.publish(SourceHealth(
            ts=now_ns(), source="rules",
            state="degraded" if self.error or self.problems or self.unrecorded else "ok",
            detail=detail, counters={**self.counters, "rule_problems": len(self.problems),
                                     "env_unrecorded": len(self.unrecorded),
                                     # what the signals keep between rounds: their memory
                                     "rows_held": self.signals.held_rows(),
                                     **{f"instances_{k}": v for k, v in states.items()}}))

    def run(self, stop: threading.Event) -> None:
        next_health = time.monotonic()
        while not stop.is_set():
            self.step()
            if time.monotonic() >= next_health:
                self.publish_health()
                next_health = time.monotonic() + HEALTH_EVERY
            stop.wait(self.interval)
        self.publish_health()


def run_rules(config: Config, stop: threading.Event) -> None:
    """The ``rules`` runner of :func:`gpuwhy.app.service.unprivileged_sources`."""
    publisher = Publisher(config["bus.endpoint"], src="rules", hwm=config["bus.hwm"])
    try:
        # A broken rule file costs only its broken rules: the engine runs the others (the
        # shipped ones always) and its health names each one left out.
        loaded = configured_rule_set(config)
        rules, problems = loaded.rules, [str(p) for p in loaded.problems]
        for problem in problems:
            log.warning("rule not loaded: %s", problem)
        db = open_store(config["store.path"], readonly=True, cache_kib=config["store.cache_kib"])
        try:
            signals = StoreSignals(db)
            engine = Engine(rules, signals, shadow_all=config["rules.shadow"],
                            interval_ns=int(config["rules.interval"] * 1e9))
            publisher.wait_for_subscriber(1.0)
            log.info("rules engine: %d rules every %s s", len(rules), config["rules.interval"])
            RulesRunner(engine, signals, publisher, config["rules.interval"], problems,
                        unrecorded_env(rules, config)).run(stop)
        finally:
            db.close()
    finally:
        publisher.close()
