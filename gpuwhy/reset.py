"""What counts as a GPU reset, for every part that looks for one.

A reset is seen three ways: a driver call that performs it (the RM control behind
``nvidia-smi -r``), a GPU source that reports the GPU ``resetting``, or the kernel log.
Controls that only mark a GPU for a later reset are requests, kept apart so that a
query can take both where it wants every sign of one (the reset history view).
"""

from __future__ import annotations

from gpuwhy.nvioctl import RM_CONTROLS

RESET_CONTROLS = ("NV0080_CTRL_CMD_BIF_RESET",)
RESET_REQUEST_CONTROLS = ("NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET",
                          "NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET")
RESET_STATES = ("resetting",)

_CONTROL_NUMBERS = {name: number for number, name in RM_CONTROLS.items()}
BIF_RESET = _CONTROL_NUMBERS["NV0080_CTRL_CMD_BIF_RESET"]


def reset_kind(control: str | None) -> str:
    """``reset`` for a control that performs a GPU reset, ``request`` for one that marks the
    GPU for a later reset, ``""`` for any other (reading a reset's status is not one)."""
    if control in RESET_CONTROLS:
        return "reset"
    if control in RESET_REQUEST_CONTROLS:
        return "request"
    return ""


def sql_names(names: tuple[str, ...]) -> str:
    """``('A', 'B')`` for an SQL ``IN``: the names are ours (identifiers), never input."""
    assert all(name.isidentifier() for name in names)
    return "(" + ", ".join(f"'{name}'" for name in names) + ")"
