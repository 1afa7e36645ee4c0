import json
import subprocess
import sys

import click
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.config import SETTINGS


def test_help_lists_every_command_with_examples():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert {"up", "probes", "rules", "check-env", "bench", "xid"} <= set(names)
    for name in names:
        assert name in result.output
    assert "Examples:" in result.output
    for name in names:
        command = cli.get_command(ctx, name)
        assert command.name == name
        assert command.help and "Example" in command.help, name


def test_long_running_commands_load_only_their_own_parts():
    """`gpuwhy probes` and `gpuwhy up` import the group, not every command's module."""
    code = ("import sys; import gpuwhy.app.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('gpuwhy')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    for module in ("gpuwhy.app.checks", "gpuwhy.app.demo", "gpuwhy.app.rules_eval_cli",
                   "gpuwhy.app.bench_cli", "gpuwhy.app.db_cli", "gpuwhy.probes.trace"):
        assert f"'{module}" not in loaded, module


def test_python_dash_m_works(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "--version"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and "gpuwhy, version" in result.stdout


def test_settings_json_lists_every_setting():
    result = CliRunner().invoke(cli, ["settings", "--json"], env={"GPUWHY_PORT": "8123"})
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == {s.name for s in SETTINGS}
    assert rows["web.port"]["value"] == 8123 and rows["web.port"]["default"] == 8000


def test_status_when_nothing_runs_is_unhealthy(tmp_path):
    env = {"GPUWHY_DB": str(tmp_path / "none.db"), "GPUWHY_PORT": "1"}
    result = CliRunner().invoke(cli, ["status", "--json"], env=env)
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["healthy"] is False
    states = {p["part"]: p["state"] for p in report["parts"]}
    assert states["web"] == "down" and states["store"] == "down"


def test_up_refuses_a_public_address(tmp_path):
    env = {"GPUWHY_DB": str(tmp_path / "x.db"), "GPUWHY_BUS": f"ipc://{tmp_path}/b.sock"}
    result = CliRunner().invoke(cli, ["up", "--host", "0.0.0.0"], env=env)
    assert result.exit_code != 0
    assert "refusing to serve the web view on '0.0.0.0'" in result.output


def test_settings_never_print_a_token():
    result = CliRunner().invoke(cli, ["settings", "--json"],
                                env={"GPUWHY_AUTH_TOKEN": "s3cret-value"})
    assert result.exit_code == 0
    assert "s3cret-value" not in result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["web.auth_token"]["value"] == "********"
