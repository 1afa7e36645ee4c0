"""The generated parts of docs/rules.md: the names rules can read and the shipped rules."""

from __future__ import annotations

from gpuwhy.rules import model as m
from gpuwhy.rules.vocabulary import describe

MARKERS = {
    "signals": ("<!-- generated: gpuwhy rules signals --markdown -->", "<!-- end signals -->"),
    "rules": ("<!-- generated: gpuwhy rules list --markdown -->", "<!-- end rules -->"),
}


def signals_markdown() -> str:
    lines = ["| name | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {unit} | {text} |" for name, unit, text in describe()]
    return "\n".join(lines) + "\n"


def _short(rule_id: str) -> str:
    return rule_id.split("_")[0]


def _relation(rule: m.Rule, rules: list[m.Rule]) -> str:
    """What a cause explains, or which causes explain a symptom (by rule number)."""
    if rule.kind == m.SYMPTOM:
        causes = [_short(r.id) for r in rules if rule.id in r.explains]
        return "explained by " + ", ".join(causes) if causes else "–"
    return "explains " + ", ".join(_short(i) for i in rule.explains) if rule.explains else "–"


def rules_markdown(rules: list[m.Rule]) -> str:
    """The shipped rules, grouped as in the catalogue."""
    lines = []
    for group, heading in m.GROUPS.items():
        members = [r for r in rules if r.group == group]
        if not members:
            continue
        lines += [f"### {heading}", "", "| rule | kind | scope | severity | title | explains |",
                  "|---|---|---|---|---|---|"]
        for r in members:
            escalates = " → " + "/".join(s for _, s in r.escalations) if r.escalations else ""
            lines.append(f"| `{r.id}` | {r.kind} | {r.scope} | {r.severity}{escalates} | "
                         f"{r.title} | {_relation(r, rules)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render(doc: str, rules: list[m.Rule]) -> str:
    """``doc`` with its generated sections replaced by what the code says now."""
    for key, text in (("signals", signals_markdown()), ("rules", rules_markdown(rules))):
        begin, end = MARKERS[key]
        head, _, rest = doc.partition(begin + "\n")
        _, _, tail = rest.partition(end)
        doc = f"{head}{begin}\n{text}{end}{tail}"
    return doc
