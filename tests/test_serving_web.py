"""The web view speaks serving: an engine's Serving charts on its process page (and on its
GPU process's), their data on the process timeline's window, and ``gpuwhy_engine_*`` on
/metrics (and so in the OTLP export), from engine samples written through the store writer."""

from __future__ import annotations

import pytest

from gpuwhy.clock import now_ns
from gpuwhy.config import load_config
from gpuwhy.events import (
    DriverCallStats,
    EngineSample,
    Envelope,
    GpuSample,
    GpuSeen,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.webui import create_app

S = 10**9
SERVER, CORE, TRAINER, OLD = (ProcessKey(100, 5000), ProcessKey(101, 5001),
                              ProcessKey(300, 7000), ProcessKey(400, 8000))
UUIDS = [f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(2)]
HOSTILE = "http://127.0.0.1:8000/metrics?<script>alert(1)</script>"


def _calls(ts: int, key: ProcessKey) -> DriverCallStats:
    return DriverCallStats(ts=ts, process=key, path="/dev/nvidiactl", device="nvidiactl", ops=[
        {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 1, "sub_name": None,
         "count": 3, "errors": 0, "latency_sum_ns": 3000, "latency_max_ns": 1500,
         "bytes": 0, "latency_log2": []}])


@pytest.fixture
def store(tmp_path):
    """A tensor-parallel vLLM (API server SERVER, GPU process CORE) scraped every 5 s for
    the last minute, a trainer with no engine, and an SGLang last scraped 10 min ago."""
    path = tmp_path / "serving.db"
    end = now_ns() - 2 * S
    start = end - 60 * S
    events: list = [GpuSeen(ts=start, gpu_id=u, source="nvml", simulated=True, uuid=u, index=i,
                            minor=i, pci_bus_id=f"0000:1{i}:00.0", model="NVIDIA H100")
                    for i, u in enumerate(UUIDS)]
    events += [ProcessSeen(ts=start, process=k, comm=c, cmdline=c)
               for k, c in ((SERVER, "vllm"), (CORE, "VLLM::EngineCore"),
                            (TRAINER, "python"), (OLD, "sglang"))]
    events += [EngineSample(ts=start - 600 * S, engine="sglang", endpoint="http://127.0.0.1:30000/metrics",
                            process=OLD, gpu_ids=[UUIDS[0]], values={"requests_running": 1})]
    for n in range(13):
        events.append(EngineSample(
            ts=start + n * 5 * S, engine="vllm", endpoint=HOSTILE, process=SERVER,
            processes=[CORE], version="<b>v1</b>", gpu_ids=[UUIDS[1], UUIDS[0]],
            values={"requests_running": 8.0, "requests_waiting": float(n),
                    "kv_cache_usage": 0.97, "ttft_p95_s": 0.5 + n / 10,
                    "tpot_p95_s": 0.04, "prompt_tokens_per_s": 900.0,
                    "generation_tokens_per_s": 300.0}))
    events += [GpuSample(ts=start + n * S, gpu_id=u, source="nvml", simulated=True,
                         fields={"sm_active": 0.2 + 0.4 * i, "gpu_util": 90.0})
               for n in range(60) for i, u in enumerate(UUIDS)]
    events += [_calls(end, k) for k in (SERVER, CORE, TRAINER)]
    db = open_store(path)
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    db.close()
    return path


@pytest.fixture
def client(store):
    return create_app(load_config(environ={"GPUWHY_DB": str(store)}),
                      {"TESTING": True}).test_client()


def test_the_engine_s_page_and_its_gpu_process_s_have_serving_charts_escaped(client):
    html = client.get(f"/processes/{SERVER}").get_data(as_text=True)
    assert 'id="serving"' in html and "Serving: vLLM" in html
    assert 'id="chart-serving-load"' in html and 'id="chart-serving-speed"' in html
    assert f'data-engine="/api/processes/{SERVER}/engine"' in html
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "<b>v1</b>" not in html and "&lt;b&gt;v1&lt;/b&gt;" in html
    assert "on GPU 1, 0" in html and "This process is the engine" in html
    core = client.get(f"/processes/{CORE}").get_data(as_text=True)
    assert "Serving: vLLM" in core and f'href="/processes/{SERVER}"' in core
    plain = client.get(f"/processes/{TRAINER}").get_data(as_text=True)
    assert 'id="serving"' not in plain and "data-engine" not in plain


def test_the_engine_api_shares_the_timeline_s_window_and_follows_its_tail(client):
    for key in (SERVER, CORE):
        timeline = client.get(f"/api/processes/{key}/series?range=5m").get_json()
        data = client.get(f"/api/processes/{key}/engine?range=5m").get_json()
        assert (data["from"], data["to"], data["bucket_ns"]) == \
            (timeline["from"], timeline["to"], timeline["bucket_ns"])
        assert data["engine"]["engine"] == "vllm" and data["engine"]["pid"] == SERVER.pid
        assert data["engine"]["gpus"] == ["1", "0"]
        assert data["sample_period_s"] == 5.0, data
        rows = [dict(zip(["ts", *data["fields"]], r, strict=True)) for r in data["rows"]]
        assert 0 < len(rows) <= 13
        assert {r["kv_cache_usage"] for r in rows} == {0.97}
        assert rows[-1]["ttft_p95_s"] > rows[0]["ttft_p95_s"]
        assert all(r["preemptions_per_s"] is None for r in rows)
        gpus = data["gpus"]     # its two GPUs' SM activity on the same buckets: the mean
        assert (gpus["from"], gpus["bucket_ns"], gpus["fields"][0]) == \
            (data["from"], data["bucket_ns"], "sm_active")
        assert len(gpus["rows"]) == 60 and {r[1] for r in gpus["rows"]} == {40.0}
    # a live chart's tail: only the buckets from the last drawn one on
    last = rows[-1]["ts"]
    tail = client.get(f"/api/processes/{CORE}/engine", query_string={
        "after": last, "grid": data["from"], "bucket": data["bucket_ns"]}).get_json()
    assert 1 <= len(tail["rows"]) <= 2 and tail["rows"][-1][0] == last
    none = client.get(f"/api/processes/{TRAINER}/engine").get_json()
    assert none["engine"] is None and none["rows"] == []
    assert client.get("/api/processes/1-2/engine").status_code == 404


def test_metrics_has_one_series_per_recent_engine_and_otlp_takes_them(client, store):
    text = client.get("/metrics").get_data(as_text=True)
    lines = [line for line in text.splitlines() if line.startswith("gpuwhy_engine_")]
    labels = 'engine="vllm",gpus="1,0",pid="100",port="8000"'
    assert any(line.startswith("gpuwhy_engine_kv_cache_usage_ratio{") and labels in line
               and line.endswith(" 0.97") for line in lines), lines
    for name in ("requests_waiting", "ttft_p95_seconds", "tpot_p95_seconds",
                 "generation_tokens_per_second", "info", "last_scrape_timestamp_seconds"):
        assert sum(line.startswith(f"gpuwhy_engine_{name}{{") for line in lines) == 1, name
    assert not any('engine="sglang"' in line for line in lines)      # 10 minutes old
    assert not any("script" in line for line in lines)               # port only, never the URL

    # the OTLP export reads the same collector: the engine families go out with their units
    from opentelemetry.sdk.resources import Resource

    from gpuwhy.app.otlp_export import FamilySnapshot, metrics_registry
    registry = metrics_registry(lambda: open_store(store, readonly=True), None)
    data, _ = FamilySnapshot(Resource.create({}), registry).read()
    sent = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    ttft = sent["gpuwhy_engine_ttft_p95_seconds"]
    assert ttft.unit == "s" and len(ttft.data.data_points) == 1
    assert ttft.data.data_points[0].attributes["engine"] == "vllm"
    assert sent["gpuwhy_engine_prompt_tokens_per_second"].unit == "1/s"
    assert sent["gpuwhy_engine_kv_cache_usage_ratio"].data.data_points[0].value == 0.97
