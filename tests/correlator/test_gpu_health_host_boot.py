"""The host's boot id (``<proc root>/sys/kernel/random/boot_id``), read once when the GPU
health machine starts, is the boot its states are entered in, so a reboot is seen on a host
whose kernel-log source is off: at the first event after start, a state entered in an older
boot is cleared by that reboot; one entered in this boot stays. The boot id a kernel-log
event carries still counts as before."""

from __future__ import annotations

from pathlib import Path

from gpuwhy.boot import host_boot_id
from gpuwhy.correlator.health_machine import GpuHealth
from gpuwhy.events import GpuState, KernelLogRecord
from gpuwhy.identity import ProcessKey
from gpuwhy.store import queries

from .conftest import UUID0

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
PCI1 = "0000:19:00.0"
BOOT_A = "0f6c1b2e-9d1c-4c2e-8a4f-3c1d2e3f4a5b"
BOOT_B = "7a1e2d3c-4b5a-4f6e-9d8c-1b2a3c4d5e6f"


def proc_root(tmp_path: Path, boot: str) -> str:
    root = tmp_path / f"proc-{boot[:4]}"
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
    return str(root)


def start(h, root: str) -> None:
    """The correlator (re)started on a host whose boot id is under ``root``."""
    h.correlator.builder.health = GpuHealth(host_boot_id(root))


def needs_reset(h, t: float, gpu: str = UUID0) -> GpuState:
    return GpuState(ts=h.at(t), gpu_id=gpu, source="sim", simulated=True,
                    state="reset_required", detail="needs one")


def health(h, gpu: str = UUID0) -> dict:
    return queries.gpu_health(h.db, gpu)


def test_the_boot_id_is_read_under_the_proc_root_as_the_kernel_log_spells_it(tmp_path):
    assert host_boot_id(proc_root(tmp_path, BOOT_A)) == BOOT_A.replace("-", "")
    assert host_boot_id(str(tmp_path / "nowhere")) is None


def test_a_reboot_without_a_kernel_log_source_clears_the_older_boots_state(harness, tmp_path):
    h = harness
    start(h, proc_root(tmp_path, BOOT_A))
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci=PCI1), needs_reset(h, 1))
    assert health(h)["health"] == "reset_required"
    assert health(h)["boot_id"] == BOOT_A.replace("-", "")     # the host's, no klog source
    # Restarted after a reboot: nothing clears it before an event ...
    start(h, proc_root(tmp_path, BOOT_B))
    assert health(h)["health"] == "reset_required"
    # ... the first one (of any kind, about another process) does.
    h.feed(h.process(100, ProcessKey(700, 7000), "bash"))
    assert health(h)["health"] == "ok"
    [last] = queries.gpu_health_history(h.db, UUID0, limit=1)
    assert last["cause"] == "reboot" and last["ts"] == h.at(100)
    assert last["evidence"]["boot_id_before"] == BOOT_A.replace("-", "")
    assert last["evidence"]["boot_id_now"] == BOOT_B.replace("-", "")
    # A state entered in this boot stays over a restart within it.
    h.feed(needs_reset(h, 110, UUID1))
    start(h, proc_root(tmp_path, BOOT_B))
    h.feed(h.process(120, ProcessKey(701, 7010), "bash"))
    assert health(h, UUID1)["health"] == "reset_required"
    assert health(h, UUID1)["boot_id"] == BOOT_B.replace("-", "")


def test_no_boot_id_file_keeps_the_state_as_before(harness, tmp_path):
    h = harness
    start(h, proc_root(tmp_path, BOOT_A))
    h.feed(h.gpu(0), needs_reset(h, 1))
    start(h, str(tmp_path / "nowhere"))
    h.feed(h.process(100, ProcessKey(700, 7000), "bash"))
    assert health(h)["health"] == "reset_required"


def test_a_kernel_log_boot_id_still_counts(harness, tmp_path):
    h = harness
    start(h, proc_root(tmp_path, BOOT_A))
    h.feed(h.gpu(0), needs_reset(h, 1))
    # The kernel-log source sees the boot change while gpuwhy runs (its lines say so).
    h.feed(KernelLogRecord(ts=h.at(50), cursor="k1", origin="journald",
                           boot_id=BOOT_B.replace("-", ""), record_kind="other",
                           message="hello", line="hello"))
    assert health(h)["health"] == "ok"
    [last] = queries.gpu_health_history(h.db, UUID0, limit=1)
    assert last["cause"] == "reboot" and last["evidence"]["event"] == "boot id changed"
