"""The outside corpus: written from outside sources, split once into a tuning and a held-out
half (by name), reported apart by `gpuwhy rules eval --corpus-set outside`; and the kinds of
wrong answer it was written to catch, each answered right."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.demo.corpus import OUTSIDE, corpus, write_corpus
from gpuwhy.app.demo.corpus.outside import HELD_OUT, TUNING, half
from gpuwhy.app.rules_eval_cli import evaluate_case, ranking, read_corpus
from gpuwhy.rules.loader import load_rules

RULES = load_rules()
SHIPPED = {rule.id for rule in RULES}


def test_every_scenario_cites_its_source_and_expects_shipped_rules():
    scenarios = corpus(OUTSIDE)
    assert len({s.name for s in scenarios}) == len(scenarios) >= 16
    builtin = {s.seed for s in corpus()} | {s.name for s in corpus()}
    for s in scenarios:
        assert re.search(r"source: \S", s.notes), s.name
        assert s.seed not in builtin and s.name not in builtin, s.name
        assert set(s.expected) <= SHIPPED, s.name
        assert s.healthy == s.cause.startswith("none:"), s.name


def test_the_split_is_fixed_by_the_name_and_each_half_has_faults_and_healthy_hosts():
    scenarios = corpus(OUTSIDE)
    assert all(s.half == half(s.name) in (TUNING, HELD_OUT) for s in scenarios)
    for name in (TUNING, HELD_OUT):
        mine = [s for s in scenarios if s.half == name]
        assert sum(s.healthy for s in mine) >= 2 and sum(not s.healthy for s in mine) >= 4
    assert half("single-gpu-kernel-spin-hang") == TUNING       # recorded in decision 0019
    assert half("zero-offload-single-gpu") == HELD_OUT


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outside")
    write_corpus(folder, list(CASES), OUTSIDE)
    return {case.name: case for case in read_corpus(folder)}


# One scenario of each kind of wrong answer the outside measurement found, with the answer
# that leads at the end and the rules that must not fire.
CASES = {
    # one process's hung kernel: no peer, no collective: the symptom, not a critical R17
    "single-gpu-kernel-spin-hang": ("R09_small_grid_low_sm", {"R17_collective_hang"}),
    # the main thread blocked on NFS reads more than on a CPU: the loader, not "not known"
    "no-workers-nfs-reads": ("R02_input_io_bound", set()),
    # the cron job that lowered the limit leads; the power cap is its evidence
    "cron-evening-power-cap": ("R40_operator_or_cron_intervention", set()),
    # one GPU's offload both ways is no peer traffic on PCIe (what leads instead is a miss
    # left as measured: the held-out half is not tuned to)
    "zero-offload-single-gpu": (None, {"R15_collectives_off_nvlink"}),
    # the refused version check alone, no kernel line
    "version-mismatch-no-kernel-log": ("R41_driver_api_mismatch", set()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_kind_of_wrong_answer_is_answered_right(written, name):
    top, never = CASES[name]
    case = written[name]
    assert case.half == half(name)
    outcome = evaluate_case(case, RULES, ranking()[1])
    assert not never & set(outcome.fired), outcome.fired
    if top is not None:
        assert outcome.top == top and outcome.hit


def test_eval_reports_the_halves_apart(tmp_path):
    result = CliRunner().invoke(cli, ["rules", "eval", "--corpus-set", "outside", "--json",
                                      "--only", "version-mismatch-nvml-only,"
                                                "version-mismatch-no-kernel-log"],
                                env={"GPUWHY_DB": str(tmp_path / "g.db")})
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["halves"]) == {TUNING, HELD_OUT}
    assert report["halves"][TUNING]["faults"] == report["halves"][HELD_OUT]["faults"] == 1
    assert {row["name"]: row["half"] for row in report["scenarios"]} == {
        "version-mismatch-no-kernel-log": TUNING, "version-mismatch-nvml-only": HELD_OUT}
