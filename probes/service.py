"""Run the privileged probes: load them, publish on the bus, re-send state on (re)subscribe."""

from __future__ import annotations

import logging
import threading

from gpuwhy.bus import Publisher
from gpuwhy.config import Config
from gpuwhy.probes.fdtrack import FdTrackProbe

log = logging.getLogger(__name__)


def run_probes(config: Config, stop: threading.Event,
               loaded: threading.Event | None = None) -> None:
    """Load every probe, then publish until ``stop`` is set. Raises ProbeLoadError."""
    publisher = Publisher(config["bus.endpoint"], src="fdtrack", hwm=config["bus.hwm"])
    probe = FdTrackProbe(config, publisher.publish,
                         bus_counters=lambda: {"dropped_bus_hwm": publisher.dropped})
    try:
        probe.load()
        if loaded is not None:
            loaded.set()

        def resync_on_subscribe() -> None:
            # The correlator (re)started: what it missed is re-sent, so nothing is lost
            # to the slow joiner or to a restart of the stable side.
            if publisher.poll_subscriptions():
                log.info("subscriber connected: re-sending state")
                probe.resync()

        probe.run(stop, on_tick=resync_on_subscribe)
    finally:
        probe.close()
        publisher.close()
