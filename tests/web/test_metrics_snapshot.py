"""`/metrics` from a snapshot: a crowd of scrapes shares one render a second, and an answer is
never older than a second nor, for a lone scrape, behind the store.

The crowd is 500 concurrent requests over the service's own server (cheroot) on the web
scenario's store; the rules of the snapshot are checked with a render that counts and blocks.
"""

from __future__ import annotations

import http.client
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.webui.metrics import Snapshot, store_stamp
from gpuwhy.webui.server import make_web_server


class Render:
    """A render that counts its calls and can be held until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.release.set()
        self.started = threading.Event()

    def __call__(self) -> bytes:
        self.calls += 1
        self.started.set()
        assert self.release.wait(10)
        return f"render {self.calls}\n".encode()


def test_500_concurrent_scrapes_share_one_render_a_second(scenario):
    """Issue #54: 500 concurrent requests gave /metrics a p99 of 15.9 s, each one a render."""
    config = scenario.config.replace({"web.host": "127.0.0.1", "web.port": 0,
                                      "web.auth_token": ""})
    server = make_web_server(config)
    snapshot = server.wsgi_app.extensions["gpuwhy.metrics"]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    start = threading.Barrier(500)

    def scrape(_: int) -> tuple[int, float, bytes]:
        start.wait(10)
        began = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=20)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            return response.status, time.monotonic() - began, response.read()
        finally:
            connection.close()

    try:
        began = time.monotonic()
        with ThreadPoolExecutor(500) as pool:
            results = list(pool.map(scrape, range(500)))
        elapsed = time.monotonic() - began
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert [status for status, _, _ in results] == [200] * 500
    # one render, and one more for each whole second the crowd took
    assert 1 <= snapshot.renders <= 1 + int(elapsed), (snapshot.renders, elapsed)
    families = {f.name for f in text_string_to_metric_families(results[-1][2].decode())}
    assert {"gpuwhy_incidents", "gpuwhy_gpu_health"} <= families
    times = sorted(t for _, t, _ in results)
    # measured here: p99 0.13-0.5 s, 0.8 s with the VM's load at 12 (before: 4.7-32 s on
    # this store); 0.5 s is the goal, 2 s leaves room for a busy CI machine
    assert times[494] < 2.0, times[494]


def test_concurrent_scrapes_wait_for_the_render_under_way_and_share_it():
    render = Render()
    snapshot = Snapshot(render, lambda: "v1")
    render.release.clear()
    with ThreadPoolExecutor(10) as pool:
        first = pool.submit(snapshot.get)
        assert render.started.wait(5)
        rest = [pool.submit(snapshot.get) for _ in range(9)]
        time.sleep(0.2)
        assert render.calls == 1 and not any(r.done() for r in rest)    # waiting, not rendering
        render.release.set()
        assert {first.result(5), *(r.result(5) for r in rest)} == {b"render 1\n"}
    assert snapshot.renders == 1


def test_an_unchanged_store_is_rendered_at_most_once_a_second():
    now = [100.0]
    render = Render()
    snapshot = Snapshot(render, lambda: "same", clock=lambda: now[0])
    for _ in range(50):
        assert snapshot.get() == b"render 1\n"
        now[0] += 0.019
    assert render.calls == 1                     # 0.95 s of scrapes: one render
    now[0] += 0.06
    assert snapshot.get() == b"render 2\n"       # a second old: rendered again


def test_a_lone_scrape_after_a_change_waits_for_the_next_render_and_sees_it():
    version = ["v1"]
    render = Render()
    snapshot = Snapshot(render, lambda: version[0], max_age=0.3)
    began = time.monotonic()
    assert snapshot.get() == b"render 1\n"
    version[0] = "v2"                            # the store changed
    assert snapshot.get() == b"render 2\n"       # not the older text, ...
    assert 0.25 <= time.monotonic() - began < 2  # ... and no sooner than max_age after it
    assert snapshot.get() == b"render 2\n" and render.calls == 2


def test_while_a_lone_scrape_waits_others_take_the_current_snapshot():
    version = ["v1"]
    render = Render()
    snapshot = Snapshot(render, lambda: version[0], max_age=0.5)
    assert snapshot.get() == b"render 1\n"
    version[0] = "v2"
    with ThreadPoolExecutor(2) as pool:
        lone = pool.submit(snapshot.get)
        time.sleep(0.1)                          # it waits for the next render ...
        started = time.monotonic()
        assert snapshot.get() == b"render 1\n"   # ... and a crowd is answered at once
        assert time.monotonic() - started < 0.2
        assert lone.result(5) == b"render 2\n"
    assert render.calls == 2


def test_a_failed_render_is_not_kept_and_the_next_scrape_renders_again():
    calls = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("store gone")
        return b"ok\n"

    snapshot = Snapshot(render, lambda: "v")
    try:
        snapshot.get()
    except OSError:
        pass
    else:
        raise AssertionError("the render's error reaches the scrape")
    assert snapshot.get() == b"ok\n" and snapshot.renders == 1


def test_the_store_stamp_changes_with_each_commit(tmp_path):
    from gpuwhy.store import open_store

    path = tmp_path / "store.db"
    db = open_store(path)
    try:
        before = store_stamp(path)
        assert before == store_stamp(path)
        db["scratch"].insert({"n": 1})
        after = store_stamp(path)
        assert after != before
        db["scratch"].insert({"n": 2})
        assert store_stamp(path) != after
    finally:
        db.close()
    assert store_stamp(tmp_path / "missing.db") == (None, None)
