"""`gpuwhy rules …` and `gpuwhy record`, and docs/rules.md against the code."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.demo.synthetic_signals import Synthetic
from gpuwhy.bus import Publisher
from gpuwhy.clock import now_ns
from gpuwhy.events import GpuXid
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.rules.docs import render
from gpuwhy.rules.loader import load_rule_set, load_rules
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
    result = invoke(tmp_path, "rules", "set", "R01", "threshold", "busy_util=0.7",
                    "worker_busy=0.8")
    assert "thresholds: busy_util=0.7 worker_busy=0.8" in result.output
    rows = {r["id"]: r for r in json.loads(invoke(tmp_path, "rules", "list", "--json").output)}
    assert rows["R01_input_cpu_bound"]["enabled"] is False
    assert rows["R01_input_cpu_bound"]["params"]["busy_util"] == 0.7
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
    assert "firing   error    R19_power_cap" in result.output
    assert "firing   warning  MY_hot" in result.output and "temp_c=67.0" in result.output
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


GOOD = ('rule G1_good {{ title: "t" group: memory when: gpu.util > {} cause: "c" fix: "a" '
        'fix: "b" verify: "v" }}\n')


def broken_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "rules.d"
    folder.mkdir()
    (folder / "a_good.rules").write_text(GOOD.format(0.5))
    (folder / "b_broken.rules").write_bytes(
        GOOD.replace("G1", "B1").format(0.5).encode()
        + b'\nrule B2 {\n  title: "t"\n  window: ' + b"9" * 309 + b's\n  when: gpu.util > 1\n}\n'
        + b'rule B3 { title: "\xff" when: gpu.util > 1 }\n'
        + GOOD.replace("G1", "B4").format("").encode())
    return folder


def test_lint_names_each_broken_rule_and_still_reports_the_good_files(tmp_path):
    folder = broken_folder(tmp_path)
    result = CliRunner().invoke(cli, ["rules", "lint", str(folder)])
    assert result.exit_code == 1
    broken = folder / "b_broken.rules"
    assert f"{folder / 'a_good.rules'}: 1 rules OK" in result.output
    assert f"{broken}:5:11: duration too large (max 7d)" in result.output
    assert f"{broken}:8:19: not UTF-8 text (byte 0xff)" in result.output
    assert f"{broken}:9:64: unexpected ':'" in result.output
    assert f"{broken}: 1 rules loaded, 3 broken (not loaded)" in result.output
    assert "Traceback" not in result.output
    alone = CliRunner().invoke(cli, ["rules", "lint", str(folder / "a_good.rules")])
    assert alone.exit_code == 0


def test_lint_reports_a_rule_id_given_in_two_files(tmp_path):
    one, two = tmp_path / "one.rules", tmp_path / "two.rules"
    one.write_text(GOOD.format(0.5))
    two.write_text("\n" + GOOD.format(0.7))
    result = CliRunner().invoke(cli, ["rules", "lint", str(one), str(two)])
    assert result.exit_code == 1
    assert f"{two}:2:1: rule G1_good is already defined at {one}:1" in result.output


def test_a_broken_rules_path_costs_only_its_broken_rules(tmp_path):
    folder = broken_folder(tmp_path)
    result = invoke(tmp_path, "rules", "list", "--json", env={"GPUWHY_RULES_PATHS": str(folder)})
    assert result.exit_code == 0
    ids = [row["id"] for row in json.loads(result.stdout)]
    assert len(ids) == len(load_rules()) + 2 and {"G1_good", "B1_good"} <= set(ids)
    assert f"warning: {folder / 'b_broken.rules'}:5:11: duration too large" in result.stderr
    loaded = load_rule_set([str(folder)])   # what the service runs
    assert [r.id for r in loaded.rules] == ids and len(loaded.problems) == 3
