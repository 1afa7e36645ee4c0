"""When the correlator writes a batch: when full, when old, or at once for an Xid."""

from __future__ import annotations

import threading
import time

from gpuwhy.bus import Publisher
from gpuwhy.config import load_config
from gpuwhy.store import open_store


def _count(view, table: str) -> int:
    return view.execute(f"select count(*) from {table}").fetchone()[0]


def _wait_for(view, table: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _count(view, table):
            return True
        time.sleep(0.02)
    return False


def test_an_xid_is_written_at_once_a_sample_waits_for_the_batch_timer(tmp_path, make_harness):
    config = load_config(environ={"GPUWHY_DB": str(tmp_path / "gpuwhy.db"),
                                  "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock",
                                  "GPUWHY_FLUSH_INTERVAL": "3"})
    harness = make_harness(config)
    stop = threading.Event()
    loop = threading.Thread(target=harness.correlator.run, args=(stop,))
    loop.start()
    publisher = Publisher(harness.subscriber.endpoint, src="test")
    view = open_store(config["store.path"], readonly=True)
    try:
        assert publisher.wait_for_subscriber(5)
        publisher.publish(harness.sample(0, 50.0))
        assert not _wait_for(view, "gpu_sample_data", 1.0)     # held for the 3 s timer
        publisher.publish(harness.xid(1, 13, pid=7, name="train"))
        assert _wait_for(view, "incidents", 1.0)                # not held: an alert waits
        assert _count(view, "gpu_sample_data") == 1             # written with it
    finally:
        stop.set()
        loop.join(10)
        publisher.close()
        view.close()


def test_only_events_a_detector_may_open_an_incident_on_are_urgent(harness):
    from dataclasses import replace

    from gpuwhy.correlator.incidents import may_open_incident
    from gpuwhy.events import GpuState

    xid = harness.xid(0, 13)
    assert may_open_incident(xid)
    assert not may_open_incident(replace(xid, record_kind="driver_loaded", xid=None))
    lost = GpuState(ts=1, gpu_id="g", source="sim", simulated=True, state="lost")
    assert may_open_incident(lost) and not may_open_incident(replace(lost, state="ok"))
    assert not may_open_incident(harness.sample(0, 5.0))


def test_the_kinds_the_correlator_asks_about_are_every_kind_that_may_be_urgent():
    from gpuwhy.correlator.incidents import MAY_OPEN_KINDS, may_open_incident
    from gpuwhy.events import EVENT_TYPES

    assert MAY_OPEN_KINDS <= EVENT_TYPES.keys()
    for kind, cls in EVENT_TYPES.items():
        if kind in MAY_OPEN_KINDS:
            continue
        # a bare instance: a kind may_open_incident looks into would fail on its fields
        assert may_open_incident(object.__new__(cls)) is False, kind
