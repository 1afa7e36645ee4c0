"""The deployment docs name real settings, files and commands."""

import re
import subprocess
from pathlib import Path

import click

from gpuwhy.app.cli import cli
from gpuwhy.config import SETTINGS_BY_NAME

REPO = Path(__file__).resolve().parent.parent


def test_the_seed_switch_table_maps_to_real_settings():
    doc = (REPO / "docs" / "settings.md").read_text()
    section = doc.split("## Switches of the seed tool", 1)[1].split("## All settings", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert {"retention_days", "use_gpu_index_as_id", "enable_nvtx"} <= {
        re.match(r"\| `(\w+)`", row)[1] for row in rows}
    named = set(re.findall(r"`([a-z]+\.[a-z_]+)`", section))
    assert named and named <= set(SETTINGS_BY_NAME), named - set(SETTINGS_BY_NAME)


def test_readme_production_install_names_what_exists():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Production install", 1)[1].split("\n## ", 1)[0]
    for path in re.findall(r"`((?:scripts|systemd|deploy)/[\w./-]+)`", section):
        assert (REPO / path).exists(), path
    assert "scripts/install.sh --mode standalone" in section
    assert "deploy/kubernetes/daemonset.yaml" in section
    assert "check-env" in cli.list_commands(click.Context(cli))


def _commands(text: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines()
            if line.split("#", 1)[0].strip()]


def test_ci_runs_the_readme_quick_start_commands_exactly_as_written():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    quick_start = _commands(re.search(r"```sh\n(.*?)```", section, re.S)[1])
    assert quick_start == ["scripts/setup.sh", ".venv/bin/pytest"]
    ci = _commands((REPO / ".ci" / "run").read_text())
    ran = [line for line in ci if line in quick_start]
    assert ran == quick_start
    assert not any(re.match(r"(export )?\w+=", line) for line in ci), \
        "CI sets no variable the README's commands do not"


def test_readme_picture_maps_every_top_level_folder():
    readme = (REPO / "README.md").read_text()
    picture = readme.split("## How it is built", 1)[1].split("```", 2)[1]
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    folders = {f.split("/", 1)[0] for f in files if "/" in f}
    missing = {f for f in folders if f"{f}/" not in picture}
    assert len(folders) >= 10 and missing == set()
