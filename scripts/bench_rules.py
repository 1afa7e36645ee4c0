#!/usr/bin/env python3
"""Benchmark: CPU cost of rule evaluation, 30 rules x 8 GPUs x 32 processes, 1 Hz data.

Builds a synthetic host (8 GPUs, 4 compute processes each, GPU samples, scheduler figures
and driver-call counters every second), then evaluates the shipped rules every
``--interval`` seconds of data time and measures the CPU time (process_time) of the
evaluations only, after the windows have filled. The rules are the first N shipped ones
that do not need CUDA uprobe figures (the synthetic host has none). Both signal sources
are measured: in memory (fed by events) and over the store (the service's path: a SQLite
file written by the StoreWriter, read through StoreSignals).

Also measured (``held()``, ``--held MINUTES``): the rows the rules hold between rounds, half-way
and at the end, which must follow the windows asked and not grow with the time since start.

Usage: .venv/bin/python scripts/bench_rules.py [--rules 30] [--seconds 600] [--interval 10]
       .venv/bin/python scripts/bench_rules.py --held 70
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlite_utils import Database

from gpuwhy.app.demo.synthetic_signals import BASE_TS, NS, Synthetic
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.signals import MemorySignals
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import Envelope
from gpuwhy.rules.loader import load_rules
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

GOAL_PCT = 0.2   # of one core: a small part of the sidecar's 1 % budget


def host(seconds: int) -> Synthetic:
    # Some GPUs idle-bursty, some power-capped, so rules do real work in every path.
    def gpu(t: float) -> dict:
        return {"gpu_util": 98.0 if t % 10 < 3 else 4.0}
    return Synthetic(duration_s=seconds, gpus=8, processes=4, gpu=gpu,
                     workers={"on_cpu": 3.8}, own={"on_cpu": 0.3, "sleep": 2.6})


def measure(engine: Engine, feed: Callable[[int], None], start_s: int, seconds: int,
            interval: int) -> list[float]:
    costs = []
    for t in range(interval, seconds + 1, interval):
        now = BASE_TS + t * NS
        feed(now)
        before = time.process_time()
        engine.evaluate(now)
        if t >= start_s:
            costs.append(time.process_time() - before)
    return costs


def measured_rules(count: int) -> list:
    """The first ``count`` shipped rules the synthetic host feeds: it sends no CUDA uprobe
    figures, and a rule on cuda.* signals stands down at its first lookup, costing ~nothing
    (counting it would flatter the figure)."""
    fed = [rule for rule in load_rules()
           if not any(signal.startswith("cuda.") for signal in rule.requires)]
    return fed[:count]


def stored(events: list, folder: Path) -> Database:
    """A store in ``folder`` holding ``events`` (through the StoreWriter), opened read-only as
    the service's rules open it."""
    path = folder / "bench.db"
    db = open_store(path)
    StoreWriter(db).write_batch(Envelope("bench", i, e) for i, e in enumerate(events))
    db.close()
    return open_store(path, readonly=True)


def run(rules: int = 30, seconds: int = 600, interval: int = 10) -> dict:
    """CPU seconds of each measured evaluation round, signals from memory and from the store."""
    args = argparse.Namespace(rules=rules, seconds=seconds, interval=interval)
    rules = measured_rules(args.rules)
    spec = host(args.seconds)
    events = spec.events()
    warm = min(args.seconds // 2, 330)   # windows (up to 5 min) filled, warm-up over
    rows = []

    signals = MemorySignals()
    position = [0]

    def feed_memory(now: int) -> None:
        while position[0] < len(events) and events[position[0]].ts <= now:
            signals.add(events[position[0]])
            position[0] += 1

    engine = Engine(rules, signals, interval_ns=args.interval * NS)
    rows.append(("memory", measure(engine, feed_memory, warm, args.seconds, args.interval),
                 engine))

    with tempfile.TemporaryDirectory() as folder:
        written = time.monotonic()
        reader = stored(events, Path(folder))
        print(f"# wrote {len(events)} events to the store in {time.monotonic() - written:.1f} s",
              file=sys.stderr)
        engine = Engine(rules, StoreSignals(reader), interval_ns=args.interval * NS)
        rows.append(("store", measure(engine, lambda now: None, warm, args.seconds,
                                      args.interval), engine))
        reader.close()

    return {"rules": len(rules), "gpus": spec.gpus, "processes": spec.gpus * spec.processes,
            "instances": len(rows[0][2].states), "interval": args.interval,
            "costs": {name: costs for name, costs, _ in rows}}


def held(minutes: int = 70, interval: int = 10) -> dict:
    """The rows the service's rules hold between rounds (their memory) with every shipped
    rule, signals from the store, half-way through ``minutes`` of rounds and at their end.
    Past the longest window asked (30 minutes here, when nothing is firing) the two must be
    alike: what is held follows the windows asked, not the time since start."""
    rules = load_rules()
    spec = host(minutes * 60)
    events = spec.events()
    with tempfile.TemporaryDirectory() as folder:
        reader = stored(events, Path(folder))
        signals = StoreSignals(reader)
        engine = Engine(rules, signals, interval_ns=interval * NS)
        held = {}
        for t in range(interval, minutes * 60 + 1, interval):
            engine.evaluate(BASE_TS + t * NS)
            if t in (minutes * 30, minutes * 60):
                held[t // 60] = signals.held_rows()
        reader.close()
    return {"rules": len(rules), "held": held}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=30)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--held", type=int, metavar="MINUTES",
                        help="only measure the rows held after MINUTES of rounds")
    args = parser.parse_args()
    if args.held:
        h = held(args.held, args.interval)
        print(f"{h['rules']} rules; rows held between rounds: " + ", ".join(
            f"{rows:,} after {minutes} min" for minutes, rows in h["held"].items()))
        return 0
    r = run(args.rules, args.seconds, args.interval)
    print(f"rules={r['rules']} gpus={r['gpus']} processes={r['processes']} "
          f"data=1 Hz instances={r['instances']} interval={args.interval}s rounds measured="
          f"{len(r['costs']['memory'])}")
    print(f"{'signals':<8} {'CPU ms/round':>13} {'max ms':>8} {'% core @interval':>17} "
          f"{'% core @1s':>11} {'goal %':>7}")
    for name, costs in r["costs"].items():
        mean = sum(costs) / len(costs)
        print(f"{name:<8} {mean * 1000:13.1f} {max(costs) * 1000:8.1f} "
              f"{100 * mean / args.interval:17.3f} {100 * mean:11.2f} {GOAL_PCT:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
