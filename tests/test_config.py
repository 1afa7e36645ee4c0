import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.config import SETTINGS, load_config
from gpuwhy.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_defaults():
    config = load_config(environ={})
    assert config["probes.device_glob"] == "/dev/nvidia*"
    assert config["web.host"] == "127.0.0.1"
    assert config["web.port"] == 8000
    assert config.source == "defaults"


def test_file_then_environment_override(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[web]\nport = 9000\n[probes]\ndevice_glob = "/tmp/x/nvidia*"\n'
                    "poll_interval = 2\n")
    config = load_config(path, environ={"GPUWHY_PORT": "9100"})
    assert config["web.port"] == 9100
    assert config["probes.device_glob"] == "/tmp/x/nvidia*"
    assert config["probes.poll_interval"] == 2.0  # int accepted for a float setting


def test_config_path_from_environment(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[store]\npath = "/tmp/elsewhere.db"\n')
    assert load_config(environ={"GPUWHY_CONFIG": str(path)})["store.path"] == "/tmp/elsewhere.db"


@pytest.mark.parametrize("text, message", [
    ("[web]\nprot = 1\n", "web.prot"),
    ("[web]\nport = \"eighty\"\n", "expected int"),
    ("[web]\nport = true\n", "boolean"),
    ("[web]\nport = 70000\n", "out of range: got 70000; allowed: 0 to 65535"),
    ("[probes]\nmax_threads = 16\n", "got 16; allowed: 256 to 1048576"),
    ("[probes]\nmax_call_stats = 4194304\n", "allowed: 256 to 1048576"),
    ("[store]\ncache_kib = 0\n", "got 0; allowed: 64 to 1048576 KiB"),
    ("[log]\nlevel = \"loud\"\n", "allowed: one of debug, info, warning, error"),
    ("[web\nport = 1\n", "invalid TOML"),
    ("surprise = 1\n", "surprise"),
])
def test_bad_config_file_names_file_and_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, environ={})
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match="config file cannot be read: No such file"):
        load_config(tmp_path / "missing.toml", environ={})
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[web]")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary, environ={})


def test_the_probes_map_sizes_are_read_from_the_environment():
    config = load_config(environ={"GPUWHY_MAX_THREADS": "4096", "GPUWHY_MAX_CALL_STATS": "512"})
    assert (config["probes.max_threads"], config["probes.max_call_stats"]) == (4096, 512)


def test_bad_environment_value():
    with pytest.raises(ConfigError, match="GPUWHY_PORT"):
        load_config(environ={"GPUWHY_PORT": "eighty"})


def test_replace_checks_names_and_types():
    config = load_config(environ={})
    assert config.replace({"web.port": 8123})["web.port"] == 8123
    with pytest.raises(ConfigError):
        config.replace({"web.nope": 1})
    with pytest.raises(ConfigError):
        config.replace({"web.port": "x"})


@pytest.mark.parametrize("text", ["[web]\nprot = 1\n", "[web\n", "\xff"])
def test_cli_bad_config_is_one_line_and_nonzero(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_bytes(text.encode("latin-1"))
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "--config", str(path), "settings"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(path) in result.stderr


def test_every_setting_is_documented_with_its_default_and_variable():
    doc = (REPO / "docs" / "settings.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_.]+)` \|.*$", doc, re.M)}
    assert set(rows) == {s.name for s in SETTINGS}
    for setting in SETTINGS:
        assert f"`{setting.env}`" in rows[setting.name]
        assert f"`{json.dumps(setting.default)}`" in rows[setting.name]


def test_the_recorded_environment_covers_the_shipped_rules_and_takes_only_names():
    from gpuwhy.config import environment_names
    from gpuwhy.correlator.rules.runner import env_keys
    from gpuwhy.rules.loader import load_rules

    default = environment_names(load_config(environ={})["probes.environment"])
    assert env_keys(load_rules()) <= default       # every env("NAME") the shipped rules read
    config = load_config(environ={"GPUWHY_ENVIRONMENT": " NCCL_DEBUG, MY_VAR_2 ,"})
    assert environment_names(config["probes.environment"]) == {"NCCL_DEBUG", "MY_VAR_2"}
    for bad in ("lower_case", "1ST", "A-B", ",".join(f"V{n}" for n in range(65))):
        with pytest.raises(ConfigError, match="probes.environment"):
            load_config(environ={"GPUWHY_ENVIRONMENT": bad})
