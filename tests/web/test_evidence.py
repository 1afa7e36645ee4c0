"""The evidence formatter (webui/evidence.py) and its template (_evidence.html): each key's
value with its unit, times as UTC instants, incidents, processes and GPUs as links to their
pages at the step's moment, unknown keys as compact text (never JSON), untrusted text
escaped; and every shipped rule's evidence names read with the unit their expression has."""

from __future__ import annotations

import re

import pytest
from flask import render_template_string

from gpuwhy.config import load_config
from gpuwhy.rules import model as m
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.vocabulary import FACTS, SIGNALS
from gpuwhy.text import format_ts
from gpuwhy.webui import create_app
from gpuwhy.webui.evidence import (
    Row,
    compact,
    detail_rows,
    duration,
    evidence_rows,
    quantity,
)
from gpuwhy.webui.filters import instant

from .conftest import EVIL_NAME

T = 1_700_000_000_123_456_789          # 2023-11-14 22:13:20.123 UTC
GPU = "GPU-fd3c38a9-20ad-41f2-b1b4-80204658b8a7"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    path = tmp_path_factory.mktemp("evidence") / "gpuwhy.db"
    return create_app(load_config(environ={"GPUWHY_DB": str(path)}), {"TESTING": True})


@pytest.fixture
def ctx(app):
    with app.test_request_context():
        yield


def by_key(rows: list[Row]) -> dict[str, Row]:
    return {r.key: r for r in rows}


# --- units ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "shown"), [
    ("gpu_idle_share", 0.55, "55%"),
    ("sync_frac", 0.042, "4.2%"),
    ("sm_active", 0.1234, "12%"),              # a ratio by name (mean(gpu.sm_active))
    ("p95_util", 0.9, "90%"),
    ("h2d_Bps", 2_500_000_000, "2.5 GB/s"),
    ("workers_received_Bps", 1500, "1.5 kB/s"),
    ("thermal_violation_ns", 2_500_000_000, "2.5 s"),
    ("power_violation_ns", 190 * 10**9, "3 min 10 s"),
    ("latency_ns", 850, "850 ns"),
    ("fb_used_mib", 30000, "30,000 MiB"),
    ("power_w", 287.4, "287 W"),
    ("temp_c", 83, "83 °C"),
    ("sm_clock_mhz", 1410, "1,410 MHz"),
    ("launches_per_s", 12345.6, "12,346/s"),
    ("alloc_rate", 3.5, "3.5/s"),
    ("main_cores", 0.98, "0.98 cores"),
    ("workers", 4.0, "4"),                     # a count: no unit
    ("util_zscore", -2.345, "-2.35"),          # a z-score of a ratio is no ratio
])
def test_numbers_carry_the_unit_their_name_says(key, value, shown):
    assert quantity(key, value) == shown


def test_identifiers_codes_and_flags_are_written_as_they_are(ctx):
    rows = by_key(evidence_rows({"start_time": 123456789, "exit_code": 137, "signal": 9,
                                 "fabric_state": 3, "gpu_reset": False, "reboot": True,
                                 "ancestry_depth": 1}))
    assert rows["start_time"].text == "123456789" and rows["exit_code"].text == "137"
    assert rows["fabric_state"].text == "3 (Success)"
    assert (rows["gpu_reset"].name, rows["gpu_reset"].text) == ("needs a GPU reset", "no")
    assert rows["reboot"].text == "yes"


def test_durations_take_the_unit_that_keeps_them_readable():
    assert [duration(ns) for ns in (999, 12_500, 3_200_000, 4_250_000_000, 7_500 * 10**9)] \
        == ["999 ns", "12.5 µs", "3.2 ms", "4.25 s", "2 h 5 min"]


# --- times -----------------------------------------------------------------------------------

def test_times_are_instants_written_by_the_one_formatter(ctx):
    rows = evidence_rows({"since": T, "window_start": T - 50 * 10**9, "window_end": T,
                          "ts": T, "opened_at": T})
    since, window, ts, opened = rows
    assert (since.name, since.parts[0].ns, since.text) == (
        "condition held since", T, format_ts(T, utc=True))
    assert window.name == "evaluated over"
    assert window.text == f"{format_ts(T - 50 * 10**9, utc=True)} – " \
                          f"{format_ts(T, utc=True)} (50 s)"
    assert [p.ns for p in window.parts[:2]] == [T - 50 * 10**9, T]
    assert ts.parts[0].ns == opened.parts[0].ns == T
    assert ts.text == "2023-11-14 22:13:20.123 UTC"


def test_the_instant_filter_is_a_time_tag_with_the_utc_text():
    assert str(instant(T)) == ('<time datetime="2023-11-14T22:13:20.123Z" '
                               'data-ns="1700000000123456789">2023-11-14 22:13:20.123 UTC</time>')
    assert str(instant(None)) == "-"


# --- links -----------------------------------------------------------------------------------

def test_incidents_processes_and_gpus_link_to_their_page_at_that_moment(ctx):
    rows = by_key(evidence_rows(
        {"incident": 2, "cause_incident": 7, "incidents": [3, 4], "pid": 301,
         "start_time": 2001, "processes": ["4242-1000", {"pid": 5151, "start_time": 1100}],
         "gpu_bindings": ["4242-1000"], "gpu_id": GPU}, at=T))
    assert [(p.text, p.href) for p in rows["incident"].parts] == [("incident 2", "/incidents/2")]
    assert rows["cause_incident"].parts[0].href == "/incidents/7"
    assert [p.href for p in rows["incidents"].parts] == ["/incidents/3", "/incidents/4"]
    assert rows["incidents"].text == "incident 3, incident 4"
    # a pid and its start time are one process
    assert "start_time" not in rows and rows["pid"].name == "process"
    assert [(p.text, p.href) for p in rows["pid"].parts] == [
        ("process 301-2001", f"/processes/301-2001?at={T}")]
    assert [p.href for p in rows["processes"].parts] == [
        f"/processes/4242-1000?at={T}", f"/processes/5151-1100?at={T}"]
    assert rows["gpu_bindings"].parts[0].href == f"/processes/4242-1000?at={T}"
    assert rows["gpu_id"].parts[0].href == f"/gpus/{GPU}?at={T}&range=15m"


def test_a_bare_pid_links_to_the_process_the_evidence_is_about(ctx):
    about = evidence_rows({"kernel_log_pid": 5151, "pid": 5151}, at=T, pid=5151,
                          start_time=1100)
    assert [r.parts[0].href for r in about] == [f"/processes/5151-1100?at={T}"] * 2
    other = evidence_rows({"ppid": 300}, at=T, pid=5151, start_time=1100)
    assert (other[0].text, other[0].parts[0].href) == ("300", None)   # no start time known


def test_stored_event_ids_open_the_process_event_list_at_that_moment(ctx):
    [row] = evidence_rows({"events": [4]}, at=T, pid=301, start_time=2001)
    assert (row.text, row.parts[0].href) == ("#4", f"/processes/301-2001?at={T}#events")
    [row] = evidence_rows({"driver_calls": [1, 2]})       # no process: text only
    assert row.text == "#1, #2" and row.parts[0].href is None


def test_without_a_linker_nothing_is_linked():
    rows = evidence_rows({"incident": 2, "pid": 1, "start_time": 2}, link=None)
    assert [r.text for r in rows] == ["incident 2", "process 1-2"]
    assert all(p.href is None for r in rows for p in r.parts)


# --- a rule finding's evidence -------------------------------------------------------------

def test_a_findings_measured_values_fixes_and_mig_instance(ctx):
    rows = evidence_rows({
        "evidence": {"gpu_idle_share": 0.55, "h2d_Bps": 1.2e9, "note": EVIL_NAME},
        "fixes": ["Raise num_workers", "Use pin_memory=True"], "explains": ["R02", "R03"],
        "unexplained": [], "group": "", "instance": "9", "mig_profile": "1g.10gb",
        "rule_id": "R02_input_io_bound", "root_cause": "Workers block on I/O."})
    assert [r.key for r in rows][:5] == ["rule_id", "instance", "evidence", "root_cause",
                                         "fixes"]
    found = by_key(rows)
    assert found["instance"].text == "MIG instance 9 (1g.10gb)"
    assert "mig_profile" not in found and "unexplained" not in found and "group" not in found
    measured = by_key(found["evidence"].rows)
    assert measured["gpu_idle_share"].text == "55%" and measured["h2d_Bps"].text == "1.2 GB/s"
    assert found["fixes"].lines and [p.text for p in found["fixes"].parts] == [
        "Raise num_workers", "Use pin_memory=True"]
    assert found["explains"].text == "R02, R03"


def test_a_whole_gpu_finding_names_no_instance(ctx):
    assert evidence_rows({"instance": "", "mig_profile": "", "rule_id": "R1"})[0].key == \
        "rule_id"
    assert len(evidence_rows({"instance": "", "mig_profile": "", "rule_id": "R1"})) == 1


# --- unknown keys, events' bodies ---------------------------------------------------------

def test_unknown_keys_are_compact_text_never_json(ctx):
    rows = by_key(evidence_rows({"cron_runs": ["cron-1", "cron-2"],
                                 "labels": {"team": "a", "quote": "it's"},
                                 "nested": [{"a": 1}, {"b": [1, 2]}],
                                 "ratio_of_things": None, "flag": True, "count": 12000}))
    assert rows["cron_runs"].text == "cron-1, cron-2"
    assert rows["labels"].text == "team=a, quote=it's"
    assert rows["nested"].text == "a=1, b=1, 2"
    assert rows["flag"].text == "yes" and rows["count"].text == "12,000"
    assert "ratio_of_things" not in rows             # empty values are left out
    for row in rows.values():
        assert not re.search(r'[\[\]{}"]|\\u', row.text), row.text
    assert compact(None) == "-" and evidence_rows("just text")[0].text == "just text"


def test_an_events_json_body_becomes_fields_and_other_details_stay_text(ctx):
    rows = detail_rows('{"fd":5,"path":"/dev/nvidia0","cloexec":false,'
                       '"parent":{"pid":300,"start_time":2000}}', at=T)
    assert [(r.name, r.text) for r in rows] == [("fd", "5"), ("path", "/dev/nvidia0"),
                                                ("cloexec", "no"),
                                                ("parent", "process 300-2000")]
    assert rows[3].parts[0].href == f"/processes/300-2000?at={T}"
    assert [r.text for r in detail_rows("NV_OK notable")] == ["NV_OK notable"]
    assert [r.text for r in detail_rows("{not json")] == ["{not json"]
    assert detail_rows(None) == [] and detail_rows("") == []


# --- the template: escaping and markup -----------------------------------------------------

TABLE = ('{% from "_evidence.html" import table, inline %}'
         '{{ table(evidence_rows(ev, at=at, pid=pid, start_time=st)) }}|'
         '{{ inline(detail_rows(d)) }}')


def test_the_template_escapes_untrusted_text_and_writes_times_as_time_tags(ctx):
    hostile = "'\"><script>alert(1)</script>"
    html = render_template_string(TABLE, at=T, pid=4242, st=1000, d='{"comm": "x<b>"}',
                                  ev={"name": EVIL_NAME, "detail": hostile, "since": T,
                                      "evidence": {"note": hostile}, "fixes": [EVIL_NAME],
                                      "processes": ["4242-1000"]})
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "x&lt;b&gt;" in html
    assert (f'<time datetime="2023-11-14T22:13:20.123Z" data-ns="{T}">'
            f'2023-11-14 22:13:20.123 UTC</time>') in html
    assert f'<a href="/processes/4242-1000?at={T}">process 4242-1000</a>' in html
    assert '<ul class="lines"><li>&lt;img' in html
    assert "\\u0027" not in html and "&#34;note" not in html and "[&#34;" not in html


# --- every shipped rule's evidence names ---------------------------------------------------

UNIT_SHOWN = {"ratio": (0.5, "50%"), "B/s": (2e9, "2.0 GB/s"), "ns": (2e9, "2 s"),
              "W": (250.0, "250 W"), "°C": (80.0, "80 °C"), "MHz": (1400.0, "1,400 MHz"),
              "MiB": (1024.0, "1,024 MiB"), "1/s": (3.0, "3/s"), "cores": (2.0, "2 cores")}
SAME_UNIT = ("mean", "min", "max", "last", "p05", "p95", "delta", "increase")


def _unit(node: m.Node) -> str | None:
    """The unit of an evidence expression's value, where the vocabulary says it."""
    if isinstance(node, m.Call):
        if node.func == "frac":
            return "ratio"
        if node.func == "rate":
            return "1/s"
        if node.func in SAME_UNIT and node.args and isinstance(node.args[0], m.Ref):
            signal = SIGNALS.get(node.args[0].name)
            return signal.unit if signal else None
        return None
    if isinstance(node, m.Ref) and node.name in FACTS:
        return FACTS[node.name][1]
    return None


def test_every_shipped_rules_evidence_shows_the_unit_of_its_expression():
    checked, wrong = set(), []
    for rule in load_rules():
        for name, node in rule.evidence:
            unit = _unit(node)
            if unit in UNIT_SHOWN:
                value, shown = UNIT_SHOWN[unit]
                if quantity(name, value) != shown:
                    wrong.append(f"{rule.id} {name} ({unit}): {quantity(name, value)}")
                checked.add(unit)
    assert not wrong, "\n".join(wrong)
    assert checked >= {"ratio", "B/s", "ns", "W", "°C", "MHz", "MiB", "1/s", "cores"}
