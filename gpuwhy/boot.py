"""The host's boot id: which boot of the machine something happened in.

The kernel draws ``/proc/sys/kernel/random/boot_id`` afresh at every boot; journald stamps
each entry with it (``_BOOT_ID``, without the dashes), so that spelling is the one kept
everywhere: kernel-log cursors, GPU health states, the boot a live event happens in.
"""

from __future__ import annotations

from pathlib import Path

BOOT_ID_FILE = ("sys", "kernel", "random", "boot_id")     # under the proc root


def host_boot_id(proc_root: str = "/proc") -> str | None:
    """The host's current boot id as journald spells it (no dashes); None when it cannot be
    read (a container without that file, a proc root of a test)."""
    try:
        found = Path(proc_root, *BOOT_ID_FILE).read_text().strip().replace("-", "")
    except (OSError, UnicodeDecodeError):
        return None
    return found or None
