"""The answer leads where a person looks: the overview's cards in the answer's order (worst
first), each opening with its sentence and severity; the GPU page opening with the answer, its
evidence, fixes, check and the candidates that rank lower; /api/answers and
/api/gpus/<id>/answer. Over a store the real correlator wrote: GPU 1 fell off the bus
(Xid 79, lost), GPU 0's loader starves it, GPU 2 is fine; and a store whose last sample is
old (its numbers greyed and dated)."""

from __future__ import annotations

import re
import types

import pytest

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import load_config
from gpuwhy.events import GpuSample, GpuSeen, KernelLogRecord, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules
from gpuwhy.webui import create_app

from .conftest import arrive

S = NS_PER_SECOND
STARVED = "R01_input_cpu_bound"
SHIPPED = {r.id: r for r in load_rules()}
TRAINER = ProcessKey(4242, 1000)
UUIDS = [f"GPU-0000000{n}-1111-2222-3333-444444444444" for n in range(3)]
PCIS = ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0"]
EVIL = "<script>alert('fix')</script>"


def _gpus(t: int) -> list:
    return [GpuSeen(ts=t, gpu_id=u, source="sim", simulated=True, uuid=u, pci_bus_id=p,
                    index=n, minor=n, model="H100 80GB HBM3")
            for n, (u, p) in enumerate(zip(UUIDS, PCIS, strict=True))]


def _samples(t: int, seconds: int) -> list:
    return [GpuSample(ts=t + s * S, gpu_id=u, source="sim", simulated=True,
                      fields={"gpu_util": 0.0 if n == 0 else 97.0, "sm_active": 0.5,
                              "temp_c": 61.0, "power_w": 300.0})
            for s in range(seconds) for n, u in enumerate(UUIDS)]


def _starved(t: int) -> RuleFinding:
    rule = SHIPPED[STARVED]
    return RuleFinding(ts=t, finding_id=f"{STARVED}:{UUIDS[0]}", rule_id=STARVED,
                       title=rule.title, severity="warning", state="firing", gpu_id=UUIDS[0],
                       process=TRAINER, rule_kind=rule.kind, group=rule.group,
                       window_start=t - 60 * S, window_end=t, since=t - 30 * S,
                       evidence={"gpu_busy": 0.31, "idle_share": 0.55, "workers": 4},
                       root_cause="The DataLoader workers are busy all the time.",
                       fixes=["Raise num_workers", EVIL], verify="GPU busy share above 0.8",
                       explains=list(rule.explains))


def _xid79(t: int) -> KernelLogRecord:
    line = "NVRM: Xid (PCI:0000:19:00): 79, pid=77, name=python, GPU has fallen off the bus."
    return KernelLogRecord(ts=t, cursor="k79", origin="journald", boot_id="b",
                           record_kind="xid", message=line[6:], xid=79, pci="0000:19:00",
                           pid=77, name="python", line=line)


def _store(tmp_path, name: str, events_at) -> types.SimpleNamespace:
    directory = tmp_path / name
    directory.mkdir()
    # a sample every 20 s: live for a minute, whatever this machine's pace
    config = load_config(environ={"GPUWHY_DB": str(directory / "gpuwhy.db"),
                                  "GPUWHY_BUS": f"ipc://{directory}/bus.sock",
                                  "GPUWHY_GPU_INTERVAL": "20"})
    t0 = now_ns() - 40 * S
    arrive(config, events_at(t0), config["bus.endpoint"], event_time=True)
    app = create_app(config, {"TESTING": True})
    return types.SimpleNamespace(config=config, t0=t0, client=app.test_client())


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """GPU 1 lost (Xid 79), GPU 0 starved by its loader, GPU 2 healthy; samples to now."""
    return _store(tmp_path_factory.mktemp("answers"), "host", lambda t0: [
        *_gpus(t0), *_samples(t0, 40), _starved(t0 + 35 * S), _xid79(t0 + 36 * S)])


def _page(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.data[:300])
    return response.get_data(as_text=True)


def _cards(html: str) -> list[tuple[str, str]]:
    """(GPU id, the card's HTML) in page order."""
    parts = re.split(r'(?=<section class="card)', html)[1:]
    return [(re.search(r'data-gpu="([^"]+)"', p).group(1), p) for p in parts]


def test_the_overview_orders_the_cards_worst_first_each_opening_with_its_answer(host):
    cards = _cards(_page(host.client, "/"))
    assert [gpu for gpu, _ in cards] == [UUIDS[1], UUIDS[0], UUIDS[2]]
    lost, starved, fine = (html for _, html in cards)
    # the answer's sentence and its severity in words, before the card's numbers
    assert 'data-severity="critical"' in lost and "sev-mark" in lost
    assert lost.index("lost: it no longer answers") < lost.index('class="metrics')
    assert "Xid 79" in lost and "> critical</span>" in lost
    assert "DataLoader workers cannot keep up" in starved and "Raise num_workers" in starved
    assert 'data-severity="warning"' in starved
    assert 'data-severity="ok"' in fine and '<span class="sentence">healthy</span>' in fine
    # the fix is the finding's text: escaped, never markup
    assert EVIL not in starved


def test_the_gpu_page_opens_with_the_answer_evidence_fixes_check_and_candidates(host):
    html = _page(host.client, f"/gpus/{UUIDS[0]}")
    answer = html[html.index('id="answer"'):html.index('id="health"')]
    assert html.index('id="answer"') < html.index('id="gpu-page"')     # before the charts
    assert "DataLoader workers cannot keep up" in answer and "since" in answer
    assert 'id="answer-severity"' in answer and "warning</span>" in answer
    assert "The DataLoader workers are busy all the time." in answer
    # evidence in plain words and units: fractions as percentages, not 0.31
    evidence = answer[answer.index('id="answer-evidence"'):answer.index('id="answer-fixes"')]
    assert "31" in evidence and "%" in evidence and "0.31" not in evidence
    assert "Raise num_workers" in answer and "&lt;script&gt;" in answer and EVIL not in answer
    assert "GPU busy share above 0.8" in answer
    lost = _page(host.client, f"/gpus/{UUIDS[1]}")
    box = lost[lost.index('id="answer"'):lost.index('id="health"')]
    assert "lost: it no longer answers" in box or "fallen off the bus" in box.lower()
    assert "critical" in box


def test_the_other_candidates_say_why_each_ranks_lower(tmp_path):
    """A lesser cause on the same GPU is listed under the answer, with why it ranks lower;
    the symptom the answer explains is named as explained."""
    bursty, tensor = SHIPPED["R14_bursty_utilisation"], SHIPPED["R12_tensor_cores_unused"]

    def finding(rule, t):
        return RuleFinding(ts=t, finding_id=f"{rule.id}:{UUIDS[0]}", rule_id=rule.id,
                           title=rule.title, severity=rule.severity, state="firing",
                           gpu_id=UUIDS[0], process=TRAINER, rule_kind=rule.kind,
                           group=rule.group, window_start=t - 60 * S, window_end=t,
                           since=t - 10 * S, explains=list(rule.explains))

    def events(t0):
        t = t0 + 35 * S
        return [*_gpus(t0), *_samples(t0, 40), _starved(t), finding(bursty, t),
                finding(tensor, t)]

    store = _store(tmp_path, "candidates", events)
    html = _page(store.client, f"/gpus/{UUIDS[0]}")
    assert bursty.title in html[html.index('id="answer-explains"'):]
    table = html[html.index('id="answer-candidates"'):]
    assert tensor.title in table and "explains 0 present symptom(s), the answer 1" in table
    data = store.client.get(f"/api/gpus/{UUIDS[0]}/answer").get_json()
    assert [(c["rule_id"], c["ranks_lower"]) for c in data["candidates"]] == [
        (STARVED, None), (tensor.id, "explains 0 present symptom(s), the answer 1")]


def test_the_answer_apis(host):
    answers = host.client.get("/api/answers").get_json()
    assert [a["gpu"]["id"] for a in answers] == [UUIDS[1], UUIDS[0], UUIDS[2]]
    assert [a["severity"] for a in answers] == ["critical", "warning", None]
    assert answers[1]["lead"]["rule_id"] == STARVED and answers[2]["healthy"]
    assert answers[0]["sentence"].startswith("GPU 1 · H100 80GB HBM3")
    one = host.client.get(f"/api/gpus/{UUIDS[0]}/answer")
    assert one.status_code == 200 and one.get_json() == answers[1]
    missing = host.client.get("/api/gpus/GPU-nope/answer")
    assert missing.status_code == 404 and "GPU-nope" in missing.get_data(as_text=True)


def test_live_numbers_carry_their_age_and_old_ones_are_greyed(host, tmp_path):
    # fresh: the last sample is about a second old (the store's samples run to now)
    fine = dict(_cards(_page(host.client, "/")))[UUIDS[2]]
    assert 'class="small sample-age"' in fine and '<dl class="metrics">' in fine
    gpus = {g["id"]: g for g in host.client.get("/api/gpus").get_json()}
    assert gpus[UUIDS[2]]["freshness"]["stale"] is False
    # a store whose last sample is ten minutes old: greyed, dated, said
    old = _store(tmp_path, "old", lambda t0: [*_gpus(t0 - 600 * S),
                                              *_samples(t0 - 600 * S, 5)])
    card = dict(_cards(_page(old.client, "/")))[UUIDS[2]]
    assert '<dl class="metrics stale">' in card and "sample-age old" in card
    assert "no live numbers" in card and re.search(r"1[01] min</span> ago", card)
    assert "97 %" in card                         # the last value, shown greyed
    page = _page(old.client, f"/gpus/{UUIDS[2]}")
    assert 'class="sample-age old"' in page and "No live numbers" in page
    assert old.client.get("/api/gpus").get_json()[0]["freshness"]["stale"] is True
