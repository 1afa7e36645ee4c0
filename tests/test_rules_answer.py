"""Cause over symptom: the `kind:` and `explains:` clauses, their lint, the shipped rules'
annotations, and the one ranking of gpuwhy/rules/answer.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.rules_cli import lint_rule
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import answers, answers_by_gpu, missing_for, rank_key, top_answer
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.model import CAUSE, KINDS, SYMPTOM
from gpuwhy.rules.parser import RuleSyntaxError, parse_rules

SHIPPED = {rule.id: rule for rule in load_rules()}
GPU0, GPU1 = "GPU-0000", "GPU-1111"
TRAINER, OTHER = ProcessKey(4242, 1000), ProcessKey(5151, 2000)
STARVED, BURSTY, LOW = "R01_input_cpu_bound", "R14_bursty_utilisation", "R14b_low_gpu_utilisation"


def finding(rule_id, gpu=GPU0, severity="warning", state="firing", process=TRAINER,
            shadow=False, ts=1, **extra):
    rule = SHIPPED.get(rule_id)
    return RuleFinding(ts=ts, finding_id=f"{rule_id}:{gpu}:{ts}", rule_id=rule_id,
                       title=rule.title if rule else rule_id, severity=severity, state=state,
                       gpu_id=gpu, process=process, shadow=shadow,
                       rule_kind=rule.kind if rule else "", **extra)


# --- the clauses -------------------------------------------------------------------------

def test_kind_and_explains_parse():
    [rule] = parse_rules('rule X {\n  title: "t"\n  kind: cause\n  explains: A_one, B_two\n'
                         '  when: gpu.util > 1\n}\n', "t.rules")
    assert (rule.kind, rule.kind_declared, rule.explains) == (CAUSE, True, ("A_one", "B_two"))
    [rule] = parse_rules('rule Y { title: "t" kind: symptom when: gpu.util > 1 }', "t.rules")
    assert (rule.kind, rule.explains) == (SYMPTOM, ())
    assert KINDS == (CAUSE, SYMPTOM)


def test_a_rule_without_kind_is_read_as_a_cause():
    [rule] = parse_rules('rule X { title: "t" when: gpu.util > 1 }', "t.rules")
    assert (rule.kind, rule.kind_declared, rule.explains) == (CAUSE, False, ())


def test_kind_is_still_a_name_inside_expressions():
    [rule] = parse_rules('rule X { title: "t" kind: cause\n  when: count(journal.nvrm where '
                         'kind == "gsp_timeout", 1m) >= 1 }', "t.rules")
    assert rule.kind == CAUSE


@pytest.mark.parametrize("source,message", [
    ('rule X { title: "t" kind: sympton when: gpu.util > 1 }',
     "t.rules:1:27: expected a kind: cause, symptom"),
    ('rule X { title: "t"\n  kind: "cause" when: gpu.util > 1 }',
     "t.rules:2:9: unexpected '\"cause\"'; expected a name"),
    ('rule X { title: "t" kind: cause kind: symptom when: gpu.util > 1 }',
     "t.rules:1:33: clause 'kind' given twice"),
    ('rule X { title: "t" explains: A, A when: gpu.util > 1 }',
     "t.rules:1:34: A listed twice in 'explains'"),
    ('rule X { title: "t" explains: X when: gpu.util > 1 }',
     "t.rules:1:31: rule X cannot explain itself"),
    ('rule X { title: "t" explains: A explains: B when: gpu.util > 1 }',
     "t.rules:1:33: clause 'explains' given twice"),
    ('rule X { title: "t" explains: A, when: gpu.util > 1 }',
     "t.rules:1:38: unexpected ':'; expected \",\", \"}\", a clause (title:, when:, ...)"),
    ('rule X { title: "t"\n  kind: symptom\n  explains: A\n  when: gpu.util > 1 }',
     "t.rules:3:3: a symptom explains nothing: write kind: cause, or drop 'explains:'"),
])
def test_bad_kind_or_explains_names_file_line_column(source, message):
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(source, "t.rules")
    assert str(error.value) == message


# --- lint --------------------------------------------------------------------------------

ADVICE = 'group: memory cause: "c" fix: "a" fix: "b" verify: "v"'


def test_lint_requires_kind_of_a_shipped_rule_only():
    [rule] = parse_rules(f'rule X {{ title: "t" {ADVICE} when: gpu.util > 1 }}', "x.rules")
    assert lint_rule(rule, SHIPPED, shipped=True) == ["x.rules:1: rule X: no 'kind:' (one of "
                                                      "cause, symptom)"]
    assert lint_rule(rule, SHIPPED) == []


def test_lint_flags_an_unknown_explains_id_but_not_a_cause_explaining_a_cause():
    # a cause may explain a cause it brings about (a failed GPU its peers' hang)
    [rule] = parse_rules(f'rule X {{ title: "t" {ADVICE} kind: cause explains: {BURSTY}, '
                         f'R99_nope, {STARVED} when: gpu.util > 1 }}', "x.rules")
    assert lint_rule(rule, SHIPPED, shipped=True) == [
        "x.rules:1: rule X: 'explains:' names no rule 'R99_nope'"]


def test_lint_command_notes_a_missing_kind_and_checks_explains_across_files(tmp_path):
    mine = tmp_path / "mine.rules"
    mine.write_text(f'rule M1 {{ title: "t" {ADVICE} when: gpu.util > 1 }}\n'
                    f'rule M2 {{ title: "t" {ADVICE} kind: symptom when: gpu.util > 2 }}\n')
    theirs = tmp_path / "theirs.rules"
    theirs.write_text(f'rule T1 {{ title: "t" {ADVICE} kind: cause explains: M2, {BURSTY} '
                      f'when: gpu.util > 3 }}\n')
    result = CliRunner().invoke(cli, ["rules", "lint", str(mine), str(theirs)])
    assert result.exit_code == 0, result.output
    assert f"{mine}:1: rule M1: note: no 'kind:', read as kind: cause" in result.output
    assert f"{theirs}: 1 rules OK" in result.output
    strict = CliRunner().invoke(cli, ["rules", "lint", "--strict", str(mine)])
    assert strict.exit_code == 1 and f"{mine}:1: rule M1: no 'kind:'" in strict.output
    theirs.write_text(f'rule T1 {{ title: "t" {ADVICE} kind: cause explains: M3 '
                      f'when: gpu.util > 3 }}\n')
    result = CliRunner().invoke(cli, ["rules", "lint", str(mine), str(theirs)])
    assert result.exit_code == 1
    assert f"{theirs}:1: rule T1: 'explains:' names no rule 'M3'" in result.output


def test_the_shipped_rule_files_lint_clean_as_shipped():
    from importlib import resources

    folder = str(resources.files("gpuwhy.rules") / "builtin")
    result = CliRunner().invoke(cli, ["rules", "lint", folder])
    assert result.exit_code == 0, result.output
    assert "note:" not in result.output


# --- the shipped rules -------------------------------------------------------------------

def test_every_shipped_rule_has_a_kind_and_explains_symptoms_or_the_causes_it_brings_about():
    from importlib import resources

    declared = sum(text.count("\nrule ") + text.startswith("rule ") for text in (
        f.read_text() for f in (resources.files("gpuwhy.rules") / "builtin").iterdir()
        if f.name.endswith(".rules")))
    assert len(SHIPPED) == declared >= 40     # every rule the files declare is loaded
    for rule in SHIPPED.values():
        assert rule.kind_declared and rule.kind in KINDS, rule.id
        assert lint_rule(rule, SHIPPED, shipped=True) == [], rule.id
        for explained in rule.explains:
            # a symptom, or a cause this one brings about (pageable copies -> the launch-
            # bound look, a failed GPU -> its peers' hang), never both ways round
            assert explained in SHIPPED and rule.id not in SHIPPED[explained].explains, \
                (rule.id, explained)
    symptoms = [r.id for r in SHIPPED.values() if r.kind == SYMPTOM]
    assert BURSTY in symptoms and STARVED not in symptoms
    for symptom in symptoms:   # every shipped symptom has a cause that can explain it
        assert any(symptom in r.explains for r in SHIPPED.values()), symptom


def test_the_host_starvation_causes_explain_the_utilisation_symptoms():
    for cause in (STARVED, "R02_input_io_bound", "R03_dataloader_synchronous"):
        assert {BURSTY, LOW} <= set(SHIPPED[cause].explains)
    for cause in ("R19_power_cap", "R12_tensor_cores_unused"):   # a busy GPU, slowed
        assert not {BURSTY, LOW} & set(SHIPPED[cause].explains)
    # a GPU off the bus explains any idle GPU, more of it than a starved loader does: it
    # outranks a starvation cause on the same GPU whatever their order
    assert {BURSTY, LOW} < set(SHIPPED["R32_xid79_fallen_off_bus"].explains)
    lost = finding("R32_xid79_fallen_off_bus", severity="critical", ts=300)
    starved = finding(STARVED, severity="warning", ts=100)
    symptom = finding(BURSTY, severity="warning", ts=50)
    assert top_answer([starved, symptom, lost], SHIPPED).finding is lost


# --- the answer --------------------------------------------------------------------------

@pytest.mark.parametrize("cause_first", [True, False])
def test_the_cause_is_the_answer_and_the_symptom_its_evidence_in_either_order(cause_first):
    cause = finding(STARVED, severity="warning", ts=200 if not cause_first else 100)
    symptom = finding(BURSTY, severity="warning", ts=100 if not cause_first else 200)
    ordered = [cause, symptom] if cause_first else [symptom, cause]
    top = top_answer(ordered, SHIPPED)
    assert top.finding is cause and top.kind == CAUSE and top.cause_established
    assert top.explained == (symptom.finding_id,)
    assert [a.finding for a in answers(ordered, SHIPPED)] == [cause]   # the symptom: evidence


def test_a_cause_beats_a_more_severe_symptom():
    cause = finding(STARVED, severity="info")
    symptom = finding("R27_allocated_but_idle", severity="error")
    assert top_answer([symptom, cause], SHIPPED).finding is cause
    assert rank_key(CAUSE, "info") < rank_key(SYMPTOM, "critical")
    assert rank_key(CAUSE, "warning", specificity=1) < rank_key(CAUSE, "critical")
    assert rank_key(CAUSE, "error") < rank_key(CAUSE, "warning")
    assert rank_key(CAUSE, "error", 0.9) < rank_key(CAUSE, "error", 0.5)


def test_a_cause_explaining_present_symptoms_ranks_first_then_severity():
    starved, capped = finding(STARVED, severity="warning"), finding("R19_power_cap",
                                                                     severity="error")
    bursty = finding(BURSTY)
    assert [a.finding for a in answers([capped, starved, bursty], SHIPPED)] == [starved, capped]
    assert [a.finding for a in answers([capped, starved], SHIPPED)] == [capped, starved]


def test_a_symptom_alone_says_its_cause_is_not_established_and_what_is_missing():
    symptom = finding(BURSTY)
    top = top_answer([symptom], SHIPPED)
    assert (top.finding, top.kind, top.cause_established, top.explained) == \
        (symptom, SYMPTOM, False, ())
    assert top.missing == tuple(missing_for(BURSTY, SHIPPED))
    assert f"{STARVED} not established: needs workers.cpu_demand, workers.count, " \
           "proc.sleep_frac" in top.missing
    assert len(top.missing) == len([r for r in SHIPPED.values() if BURSTY in r.explains])
    told = finding(BURSTY, unexplained=[f"{STARVED}: needs workers.cpu_cores (no samples)"])
    assert top_answer([told], SHIPPED).missing == (f"{STARVED}: needs workers.cpu_cores "
                                                    "(no samples)",)


def test_a_cause_that_does_not_explain_the_symptom_leaves_it_unestablished():
    capped, bursty = finding("R19_power_cap", severity="error"), finding(BURSTY)
    found = answers([bursty, capped], SHIPPED)
    assert [(a.finding, a.cause_established) for a in found] == [(capped, True),
                                                                 (bursty, False)]
    assert found[0].explained == ()


def test_findings_on_two_gpus_are_ranked_per_gpu():
    gpu0 = [finding(BURSTY, GPU0), finding(STARVED, GPU0)]
    gpu1 = [finding(LOW, GPU1), finding("R04_launch_bound", GPU1, severity="info"),
            finding("R20_thermal_throttle", GPU1, severity="error")]
    grouped = answers_by_gpu(gpu0 + gpu1, SHIPPED)
    assert set(grouped) == {GPU0, GPU1}
    assert [a.rule_id for a in grouped[GPU0]] == [STARVED]
    assert [a.rule_id for a in grouped[GPU1]] == ["R04_launch_bound", "R20_thermal_throttle"]
    assert grouped[GPU1][0].explained == (gpu1[0].finding_id,)
    assert top_answer(gpu0 + gpu1, SHIPPED, gpu_id=GPU1).rule_id == "R04_launch_bound"
    assert top_answer(gpu0 + gpu1, SHIPPED, gpu_id="GPU-none") is None


def test_a_symptom_on_gpu1_is_never_explained_by_a_cause_on_gpu0():
    cause, symptom = finding(STARVED, GPU0), finding(BURSTY, GPU1)
    grouped = answers_by_gpu([cause, symptom], SHIPPED)
    assert grouped[GPU0][0].explained == ()
    [alone] = grouped[GPU1]
    assert (alone.finding, alone.cause_established) == (symptom, False)
    assert top_answer([cause, symptom], SHIPPED, gpu_id=GPU1).finding is symptom


def test_a_process_cause_explains_the_gpu_symptom_of_its_gpu():
    env = finding("R08_debug_or_limiting_env", process=OTHER)
    low = finding(LOW, process=TRAINER)
    assert top_answer([low, env], SHIPPED).explained == (low.finding_id,)


def test_cleared_and_shadow_findings_are_no_answer():
    assert top_answer([finding(STARVED, state="cleared"), finding(BURSTY, shadow=True)],
                      SHIPPED) is None
    bursty = finding(BURSTY)
    [only] = answers([finding(STARVED, shadow=True), bursty], SHIPPED)
    assert (only.finding, only.cause_established) == (bursty, False)
    assert top_answer([], SHIPPED) is None


def test_findings_of_rules_not_loaded_use_what_the_finding_says():
    cause = RuleFinding(ts=1, finding_id="c", rule_id="MY_cause", title="t", severity="info",
                        state="firing", gpu_id=GPU0, rule_kind=CAUSE, explains=["MY_symptom"])
    symptom = RuleFinding(ts=1, finding_id="s", rule_id="MY_symptom", title="t",
                          severity="error", state="firing", gpu_id=GPU0, rule_kind=SYMPTOM)
    old = RuleFinding(ts=1, finding_id="o", rule_id="OLD", title="t", severity="warning",
                      state="firing", gpu_id=GPU0)   # an older sender: no kind, a cause
    found = answers([symptom, old, cause], {})
    assert [(a.finding.finding_id, a.kind, a.explained) for a in found] == \
        [("c", CAUSE, ("s",)), ("o", CAUSE, ())]


# --- across GPUs, and a cause a cause brings about ----------------------------------------

def test_a_failed_gpu_not_its_peers_collective_hang_is_the_answer():
    # GPU 0 fell off the bus (Xid 79); its peers of the same job wait in the all-reduce
    lost = finding("R32_xid79_fallen_off_bus", GPU0, "critical", process=TRAINER)
    hung = [finding("R17_collective_hang", gpu, "critical", process=OTHER, ts=2)
            for gpu in (GPU1, "GPU-2222")]
    ranked = answers([*hung, lost], SHIPPED)
    assert [a.rule_id for a in ranked] == ["R32_xid79_fallen_off_bus"]
    assert set(ranked[0].explained) == {h.finding_id for h in hung}
    assert top_answer([*hung, lost], SHIPPED).rule_id == "R32_xid79_fallen_off_bus"
    # without the failure, each hang is its own answer; a failure never explains another
    # GPU's own kind of trouble (host starvation is per GPU)
    assert [a.rule_id for a in answers(hung, SHIPPED)] == ["R17_collective_hang"] * 2
    starved = finding(STARVED, GPU1, "warning", ts=3)
    assert {a.rule_id for a in answers([lost, starved], SHIPPED)} == {
        "R32_xid79_fallen_off_bus", STARVED}


def test_causes_that_explain_each_other_both_stay():
    rules = {r.id: r for r in parse_rules(
        f'rule A {{ title: "a" {ADVICE} kind: cause explains: B scope: gpu when: gpu.util > 1 }}'
        f'rule B {{ title: "b" {ADVICE} kind: cause explains: A scope: gpu when: gpu.util > 1 }}',
        "ab.rules")}
    both = [finding("A", severity="warning"), finding("B", severity="warning", ts=2)]
    assert sorted(a.rule_id for a in answers(both, rules)) == ["A", "B"]


def test_a_cause_that_cleared_inside_a_symptoms_window_still_answers_for_it():
    # R25 (memory nearly full) held until the job died of OOM at t=560; the GPU's bursty
    # window (R14, evaluated over 100..700) is made of that job's samples: R25 answers.
    fb_full = "R25_fb_near_full"
    assert BURSTY in SHIPPED[fb_full].explains
    cleared = finding(fb_full, state="cleared", ts=560)
    bursty = finding(BURSTY, ts=700, window_start=100, window_end=700)
    [top] = answers([cleared, bursty], SHIPPED)
    assert (top.rule_id, top.kind, top.held_until, top.explained) == \
        (fb_full, CAUSE, 560, (bursty.finding_id,))
    # ... never on its own, nor for a symptom whose window began after it cleared
    assert answers([cleared], SHIPPED) == []
    late = finding(BURSTY, ts=1300, window_start=600, window_end=1300)
    [alone] = answers([cleared, late], SHIPPED)
    assert (alone.rule_id, alone.cause_established) == (BURSTY, False)
    # a cause firing now ranks before one that held earlier, whatever they explain
    starved = finding(STARVED, ts=690)
    assert [a.rule_id for a in answers([cleared, bursty, starved], SHIPPED)] == \
        [STARVED, fb_full]
