"""Feeds constructed events through the real correlator (writer + decide stage + store)."""

from __future__ import annotations

import itertools

import pytest

from gpuwhy.boot import host_boot_id
from gpuwhy.bus import Subscriber
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.correlator.alerts import Alerter
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.events import (
    DeviceOpened,
    DriverCall,
    Envelope,
    GpuSample,
    GpuSeen,
    KernelLogRecord,
    ProcessExec,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import BIF_RESET, RESET_CONTROLS
from gpuwhy.store import open_store

S = NS_PER_SECOND
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
PCI0 = "0000:18:00.0"


class Harness:
    """The correlator with its real store, fed batch by batch; alerts collected in a list."""

    def __init__(self, config, t0: int):
        self.config = config
        self.t0 = t0
        self.db = open_store(config["store.path"])
        self.subscriber = Subscriber(config["bus.endpoint"])
        self.alerts: list[dict] = []
        alerter = Alerter(config["correlator.url"],
                          send=lambda message, **fields: self.alerts.append(
                              {"MESSAGE": message, **fields}))
        # the host's boot id, read for the decide stage as the service reads it for it
        self.correlator = Correlator(config, self.db, self.subscriber, alerter,
                                     host_boot=host_boot_id(config["probes.proc_root"]))
        self.correlator.wall_clock = lambda: None      # event time only, like a replay
        self.seq = itertools.count()
        self.cursor = itertools.count()

    def close(self) -> None:
        self.subscriber.close()
        self.db.close()

    def at(self, seconds: float) -> int:
        return self.t0 + int(seconds * S)

    def feed(self, *events, src: str = "test") -> None:
        self.correlator.pending = [Envelope(src, next(self.seq), e) for e in events]
        self.correlator._last_decide = 0.0
        self.correlator.flush()
        assert not self.correlator.store_error, self.correlator.store_error

    # --- event makers ----------------------------------------------------------------------
    def gpu(self, t: float, uuid: str = UUID0, minor: int = 0, pci: str = PCI0) -> GpuSeen:
        return GpuSeen(ts=self.at(t), gpu_id=uuid, source="sim", simulated=True, uuid=uuid,
                       pci_bus_id=pci, index=minor, minor=minor)

    def sample(self, t: float, util: float, uuid: str = UUID0) -> GpuSample:
        return GpuSample(ts=self.at(t), gpu_id=uuid, source="sim", simulated=True,
                         fields={"gpu_util": util, "sm_active": util / 100})

    def process(self, t: float, key: ProcessKey, comm: str, ppid: int = 1,
                cgroup: str = "/user.slice/session-1.scope") -> ProcessSeen:
        return ProcessSeen(ts=self.at(t), process=key, comm=comm, cmdline=comm, exe=comm,
                           ppid=ppid, uid=0, cgroup=cgroup)

    def opened(self, t: float, key: ProcessKey, minor: int = 0) -> DeviceOpened:
        return DeviceOpened(ts=self.at(t), process=key, fd=5, path=f"/dev/nvidia{minor}",
                            device="nvidiaN", minor=minor)

    def exec_(self, t: float, key: ProcessKey, filename: str, ppid: int = 1) -> ProcessExec:
        return ProcessExec(ts=self.at(t), process=key, filename=filename, ppid=ppid)

    def exited(self, t: float, key: ProcessKey, signal: int | None = None) -> ProcessExited:
        return ProcessExited(ts=self.at(t), process=key, signal=signal)

    def reset_call(self, t: float, key: ProcessKey, path: str = "/dev/nvidiactl") -> DriverCall:
        return DriverCall(ts=self.at(t), process=key, tid=key.pid, fd=3, path=path,
                          device="nvidiactl", cmd=0xC020462A, nr=0x2A, size=32,
                          op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0,
                          sub=BIF_RESET, sub_name=RESET_CONTROLS[0], reasons=["notable"])

    def xid(self, t: float, code: int, pid: int | None = None, name: str | None = None,
            pci: str = "0000:18:00") -> KernelLogRecord:
        n = next(self.cursor)
        line = f"NVRM: Xid (PCI:{pci}): {code}, pid={pid}, name={name}, test n={n}"
        return KernelLogRecord(ts=self.at(t), cursor=f"c{n}", origin="journald", boot_id="b",
                               record_kind="xid", message=line[6:], xid=code, pci=pci,
                               pid=pid, name=name, line=line)

    # --- reads -----------------------------------------------------------------------------
    def incidents(self, kind: str | None = None) -> list[dict]:
        sql = "select * from incidents" + (" where kind = ?" if kind else "") + " order by id"
        cursor = self.db.execute(sql, [kind] if kind else [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]

    def links(self, incident_id: int) -> list[dict]:
        cursor = self.db.execute("select * from incident_links where incident_id = ? "
                                 "order by seq", [incident_id])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


@pytest.fixture
def harness(tmp_config):
    """A Harness whose t0 is now, on a whole second (timelines are per second)."""
    made = Harness(tmp_config, now_ns() // S * S)
    yield made
    made.close()


@pytest.fixture
def make_harness():
    """make_harness(config) -> a Harness on that config, closed after the test."""
    made = []

    def make(config):
        made.append(Harness(config, now_ns() // S * S))
        return made[-1]
    yield make
    for harness in made:
        harness.close()
