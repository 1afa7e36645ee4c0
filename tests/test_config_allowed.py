"""Every setting is checked at load against what it allows (range, choice, scheme): a value
that would only fail at start-up, or silently cost a core, memory or exposure, is one clear
error naming the setting, the value and what is allowed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.app.cli import settings_markdown
from gpuwhy.config import (
    ALLOWED,
    GPU_SOURCES,
    KLOG_BACKENDS,
    KLOG_STARTS,
    SETTINGS,
    SETTINGS_BY_NAME,
    SIM_SCENARIOS,
    load_config,
)
from gpuwhy.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_every_setting_has_its_allowed_values_and_every_default_is_allowed():
    assert set(ALLOWED) == {s.name for s in SETTINGS}
    for setting in SETTINGS:
        if setting.name != "store.path":      # the default's folder may not exist here
            assert ALLOWED[setting.name].why_not(setting.default) is None, setting.name


# Each was accepted at load, then cost a core, memory or exposure, or failed at start-up.
@pytest.mark.parametrize("env, value, allowed", [
    ("GPUWHY_RULES_INTERVAL", "0", "0.1 to 86400 seconds"),
    ("GPUWHY_MAINTENANCE_INTERVAL", "0", "1 to 86400 seconds"),
    ("GPUWHY_SIM_GPUS", str((1 << 63) - 1), "1 to 256 GPUs"),
    ("GPUWHY_BUS_HWM", "0", "1 to 10000000 messages"),
    ("GPUWHY_GPU_INTERVAL", "0", "0.1 to 3600 seconds"),
    ("GPUWHY_POLL_INTERVAL", "0", "0.01 to 600 seconds"),
    ("GPUWHY_CRON_RESCAN", "0", "0.1 to 86400 seconds"),
    ("GPUWHY_EXPORTER_URL", "file:///etc/passwd", "an http:// or https:// URL or empty"),
    ("GPUWHY_ALERTMANAGER_URL", "gopher://h:70/", "an http:// or https:// URL or empty"),
    ("GPUWHY_URL", "", "an http:// or https:// URL"),
    ("GPUWHY_KLOG_BACKEND", "carrier-pigeon", "one of auto, journald, kmsg, file"),
    ("GPUWHY_KLOG_START", "yesterday", "one of boot, all, now"),
    ("GPUWHY_GPU_SOURCE", "nvml2", "one of auto, dcgm, nvml, dcgm-exporter, sim"),
    ("GPUWHY_DCGM_EMBEDDED", "always", "one of auto, never"),
    ("GPUWHY_SIM_SCENARIO", "meltdown", "one of healthy-training"),
    ("GPUWHY_DCGM_HOST", "a b:5555", "HOST or HOST:PORT"),
    ("GPUWHY_STORE_WARN_FRACTION", "2", "0.01 to 1"),
    ("GPUWHY_STALL_UTIL", "101", "0 to 100 %"),
    ("GPUWHY_DB", "", "a path to a regular file"),
    ("GPUWHY_BUS", "inproc://x", "ipc://PATH or tcp://HOST:PORT"),
    ("GPUWHY_BUS", "tcp://127.0.0.1:0", "ipc://PATH or tcp://HOST:PORT"),
    ("GPUWHY_ALLOWED_HOSTS", "ok.example, bad host", "comma-separated host names"),
    ("GPUWHY_CUDA_ALLOWED_BUILD_IDS", "00ff,zz", "comma-separated hexadecimal build ids"),
    ("GPUWHY_DRIVER_VERSION", "580; rm", "a driver version"),
])
def test_a_value_out_of_what_a_setting_allows_is_refused_at_load(env, value, allowed):
    with pytest.raises(ConfigError) as caught:
        load_config(environ={env: value})
    message = str(caught.value)
    name = next(s.name for s in SETTINGS if s.env == env)
    assert message.startswith(f"environment {env} [{name}]: "), message
    shown = repr(SETTINGS_BY_NAME[name].type(value))     # 0.0 for a float, '' for text
    assert f"got {shown}" in message, message
    assert f"allowed: {allowed}" in message, message


def test_a_store_path_that_is_a_folder_or_a_fifo_is_refused_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"\[store.path\]: there is a directory at that"):
        load_config(environ={"GPUWHY_DB": str(tmp_path)})
    fifo = tmp_path / "db"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="there is a FIFO at that path"):
        load_config(environ={"GPUWHY_DB": str(fifo)})
    assert load_config(environ={"GPUWHY_DB": str(tmp_path / "new.db")})["store.path"]


def test_the_same_checks_hold_in_a_file_and_in_an_override(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[gpu]\nexporter_url = "file:///etc/passwd"\n')
    with pytest.raises(ConfigError, match=r"c.toml \[gpu.exporter_url\]: .*got 'file:///etc/"):
        load_config(path, environ={})
    config = load_config(environ={})
    with pytest.raises(ConfigError, match=r"override \[rules.interval\]"):
        config.replace({"rules.interval": 0})


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:5555",
                                      "tcp://[::]:5555", "tcp://gpu-node-1:5555"])
def test_a_tcp_bus_beyond_loopback_needs_allow_remote(endpoint):
    with pytest.raises(ConfigError) as caught:
        load_config(environ={"GPUWHY_BUS": endpoint})
    message = str(caught.value)
    assert message.startswith("environment GPUWHY_BUS [bus.endpoint]: ")
    assert "no authentication" in message and "bus.allow_remote" in message
    config = load_config(environ={"GPUWHY_BUS": endpoint, "GPUWHY_BUS_ALLOW_REMOTE": "1"})
    assert config["bus.endpoint"] == endpoint
    with pytest.raises(ConfigError, match="beyond loopback"):
        load_config(environ={}).replace({"bus.endpoint": endpoint})


@pytest.mark.parametrize("endpoint", ["ipc:///run/gpuwhy/bus.sock", "tcp://127.0.0.1:5555",
                                      "tcp://[::1]:5555", "tcp://localhost:5555"])
def test_local_bus_endpoints_load(endpoint):
    assert load_config(environ={"GPUWHY_BUS": endpoint})["bus.endpoint"] == endpoint


def test_the_choices_are_the_ones_the_parts_act_on():
    from gpuwhy.probes.gpu.sim import SCENARIOS
    from gpuwhy.probes.gpu.source import SOURCE_NAMES
    from gpuwhy.probes.klog.source import BACKENDS, STARTS

    assert GPU_SOURCES == ("auto", *SOURCE_NAMES)
    assert SIM_SCENARIOS == SCENARIOS
    assert (KLOG_BACKENDS, KLOG_STARTS) == (BACKENDS, STARTS)


def test_docs_settings_md_is_the_generated_table():
    doc = (REPO / "docs" / "settings.md").read_text()
    assert settings_markdown() in doc, "run `gpuwhy settings --markdown` into docs/settings.md"
    assert "allowed" in settings_markdown().splitlines()[0]
    assert "bus.allow_remote" in doc and SETTINGS_BY_NAME["bus.allow_remote"].default is False


def test_a_refused_value_is_one_line_from_the_command_line(tmp_path):
    env = {**os.environ, "GPUWHY_RULES_INTERVAL": "0"}
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "settings"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == ("Error: environment GPUWHY_RULES_INTERVAL [rules.interval]: "
                                     "out of range: got 0.0; allowed: 0.1 to 86400 seconds")
