"""`gpuwhy check` and `gpuwhy baseline` end to end, all real but the GPU: the eBPF probes,
the simulator and the correlator watch a stand-in training process (real driver-call
traffic on look-alike device files), through a running pipeline (service mode) and through
the private pipeline the command starts itself (standalone)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from gpuwhy.app.service import Pipeline
from gpuwhy.store import open_store

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _env(config, **extra):
    env = {**os.environ, "GPUWHY_DB": config["store.path"], "GPUWHY_BUS": config["bus.endpoint"],
           "GPUWHY_DEVICE_GLOB": config["probes.device_glob"], "GPUWHY_GPU_SOURCE": "sim",
           "GPUWHY_GPU_INTERVAL": "0.2", "GPUWHY_SIM_GPUS": "2", "GPUWHY_POLL_INTERVAL": "0.2",
           "GPUWHY_FLUSH_INTERVAL": "0.1", "GPUWHY_CHECK_PROGRESS": "1",
           "GPUWHY_CHECK_SETTLE": "3", "GPUWHY_KLOG_START": "now", "GPUWHY_PORT": "1"}
    env.pop("GPUWHY_CONFIG", None)
    return {**env, **extra}


def _gpuwhy(env, *args, timeout=90):
    return subprocess.run([sys.executable, "-m", "gpuwhy", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)


def _trainer(config, *extra):
    dev = os.path.dirname(config["probes.device_glob"])
    return [sys.executable, "-m", "gpuwhy.app.demo.standin", "train", dev, "--minor", "0",
            *extra]


def _gpu_of_minor(path, minor):
    with open_store(path, readonly=True) as db:
        return db.execute("select gpu_id from gpu_aliases where alias = ?",
                          [f"minor:{minor}"]).fetchone()[0]


@pytest.fixture
def service(tmp_config):
    """A running pipeline (probes, simulator, correlator) reporting to tmp_config's store,
    as `gpuwhy up` would."""
    dev = os.path.dirname(tmp_config["probes.device_glob"])
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        open(os.path.join(dev, name), "w").close()
    config = tmp_config.replace({"gpu.source": "sim", "gpu.interval": 0.2, "gpu.sim_gpus": 2,
                                 "klog.start": "now", "rules.interval": 1.0})
    pipe = Pipeline(config)
    pipe.start()
    yield config
    pipe.close()


def test_check_through_the_service_passes_and_fails_with_observed_values(service, tmp_path):
    env = _env(service)
    junit = tmp_path / "check.xml"
    done = _gpuwhy(env, "check", "--source", "service", "--duration", "4", "--json",
                   "--junit", str(junit),
                   "--expect", "mean(sm_active) >= 0.6", "--expect", "p95(copy_util) <= 0.8",
                   "--expect", "count(xid) == 0", "--expect", "rate(ioctls) > 5",
                   "--", *_trainer(service))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)         # the command's own output went to stderr
    assert report["passed"] is True
    assert report["watched"]["mode"] == "service"
    assert report["watched"]["gpu"] == _gpu_of_minor(service["store.path"], 0)
    observed = {e["expectation"]: e["observed"] for e in report["expectations"]}
    assert 0.8 < observed["mean(sm_active) >= 0.6"] < 0.92   # the simulator's healthy 0.86
    assert observed["count(xid) == 0"] == 0
    assert observed["rate(ioctls) > 5"] > 5                  # a control call per ~20 ms step
    assert "watching command" in done.stderr and "left]" in done.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"

    trainer = subprocess.Popen(_trainer(service), stdout=subprocess.PIPE, text=True)
    try:
        pid = int(trainer.stdout.readline())
        done = _gpuwhy(env, "check", "--pid", str(pid), "--duration", "3",
                       "--expect", "mean(sm_active) >= 0.95",
                       "--expect", "mean(gpu.temp_c) < 80")
    finally:
        trainer.terminate()
        trainer.wait(10)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {line.split("  ")[0]: line for line in done.stdout.splitlines()}
    failed = lines["mean(sm_active) >= 0.95"]
    assert "FAIL" in failed
    assert 0.8 < float(failed.split()[3]) < 0.92
    assert "pass" in lines["mean(gpu.temp_c) < 80"]
    assert "expectations FAILED" in done.stdout


def test_baseline_of_a_healthy_run_flags_a_starved_one(tmp_config):
    dev = os.path.dirname(tmp_config["probes.device_glob"])
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        open(os.path.join(dev, name), "w").close()
    env = _env(tmp_config)
    done = _gpuwhy(env, "baseline", "capture", "healthy", "--source", "standalone",
                   "--duration", "4", "--", *_trainer(tmp_config))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting probes and sources" in done.stderr

    starved = _env(tmp_config, GPUWHY_SIM_SCENARIO="input-starved")
    done = _gpuwhy(starved, "baseline", "compare", "healthy", "--source", "standalone",
                   "--duration", "4", "--threshold", "0.1", "--json", "--",
                   *_trainer(tmp_config, "--starved", "--workers", "2"))
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["regressed"] is True
    flagged = {(c["figure"], c["stat"]) for c in result["changes"] if c["flagged"]}
    assert ("gpu.sm_active", "mean") in flagged
    assert ("gpu.util", "mean") in flagged
    assert ("proc.sleep_frac", "mean") in flagged
    assert ("proc.ioctl.rm_control/s", "value") in flagged     # fewer steps per second
    figures = {c["figure"] for c in result["changes"]}
    assert {"gpu.temp_c", "gpu.fb_used"} <= figures
    # What the scenario does not change is not flagged. (Not proc.runq_frac: the time the
    # process waits for a CPU follows the host's load, which this shared machine varies.)
    unrelated = [c for c in result["changes"] if c["flagged"]
                 and c["figure"] in ("gpu.temp_c", "gpu.fb_used", "gpu.mem_temp_c")]
    assert not unrelated
    assert result["environment"]["now"]["driver"] == "595.45.04"   # the process's version check

    shown = _gpuwhy(env, "baseline", "show", "healthy", "--json")
    kept = json.loads(shown.stdout)
    assert "SIMULATED" in kept["environment"]["gpu_model"]
    assert 0.8 < kept["figures"]["gpu.sm_active"]["p50"] < 0.92
    assert "healthy" in _gpuwhy(env, "baseline", "list").stdout
    assert _gpuwhy(env, "baseline", "delete", "healthy").returncode == 0
    assert "no baselines" in _gpuwhy(env, "baseline", "list").stdout
