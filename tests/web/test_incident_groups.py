"""Severity at a glance in the incident list: like incidents on several GPUs of the host are
one row ("×4 GPUs") that opens to each; the severity in words and colour on every row."""

from __future__ import annotations

import re

from gpuwhy.events import GpuSeen, RuleFinding
from gpuwhy.rules.loader import load_rules

from .test_answers import S, _page, _store

THERMAL = {r.id: r for r in load_rules()}["R20_thermal_throttle"]
UUIDS = [f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd" for n in range(5)]
PCIS = [f"0000:2{n}:00.0" for n in range(5)]


def _thermal(t: int, gpu: str, title: str = THERMAL.title) -> RuleFinding:
    return RuleFinding(ts=t, finding_id=f"{THERMAL.id}:{gpu}", rule_id=THERMAL.id, title=title,
                       severity="warning", state="firing", gpu_id=gpu,
                       rule_kind=THERMAL.kind, group=THERMAL.group, window_start=t - 60 * S,
                       window_end=t, since=t)


def test_four_like_incidents_on_four_gpus_are_one_row_that_opens(tmp_path):
    def events(t0):
        seen = [GpuSeen(ts=t0, gpu_id=u, source="sim", simulated=True, uuid=u, pci_bus_id=p,
                        index=n, minor=n) for n, (u, p) in enumerate(zip(UUIDS, PCIS,
                                                                          strict=True))]
        return [*seen, *[_thermal(t0 + (10 + n) * S, u) for n, u in enumerate(UUIDS[:4])],
                _thermal(t0 + 20 * S, UUIDS[4], "Something else <b>entirely</b>")]

    store = _store(tmp_path, "groups", events)
    listed = store.client.get("/api/incidents").get_json()
    assert len([i for i in listed if i["title"] == THERMAL.title]) == 4   # the API: each
    html = _page(store.client, "/incidents")
    body = html[html.index("<tbody>"):html.index("</tbody>")]
    rows = re.findall(r"<tr class=\"sev-[^\"]*\".*?</tr>", body, re.S)
    assert len(rows) == 2, rows
    group = next(r for r in rows if THERMAL.title in r)
    assert 'class="sev-warning group"' in group and 'data-members="4"' in group
    assert "×4 GPUs" in group and "<details" in group
    for uuid in UUIDS[:4]:
        assert uuid in group                      # each, behind the row's details
    assert UUIDS[4] not in group
    lone = next(r for r in rows if r is not group)
    assert "group" not in lone.split(">")[0] and "&lt;b&gt;entirely" in lone
    # the severity in words, with its mark, on both rows
    assert all("> warning</span>" in r and "sev-mark" in r for r in rows)
