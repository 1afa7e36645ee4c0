import pytest

from gpuwhy.config import load_config
from gpuwhy.events import DeviceOpened, DriverCallStats, Envelope, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.webui import create_app

EVIL = ProcessKey(666, 1234)


@pytest.fixture
def client(tmp_path):
    path = tmp_path / "web.db"
    db = open_store(path)
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate([
        ProcessSeen(ts=1, process=EVIL, comm="<b>x</b>",
                    cmdline="python -c '<script>alert(1)</script>'", tag="<img src=x>"),
        DeviceOpened(ts=2, process=EVIL, fd=3, path="/dev/nvidiactl", device="nvidiactl"),
        DriverCallStats(ts=3, process=EVIL, path="/dev/nvidiactl", device="nvidiactl", ops=[
            {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 1, "sub_name": None,
             "count": 3, "errors": 0, "latency_sum_ns": 3000, "latency_max_ns": 1500,
             "bytes": 0, "latency_log2": []}]),
    ])])
    db.close()
    app = create_app(load_config(environ={"GPUWHY_DB": str(path)}), {"TESTING": True})
    return app.test_client()


def test_index_lists_processes_and_escapes_what_they_control(client):
    page = client.get("/processes")   # "/" is the GPU overview (tests/web)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "666-1234" in html
    assert "NV_ESC_RM_CONTROL × 3" in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert "<b>x</b>" not in html and "<img src=x>" not in html


def test_api_processes(client):
    [row] = client.get("/api/processes").get_json()
    assert row["key"] == "666-1234"
    assert row["devices"][0]["path"] == "/dev/nvidiactl"
    assert row["ioctls"][0] == {"path": "/dev/nvidiactl", "device": "nvidiactl",
                                "cmd": 0xC020462A, "name": "NV_ESC_RM_CONTROL", "count": 3,
                                "errors": 0, "latency_sum_ns": 3000, "latency_max_ns": 1500,
                                "bytes": 0}


def test_page_script_never_uses_inner_html(client):
    script = client.get("/static/processes.js").get_data(as_text=True)
    assert "innerHTML" not in script.replace("never innerHTML", "")
    assert "textContent" in script


def test_healthz(client):
    assert client.get("/healthz").get_json()["status"] == "ok"


def test_healthz_reports_a_missing_store(tmp_path):
    app = create_app(load_config(environ={"GPUWHY_DB": str(tmp_path / "none.db")}))
    response = app.test_client().get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["status"] == "error"
