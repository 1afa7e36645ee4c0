"""A corpus scenario: a seeded host with a planted cause, and the answers acceptable for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwhy.app.demo.corpus.host import Host


@dataclass(frozen=True)
class Scenario:
    """A host with a planted cause (``expected``: the acceptable top answers) or a healthy
    one (``expected`` empty). ``onset_s``: capture second the fault starts (0: before)."""

    name: str
    seed: int
    cause: str
    expected: tuple[str, ...]
    build: Callable[[int], Host]
    group: str = ""
    onset_s: float = 0.0
    notes: str = ""
    half: str = ""        # the outside corpus's split: "tuning" or "held-out"

    @property
    def healthy(self) -> bool:
        return not self.expected

    def host(self) -> Host:
        return self.build(self.seed)
