"""GPU health: the one set of states a GPU is in, what sends it there and what clears it.

Every part names a GPU's health with these words (the correlator decides it, the store keeps
it, the CLI, the web view and ``/metrics`` show it). The transitions themselves are the
correlator's (:mod:`gpuwhy.correlator.health_machine`); this module says what each source's
facts mean for health, so that the words and their meaning are defined once:

- ``ok``: nothing known to be wrong;
- ``degraded``: usable, but throttled by hardware or heat, in a storm of corrected (SBE) ECC
  errors, with a memory row waiting to be remapped at the next reset, or with its NVLink
  fabric failed or unhealthy (no NVLink peer traffic, or less of it);
- ``reset_required``: unusable until a GPU reset (an Xid whose catalogue entry says so, a
  row-remap failure, an uncorrectable ECC error);
- ``reboot_required``: unusable until the node reboots (the catalogue says so);
- ``lost``: the GPU no longer answers (Xid 79, fallen off the bus, NVML GPU_IS_LOST);
- ``resetting``: a reset was seen (:mod:`gpuwhy.reset`); ``ok`` again once the GPU source
  reads it with clean counters.

What clears a state follows NVIDIA's Xid catalogue (:func:`remedies`): a state entered from
an Xid whose catalogue action is a reboot (Xid 79 among them) clears only at a reboot (a new
boot id); one whose action is a GPU reset, at a reset seen (:mod:`gpuwhy.reset`) or a
reboot; never because a counter source answered for the GPU again. Reading the GPU again
clears only what a source said by itself (its own transient "lost", with no kernel Xid) and
the end of a reset. An operator's mark-healthy (with who and why) clears any state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpuwhy import lifecycle as lc
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.gpufields import FABRIC_FAILURE, FABRIC_UNHEALTHY, THROTTLE_BITS
from gpuwhy.reset import RESET_STATES
from gpuwhy.xid import xid_info

OK = "ok"
DEGRADED = "degraded"
RESET_REQUIRED = "reset_required"
REBOOT_REQUIRED = "reboot_required"
LOST = "lost"
# The health state a reset leads to has the name of the GPU source's state that says a
# reset is under way: gpuwhy/reset.py, the one definition, spells it.
RESETTING = RESET_STATES[0]
STATES = (OK, DEGRADED, RESET_REQUIRED, REBOOT_REQUIRED, LOST, RESETTING)

# How bad a state is: a fact that calls for a worse state moves the GPU there, a milder one
# leaves it (a throttled sample does not hide a lost GPU). resetting sits between degraded
# and reset_required: an Xid 48 during a reset still means the reset did not help.
RANK = {OK: 0, DEGRADED: 1, RESETTING: 2, RESET_REQUIRED: 3, REBOOT_REQUIRED: 4, LOST: 5}

# States in which the GPU is unusable until something clears it: a health-backed incident
# (a lost GPU, an Xid whose catalogue action is a reset or a reboot) is open exactly while
# its GPU is in one of these.
UNUSABLE = (RESET_REQUIRED, REBOOT_REQUIRED, LOST, RESETTING)

# States in which the GPU source's latest numbers describe the GPU now (a GPU that needs a
# reset or reboot still answers); in the others they are the last values read before it
# stopped answering or went into reset, shown greyed and dated, never as current.
LIVE_STATES = (OK, DEGRADED, RESET_REQUIRED, REBOOT_REQUIRED)

# What brings each state back to ok, as shown beside it.
CLEARS = {
    OK: "",
    DEGRADED: "throttling ends (a sample without the reasons); a failed or unhealthy NVLink "
              "fabric clears when the GPU source reads it set up and healthy again; an SBE "
              "storm or a pending row remap clears at the next GPU reset or reboot",
    RESET_REQUIRED: "a GPU reset (then the source reading it with clean counters) or a reboot",
    REBOOT_REQUIRED: "a reboot (a new boot id); a GPU reset does not clear it",
    LOST: "a reboot when the kernel said it fell off the bus (Xid 79); a GPU reset, a "
          "reboot or the GPU source reading it again when only the source lost it",
    RESETTING: "the GPU source reading it again with clean counters (no uncorrectable ECC "
               "error, no row-remap failure)",
}

# Degraded causes, and which of them a clean sample clears (the rest wait for a reset).
THROTTLING = "throttling"
SBE_STORM = "sbe_storm"
ROW_REMAP_PENDING = "row_remap_pending"
FABRIC_FAILED = "fabric_failure"        # fabric_state Failure: Fabric Manager could not set it up
FABRIC_UNWELL = "fabric_unhealthy"      # fabric_health Unhealthy
SAMPLE_CLEARED_CAUSES = frozenset({THROTTLING, FABRIC_FAILED, FABRIC_UNWELL})
# What a sample that no longer shows a cleared cause is recorded as.
ENDED = {THROTTLING: "throttling ended", FABRIC_FAILED: "fabric set up again",
         FABRIC_UNWELL: "fabric healthy again"}

# Clock-event reasons that mean the GPU is held back by hardware, heat or a power brake;
# idle, application clocks, sync boost and the software power cap are normal operation.
THROTTLE_MASK = (THROTTLE_BITS["HW_SLOWDOWN"] | THROTTLE_BITS["SW_THERMAL"]
                 | THROTTLE_BITS["HW_THERMAL"] | THROTTLE_BITS["HW_POWER_BRAKE"])

# An SBE storm: this many corrected ECC errors within the window (the driver's own Xid 92
# says the same from its interrupt rate).
SBE_STORM_COUNT = 50
SBE_STORM_WINDOW_NS = 60 * NS_PER_SECOND

# Xids that mean degraded although their catalogue entry asks for no reset: 63 marks a row
# for remapping at the next reset, 92 is the driver's own SBE-storm report.
DEGRADED_XIDS = {63: ROW_REMAP_PENDING, 92: SBE_STORM}
LOST_XIDS = frozenset({79})


def xid_target(code: int, catalogue: dict[str, Any]) -> tuple[str, str] | None:
    """The state and cause an Xid calls for, from its catalogue fields
    (:func:`gpuwhy.xid.catalogue_fields`), or None when its action needs no reset or
    reboot: such a code leaves the GPU's health alone.

    >>> from gpuwhy.xid import xid_info
    >>> xid_target(48, xid_info(48).as_fields())
    ('reset_required', 'xid 48')
    >>> xid_target(13, xid_info(13).as_fields()) is None
    True
    """
    if code in LOST_XIDS:
        return LOST, f"xid {code}"
    if catalogue.get("reboot"):
        return REBOOT_REQUIRED, f"xid {code}"
    if catalogue.get("gpu_reset"):
        return RESET_REQUIRED, f"xid {code}"
    if code in DEGRADED_XIDS:
        return DEGRADED, DEGRADED_XIDS[code]
    return None


def throttling(fields: dict[str, float]) -> int:
    """The throttling reason bits of a sample (0: not throttled, or not reported)."""
    reasons = fields.get("clocks_event_reasons")
    return int(reasons) & THROTTLE_MASK if reasons is not None else 0


def uncorrectable(fields: dict[str, float]) -> str | None:
    """Why a sample's counters are not clean (an uncorrectable ECC error since the last
    reset, a row-remap failure), or None when they are (absent fields count as clean)."""
    if fields.get("row_remap_failed"):
        return "row_remap_failure"
    if fields.get("ecc_dbe_volatile"):
        return "uncorrectable_ecc"
    return None


def remap_pending(fields: dict[str, float]) -> bool:
    """Whether the source says a row remap is pending (NVML's isPending, DCGM field 396):
    the remap takes effect only at the next GPU reset, so the GPU is degraded until then."""
    return bool(fields.get("row_remap_pending"))


def sample_causes(fields: dict[str, float]) -> dict[str, bool]:
    """The sample-cleared degraded causes (:data:`SAMPLE_CLEARED_CAUSES`) a sample speaks
    for: cause -> whether it holds now. Throttling is always spoken for (no reasons read,
    not throttled); the fabric's causes only when the sample has the field, so that a source
    or a sample without it neither degrades the GPU nor clears what another sample found.
    The fabric degrades the GPU while it has failed (Failure) or is unhealthy; NotStarted
    and InProgress do not: a fabric still training at boot, or one a rack needs no host
    Fabric Manager for, is no fault by itself (rule R45 reads how long it lasts)."""
    said = {THROTTLING: bool(throttling(fields))}
    state, health = fields.get("fabric_state"), fields.get("fabric_health")
    if state is not None:
        said[FABRIC_FAILED] = int(state) == FABRIC_FAILURE
    if health is not None:
        said[FABRIC_UNWELL] = int(health) == FABRIC_UNHEALTHY
    return said


def fabric_fault(fields: dict[str, float]) -> bool:
    """Whether a sample says the NVLink fabric has failed or is unhealthy: the fabric's
    causes :func:`sample_causes` finds holding, without building its answer."""
    state, health = fields.get("fabric_state"), fields.get("fabric_health")
    return (state is not None and int(state) == FABRIC_FAILURE) or \
        (health is not None and int(health) == FABRIC_UNHEALTHY)


def is_live(state: str | None) -> bool:
    """Whether the GPU's latest numbers may be shown as current."""
    return (state or OK) in LIVE_STATES


# --- what clears a state ---------------------------------------------------------------------
# The remedies a state waits for: a reset seen (gpuwhy/reset.py: a reset call that returned
# NV_OK, a GPU source's resetting), a reboot seen (a new boot id), the GPU source reading
# the GPU again (a sample with clean counters, its "back"), an operator's mark-healthy.
BY_RESET = "reset"
BY_REBOOT = "reboot"
BY_READ = "read"
BY_OPERATOR = "operator"
REMEDIES = (BY_RESET, BY_REBOOT, BY_READ, BY_OPERATOR)

# How a health-backed incident is resolved when its GPU's state is cleared by each remedy:
# the same word on both, so that the incident and the GPU's history tell one story.
RESOLUTION = {BY_RESET: lc.RESET, BY_REBOOT: lc.REBOOT, BY_OPERATOR: lc.OPERATOR,
              BY_READ: lc.RECOVERED}

XID_CAUSE = "xid "          # the cause of a state an Xid called for: "xid 79"


def cause_xid(cause: str | None) -> int | None:
    """The Xid code a state's cause names (``xid 48`` -> 48), None for any other cause."""
    if cause and cause.startswith(XID_CAUSE) and cause[len(XID_CAUSE):].isdigit():
        return int(cause[len(XID_CAUSE):])
    return None


def remedies(state: str, cause: str | None) -> frozenset[str]:
    """What clears ``state`` entered for ``cause``, besides an operator (who clears any).

    - an Xid's state follows its catalogue entry: a reboot action (79, fallen off the bus,
      among them) clears only at a reboot; a reset action at a reset or a reboot;
    - ``lost`` that only the GPU source said (NVML GPU_IS_LOST, no kernel Xid) may be the
      source's own trouble: reading the GPU again clears it, as a reset or reboot does;
    - ``reset_required`` for any other cause (an uncorrectable ECC error in a sample, a
      row-remap failure, RmInitAdapter failed, the source saying so): a reset or a reboot;
    - ``resetting``: waits for its reset to end, which the GPU source reading the GPU
      again with clean counters shows (a reset call that returned NV_OK where no source
      reads the GPU has ended it already); a reboot ends it too;
    - ``degraded``: each cause clears its own way (:data:`SAMPLE_CLEARED_CAUSES`); the
      state as a whole clears at a reset or a reboot.

    >>> sorted(remedies(LOST, "xid 79"))
    ['reboot']
    >>> sorted(remedies(RESET_REQUIRED, "xid 48"))
    ['reboot', 'reset']
    >>> sorted(remedies(LOST, "source lost it"))
    ['read', 'reboot', 'reset']
    """
    if state == OK:
        return frozenset()
    if state == REBOOT_REQUIRED:
        return frozenset({BY_REBOOT})
    code = cause_xid(cause)
    if code is not None and state in (LOST, RESET_REQUIRED):
        info = xid_info(code)
        if info.reboot:
            return frozenset({BY_REBOOT})
        if info.gpu_reset or state == RESET_REQUIRED:
            return frozenset({BY_RESET, BY_REBOOT})
    if state == LOST and code is None and cause in SOURCE_ONLY_CAUSES:
        return frozenset({BY_READ, BY_RESET, BY_REBOOT})
    if state == LOST:
        return frozenset({BY_REBOOT})       # the kernel said so: no read brings it back
    return frozenset({BY_RESET, BY_REBOOT})


# Causes of ``lost`` that only a GPU source gave: the source's own view, which its reading
# the GPU again takes back.
SOURCE_LOST = "source lost it"
SOURCE_ONLY_CAUSES = frozenset({SOURCE_LOST})


def xid_remedies(catalogue: dict[str, Any]) -> frozenset[str]:
    """What clears the state an Xid called for, from the catalogue fields that decided it
    (:func:`gpuwhy.xid.catalogue_fields`: an Xid 154's line, an NVLink5 Xid's decoded status
    may change the entry's): a reboot action, only a reboot; a reset action, a reset or a
    reboot; empty for neither (the state's own rule then says)."""
    if catalogue.get("reboot"):
        return frozenset({BY_REBOOT})
    if catalogue.get("gpu_reset"):
        return frozenset({BY_RESET, BY_REBOOT})
    return frozenset()


def entry_remedies(own: frozenset[str], now: str | None,
                   now_remedies: frozenset[str]) -> frozenset[str]:
    """What clears a state entered for a fact that asks for ``own``, from the state ``now``
    (which waits for ``now_remedies``). A worse fact on a GPU that still waits for its
    remedy keeps waiting for it too: a source's "lost" on a GPU the catalogue said needs a
    reboot still needs that reboot, so only what clears both clears it. From ok, degraded
    or resetting (a reset was seen) the new fact alone says."""
    if now in (LOST, RESET_REQUIRED, REBOOT_REQUIRED) and now_remedies:
        return (own & now_remedies) or own
    return own


def clears_text(state: str, remedy_set: frozenset[str]) -> str:
    """What brings the GPU back to ok, as shown beside its state: the remedies it waits for
    in words (the state's general text where they are the state's usual ones)."""
    if state in (OK, DEGRADED, RESETTING, REBOOT_REQUIRED) or not remedy_set:
        return CLEARS[state]
    words = {BY_REBOOT: "a reboot (a new boot id)", BY_RESET: "a GPU reset",
             BY_READ: "the GPU source reading it again"}
    named = [words[r] for r in (BY_RESET, BY_READ, BY_REBOOT) if r in remedy_set]
    said = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]
    if remedy_set == {BY_REBOOT}:
        said += " only: the catalogue's action is a reboot, a GPU reset does not clear it"
    return said + "; or an operator's mark-healthy"


@dataclass(frozen=True)
class Transition:
    """One decided move of a GPU's health, as the store applies it (``gpus`` row and one
    ``gpu_health_history`` row). ``how``: the remedy that cleared the state it leaves
    (:data:`REMEDIES`), None for a move that clears nothing (a worse fact, a changed set of
    degraded causes, a degraded cause ending on its own). ``remedies``: what clears the
    state it enters."""

    gpu_id: str
    ts: int
    state: str
    previous: str
    cause: str
    evidence: dict = field(default_factory=dict)
    remedies: frozenset[str] = frozenset()
    how: str | None = None
    boot_id: str | None = None
    pci: str | None = None          # a GPU only the kernel log named: its row's PCI address

    @property
    def clears(self) -> str:
        return clears_text(self.state, self.remedies)

    def body(self) -> dict:
        """The evidence as stored: the event's own, plus the cause, time, remedies and how."""
        return {**self.evidence, "cause": self.cause, "ts": self.ts,
                "clears_by": sorted(self.remedies),
                **({"how": self.how} if self.how else {})}

    @property
    def leaves_unusable(self) -> bool:
        """Whether this move makes an unusable GPU usable: its health-backed incidents end."""
        return self.previous in UNUSABLE and self.state not in UNUSABLE


class Contradiction(NamedTuple):
    """A source's sign against a GPU's current state (a source still reading a GPU the kernel
    says fell off the bus): kept on the state as evidence (``seen``), never a transition.
    A pair, so that it unpacks as ``gpu_id, seen``."""

    gpu_id: str
    seen: dict[str, Any]


def stored_remedies(state: str | None, evidence: dict) -> frozenset[str]:
    """What clears the GPU's current state, as its stored evidence says (a state stored
    before remedies were recorded: as its cause says)."""
    if not state or state == OK:
        return frozenset()
    said = evidence.get("clears_by")
    if isinstance(said, list):
        return frozenset(r for r in said if r in REMEDIES)
    return remedies(state, evidence.get("cause"))


def clears_by(remedy: str, state: str | None, remedy_set: frozenset[str]) -> bool:
    """Whether ``remedy`` clears a GPU in ``state`` that waits for ``remedy_set``: an
    operator clears any; anything else only what it is waiting for."""
    if not state or state == OK:
        return False
    return remedy == BY_OPERATOR or remedy in remedy_set


def marked_healthy(gpu_id: str, state: str | None, by: str, why: str, ts: int,
                   ) -> Transition | None:
    """An operator's mark-healthy of a GPU in ``state``: the move to ok it decides, with
    who and why as its evidence; None when the GPU is ok already (nothing to clear)."""
    if not state or state == OK:
        return None
    return Transition(gpu_id, ts, OK, state, f"marked healthy by {by}",
                      {"event": "operator mark-healthy", "by": by, "why": why},
                      how=BY_OPERATOR)
