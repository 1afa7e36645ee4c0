"""What a parsed rule is: expression nodes and the Rule with its clauses (no behaviour here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwhy import severity as sev

# gpu: one instance per GPU; process: per compute process on a GPU; instance: per MIG GPU
# instance of a GPU (its gpu.* signals read that instance's samples).
INSTANCE = "instance"
SCOPES = ("gpu", "process", INSTANCE)
SHARED_POLICIES = ("keep", "info", "skip")
# What a rule's finding is: a CAUSE names why (the workers cannot keep up, the power limit),
# a SYMPTOM only what is seen (bursty or low utilisation); a cause ``explains`` the symptom
# rules its condition produces. Causes rank above symptoms (gpuwhy/rules/answer.py).
CAUSE = "cause"
SYMPTOM = "symptom"
KINDS = (CAUSE, SYMPTOM)
GROUPS = {
    "host_starvation": "A. Host-side starvation (the GPU waits for the CPU)",
    "device_efficiency": "B. Device efficiency (busy but inefficient)",
    "communication": "C. Communication and multi-GPU",
    "power_thermal": "D. Power, thermal and clocks",
    "memory": "E. Memory behaviour",
    "sharing_config": "F. Sharing, configuration and platform",
    "failures": "G. Failures (Xid, ECC, resets)",
    "operator": "H. Operator and cron interventions",
}


class Node:
    """Base of expression nodes; ``line``/``column`` point into the rule file."""

    line: int
    column: int


@dataclass(frozen=True)
class Num(Node):
    value: float
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Str(Node):
    value: str
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Dur(Node):
    ns: int
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Ref(Node):
    """A name. ``kind``: ``signal`` (a series), ``fact`` (GPU model constant), ``instance``
    (engine-known fact), ``text`` (process text fact), ``param`` (a rule threshold),
    ``field`` (an event field inside ``where``), ``bit`` (a throttle-reason bit name)."""

    name: str
    kind: str = ""
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Unary(Node):
    op: str
    operand: Node
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Bin(Node):
    op: str   # + - * /
    left: Node
    right: Node
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Cmp(Node):
    op: str   # < <= > >= == !=
    left: Node
    right: Node
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Between(Node):
    term: Node
    low: Node
    high: Node
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Match(Node):
    """``term ~ "regex"``: RE2 (linear time), searched in the bounded text."""

    term: Node
    pattern: str
    regex: Any = field(compare=False, hash=False, default=None)
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class BoolOp(Node):
    op: str   # and / or
    items: tuple[Node, ...]
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Not(Node):
    item: Node
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class StreamRef(Node):
    """``journal.xid where code == 79``: events of a stream, optionally filtered."""

    name: str
    where: Node | None = None
    line: int = 0
    column: int = 0


@dataclass(frozen=True)
class Call(Node):
    func: str
    args: tuple[Node, ...]
    kwargs: tuple[tuple[str, Node], ...] = ()
    line: int = 0
    column: int = 0

    def kwarg(self, name: str) -> Node | None:
        return dict(self.kwargs).get(name)


@dataclass(frozen=True)
class Fix:
    text: str
    condition: Node | None = None


@dataclass
class Rule:
    """One rule as written. Durations are in ns; ``params`` are the overridable thresholds."""

    id: str
    path: str
    line: int
    title: str = ""
    group: str = ""
    kind: str = CAUSE             # CAUSE when the file gives no 'kind:' (kind_declared False)
    kind_declared: bool = False
    explains: tuple[str, ...] = ()   # ids of the symptom rules this cause explains
    scope: str = "gpu"
    requires: tuple[str, ...] = ()
    window_ns: int = 60_000_000_000
    every_ns: int | None = None
    warmup_ns: int = 0
    shared: str = "keep"
    params: dict[str, float] = field(default_factory=dict)
    when: Node | None = None
    for_ns: int = 0
    clear: Node | None = None
    clear_after_ns: int | None = None
    guards: tuple[Node, ...] = ()
    severity: str = sev.DEFAULT
    escalations: tuple[tuple[Node, str], ...] = ()
    evidence: tuple[tuple[str, Node], ...] = ()
    cause: str = ""
    fixes: tuple[Fix, ...] = ()
    verify: str = ""
    sources: tuple[str, ...] = ()
    text: str = ""

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Override:
    """What an operator changed about a rule (kept in the ``rule_overrides`` table)."""

    enabled: bool = True
    shadow: bool = False
    params: Mapping[str, float] = field(default_factory=dict)


def children(node: Node) -> tuple[Node, ...]:
    """The sub-expressions of a node (a window or a stream is not one)."""
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, (Bin, Cmp)):
        return (node.left, node.right)
    if isinstance(node, Between):
        return (node.term, node.low, node.high)
    if isinstance(node, Match):
        return (node.term,)
    if isinstance(node, BoolOp):
        return node.items
    if isinstance(node, Not):
        return (node.item,)
    if isinstance(node, Call):
        return tuple(a for a in node.args if not isinstance(a, (Dur, StreamRef)))
    return ()


def cost(node: Node) -> int:
    """A rough relative cost of evaluating a node: a regex search per text, then an event
    stream read (count, within), then a window aggregate; what reads a value is ~free."""
    own = 0
    if isinstance(node, Match):
        own = 100
    elif isinstance(node, Call):
        own = 50 if any(isinstance(a, StreamRef) for a in node.args) else 1
    return own + sum(cost(child) for child in children(node)) + sum(
        cost(a.where) for a in getattr(node, "args", ()) if isinstance(a, StreamRef)
        and a.where is not None)
