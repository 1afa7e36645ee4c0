"""What counts as a GPU reset, for every part that looks for one: the one definition.

A reset is seen two ways: a driver call that performs it (the RM control behind
``nvidia-smi -r``) or a GPU source that reports the GPU ``resetting``; the kernel-log
parser knows no line that says a reset happened (``RESET_LOG_KINDS`` is empty), only lines
that say one is needed. Every other sign has its own class, so that a query can take all
of them where it wants every sign (the reset history view) and only ``reset`` where it
counts resets (the incidents, ``/resets``, the GPU page, the rules):

- ``reset``: the GPU was reset (``RESET_CONTROLS``, ``RESET_STATES``);
- ``request``: something asked for one: a control that marks the GPU for a later reset
  (``RESET_REQUEST_CONTROLS``) or a command that resets (``nvidia-smi -r``, whose
  ``gpu_action`` is ``RESET_ACTION``); the driver call it sends is the reset itself;
- ``needed``: the GPU needs one: ``NEEDED_STATES``, ``NEEDED_LOG_KINDS``, Xids whose
  catalogue entry says so (``gpuwhy.xid``);
- ``back``: the GPU answers again after a reset or loss (``BACK_STATES``).
"""

from __future__ import annotations

from gpuwhy.nvioctl import RM_CONTROLS

RESET_CONTROLS = ("NV0080_CTRL_CMD_BIF_RESET",)
RESET_REQUEST_CONTROLS = ("NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET",
                          "NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET")
RESET_STATES = ("resetting",)
NEEDED_STATES = ("lost", "reset_required")
BACK_STATES = ("back",)
RESET_LOG_KINDS: tuple[str, ...] = ()
NEEDED_LOG_KINDS = ("fallen_off_bus", "rm_init_failed")
# gpuwhy.gpu_actions words a command's action "<program> <flag>: <what>"; a reset's <what>.
RESET_ACTION = "GPU reset"
RESET_ACTION_SUFFIX = ": " + RESET_ACTION

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


def state_kind(state: str | None) -> str:
    """The class of a GPU source's state (``reset``, ``needed``, ``back``), ``""`` if none."""
    if state in RESET_STATES:
        return "reset"
    if state in NEEDED_STATES:
        return "needed"
    if state in BACK_STATES:
        return "back"
    return ""


def action_kind(gpu_action: str | None) -> str:
    """``request`` for a command's ``gpu_action`` that resets a GPU, ``""`` for any other
    (``GPU clocks reset`` resets clocks, not the GPU)."""
    return "request" if gpu_action and gpu_action.endswith(RESET_ACTION_SUFFIX) else ""


def sql_names(names: tuple[str, ...]) -> str:
    """``('A', 'B')`` for an SQL ``IN``: the names are ours (identifiers), never input."""
    assert all(name.isidentifier() for name in names)
    return "(" + ", ".join(f"'{name}'" for name in names) + ")"


def sql_case(column: str, classes: dict[str, tuple[str, ...]]) -> str:
    """An SQL ``CASE`` giving each class for the names it holds (``''`` otherwise): the way a
    view takes its classes from the lists above, built when the view is created."""
    arms = " ".join(f"WHEN {column} IN {sql_names(names)} THEN '{kind}'"
                    for kind, names in classes.items() if names)
    return f"(CASE {arms} ELSE '' END)" if arms else "''"
