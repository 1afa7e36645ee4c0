"""The deployment docs name real settings, files and commands."""

import re
from pathlib import Path

from gpuwhy.cli import cli
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
    assert "check-env" in cli.commands
