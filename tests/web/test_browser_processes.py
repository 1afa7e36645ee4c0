"""The process list in a real browser: left open, it shows a new process without a reload,
and keeps the search and sort that its URL carries."""

from __future__ import annotations

import pytest

from gpuwhy.config import load_config
from gpuwhy.events import DeviceOpened, Envelope, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

from .test_browser import LiveServer, Watched, shoot

pytestmark = pytest.mark.browser


def _arrive(path, seq: int, key: ProcessKey, comm: str, cmdline: str, minor: int) -> None:
    db = open_store(path)
    try:
        StoreWriter(db).write_batch([
            Envelope("t", seq, ProcessSeen(ts=seq, process=key, comm=comm, cmdline=cmdline)),
            Envelope("t", seq + 1, DeviceOpened(ts=seq + 1, process=key, fd=7,
                                                path=f"/dev/nvidia{minor}", device="nvidiaN",
                                                minor=minor))])
    finally:
        db.close()


def test_an_open_process_list_shows_a_new_process_and_keeps_its_filter(browser, tmp_path):
    path = tmp_path / "live.db"
    _arrive(path, 1, ProcessKey(100, 5), "python", "python train.py", 0)
    config = load_config(environ={"GPUWHY_DB": str(path), "GPUWHY_REFRESH": "1"})
    live = LiveServer(config)
    watched = Watched(browser)
    page = watched.page
    try:
        page.goto(f"{live.url}/processes?q=train&sort=gpu", wait_until="networkidle")
        assert page.locator("#processes tbody tr[data-key]").count() == 1
        _arrive(path, 10, ProcessKey(200, 7), "python", "python train.py --rank 1", 1)
        _arrive(path, 20, ProcessKey(300, 9), "vllm", "vllm serve", 2)   # filtered out
        page.wait_for_selector("#processes tr[data-key='200-7']", timeout=3000)
        keys = page.eval_on_selector_all("#processes tbody tr[data-key]",
                                         "rows => rows.map(r => r.dataset.key)")
        assert keys == ["100-5", "200-7"]                      # sorted by GPU, vllm hidden
        assert page.input_value("input[name=q]") == "train"
        assert "GPU" in page.inner_text("#processes tr[data-key='200-7'] td.gpus")
        shoot(page, tmp_path, "processes-filtered")
        assert watched.problems == []
    finally:
        watched.close()
        live.close()
