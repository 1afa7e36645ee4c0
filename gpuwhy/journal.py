"""What gpuwhy writes to the systemd journal: message ids, the identifier, and the sender.

Alerts of new incidents and every lifecycle change (acknowledged, resolved, reopened, a
note) go to the journal, whichever process made the change: the correlator for its own
decisions, the CLI and the web view for an operator's. Each kind of entry has a stable
MESSAGE_ID, explained in ``systemd/gpuwhy.catalog`` (``journalctl -x``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpuwhy.lifecycle import ACKNOWLEDGE, NOTE, REOPENED, RESOLVE

SYSLOG_IDENTIFIER = "gpuwhy"

# A new incident, by its kind.
MESSAGE_IDS: dict[str, str] = {
    "xid": "a60674d8f4564a328eb45da8ed4e5115",
    "gpu_lost": "80e86e4aca9846a7b84cae771150ad74",
    "gpu_reset": "497ca03f02774035b99222255a843c7c",
    "process_stall": "e4599001cf174a6ba79386c50d56ee7a",
    "process_exit": "29cc6c008cf1404fb185c2f3f27ebf26",
    "rule_finding": "edb02d46c3fc48debfc0880a04139975",
}
# A change to an incident, by what changed (gpuwhy/lifecycle.py).
CHANGE_MESSAGE_IDS: dict[str, str] = {
    ACKNOWLEDGE: "cae02e2f55af4f73b9a9836b46d5ffb2",
    RESOLVE: "6d6e69beeb40441e825af64ee858c12f",
    REOPENED: "303866e4f9ed4f17b0e8b18259ea5e8f",
    NOTE: "73c23a497b764f658000d85b1e1ee99c",
}

Sender = Callable[..., object]
JOURNAL_SOCKET = "/run/systemd/journal/socket"


def journal_sender() -> Sender | None:
    """systemd-python's ``journal.send``, or None where systemd-python is not installed."""
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal.send


def one_line(text: str, limit: int = 1000) -> str:
    """Text that processes or operators control, as one bounded journal MESSAGE line."""
    return text.replace("\r", " ").replace("\n", " ")[:limit]


def write_entry(fields: dict[str, str], send: Sender | None = None) -> str | None:
    """Write one entry (``fields`` holds MESSAGE); None when written, else why not. ``send``
    stands in for systemd's sender; without it, an entry is refused when journald is not
    running, since ``sd_journal_send`` drops it silently and reports success."""
    if send is None:
        send = journal_sender()
        if send is None:
            return "systemd-python is not installed"
        if (getattr(send, "__module__", "") or "").startswith("systemd") and \
                not os.path.exists(JOURNAL_SOCKET):
            return f"journald is not running (no {JOURNAL_SOCKET})"
    fields = dict(fields)
    message = fields.pop("MESSAGE")
    try:
        send(message, **fields)
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return None
