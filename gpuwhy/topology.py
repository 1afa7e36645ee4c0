"""Where CPUs and PCI devices sit: their NUMA nodes, read from sysfs.

A GPU hangs off one socket's PCIe root; a process whose threads run on another socket's CPUs
copies through the inter-socket link and waits longer for every launch. The kernel says which
node each CPU belongs to (``/sys/devices/system/node/nodeN/cpulist``) and which node a PCI
device is attached to (``/sys/bus/pci/devices/ADDRESS/numa_node``, -1 when the firmware does
not say, as on most VMs).
"""

from __future__ import annotations

import os
import re

from gpuwhy.identity import normalize_pci

_NODE_DIR = re.compile(r"node(\d+)$")


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a kernel cpulist (``0-3,8,10-11``); raises ValueError on anything else.

    >>> parse_cpulist("0-2,8\\n")
    [0, 1, 2, 8]
    """
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"not a CPU range: {part!r}")
        cpus.extend(range(low, high + 1))
    return cpus


def cpu_nodes(sys_root: str = "/sys") -> dict[int, int]:
    """CPU -> NUMA node, for every CPU of every node; empty when sysfs has no node list (a
    kernel without NUMA): read that as one node."""
    base = os.path.join(sys_root, "devices", "system", "node")
    try:
        entries = os.listdir(base)
    except OSError:
        return {}
    nodes: dict[int, int] = {}
    for entry in entries:
        match = _NODE_DIR.match(entry)
        if not match:
            continue
        try:
            with open(os.path.join(base, entry, "cpulist")) as f:
                cpus = parse_cpulist(f.read())
        except (OSError, ValueError):
            continue
        for cpu in cpus:
            nodes[cpu] = int(match.group(1))
    return nodes


def pci_numa_node(pci_bus_id: str | None, sys_root: str = "/sys") -> int | None:
    """The NUMA node a PCI device is attached to; None when unknown (no such device, no
    address, or the firmware's -1)."""
    if not pci_bus_id:
        return None
    try:
        address = normalize_pci(pci_bus_id) + "." + (pci_bus_id.rsplit(".", 1)[1]
                                                     if "." in pci_bus_id else "0")
        with open(os.path.join(sys_root, "bus", "pci", "devices", address, "numa_node")) as f:
            node = int(f.read().strip())
    except (OSError, ValueError, IndexError):
        return None
    return node if node >= 0 else None
