"""The scenario corpus: seeded GPU hosts with a planted cause, written as `gpuwhy record`
captures, for `gpuwhy rules eval`. Harness, not product.

A :class:`Scenario` names a host (:mod:`.specs`, built with :mod:`.host`) and what is wrong
with it: the planted cause in words and the rule ids that are acceptable first answers, or
none for a healthy host (where an acceptable answer is no warning-or-worse finding at all).
:func:`write_scenario` writes ``NAME.jsonl`` (JSON lines of bus payloads, the format `gpuwhy
record` writes and `gpuwhy rules test --replay` reads) and ``NAME.json`` beside it, the
manifest::

    {"format": "gpuwhy-scenario/1", "name": "...", "seed": 7, "capture": "NAME.jsonl",
     "healthy": false, "cause": "...", "expected": ["R01_input_cpu_bound"],
     "group": "host_starvation", "onset_s": 0, "duration_s": 720, "gpus": 4,
     "model": "NVIDIA A100-SXM4-80GB", "source": "dcgm", "notes": "..."}

The same seed gives the same capture, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from gpuwhy.app.demo.corpus.host import Host
from gpuwhy.app.demo.corpus.planted import Scenario

__all__ = ["Scenario", "corpus", "select", "write_corpus", "write_scenario"]

MANIFEST_FORMAT = "gpuwhy-scenario/1"


BUILTIN, OUTSIDE = "builtin", "outside"
CORPUS_SETS = (BUILTIN, OUTSIDE)


def corpus(corpus_set: str = BUILTIN) -> list[Scenario]:
    """Every scenario of a set, in their order: ``builtin`` (:mod:`.specs`) or ``outside``
    (:mod:`.outside`: written from outside sources, split into a tuning and a held-out
    half)."""
    if corpus_set == OUTSIDE:
        from gpuwhy.app.demo.corpus.outside import OUTSIDE as scenarios
    else:
        from gpuwhy.app.demo.corpus.specs import CORPUS as scenarios
    return list(scenarios)


def select(names: Iterable[str] = (), corpus_set: str = BUILTIN) -> list[Scenario]:
    """The scenarios named (all when none) of a set; KeyError names an unknown one."""
    every = {s.name: s for s in corpus(corpus_set)}
    wanted = list(names)
    unknown = [n for n in wanted if n not in every]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [every[n] for n in wanted] if wanted else list(every.values())


def capture_bytes(host: Host) -> bytes:
    """The host's events as a capture: one payload a line, each source numbering its own."""
    from gpuwhy.wire import to_payload

    seqs: dict[str, int] = {}
    lines = []
    for src, event in host.events():
        seqs[src] = seqs.get(src, 0) + 1
        lines.append(to_payload(event, src=src, seq=seqs[src]))
    return b"\n".join(lines) + b"\n"


def manifest(scenario: Scenario, host: Host) -> dict:
    return {"format": MANIFEST_FORMAT, "name": scenario.name, "seed": scenario.seed,
            "capture": f"{scenario.name}.jsonl", "healthy": scenario.healthy,
            "cause": scenario.cause, "expected": list(scenario.expected),
            "group": scenario.group, "onset_s": scenario.onset_s, "duration_s": host.n,
            "gpus": host.count, "model": host.board.model, "source": host.source,
            "notes": scenario.notes, **({"half": scenario.half} if scenario.half else {})}


def write_scenario(scenario: Scenario, directory: Path) -> tuple[Path, Path]:
    """Write ``NAME.jsonl`` and its manifest ``NAME.json`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    host = scenario.host()
    capture = directory / f"{scenario.name}.jsonl"
    capture.write_bytes(capture_bytes(host))
    meta = directory / f"{scenario.name}.json"
    meta.write_text(json.dumps(manifest(scenario, host), indent=2) + "\n")
    return capture, meta


def write_corpus(directory: Path, names: Iterable[str] = (),
                 corpus_set: str = BUILTIN) -> list[Path]:
    """Write a set's scenarios (all, or those named); returns the manifests' paths."""
    return [write_scenario(s, directory)[1] for s in select(names, corpus_set)]
