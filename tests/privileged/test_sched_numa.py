"""The scheduler probe's per-NUMA-node on-CPU time, through the real BPF program.

This VM has one node (and two CPUs, which the test needs), so the test gives the probe a
sysfs of two (CPU 0 on node 0, CPU 1 on node 1): the kernel's own sched_switch then credits
a process pinned to one CPU to that CPU's node. A host of one node compiles the accounting
out and reports nothing per node.
"""

import os
import subprocess
import sys
import time

import pytest

from gpuwhy.events import SchedStats
from gpuwhy.probes.sched import SchedProbe
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

SPIN = "import time\nend = time.perf_counter() + 3.0\nwhile time.perf_counter() < end: pass\n"


def sysfs(root, nodes: dict[int, str]) -> str:
    for node, cpus in nodes.items():
        path = root / "devices" / "system" / "node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")
    return str(root)


def spin_on(config, nodes: int, cpu: int) -> list[SchedStats]:
    """A process spinning on ``cpu`` for 3 s, watched by a probe that sees ``nodes``
    nodes; its stats, the first flush after the watch being the baseline."""
    published = []
    probe = SchedProbe(config, published.append)
    assert probe.numa_nodes == nodes
    probe.load()
    spinner = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", SPIN])
    try:
        time.sleep(0.2)
        key = process_key(spinner.pid)
        probe.watch(key)
        probe.flush()                       # a baseline: the figures below are from now on
        time.sleep(2.0)
        probe.flush()
    finally:
        spinner.wait(10)
        probe.close()
    return [e for e in published if isinstance(e, SchedStats) and e.process == key]


@pytest.mark.parametrize("cpu", [0, 1])
def test_on_cpu_time_is_credited_to_the_node_of_the_cpu_it_ran_on(tmp_config, tmp_path, cpu):
    root = sysfs(tmp_path / "sys", {0: "0", 1: "1"})
    last = spin_on(tmp_config.replace({"probes.sys_root": root}), 2, cpu)[-1]
    assert len(last.node_on_cpu_ns) == 2
    ran = last.node_on_cpu_ns[cpu]
    assert ran >= 0.5 * last.interval_ns                 # it spun on that node's CPU
    assert last.node_on_cpu_ns[1 - cpu] <= 0.05 * ran    # and barely anywhere else
    on_cpu = last.own["on_cpu_ns"] + last.workers["on_cpu_ns"]
    assert abs(sum(last.node_on_cpu_ns) - on_cpu) <= 0.1 * on_cpu


def test_a_host_of_one_node_reports_nothing_per_node(tmp_config, tmp_path):
    root = sysfs(tmp_path / "sys", {0: f"0-{os.cpu_count() - 1}"})
    stats = spin_on(tmp_config.replace({"probes.sys_root": root}), 1, 0)
    assert stats and all(e.node_on_cpu_ns == [] for e in stats)
    assert stats[-1].own["on_cpu_ns"] >= 0.5 * stats[-1].interval_ns
