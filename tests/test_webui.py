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


@pytest.fixture
def two_process_client(tmp_path):
    """Two processes on two GPUs (bound through /dev/nvidiaN) and one holding only nvidiactl."""
    path = tmp_path / "two.db"
    db = open_store(path)
    trainer, server, tool = ProcessKey(100, 5), ProcessKey(200, 3), ProcessKey(300, 9)
    events = [
        ProcessSeen(ts=1, process=trainer, comm="python", cmdline="python train.py --lr 3e-4"),
        ProcessSeen(ts=1, process=server, comm="vllm", cmdline="vllm serve llama"),
        ProcessSeen(ts=1, process=tool, comm="nvtop", cmdline="nvtop"),
        DeviceOpened(ts=2, process=trainer, fd=5, path="/dev/nvidia1", device="nvidiaN", minor=1),
        DeviceOpened(ts=2, process=server, fd=6, path="/dev/nvidia0", device="nvidiaN", minor=0),
        DeviceOpened(ts=2, process=tool, fd=3, path="/dev/nvidiactl", device="nvidiactl"),
        DriverCallStats(ts=3, process=server, path="/dev/nvidiactl", device="nvidiactl", ops=[
            {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 1, "sub_name": None,
             "count": 50, "errors": 0, "latency_sum_ns": 3000, "latency_max_ns": 1500,
             "bytes": 0, "latency_log2": []}]),
    ]
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    db.close()
    app = create_app(load_config(environ={"GPUWHY_DB": str(path)}), {"TESTING": True})
    return app.test_client()


def test_process_list_has_a_gpu_column_sort_and_search(two_process_client):
    client = two_process_client
    busiest = client.get("/api/processes").get_json()
    assert [p["key"] for p in busiest][0] == "200-3"   # 50 ioctls first
    trainer = next(p for p in busiest if p["key"] == "100-5")
    assert [g["gpu_id"] for g in trainer["gpus"]] and trainer["gpus"][0]["gpu_id"].endswith("1")
    by_gpu = [p["key"] for p in client.get("/api/processes?sort=gpu").get_json()]
    assert by_gpu == ["200-3", "100-5", "300-9"]       # minor 0, minor 1, then no GPU
    by_name = [p["key"] for p in client.get("/api/processes?sort=name").get_json()]
    assert by_name == ["300-9", "100-5", "200-3"]      # nvtop, python, vllm
    found = client.get("/api/processes?q=TRAIN.py").get_json()
    assert [p["key"] for p in found] == ["100-5"]
    assert client.get("/api/processes?q=train+vllm").get_json() == []   # every word must match
    assert client.get("/api/processes?sort=bogus").status_code == 400
    page = client.get("/processes?q=vllm&sort=gpu").get_data(as_text=True)
    assert "200-3" in page and "100-5" not in page
    assert 'value="vllm"' in page and '<option value="gpu" selected>' in page
    assert "/gpus/" in page                             # the GPU cell links to its page
    empty = client.get("/processes?q=nothing-like-this").get_data(as_text=True)
    assert "No process matches" in empty
