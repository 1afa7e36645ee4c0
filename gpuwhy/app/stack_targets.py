"""Decide which processes the stack sampler samples, from the store, and tell it in a file.

An application (it reads the store and runs the rules' answer; nothing below imports it).
Every STEP_SECONDS (5 s) it reads the one answer per GPU
(:func:`gpuwhy.store.queries.gpu_verdicts`);
for each GPU whose answer is host-side (:func:`gpuwhy.pystacks.host_side`) it names the
processes bound to that GPU now (the answer's compute processes among them when it names
some) for ``stacks.window_seconds`` from when it first saw that answer, and writes them to
``stacks.targets_path`` (:func:`gpuwhy.pystacks.write_targets`). The sampler
(gpuwhy.probes.stack_sampler), which holds the privilege to read other processes' memory, reads
that file: configuration flowing upstream, never a read of the store by a source.
docs/decisions/0018-python-stacks-sampler.md weighs the alternatives.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import Config
from gpuwhy.pystacks import MAX_TARGETS, Target, host_side, write_targets
from gpuwhy.rules.answer import Verdict

log = logging.getLogger(__name__)

# The answer moves at most once a rules round (rules.interval, 10 s): a look every 5 s starts
# sampling within a few seconds of it and costs an idle service 0.2 wake-ups a second.
STEP_SECONDS = 5.0


def host_side_targets(db: Any, verdicts: list[Verdict], rules: Mapping[str, Any],
                      first_seen: dict[str, int], now: int, window_ns: int) -> list[Target]:
    """The processes to sample now: for each verdict whose lead answer is host-side, the
    processes bound to its GPU (those the answer names, when it names any among them),
    until ``window_ns`` after ``first_seen`` of that answer (filled in here for a new one;
    answers no longer leading are forgotten)."""
    from gpuwhy.store.queries import bound_processes

    targets: list[Target] = []
    leading = set()
    for verdict in verdicts:
        lead = verdict.lead
        if lead is None or verdict.health_leads or lead.held_until is not None:
            continue           # a health state, or a cause that already cleared
        finding = lead.finding
        rule = rules.get(finding.rule_id)
        group = rule.group if rule is not None else finding.group
        if not host_side(finding.rule_id, group, lead.kind, lead.cause_established):
            continue
        leading.add(finding.finding_id)
        until = first_seen.setdefault(finding.finding_id, now) + window_ns
        if until <= now:
            continue
        bound = [(int(b["pid"]), int(b["start_time"]))
                 for b in bound_processes(db, verdict.gpu.gpu_id)]
        named = {(p.pid, p.start_time) for p in finding.processes}
        if finding.process is not None:
            named.add((finding.process.pid, finding.process.start_time))
        chosen = [b for b in bound if b in named] or bound
        targets += [Target(pid=pid, start_time=start, gpu_id=verdict.gpu.gpu_id,
                           finding_id=finding.finding_id, rule_id=finding.rule_id,
                           until=until) for pid, start in chosen]
    for finding_id in set(first_seen) - leading:
        del first_seen[finding_id]
    return targets[:MAX_TARGETS]


def run_stack_targets(config: Config, stop: threading.Event) -> None:
    """Write the targets file until ``stop`` is set, then empty it (the sampler stops).
    Does nothing when ``stacks.enabled`` is false."""
    if not config["stacks.enabled"]:
        return
    from gpuwhy.app.verdicts import service_rules
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import gpu_verdicts

    rules, _ = service_rules(config)
    path = config["stacks.targets_path"]
    window_ns = int(config["stacks.window_seconds"] * NS_PER_SECOND)
    first_seen: dict[str, int] = {}
    written: list[Target] = []     # an empty file is never written: nothing to say
    db = None
    last_error = ""
    try:
        while not stop.wait(STEP_SECONDS):
            try:
                if db is None:
                    db = open_store(config["store.path"], readonly=True)
                now = now_ns()
                targets = host_side_targets(db, gpu_verdicts(db, rules), rules, first_seen,
                                            now, window_ns)
                if targets != written:
                    write_targets(path, targets, now)
                    written = targets
            except Exception as exc:  # noqa: BLE001 - said once, then tried again each step
                said = f"{type(exc).__name__}: {exc}"
                if said != last_error:
                    log.warning("stack targets: %s", said)
                    last_error = said
            else:
                last_error = ""
    finally:
        if written:
            with contextlib.suppress(OSError):
                write_targets(path, [], now_ns())
        if db is not None:
            db.close()
