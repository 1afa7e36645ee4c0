"""The answers as the commands read them: the rules the service runs, and the verdicts a
target (a GPU, or a process's PID-START) names; shared by `gpuwhy why`, `gpuwhy mcp` and the
stack sampler's targets."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import click
from sqlite_utils import Database

from gpuwhy.config import Config
from gpuwhy.errors import GpuwhyError
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import Answer, Verdict
from gpuwhy.rules.model import Rule
from gpuwhy.text import printable


def service_rules(config: Config) -> tuple[dict[str, Rule], list[str]]:
    """The rules the service runs, by id, and the problems of the rule files skipped (the
    one loading `gpuwhy why` and `gpuwhy mcp` share)."""
    from gpuwhy.rules.loader import configured_rule_set

    loaded = configured_rule_set(config)
    return {r.id: r for r in loaded.rules}, [str(p) for p in loaded.problems]


class ServiceRules(Mapping[str, Rule]):
    """The rules the service runs, by id, loaded at the first look (a broken rule file is
    said on stderr, skipped). Findings the store keeps carry what the ranking reads of
    their rule (gpuwhy.rules.answer.described): reading the answer needs the rule files
    only for older rows, so `gpuwhy why` parses none (about 0.4 s) where it need not."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._rules: dict[str, Rule] | None = None

    def _loaded(self) -> dict[str, Rule]:
        if self._rules is None:
            self._rules, problems = service_rules(self.config)
            for problem in problems:
                click.echo(f"warning: {problem} (rule skipped)", err=True)
        return self._rules

    def __getitem__(self, rule_id: str) -> Rule:
        return self._loaded()[rule_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


def about_process(answer: Answer, key: ProcessKey) -> bool:
    """Whether the answer's finding is about process ``key`` (its own, or among those named)."""
    f = answer.finding
    return f.process == key or key in f.processes


class NotNamed(GpuwhyError):
    """The target names no GPU or process the answers know (the message lists the GPUs)."""


def select_verdicts(db: Database, shown: list[Verdict], target: str
                    ) -> tuple[list[Verdict], ProcessKey | None]:
    """The verdicts ``target`` names: one GPU, or each GPU a process's findings are on
    (shared by `gpuwhy why TARGET` and `gpuwhy mcp`'s ``why``). Raises :class:`NotNamed`."""
    from gpuwhy.store.queries import gpu_named, gpu_of_process

    try:
        key = ProcessKey.parse(target)
    except ValueError:
        key = None
    if key is not None:
        mine = [v for v in shown if any(about_process(a, key) for a in v.candidates)]
        if not mine:
            gpu = gpu_of_process(db, key)
            mine = [v for v in shown if v.gpu.gpu_id == gpu]
        if not mine:
            raise NotNamed(f"no GPU answer names process {key} (not seen on a GPU)")
        return mine, key
    gpu_id = gpu_named(db, target)
    mine = [v for v in shown if v.gpu.gpu_id == gpu_id]
    if not mine:
        known = ", ".join(v.gpu.label for v in shown) or "none"
        raise NotNamed(f"no GPU known as {printable(target, 80)} (known: {known})")
    return mine, None
