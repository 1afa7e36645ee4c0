"""Incident lifecycle: the one set of states an incident is in and the ways it ends.

``open`` -> ``acknowledged`` (an operator has it) -> ``resolved``, with how it was resolved:

- ``recovered``: what the incident is about stopped holding (the GPU source read the GPU
  again where only it had lost it, a stalled process busy again, a rule finding cleared);
- ``reset``: the GPU was reset and read healthy again;
- ``reboot``: the node rebooted (a new boot id), which is what its GPU's state waited for;
- ``process_exited``: the process the incident is about ended;
- ``operator``: someone resolved it (CLI or web view), or marked its GPU healthy
  (``gpuwhy gpu mark-healthy``, with who and why); resolving an incident that rests on its
  GPU's health marks the GPU healthy too, so that the two never disagree;
- ``timeout``: nothing more was seen of it for the quiet period (an Xid whose catalogue
  action is "none" leaves the GPU healthy: there is nothing else to wait for).

An incident is never resolved at the moment it opens: an automatic resolution waits for the
incident to settle (late events and effects) and is dated when it was observed; an incident
that rests on its GPU's health (a lost GPU, an Xid whose catalogue action is a reset or a
reboot) is resolved by the health transition that ends it, at its time and with its how, so
that the two never disagree. A repeat of a
resolved incident within the reopen window reopens it (``reopened`` in its log); later, it is a
new incident. Every change is one row of ``incident_log`` and one journal entry.
"""

from __future__ import annotations

OPEN = "open"
ACKNOWLEDGED = "acknowledged"
RESOLVED = "resolved"
STATES = (OPEN, ACKNOWLEDGED, RESOLVED)
ACTIVE_STATES = (OPEN, ACKNOWLEDGED)      # not resolved: repeats merge, effects attach

RECOVERED = "recovered"
RESET = "reset"
REBOOT = "reboot"
PROCESS_EXITED = "process_exited"
OPERATOR = "operator"
TIMEOUT = "timeout"
RESOLUTIONS = (RECOVERED, RESET, REBOOT, PROCESS_EXITED, OPERATOR, TIMEOUT)

# What an incident_log row records (the lifecycle changes above, plus notes and merges).
OPENED = "opened"
ACKNOWLEDGE = "acknowledged"
RESOLVE = "resolved"
REOPENED = "reopened"
NOTE = "note"
ANSWERED = "answered"        # a cause was established for a symptom: the answer changed
ACTIONS = (OPENED, ACKNOWLEDGE, RESOLVE, REOPENED, NOTE, ANSWERED)

# What an operator asks for, by its word (`gpuwhy incident ID ack`, POST …/ack)
OPERATOR_CHANGES = ("ack", "resolve", "note")

NOTE_MAX = 4000          # characters of one note: an operator's text, kept and shown escaped
ACTOR_MAX = 128


def is_active(state: str | None) -> bool:
    """True for an incident that is not resolved (open or acknowledged)."""
    return state in ACTIVE_STATES


def sql_active(column: str = "state") -> str:
    """The SQL test for an active incident, for the store's queries."""
    return f"{column} in ('{OPEN}', '{ACKNOWLEDGED}')"
