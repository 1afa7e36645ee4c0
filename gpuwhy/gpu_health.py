"""GPU health: the one set of states a GPU is in, what sends it there and what clears it.

Every part names a GPU's health with these words (the correlator decides it, the store keeps
it, the CLI, the web view and ``/metrics`` show it). The transitions themselves are the
correlator's (:mod:`gpuwhy.correlator.gpu_health`); this module says what each source's
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
"""

from __future__ import annotations

from typing import Any

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.gpufields import FABRIC_FAILURE, FABRIC_UNHEALTHY, THROTTLE_BITS
from gpuwhy.reset import RESET_STATES

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
    LOST: "a GPU reset, a reboot, or the GPU source reading it again",
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
