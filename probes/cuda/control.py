"""The CUDA uprobes' kill switch and state file, shared by the probes process and the CLI.

The kill switch is a file, ``cuda.disabled`` in ``probes.cuda_control_dir``: while it
exists no CUDA uprobe is attached. The running probes process looks for it every
:data:`CHECK_INTERVAL` seconds, turns its programs off in the kernel at once and detaches
everything; it stays off across restarts of the probes until ``gpuwhy cuda enable`` removes
it (or the host reboots, /run being a tmpfs). The probe itself creates it when it turns
itself off (too many errors). The probes process describes what it holds in ``cuda.state``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuwhy.config import Config

KILL_FILE = "cuda.disabled"
STATE_FILE = "cuda.state"
CHECK_INTERVAL = 0.05
MAX_REASON = 200


def kill_path(config: Config) -> Path:
    return Path(config["probes.cuda_control_dir"], KILL_FILE)


def state_path(config: Config) -> Path:
    return Path(config["probes.cuda_control_dir"], STATE_FILE)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def disable(config: Config, reason: str) -> None:
    """Set the kill switch (idempotent; a newer reason replaces the older one)."""
    _write_atomic(kill_path(config), json.dumps({"reason": reason[:MAX_REASON],
                                                 "since": time.time()}))


def enable(config: Config) -> bool:
    """Clear the kill switch; True if it was set."""
    try:
        kill_path(config).unlink()
        return True
    except FileNotFoundError:
        return False


def disabled_reason(config: Config) -> str | None:
    """Why the kill switch is set, or None when it is not."""
    try:
        raw = kill_path(config).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"kill switch set (unreadable: {exc.strerror})"
    try:
        return str(json.loads(raw).get("reason", "set by hand"))[:MAX_REASON]
    except (ValueError, AttributeError):
        return "set by hand"


def write_state(config: Config, state: dict) -> None:
    _write_atomic(state_path(config), json.dumps({**state, "updated": time.time()}))


def read_state(config: Config) -> dict | None:
    """What the probes process last wrote, or None when it never did."""
    try:
        return json.loads(state_path(config).read_text())
    except (OSError, ValueError):
        return None
