"""Auto-selection on this GPU-less host, and simulator -> bus -> correlator -> store, all real."""

import threading
import time

from click.testing import CliRunner

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.gpu.runner import run_gpu_source
from gpuwhy.probes.gpu.select import open_source
from gpuwhy.probes.gpu.source import SourceUnavailable
from gpuwhy.store import open_store


def _no_gpu_libraries(monkeypatch):
    """As on this host, on any host: no DCGM bindings, no libnvidia-ml (at the module edge)."""
    import sys

    import pynvml

    def library_not_found():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monkeypatch.setitem(sys.modules, "pydcgm", None)
    monkeypatch.setattr(pynvml, "nvmlInit", library_not_found)


def test_auto_selection_says_why_each_step_was_skipped(tmp_config, monkeypatch):
    _no_gpu_libraries(monkeypatch)
    config = tmp_config.replace({"gpu.dcgm_bindings": "/nonexistent", "gpu.sim_gpus": 3})
    source, steps = open_source(config)
    try:
        assert source.name == "sim" and len(source.gpus) == 3
        assert steps[0].startswith("dcgm: not installed")
        assert steps[1] == "nvml: library not found (no libnvidia-ml.so.1)"
        assert steps[2:] == ["exporter: not configured", "using SIMULATOR"]
    finally:
        source.close()


def test_auto_tries_the_exporter_when_a_url_is_set(tmp_config, monkeypatch):
    _no_gpu_libraries(monkeypatch)
    config = tmp_config.replace({"gpu.exporter_url": "http://127.0.0.1:1/metrics"})
    source, steps = open_source(config)
    source.close()
    assert steps[2].startswith("exporter: cannot scrape http://127.0.0.1:1/metrics")


def test_forced_source_fails_loudly(tmp_config):
    config = tmp_config.replace({"gpu.dcgm_bindings": "/nonexistent"})
    try:
        open_source(config, forced="dcgm")
    except SourceUnavailable as exc:
        assert "not installed" in str(exc)
    else:
        raise AssertionError("a forced dcgm source opened on a host without DCGM")


def test_simulated_samples_reach_the_store_with_ids_and_mark(tmp_config):
    config = tmp_config.replace({"gpu.interval": 0.2, "gpu.sim_scenario": "xid-79",
                                 "gpu.sim_event_after": 0.6, "gpu.source": "sim"})
    db = open_store(config["store.path"])
    subscriber = Subscriber(config["bus.endpoint"])
    correlator = Correlator(config, db, subscriber)
    stop = threading.Event()
    threads = [threading.Thread(target=correlator.run, args=(stop,)),
               threading.Thread(target=run_gpu_source, args=(config, stop))]
    for thread in threads:
        thread.start()
    reader = open_store(config["store.path"], readonly=True)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            xids = reader.execute("select count(*) from events where kind = 'gpu_xid'").fetchone()
            peers = reader.execute("select count(*) from gpu_samples where gpu_id = "
                                   "(select id from gpus where gpu_index = 1)").fetchone()
            if xids[0] and peers[0] >= 6:
                break
            time.sleep(0.1)
        gpus = reader.execute("select id, uuid, gpu_index, minor, model, simulated, source, "
                              "state from gpus order by gpu_index").fetchall()
        assert [(g[2], g[3], g[5], g[6]) for g in gpus] == [(0, 0, 1, "sim"), (1, 1, 1, "sim")]
        assert all(g[0] == g[1] and g[1].startswith("GPU-") for g in gpus)
        assert all("SIMULATED" in g[4] for g in gpus)
        assert gpus[0][7] == "lost" and gpus[1][7] is None
        by_gpu = dict(reader.execute("select gpu_id, count(*) from gpu_samples group by gpu_id"))
        assert set(by_gpu) == {gpus[0][0], gpus[1][0]}
        assert by_gpu[gpus[1][0]] >= 6 and by_gpu[gpus[0][0]] <= 4   # GPU 0 fell off the bus
        row = reader.execute("select sm_active, power_w, fb_total_mib from gpu_samples "
                             "where gpu_id = ?", [gpus[1][0]]).fetchone()
        assert 0 < row[0] <= 1 and row[1] > 0 and row[2] == 81559
        [(gpu_id, body)] = reader.execute("select gpu_id, body from events "
                                          "where kind = 'gpu_xid'").fetchall()
        assert gpu_id == gpus[0][0] and '"xid":79' in body
        state, detail = reader.execute("select state, detail from source_health "
                                       "where source = 'gpu'").fetchone()
        assert state == "degraded" and detail.startswith("SIMULATED data")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        assert not any(t.is_alive() for t in threads), "a thread did not stop within 5 s"
        reader.close()
        subscriber.close()


def test_cli_sample_once_json_and_table(tmp_config):
    from gpuwhy.app.cli import cli

    env = {"GPUWHY_DB": tmp_config["store.path"], "GPUWHY_SIM_GPUS": "3",
           "GPUWHY_SIM_SCENARIO": "power-cap"}
    result = CliRunner().invoke(cli, ["gpu", "sample", "--source", "sim", "--once", "--json"],
                                env=env)
    assert result.exit_code == 0, result.output
    import json

    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert {"index", "uuid", "model", "pci_bus_id", "source", "ts", "fields"} <= set(r)
        assert r["source"] == "sim" and r["simulated"] is True
        assert r["fields"]["clocks_event_reasons"] == 4
    table = CliRunner().invoke(cli, ["gpu", "sample", "--source", "sim", "--once"], env=env)
    assert table.exit_code == 0
    assert "SIMULATED" in table.output.splitlines()[0]
    assert len([line for line in table.output.splitlines() if "(SIMULATED)" in line]) == 3


def test_cli_forced_missing_source_is_one_line(tmp_config):
    from gpuwhy.app.cli import cli

    result = CliRunner().invoke(cli, ["gpu", "sample", "--source", "dcgm-exporter", "--url",
                                      "http://127.0.0.1:1/metrics", "--once"])
    assert result.exit_code != 0 and "dcgm-exporter: cannot scrape" in result.output
    assert "Traceback" not in result.output
    bad = CliRunner().invoke(cli, ["gpu", "sample", "--source", "sim", "--interval", "0.01"])
    assert bad.exit_code != 0 and "[gpu.interval]: out of range: got 0.01" in bad.output
