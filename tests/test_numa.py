"""NUMA placement: CPUs' and GPUs' nodes from sysfs, the GPU's node on its gpu_seen, and
the share of a process's CPU time off its GPU's node, alike from memory and from the store."""

from __future__ import annotations

import contextlib

import pytest

from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import Envelope, GpuSeen, ProcessSeen, SchedStats
from gpuwhy.identity import GpuIdentity, ProcessKey
from gpuwhy.probes.gpu.runner import GpuRunner
from gpuwhy.probes.gpu.source import GpuInfo
from gpuwhy.rules.vocabulary import SIGNALS
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.topology import cpu_nodes, parse_cpulist, pci_numa_node

NS = 10**9
T0 = 1_790_000_000 * NS
KEY = ProcessKey(4242, 987654)
GPU = "GPU-00000000-0000-4000-8000-000000000006"


def sysfs(root, nodes: dict[int, str], devices: dict[str, str]):
    for node, cpus in nodes.items():
        path = root / "devices" / "system" / "node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")
    (root / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    for address, node in devices.items():
        path = root / "bus" / "pci" / "devices" / address
        path.mkdir(parents=True)
        (path / "numa_node").write_text(node + "\n")
    return str(root)


def test_cpulists_and_nodes_are_read_as_the_kernel_writes_them(tmp_path):
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    root = sysfs(tmp_path, {0: "0-1,4", 1: "2-3,5"}, {"0000:9a:00.0": "1",
                                                       "0000:18:00.0": "-1"})
    assert cpu_nodes(root) == {0: 0, 1: 0, 4: 0, 2: 1, 3: 1, 5: 1}
    assert pci_numa_node("00000000:9A:00.0", root) == 1      # NVML's form
    assert pci_numa_node("0000:9a:00.0", root) == 1
    assert pci_numa_node("0000:18:00.0", root) is None        # the firmware did not say
    assert pci_numa_node("0000:5d:00.0", root) is None        # no such device
    assert pci_numa_node("not a bus id", root) is None
    assert cpu_nodes(str(tmp_path / "nowhere")) == {}


class OneGpu:
    name, simulated = "nvml", False

    def __init__(self, bus: str):
        self.gpus = [GpuInfo(GpuIdentity(uuid=GPU, pci_bus_id=bus, index=6), model="H100")]


class Sink:
    dropped = 0

    def __init__(self):
        self.events = []

    def publish(self, event) -> bool:
        self.events.append(event)
        return True

    @contextlib.contextmanager
    def batched(self):
        yield


def test_a_real_gpus_node_is_read_from_sysfs_and_published(tmp_path):
    root = sysfs(tmp_path, {0: "0", 1: "1"}, {"0000:9a:00.0": "1"})
    sink = Sink()
    GpuRunner(OneGpu("00000000:9A:00.0"), [], sink, 1.0, sys_root=root).publish_gpus()
    [seen] = sink.events
    assert isinstance(seen, GpuSeen) and seen.numa_node == 1
    sink.events.clear()
    GpuRunner(OneGpu("00000000:18:00.0"), [], sink, 1.0, sys_root=root).publish_gpus()
    assert sink.events[0].numa_node is None


def events(nodes_per_second: list[list[int]], gpu_node: int | None = 1) -> list:
    out = [GpuSeen(ts=T0, gpu_id=GPU, source="nvml", simulated=False, uuid=GPU, index=6,
                   minor=6, model="NVIDIA H100 80GB HBM3", numa_node=gpu_node),
           ProcessSeen(ts=T0, process=KEY, comm="python3", cmdline="python3 train.py")]
    for i, nodes in enumerate(nodes_per_second, 1):
        on = sum(nodes)
        out.append(SchedStats(ts=T0 + i * NS, process=KEY, interval_ns=NS,
                              own={"on_cpu_ns": on, "runqueue_ns": 0, "sleep_ns": NS - on,
                                   "blocked_ns": 0, "threads": 1},
                              workers=dict.fromkeys(("on_cpu_ns", "runqueue_ns", "sleep_ns",
                                                     "blocked_ns", "threads"), 0),
                              node_on_cpu_ns=nodes))
    return out


def remote_share(signals, source_events) -> list[float]:
    scope = Scope(GPU, KEY)
    return [v for _, v in signals.series(scope, "proc.cpu_remote_frac", T0, T0 + 100 * NS)]


def both(evs):
    memory = MemorySignals()
    for e in evs:
        memory.add(e)
    db = open_store(":memory:")
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(evs, 1)])
    store = StoreSignals(db)
    store.begin(T0 + 100 * NS)
    return remote_share(memory, evs), remote_share(store, evs)


def test_the_share_off_the_gpus_node_is_the_same_from_memory_and_from_the_store():
    memory, store = both(events([[9 * 10**8, 10**8], [0, 5 * 10**8], [4 * 10**8, 4 * 10**8],
                                 [0, 0]]))
    # the GPU is on node 1: 0.9 of the first second ran elsewhere; a second without CPU
    # time says nothing
    assert memory == pytest.approx([0.9, 0.0, 0.5]) and store == pytest.approx(memory)


def test_the_share_is_unknown_without_the_gpus_node_or_on_a_host_of_one_node():
    assert both(events([[9 * 10**8, 10**8]], gpu_node=None)) == ([], [])
    assert both(events([[], []])) == ([], [])
    assert SIGNALS["proc.cpu_remote_frac"].derive(
        {"node_on_cpu_ns": "[5, 5]", "gpu_numa_node": 7}) is None   # a node it never had


def test_the_drivers_gpu_table_is_published_before_the_sources_gpus():
    """The GPU source publishes the driver's own table (/proc/driver/nvidia/gpus) as events,
    so the correlator reads no /proc: a GPU NVML cannot open is listed all the same."""
    from pathlib import Path

    from gpuwhy.events import DriverGpu

    proc = str(Path(__file__).resolve().parent / "data" / "proc-nvidia")
    sink = Sink()

    class NoGpus(OneGpu):
        def __init__(self) -> None:
            self.gpus = []          # the counters source reads none (NVML failed on it)

    GpuRunner(NoGpus(), [], sink, 1.0, proc_root=proc).publish_gpus()
    assert [(e.kind, e.pci_bus_id, e.minor, e.uuid) for e in sink.events] == [
        ("driver_gpu", "0000:3b:00.0", 3, "GPU-5f3c6a1e-0d2b-4f7e-9a51-3c2d1e0f9b87")]
    assert all(isinstance(e, DriverGpu) for e in sink.events)
    sink.events.clear()
    GpuRunner(OneGpu("00000000:9A:00.0"), [], sink, 1.0, proc_root=proc).publish_gpus()
    assert [e.kind for e in sink.events] == ["driver_gpu", "gpu_seen"]
    sink.events.clear()
    GpuRunner(OneGpu("00000000:9A:00.0"), [], sink, 1.0,
              proc_root=proc + "/nothing").publish_gpus()     # no driver loaded: none
    assert [e.kind for e in sink.events] == ["gpu_seen"]
