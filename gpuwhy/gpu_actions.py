"""Flag scheduled commands that act on GPUs: resets, persistence/power/clock/MIG changes,
driver unloads and restarts, DCGM diagnostics and policy changes.

Pure: works on the command text of a cron line or a systemd ``ExecStart=``. Shell
compounds (``a && b; c | d``) are split and each simple command checked, after
``sudo``/``env``/``nice``-style wrappers and ``VAR=value`` assignments.
"""

from __future__ import annotations

import functools
import re
import shlex

from gpuwhy.reset import RESET_ACTION

_SEPARATORS = re.compile(r"&&|\|\||[;|&\n]|\$\(|`")
_WRAPPERS = {"sudo", "env", "nice", "ionice", "nohup", "timeout", "exec", "command", "chrt",
             "taskset", "flock", "-", "@"}
_WRAPPER_OPTIONS_WITH_VALUE = {"-u", "-g", "-n", "-s", "-k", "-c", "-p", "-C", "--user"}
_SHELLS = {"sh", "bash", "dash", "zsh"}
_NVIDIA_SMI_FLAGS = {
    "-r": RESET_ACTION, "--gpu-reset": RESET_ACTION,
    "-pm": "persistence mode change", "--persistence-mode": "persistence mode change",
    "-pl": "power limit change", "--power-limit": "power limit change",
    "-lgc": "GPU clocks locked", "--lock-gpu-clocks": "GPU clocks locked",
    "-rgc": "GPU clocks reset", "--reset-gpu-clocks": "GPU clocks reset",
    "-lmc": "memory clocks locked", "-rmc": "memory clocks reset",
    "-mig": "MIG mode change", "--multi-instance-gpu": "MIG mode change",
    "-e": "ECC mode change", "--ecc-config": "ECC mode change",
    "-c": "compute mode change", "--compute-mode": "compute mode change",
}


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _strip_wrappers(words: list[str]) -> list[str]:
    while words and (words[0].rsplit("/", 1)[-1] in _WRAPPERS or "=" in words[0]
                     or words[0].startswith("-") and len(words) > 1):
        words = words[2:] if words[0] in _WRAPPER_OPTIONS_WITH_VALUE else words[1:]
        if words and words[0].isdigit():     # timeout 60 / nice -n 5 style arguments
            words = words[1:]
    return words


def _nvidia_smi(args: list[str]) -> str | None:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in _NVIDIA_SMI_FLAGS:
            return f"nvidia-smi {flag}: {_NVIDIA_SMI_FLAGS[flag]}"
        if flag == "mig" or flag.startswith("-c") and flag in ("-cgi", "-cci", "-dgi", "-dci"):
            return f"nvidia-smi {flag}: MIG instance change"
    if args[:1] == ["mig"]:
        return "nvidia-smi mig: MIG instance change"
    return None


def _simple_action(words: list[str]) -> str | None:
    words = _strip_wrappers(words)
    if not words:
        return None
    program, args = words[0].rsplit("/", 1)[-1], words[1:]
    if program in _SHELLS and "-c" in args[:-1]:
        return gpu_action(args[args.index("-c") + 1])
    if program == "nvidia-smi":
        return _nvidia_smi(args)
    if program == "nvidia-persistenced":
        return "nvidia-persistenced: persistence daemon (re)started"
    if program == "modprobe" and ("-r" in args or "--remove" in args) and \
            any(a.startswith("nvidia") for a in args):
        return "modprobe -r: NVIDIA driver module unloaded"
    if program == "rmmod" and any(a.startswith("nvidia") for a in args):
        return "rmmod: NVIDIA driver module unloaded"
    if program == "systemctl":
        verbs = [a for a in args if not a.startswith("-")]
        if verbs and verbs[0] in ("restart", "stop", "try-restart", "reload-or-restart",
                                  "kill") and any(u.startswith(("nvidia", "dcgm", "nv-"))
                                                  for u in verbs[1:]):
            return f"systemctl {verbs[0]} {' '.join(verbs[1:])[:80]}: NVIDIA service"
    if program == "dcgmi" and args:
        if args[0] == "diag":
            return "dcgmi diag: GPU diagnostics (loads the GPUs)"
        if args[0] == "policy" and any(a.startswith(("--set", "--clear", "--reg")) for a in args):
            return "dcgmi policy: GPU policy change"
        if args[0] in ("config",) and any(a.startswith("--set") for a in args):
            return "dcgmi config --set: GPU configuration change"
    return None


# A host runs the same few commands over and over (health checks, agents, cron jobs): each
# exec's command is asked about once by the rules; 256 commands of at most 4 KiB stay small.
@functools.lru_cache(maxsize=256)
def gpu_action(command: str) -> str | None:
    """What a command does to GPUs, in words, or None when it does nothing to them.

    >>> gpu_action("sudo /usr/bin/nvidia-smi -i 0 -r")
    'nvidia-smi -r: GPU reset'
    >>> gpu_action("nvidia-smi --query-gpu=name --format=csv") is None
    True
    """
    for part in _SEPARATORS.split(command[:4096]):
        action = _simple_action(_words(part))
        if action:
            return action
    return None
