"""Replay a capture through the live path: writer, decide stage, store, rules over the store,
and the answer read back as `gpuwhy why` reads it.

The service runs the same pieces on a bus and a clock; here the capture's own time drives
them, round by round: the events up to the round's moment are written and decided (health,
incidents), the rules engine evaluates over the store (:class:`StoreSignals`, as the
service's runner does), its findings are written and decided in turn, and the answer is
:func:`gpuwhy.store.queries.gpu_verdicts` at that moment, the read `gpuwhy why` makes: one
function from the store to the answer, for the person and for the measurement alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuwhy.bus import Subscriber
from gpuwhy.config import load_config
from gpuwhy.correlator.alerts import Alerter
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import Envelope, Event, RuleFinding
from gpuwhy.rules.answer import Verdict
from gpuwhy.rules.model import Rule
from gpuwhy.store import open_store
from gpuwhy.store.queries import gpu_verdicts

Round = Callable[[int, list[RuleFinding], list[Verdict]], None]


class LivePath:
    """A private store and bus in ``folder`` with the service's correlator and rules."""

    def __init__(self, folder: Path, rules: list[Rule], every_ns: int):
        self.config = load_config(environ={
            "GPUWHY_DB": str(folder / "replay.db"), "GPUWHY_BUS": f"ipc://{folder}/bus.sock"})
        self.rules = {r.id: r for r in rules}
        self.db = open_store(self.config["store.path"])
        self.subscriber = Subscriber(self.config["bus.endpoint"])
        self.correlator = Correlator(self.config, self.db, self.subscriber,
                                     Alerter(self.config["correlator.url"], enabled=False))
        self.correlator.wall_clock = lambda: None      # the capture's time only
        self.reader = open_store(self.config["store.path"], readonly=True)
        self.signals = StoreSignals(self.reader)
        self.engine = Engine(rules, self.signals, interval_ns=every_ns)
        self._seq = itertools.count()

    def close(self) -> None:
        self.reader.close()
        self.subscriber.close()
        self.db.close()

    def write(self, events: list[Event]) -> None:
        """Write and decide ``events`` as one batch, as the correlator does with the bus's."""
        self.correlator.pending = [Envelope(e.topic, next(self._seq), e) for e in events]
        self.correlator._last_decide = 0.0     # a batch every round, whatever the wall clock
        self.correlator.flush()
        if self.correlator.store_error:
            raise RuntimeError(f"the replay's store failed: {self.correlator.store_error}")

    def answer(self, now: int) -> list[Verdict]:
        """The answer on every GPU at ``now``, read from the store as `gpuwhy why` reads it."""
        return gpu_verdicts(self.db, self.rules, now)

    def round(self, now: int, events: list[Event]) -> tuple[list[RuleFinding], list[Verdict]]:
        """One round at capture moment ``now``: the events since the last round written, the
        rules evaluated over the store, their findings written, the answer read."""
        if events:
            self.write(events)
        found = self.engine.evaluate(now)
        if found:
            self.write(list(found))
        return found, self.answer(now)


@contextmanager
def live_path(folder: Path, rules: list[Rule], every_ns: int) -> Iterator[LivePath]:
    path = LivePath(folder, rules, every_ns)
    try:
        yield path
    finally:
        path.close()


def replay_live(events: list[Event], rules: list[Rule], every_ns: int, folder: Path,
                each_round: Round | None = None) -> list[Verdict]:
    """Replay ``events`` (in time order) through the live path in ``folder``, a round every
    ``every_ns`` of capture time (as :func:`gpuwhy.app.rules_cli.replay` steps);
    ``each_round(now, new findings, answer)`` after each. The answer at the end."""
    step = every_ns
    end = events[-1].ts + max([r.every_ns or step for r in rules] + [step])
    now, i = events[0].ts + step, 0
    answer: list[Verdict] = []
    with live_path(folder, rules, every_ns) as path:
        while now <= end:
            start = i
            while i < len(events) and events[i].ts <= now:
                i += 1
            found, answer = path.round(now, events[start:i])
            if each_round is not None:
                each_round(now, found, answer)
            now += step
            if i < len(events) and events[i].ts > now + step:   # a gap: no need to walk it
                now += (events[i].ts - now) // step * step
    return answer


def top_of(answer: list[Verdict]) -> tuple[str | None, str | None, str | None]:
    """(rule id, kind, GPU id) of what leads the host's answer: the worst GPU's lead, or
    ``health:<state>`` when the GPU's health state itself leads; Nones when all is well."""
    for verdict in answer:
        if verdict.healthy:
            break
        if verdict.health_leads:
            return f"health:{verdict.gpu.health}", None, verdict.gpu.gpu_id
        if verdict.lead is not None:
            return verdict.lead.rule_id, verdict.lead.kind, verdict.gpu.gpu_id
    return None, None, None

