"""Identity of processes (pid + start time), GPUs (UUID, PCI, index) and NVIDIA device files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any


@dataclass(frozen=True, order=True)
class ProcessKey:
    """A process: its pid plus its start time in clock ticks since boot (/proc/PID/stat
    field 22). Pids are reused; the pair is not."""

    pid: int
    start_time: int

    def __str__(self) -> str:
        return f"{self.pid}-{self.start_time}"

    @classmethod
    def parse(cls, text: str) -> ProcessKey:
        """``"1234-5678"`` -> ``ProcessKey(1234, 5678)``; raises ValueError otherwise."""
        pid, sep, start = text.partition("-")
        if not sep or not pid.isdigit() or not start.isdigit():
            raise ValueError(f"not a process key (PID-STARTTIME): {text!r}")
        return cls(int(pid), int(start))


@dataclass(frozen=True)
class GpuIdentity:
    """Everything one GPU is called by. ``id`` prefers the UUID, then the PCI bus id,
    then the index (the kernel log knows PCI, device files the minor, NVML/DCGM index+UUID)."""

    uuid: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None
    minor: int | None = None

    @property
    def id(self) -> str:
        if self.uuid:
            return self.uuid
        if self.pci_bus_id:
            return self.pci_bus_id
        if self.index is not None:
            return f"index:{self.index}"
        if self.minor is not None:
            return f"minor:{self.minor}"
        raise ValueError("a GPU identity needs at least one of uuid, pci_bus_id, index, minor")

    def aliases(self) -> list[str]:
        """Every name this GPU is known by in ``gpu_aliases`` (``uuid:…``, ``pci:…``,
        ``index:N``, ``minor:N``), strongest first."""
        names = []
        if self.uuid:
            names.append(f"uuid:{self.uuid}")
        if self.pci_bus_id:
            names.append(f"pci:{normalize_pci(self.pci_bus_id)}")
        if self.index is not None:
            names.append(f"index:{self.index}")
        if self.minor is not None:
            names.append(GpuIdentity(minor=self.minor).id)
        return names

    def weak_ids(self) -> list[str]:
        """The ids other parts may have stored this GPU under before its UUID was known."""
        ids = []
        if self.pci_bus_id:
            ids += [normalize_pci(self.pci_bus_id), self.pci_bus_id]
        if self.index is not None:
            ids.append(GpuIdentity(index=self.index).id)
        if self.minor is not None:
            ids.append(GpuIdentity(minor=self.minor).id)
        return [i for i in ids if i != self.id]


def mig_instance_name(instance: str, profile: str = "") -> str:
    """A MIG GPU instance as answers name it: ``MIG instance 9 (1g.10gb)``; the instance is
    the GPU instance id the GPU source reports (DCGM's GPU_I_ID), the profile where known."""
    return f"MIG instance {instance}" + (f" ({profile})" if profile else "")


def normalize_pci(address: str) -> str:
    """A PCI address as ``dddd:bb:dd`` lowercase, whatever the source wrote.

    The kernel log writes ``0000:2b:00`` (no function), NVML ``00000000:2B:00.0``, very
    old drivers ``03:00`` (no domain).

    >>> normalize_pci("00000000:2B:00.0")
    '0000:2b:00'
    >>> normalize_pci("03:00")
    '0000:03:00'
    """
    address = address.strip().lower().split(".")[0]
    parts = address.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3 or not 1 <= len(parts[0]) <= 8 or len(parts[1]) != 2 or \
            len(parts[2]) != 2 or not all(c in "0123456789abcdef" for c in "".join(parts)):
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, device = (int(p, 16) for p in parts)
    if domain > 0xFFFF or bus > 0xFF or device > 0xFF:
        raise ValueError(f"not a PCI address: {address!r}")
    return f"{domain:04x}:{bus:02x}:{device:02x}"


DEVICE_KINDS = ("nvidiactl", "nvidiaN", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                "nvidia-caps", "other")
_GPU_NODE = re.compile(r"nvidia(\d+)\Z")


def using_gpu_minor(event: Any) -> int | None:
    """The minor of the GPU an event shows its process using, if it does: a ``/dev/nvidiaN``
    it opened (or held at the start-up scan), or driver calls on one. An fd inherited at fork
    does not count: a forked child (a DataLoader worker) holds them without using them, as
    CUDA does not survive a fork."""
    kind = getattr(event, "kind", "")
    if kind == "device_opened" and event.device == "nvidiaN" and \
            event.how not in ("fork", "inherited"):
        return event.minor
    if kind == "driver_call_stats" and event.device == "nvidiaN" and event.ops:
        return classify_device(event.path)[1]
    return None


def classify_device(path: str) -> tuple[str, int | None]:
    """Device kind of an NVIDIA device path and, for ``/dev/nvidiaN``, its minor N.

    Works on the basename so that tests can use look-alike files anywhere:

    >>> classify_device("/dev/nvidia3")
    ('nvidiaN', 3)
    >>> classify_device("/dev/nvidia-caps/nvidia-cap1")
    ('nvidia-caps', None)
    """
    p = PurePosixPath(path)
    name = p.name
    if name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        return name, None
    if p.parent.name.startswith("nvidia-caps"):
        return "nvidia-caps", None
    match = _GPU_NODE.search(name)
    if match:
        return "nvidiaN", int(match.group(1))
    return "other", None
