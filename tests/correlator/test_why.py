"""`gpuwhy why`: the one answer per GPU (gpuwhy.rules.answer.verdicts), read from a store the
real correlator wrote, and the pure function's choices between the health state and the
rules' findings."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import GpuFacts, ranks_lower, sentence, verdicts
from gpuwhy.rules.loader import load_rules

SHIPPED = {rule.id: rule for rule in load_rules()}
TRAINER = ProcessKey(4242, 1000)
STARVED, BURSTY = "R01_input_cpu_bound", "R14_bursty_utilisation"
XID79 = "R32_xid79_fallen_off_bus"
S = 1_000_000_000


def finding(rule_id: str, gpu: str = "G0", state: str = "firing", ts: int = 100 * S,
            severity: str | None = None) -> RuleFinding:
    rule = SHIPPED[rule_id]
    return RuleFinding(ts=ts, finding_id=f"{rule_id}:{gpu}", rule_id=rule_id, title=rule.title,
                       severity=severity or rule.severity, state=state, gpu_id=gpu,
                       process=TRAINER, rule_kind=rule.kind, group=rule.group,
                       window_start=ts - rule.window_ns, window_end=ts, since=ts,
                       fixes=["raise num_workers"], explains=list(rule.explains))


def run(env: dict, *args: str):
    return CliRunner().invoke(cli, ["why", *args], env=env)


# --- the pure function ---------------------------------------------------------------------

def test_a_lost_gpu_is_the_answer_after_its_rule_has_cleared():
    lost = GpuFacts("G0", index=0, model="H100", pci="0000:18:00.0", health="lost",
                    health_since=50 * S, health_cause="xid 79")
    # R32 saw the Xid line for a minute and cleared; a starved loader fires on the same GPU
    found = [finding(XID79, state="cleared", ts=60 * S), finding(STARVED)]
    [verdict] = verdicts([lost], found, SHIPPED)
    assert verdict.lead.finding.rule_id == XID79 and verdict.lead.held_until == 60 * S
    assert verdict.severity == "critical" and not verdict.health_leads
    # a failure finding that cleared before the GPU entered its state is another story
    earlier = [finding(XID79, state="cleared", ts=40 * S), finding(STARVED)]
    [verdict] = verdicts([lost], earlier, SHIPPED)
    assert verdict.health_leads and verdict.lead is None
    assert verdict.severity == "critical"
    line = sentence(verdict, utc=True)
    assert line.startswith("GPU 0 · H100 · 0000:18:00.0 — [critical] lost")
    assert "Xid 79" in line and "reboot" in line      # the catalogue's action


def test_a_failure_finding_speaks_for_the_health_state():
    lost = GpuFacts("G0", index=0, health="lost", health_since=50 * S, health_cause="xid 79")
    [verdict] = verdicts([lost], [finding(STARVED), finding(XID79)], SHIPPED)
    assert not verdict.health_leads
    assert verdict.lead.finding.rule_id == XID79      # not the starved loader, ranked first
    assert verdict.severity == "critical"


def test_the_cause_leads_with_the_symptoms_it_explains_and_worst_gpu_first():
    gpus = [GpuFacts("G0", index=0), GpuFacts("G1", index=1, health="degraded",
                                                health_cause="throttling")]
    found = [finding(STARVED, "G0"), finding(BURSTY, "G0")]
    first, second = verdicts(gpus, found, SHIPPED)
    # G1 degraded (warning) and G0 starved (warning): the GPU's own state first
    assert (first.gpu.gpu_id, second.gpu.gpu_id) == ("G1", "G0")
    assert first.health_leads and "degraded (throttling)" in sentence(first)
    assert second.lead.finding.rule_id == STARVED
    assert second.explains == (SHIPPED[BURSTY].title,)
    assert "explains " + SHIPPED[BURSTY].title[:1].lower() in sentence(second)
    worst = verdicts(gpus + [GpuFacts("G2", index=2, health="reset_required",
                                      health_cause="xid 48")], found, SHIPPED)
    assert [v.gpu.gpu_id for v in worst] == ["G2", "G1", "G0"]
    # between two rule answers of one severity, a cause ranks before a lone symptom
    two = verdicts([GpuFacts("G0", index=0), GpuFacts("G1", index=1)],
                   [finding(BURSTY, "G0"), finding(STARVED, "G1")], SHIPPED)
    assert [v.gpu.gpu_id for v in two] == ["G1", "G0"]


def test_healthy_gpus_and_gpus_known_only_from_a_finding():
    [named, healthy] = verdicts([GpuFacts("G0", index=0)], [finding(STARVED, "G9")], SHIPPED)
    assert named.gpu.gpu_id == "G9" and named.lead is not None      # worst first
    assert healthy.healthy and sentence(healthy).endswith("— healthy")


def test_why_a_candidate_ranks_lower():
    [verdict] = verdicts([GpuFacts("G0")], [finding(STARVED), finding(XID79)], SHIPPED)
    [other] = [a for a in verdict.candidates if a is not verdict.lead]
    assert other.finding.rule_id == STARVED
    assert ranks_lower(other, verdict.lead) == "less severe (warning against critical)"


# --- the command, on a store the real correlator wrote --------------------------------------

def _env(config) -> dict:
    return {"GPUWHY_DB": config["store.path"]}


def test_why_reads_a_lost_gpu_from_the_kernel_log(harness):
    harness.feed(harness.gpu(0))
    harness.feed(harness.xid(5, 79, pid=4242, name="python"))
    env = _env(harness.config)
    result = run(env)
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith("GPU 0 · 0000:18:00.0 — [critical] lost")
    assert "Xid 79: GPU has fallen off the bus" in line
    detail = run(env, "0000:18:00.0")
    assert detail.exit_code == 1
    assert "health     lost since" in detail.output and "clears on" in detail.output
    as_json = json.loads(run(env, "--json").output)
    [verdict] = as_json["verdicts"]
    assert (verdict["severity"], verdict["health_leads"]) == ("critical", True)
    assert verdict["gpu"]["health_cause"] == "xid 79"
    # before the Xid line the GPU was healthy: --at reads the health history
    before = run(env, "--at", str(harness.at(3)))
    assert (before.exit_code, before.output.strip()) == (0, "all 1 GPU healthy")


def test_why_reads_the_rules_answer_and_names_a_process(harness):
    harness.feed(harness.gpu(0))
    uuid = harness.gpu(0).gpu_id
    t = harness.at(30)
    for rule_id in (STARVED, BURSTY):
        rule = SHIPPED[rule_id]
        harness.feed(RuleFinding(
            ts=t, finding_id=f"{rule_id}:{uuid}:-:{t}", rule_id=rule_id, title=rule.title,
            severity="warning", state="firing", gpu_id=uuid, process=TRAINER,
            window_start=t - rule.window_ns, window_end=t, evidence={"workers_cpu": 0.97},
            fixes=["Raise num_workers"], verify="gpu.util rises", group=rule.group, since=t,
            processes=[TRAINER], rule_kind=rule.kind, explains=list(rule.explains)))
    env = _env(harness.config)
    result = run(env)
    assert result.exit_code == 1
    assert f"— [warning] {SHIPPED[STARVED].title}; explains " in result.output
    assert "fix: Raise num_workers" in result.output
    detail = run(env, str(TRAINER))
    assert detail.exit_code == 1
    assert f"rule       {STARVED} (cause, warning)" in detail.output
    assert "workers CPU: 0.97" in detail.output and "verify     gpu.util rises" in detail.output


def test_why_says_what_is_wrong_with_its_environment(tmp_path, harness):
    missing = run({"GPUWHY_DB": str(tmp_path / "none.db")})
    assert missing.exit_code == 2 and "no gpuwhy store at" in missing.output
    harness.feed(harness.gpu(0))
    env = _env(harness.config)
    healthy = run(env)
    assert (healthy.exit_code, healthy.output.strip()) == (0, "all 1 GPU healthy")
    unknown = run(env, "7")
    assert unknown.exit_code == 2 and "no GPU known as 7" in unknown.output
    bad = run(env, "--at", "yesterday-ish")
    assert bad.exit_code == 2


def test_the_journal_alert_carries_the_answer(harness):
    from gpuwhy.correlator.alerts import Alerter

    harness.feed(harness.gpu(0))
    harness.feed(harness.xid(5, 79, pid=4242, name="python"))
    [lost] = harness.incidents("gpu_lost") or harness.incidents("xid")
    sent: list[dict] = []
    alerter = Alerter(harness.config["correlator.url"], settings=harness.config,
                      send=lambda message, **fields: sent.append(fields))
    assert alerter.alert(harness.db, [lost["id"]]) == [lost["id"]]
    [fields] = sent
    assert fields["GPUWHY_ANSWER"].startswith("GPU 0 · 0000:18:00.0 — [critical] lost")
    assert fields["GPUWHY_ANSWER_RULE"] == "health:lost"
    # an alerter that knows no rules (no settings) sends the alert without an answer
    bare: list[dict] = []
    Alerter(harness.config["correlator.url"], send=lambda message, **f: bare.append(f)).alert(
        harness.db, [lost["id"]])
    assert "GPUWHY_ANSWER" not in bare[0]
