"""How many GPUs the kernel log may name here: the NVIDIA PCI functions of this host, plus a few.

Every PCI address in a kernel-log record becomes a GPU downstream (its health, its
incidents). The kernel log is written by the driver, and by root (``/dev/kmsg``), so a
flood of distinct addresses is a bug or a test, never a thousand new GPUs: a record that
names an address beyond the bound is kept as an ``unparsed`` record, counted, and no GPU
is made of it.

The bound is what the host can hold: the NVIDIA functions (vendor 0x10de: GPUs and
NVSwitches) that ``/sys/bus/pci/devices`` lists, and up to :data:`MAX_UNLISTED` others. Those
others are for what sysfs does not show: a GPU that fell off the bus and was removed, a
container whose /sys shows no host devices, a host with no driver loaded yet.
"""

from __future__ import annotations

from pathlib import Path

from gpuwhy.identity import normalize_pci

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
MAX_UNLISTED = 16       # an HGX board holds 8 GPUs and 4 NVSwitches: room for one more


def nvidia_pci_addresses(root: str = PCI_DEVICES) -> set[str]:
    """The addresses (``dddd:bb:dd``) of the NVIDIA PCI functions sysfs lists; empty when
    sysfs cannot be read."""
    found: set[str] = set()
    try:
        devices = list(Path(root).iterdir())
    except OSError:
        return found
    for device in devices:
        try:
            if (device / "vendor").read_text().strip().lower() == NVIDIA_VENDOR:
                found.add(normalize_pci(device.name))
        except (OSError, ValueError):
            continue
    return found


class GpuBound:
    """Admits the PCI addresses a kernel log may name: the ``listed`` ones, and the first
    ``unlisted`` others seen; counts the records refused (``over``)."""

    def __init__(self, listed: set[str] | None = None, unlisted: int = MAX_UNLISTED):
        self.listed = nvidia_pci_addresses() if listed is None else set(listed)
        self.unlisted = unlisted
        self.admitted: set[str] = set()
        self.over = 0

    def admit(self, pci: str) -> bool:
        if pci in self.listed or pci in self.admitted:
            return True
        if len(self.admitted) < self.unlisted:
            self.admitted.add(pci)
            return True
        self.over += 1
        return False

    def describe(self) -> str:
        """The bound in words (for the reason of a refused record)."""
        return f"{len(self.listed)} NVIDIA PCI functions listed in {PCI_DEVICES} and " \
               f"{self.unlisted} others"
