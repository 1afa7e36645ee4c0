"""`gpuwhy rules …` and `gpuwhy record`, and docs/rules.md against the code."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from click.testing import CliRunner

from gpuwhy.bus import Publisher
from gpuwhy.cli import cli
from gpuwhy.clock import now_ns
from gpuwhy.demo.synthetic_signals import Synthetic
from gpuwhy.events import GpuXid
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.rules.docs import render
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.parser import parse_rules
from gpuwhy.wire import to_payload

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "rules.md"


def invoke(tmp_path, *args, env=None):
    environ = {"GPUWHY_DB": str(tmp_path / "g.db"), **(env or {})}
    return CliRunner().invoke(cli, list(args), env=environ, catch_exceptions=False)


def test_docs_list_every_shipped_rule_and_signal():
    text = DOC.read_text()
    assert render(text, load_rules()) == text, "regenerate docs/rules.md (see its markers)"
    for rule in load_rules():
        assert f"`{rule.id}`" in text


def test_the_docs_and_readme_state_the_real_rule_count():
    shipped = len(load_rules())
    stated = re.findall(r"\b(\d+) (?:expert|shipped) rules\b|\((\d+) shipped\b",
                        DOC.read_text() + (REPO / "README.md").read_text())
    counts = [int(a or b) for a, b in stated]
    assert len(counts) >= 3 and set(counts) == {shipped}


def test_docs_examples_are_valid_rules_that_lint_clean(tmp_path):
    blocks = re.findall(r"```rules\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        assert parse_rules(block, f"example{i}")
        path = tmp_path / f"example{i}.rules"
        path.write_text(block)
        result = invoke(tmp_path, "rules", "lint", str(path))
        assert result.exit_code == 0, result.output


def test_list_and_show(tmp_path):
    result = invoke(tmp_path, "rules", "list", "--json")
    rows = json.loads(result.output)
    assert len(rows) >= 30 and all(r["enabled"] for r in rows)
    shown = invoke(tmp_path, "rules", "show", "R19")
    assert shown.exit_code == 0 and "rule R19_power_cap {" in shown.output
    assert "builtin/d_power_thermal.rules" in shown.output
    missing = invoke(tmp_path, "rules", "show", "R99")
    assert missing.exit_code != 0 and "no rule 'R99'" in missing.output


def test_set_keeps_overrides_in_the_store(tmp_path):
    result = invoke(tmp_path, "rules", "set", "R01_input_cpu_bound", "enabled=false")
    assert result.exit_code == 0
    assert "R01_input_cpu_bound: enabled=false" in result.output
    result = invoke(tmp_path, "rules", "set", "R01", "threshold", "idle_share=0.6",
                    "worker_busy=0.8")
    assert "thresholds: idle_share=0.6 worker_busy=0.8" in result.output
    rows = {r["id"]: r for r in json.loads(invoke(tmp_path, "rules", "list", "--json").output)}
    assert rows["R01_input_cpu_bound"]["enabled"] is False
    assert rows["R01_input_cpu_bound"]["params"]["idle_share"] == 0.6
    bad = invoke(tmp_path, "rules", "set", "R01", "threshold", "nope=1")
    assert bad.exit_code == 1 and "has no threshold 'nope'" in bad.output
    bad = invoke(tmp_path, "rules", "set", "R01", "enabled=maybe")
    assert bad.exit_code == 1 and "enabled must be true or false" in bad.output
    assert "[disabled]" in invoke(tmp_path, "rules", "list").output


def test_lint_reports_errors_and_missing_advice(tmp_path):
    broken = tmp_path / "broken.rules"
    broken.write_text('rule A {\n  title: "t"\n  when: mean(gpu.util, 60s) >\n}\n')
    thin = tmp_path / "thin.rules"
    thin.write_text('rule B { title: "t" when: gpu.util > 0.5 fix: "only one" }\n')
    result = CliRunner().invoke(cli, ["rules", "lint", str(broken), str(thin)])
    assert result.exit_code == 1
    assert f"{broken}:4:1: unexpected '}}'" in result.output
    assert f"{thin}:1: rule B: 1 'fix:' clauses; give 2 to 4" in result.output
    assert f"{thin}:1: rule B: no 'cause:'" in result.output


def capture_of(tmp_path, spec: Synthetic) -> Path:
    path = tmp_path / "capture.jsonl"
    with open(path, "wb") as f:
        for seq, event in enumerate(spec.events(), 1):
            f.write(to_payload(event, src="test", seq=seq) + b"\n")
    return path


def test_rules_test_replays_a_capture(tmp_path):
    spec = Synthetic(duration_s=300, gpu={"clocks_event_reasons": 0x4, "sm_clock_mhz": 1228,
                                          "power_limit_w": 350})
    capture = capture_of(tmp_path, spec)
    rule_file = tmp_path / "mine.rules"
    rule_file.write_text('rule MY_hot { title: "Hot" when: mean(gpu.temp_c, 30s) > 60\n'
                         '  evidence: mean(gpu.temp_c, 30s) as temp_c }\n')
    result = invoke(tmp_path, "rules", "test", str(rule_file), "--builtin", "--replay",
                    str(capture))
    assert result.exit_code == 0, result.output
    assert "firing   high     R19_power_cap" in result.output
    assert "firing   warn     MY_hot" in result.output and "temp_c=67.0" in result.output
    lines = invoke(tmp_path, "rules", "test", str(rule_file), "--replay", str(capture),
                   "--json").output.splitlines()
    assert {json.loads(line)["rule_id"] for line in lines} == {"MY_hot"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "gpu_sample"}\nnot json\n')
    result = invoke(tmp_path, "rules", "test", "--builtin", "--replay", str(bad))
    assert result.exit_code == 1 and f"{bad}:1: not a bus event" in result.output


def test_record_captures_what_connects_to_its_own_endpoint(tmp_path, tmp_config):
    endpoint = f"ipc://{tmp_path}/record.sock"
    output = tmp_path / "out.jsonl"
    gpu_id = SimulatedGpus(seed=0).open()[0].id   # the GPU the recorded simulator reports

    def publish() -> None:
        publisher = Publisher(endpoint, src="test")
        publisher.wait_for_subscriber(5.0)
        for code in (79, 48):
            publisher.publish(GpuXid(ts=now_ns(), gpu_id=gpu_id, xid=code, source="sim",
                                     simulated=True))
        publisher.close()

    thread = threading.Thread(target=publish)
    thread.start()
    env = {"GPUWHY_GPU_SOURCE": "sim", "GPUWHY_GPU_INTERVAL": "0.2",
           "GPUWHY_BUS": tmp_config["bus.endpoint"]}
    result = invoke(tmp_path, "record", "--duration", "2", "--endpoint", endpoint,
                    "--sources", "gpu", str(output), env=env)
    thread.join()
    assert result.exit_code == 0, result.output
    kinds = [json.loads(line)["kind"] for line in output.read_text().splitlines()]
    assert kinds.count("gpu_xid") == 2 and "gpu_sample" in kinds and "gpu_seen" in kinds
    assert "recorded" in result.output and "gpu_xid" in result.output
    replay = invoke(tmp_path, "rules", "test", "--builtin", "--replay", str(output),
                    "--every", "1")
    assert "R32_xid79_fallen_off_bus" in replay.output
    assert "R33_xid48_double_bit_ecc" in replay.output
    unknown = invoke(tmp_path, "record", "--duration", "1", "--sources", "nope", str(output))
    assert unknown.exit_code == 2 and "unknown source(s) nope" in unknown.output
