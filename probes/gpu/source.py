"""The one interface every GPU source implements, and the GPU description they share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuwhy.errors import GpuwhyError
from gpuwhy.events import DriverGpu, Event, GpuSample, GpuSeen
from gpuwhy.identity import GpuIdentity

SOURCE_NAMES = ("dcgm", "nvml", "dcgm-exporter", "sim")


class SourceUnavailable(GpuwhyError):
    """A GPU source cannot run on this host; ``reason`` says why, in a few words."""

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


@dataclass
class GpuInfo:
    """One GPU as a source sees it: identity plus model and driver."""

    identity: GpuIdentity
    model: str = ""
    driver_version: str = ""
    numa_node: int | None = None
    handle: object = field(default=None, repr=False, compare=False)   # the source's own key

    @property
    def id(self) -> str:
        return self.identity.id

    def seen(self, ts: int, source: str, simulated: bool) -> GpuSeen:
        i = self.identity
        return GpuSeen(ts=ts, gpu_id=self.id, source=source, simulated=simulated, uuid=i.uuid,
                       pci_bus_id=i.pci_bus_id, index=i.index, minor=i.minor,
                       model=self.model, driver_version=self.driver_version,
                       numa_node=self.numa_node)


class GpuSource(Protocol):
    """What the runner and ``gpuwhy gpu sample`` need from a source.

    ``open`` raises :class:`SourceUnavailable`; ``read`` returns the events since the last
    read (samples, Xids, state changes, process lists) and raises :class:`SourceUnavailable`
    only when the whole source broke (it is retried); ``notes`` lists what is degraded
    (profiling fields off, a field not supported); ``close`` releases everything.
    """

    name: str
    simulated: bool
    gpus: list[GpuInfo]

    def open(self) -> list[GpuInfo]: ...

    def read(self) -> list[Event]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


def samples_of(events: list[Event]) -> list[GpuSample]:
    return [e for e in events if isinstance(e, GpuSample)]


def normalise_bus_id(bus_id: str | bytes | None) -> str | None:
    """NVML/DCGM give ``00000000:0A:00.0`` (sometimes as bytes); the kernel log and
    /proc/driver/nvidia use ``0000:0a:00.0``. We keep the 4-digit-domain lower-case form."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    if not bus_id:
        return None
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) == 8 and rest.count(":") == 1:
        bus_id = f"{domain[-4:]}:{rest}"
    return bus_id


def minor_from_procfs(pci_bus_id: str | None, proc_root: str = "/proc") -> int | None:
    """The /dev/nvidiaN minor of a GPU, from /proc/driver/nvidia/gpus/<bus id>/information."""
    if not pci_bus_id:
        return None
    path = os.path.join(proc_root, "driver", "nvidia", "gpus", pci_bus_id, "information")
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "Device Minor":
                    return int(value.strip())
    except (OSError, ValueError):
        return None
    return None


def proc_identities(proc_root: str = "/proc") -> list[GpuIdentity]:
    """GPUs the driver lists in ``/proc/driver/nvidia/gpus/*/information`` (minor number,
    UUID, bus location); none when the driver is not loaded."""
    found = []
    for info in sorted(Path(proc_root, "driver", "nvidia", "gpus").glob("*/information")):
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        minor = fields.get("Device Minor")
        uuid = fields.get("GPU UUID")
        found.append(GpuIdentity(uuid=uuid if uuid and uuid.startswith("GPU-") else None,
                                 pci_bus_id=fields.get("Bus Location") or info.parent.name,
                                 minor=int(minor) if minor and minor.isdigit() else None))
    return found


def driver_gpu_events(ts: int, proc_root: str = "/proc") -> list[DriverGpu]:
    """The driver's GPU table (:func:`proc_identities`) as the events the GPU source
    publishes: the correlator learns each GPU's minor, UUID and bus id from them and reads
    no /proc itself. A row without a bus location is no GPU the kernel log could name."""
    return [DriverGpu(ts=ts, pci_bus_id=normalise_bus_id(gpu.pci_bus_id) or "",
                      minor=gpu.minor, uuid=gpu.uuid)
            for gpu in proc_identities(proc_root) if gpu.pci_bus_id]
