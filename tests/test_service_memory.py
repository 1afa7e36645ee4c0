"""The service keeps its heap small as it runs."""

import threading
import time

from gpuwhy.app import service as service_module
from gpuwhy.app.service import Service


def _anon_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon")) / 1024


def test_a_waiting_service_gives_freed_heap_back_to_the_kernel(tmp_config, monkeypatch):
    # glibc keeps what threads free; the service hands it back while it waits, not only at
    # start-up (a day's rounds, batches and pages would leave it holding megabytes)
    monkeypatch.setattr(service_module, "RELEASE_EVERY", 0.2)
    monkeypatch.setattr(service_module, "WATCH_EVERY", 0.5)
    service = Service(tmp_config.replace({"web.port": 0}), with_probes=False, sources={})
    blocks = [bytes(2000) for _ in range(40_000)]       # ~80 MB of malloc'ed blocks
    kept = blocks[::16]                                  # holes glibc keeps by itself
    del blocks
    held = _anon_mb()
    waiting = threading.Thread(target=service.wait)
    waiting.start()
    try:
        time.sleep(1.0)    # two looks
        after = _anon_mb()
    finally:
        service.shutdown.set()
        waiting.join(5)
        service.stop()
    assert held - after > 40, (held, after)
    assert len(kept) == 2500
