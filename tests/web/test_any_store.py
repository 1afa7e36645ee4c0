"""Every page and API of the web view answers whatever the store holds (issue #53, item 1).

Hypothesis generates hosts the way real ones come (GPUs known from any subset of sources:
the kernel log only, a counter source only, with or without UUID, PCI address or index, no
sample yet, lost, resetting; processes holding no GPU; incidents naming no GPU; nothing at
all), plays them through the real correlator into a real store, and requests EVERY GET route
of the Flask app's url_map, its path parameters filled with ids that exist and ids that do
not: no answer is a 5xx. A store whose migrations are not finished answers 503 with
Retry-After and the reason, never 500. Then one test per defect the issue found: the
overview and the GPU page of a GPU known only from one kernel-log line, out-of-range
integers in query parameters and URLs (400 or 404, never 500), and error pages that try
again by themselves.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import load_config
from gpuwhy.events import (
    DeviceOpened,
    DriverCallStats,
    GpuSample,
    GpuSeen,
    GpuState,
    GpuXid,
    ProcessExited,
    ProcessKey,
    ProcessSeen,
)
from gpuwhy.identity import GpuIdentity
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import parse_line
from gpuwhy.probes.klog.source import record_event
from gpuwhy.store import open_store
from gpuwhy.store.migrations import migrations
from gpuwhy.webui import create_app

from .conftest import arrive

S = NS_PER_SECOND
XID_LINE = "NVRM: Xid (PCI:{pci}): {xid}, pid=1234, name=python, {text}"
XID_TEXT = {13: "Graphics Exception: ESR 0x404600=0x80000001", 31: "Ch 00000008, "
            "intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_2a000000.",
            48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
            79: "GPU has fallen off the bus.", 94: "Contained: CE User Channel (0x9)."}
THE_XID_LINE = XID_LINE.format(pci="0000:0a:00", xid=79, text=XID_TEXT[79])
HUGE = [str(2**63), str(2**64), str(-2**63 - 1), "9" * 30, "-1", "nan", "1e3", "\u0663", "x"]


def uuid_of(n: int) -> str:
    return f"GPU-5e1f0c2a-0000-4000-8000-{n:012x}"


def pci_of(n: int) -> str:
    return f"0000:{0x0a + n:02x}:00"


def kernel_line(text: str, ts: int, n: int):
    """The bus event the kernel-log source makes of one /dev/kmsg line (its own parser)."""
    raw = RawLine(text=text, cursor=f"kmsg:b:{n}", boot_id="b", monotonic_ns=n * S)
    return record_event(raw, parse_line(text), "kmsg", ts)


# --- generated hosts ---------------------------------------------------------------------

GPUS = st.fixed_dictionaries({
    "uuid": st.booleans(), "pci": st.booleans(), "index": st.booleans(),
    # the counter source that reads it: none (kernel log or device file only), or one
    "counters": st.sampled_from([None, "dcgm-exporter", "nvml"]),
    "samples": st.sampled_from([0, 1, 3]),           # none yet, one, a few
    "fields": st.sampled_from(["all", "util only", "none"]),
    "xid": st.sampled_from([None, 13, 31, 48, 79, 94]),
    "state": st.sampled_from([None, "lost", "resetting", "reset_required", "back"]),
})
PROCESSES = st.fixed_dictionaries({
    "gpu": st.none() | st.integers(0, 2),           # None: holds /dev/nvidiactl only
    "exited": st.booleans(), "calls": st.booleans(),
})
QUERIES = st.sampled_from([
    {}, {"range": "7d"}, {"range": "5m"}, {"at": "XID"}, {"from": "T0", "to": "XID"},
    {"after": "XID", "grid": "T0", "bucket": str(60 * S)}, {"state": "active"},
    {"since": "0", "limit": "1"}, {"page": "2"}, {"format": "jsonl", "since": "1"},
    {"within": "7d", "gpu": pci_of(0)}, {"sort": "gpu", "q": "python"},
])
HOSTS = st.fixed_dictionaries({
    "gpus": st.lists(GPUS, max_size=3),
    "processes": st.lists(PROCESSES, max_size=3),
    "orphan_incidents": st.integers(0, 2),
    "query": QUERIES,
})


def host_events(host: dict, t0: int) -> list:
    """The events a host like ``host`` publishes, in time order, as its sources would."""
    events: list = []
    for n, spec in enumerate(host["gpus"]):
        identity = GpuIdentity(uuid=uuid_of(n) if spec["uuid"] else None,
                               pci_bus_id=pci_of(n) if spec["pci"] else None,
                               index=n if spec["index"] else None)
        source, at = spec["counters"], t0 + n * S
        known = any((spec["uuid"], spec["pci"], spec["index"]))
        if source and known:
            gpu_id = identity.id
            events.append(GpuSeen(ts=at, gpu_id=gpu_id, source=source, simulated=False,
                                  uuid=identity.uuid, pci_bus_id=identity.pci_bus_id,
                                  index=identity.index, minor=identity.index,
                                  model="NVIDIA H100 80GB HBM3"))
            fields = {"all": {"gpu_util": 87.0, "sm_active": 0.61, "tensor_active": 0.2,
                              "dram_active": 0.4, "fb_used_mib": 40_000.0,
                              "fb_total_mib": 81_559.0, "temp_c": 61.0, "power_w": 420.5},
                      "util only": {"gpu_util": 0.0}, "none": {}}[spec["fields"]]
            events += [GpuSample(ts=at + i * S, gpu_id=gpu_id, source=source,
                                 simulated=False, fields=fields)
                       for i in range(spec["samples"])]
            if spec["xid"] and not spec["pci"]:
                # no PCI address to read a kernel line by: the counter source's Xid
                events.append(GpuXid(ts=at + 5 * S, gpu_id=gpu_id, xid=spec["xid"],
                                     source=source, simulated=False))
            if spec["state"]:
                events.append(GpuState(ts=at + 6 * S, gpu_id=gpu_id, state=spec["state"],
                                       source=source, simulated=False, detail="test"))
        if spec["xid"] and spec["pci"]:
            line = XID_LINE.format(pci=pci_of(n), xid=spec["xid"], text=XID_TEXT[spec["xid"]])
            events.append(kernel_line(line, at + 5 * S, n + 1))
    for m, spec in enumerate(host["processes"]):
        key, at = ProcessKey(4000 + m, 90_000 + m), t0 + (10 + m) * S
        events.append(ProcessSeen(ts=at, process=key, comm="python",
                                  cmdline=f"python train.py --rank {m}", exe="/usr/bin/python3",
                                  ppid=1, uid=1000, cgroup="/system.slice/job.scope"))
        path, device, minor = (("/dev/nvidiactl", "nvidiactl", None) if spec["gpu"] is None
                               else (f"/dev/nvidia{spec['gpu']}", "nvidiaN", spec["gpu"]))
        events.append(DeviceOpened(ts=at, process=key, fd=5, path=path, device=device,
                                   minor=minor))
        if spec["calls"]:
            events.append(DriverCallStats(ts=at + S, process=key, path=path, device=device, ops=[
                {"cmd": 0xC020462A, "op": "NV_ESC_RM_CONTROL", "sub": 0x20800110,
                 "sub_name": "NV2080_CTRL_CMD_GPU_GET_INFO", "count": 40, "errors": 0,
                 "latency_sum_ns": 160_000, "latency_max_ns": 9_000, "bytes": 0,
                 "latency_log2": []}]))
        if spec["exited"]:
            events.append(ProcessExited(ts=at + 30 * S, process=key, exit_code=1))
    return sorted(events, key=lambda e: e.ts)


def host_kinds(host: dict) -> set[str]:
    """The kinds of state a generated host holds, by the issue's names."""
    kinds = set()
    for g in host["gpus"]:
        counted = g["counters"] and (g["uuid"] or g["pci"] or g["index"])
        kinds.add("GPU from the kernel log only" if not counted and g["xid"] and g["pci"]
                  else "GPU from a counter source only" if counted and not g["xid"]
                  else "GPU from both" if counted else "GPU not stored (no source names it)")
        if counted and not g["uuid"]:
            kinds.add("GPU without UUID")
        if counted and not g["pci"]:
            kinds.add("GPU without PCI address")
        if counted and not g["samples"]:
            kinds.add("GPU with no sample yet")
        if counted and g["state"] in ("lost", "resetting"):
            kinds.add(f"GPU {g['state']}")
    if any(p["gpu"] is None for p in host["processes"]):
        kinds.add("process without a GPU")
    if host["orphan_incidents"]:
        kinds.add("incident without a GPU")
    if not host["gpus"] and not host["processes"] and not host["orphan_incidents"]:
        kinds.add("empty store")
    return kinds


def orphan_incidents(path: Path, count: int, t0: int) -> None:
    """Incidents that name no GPU (a process's stall, a rule with no GPU in scope), stored
    as the correlator stores them: the row and its chain's links."""
    db = open_store(path)
    try:
        for k in range(count):
            incident = db["incidents"].insert({
                "opened_at": t0 + (40 + k) * S, "kind": "process_stall", "severity": "warning",
                "gpu_id": None, "pid": 4000, "start_time": 90_000, "title": "stalled",
                "summary": "no driver calls for 30 s", "state": "open", "count": 1,
                "last_seen": t0 + (41 + k) * S}).last_pk
            db["incident_links"].insert({
                "incident_id": incident, "seq": 1, "kind": "process_stall",
                "ts": t0 + (40 + k) * S, "summary": "stalled", "confidence": 0.5,
                "evidence": json.dumps({"pid": 4000})})
    finally:
        db.close()


def config_for(directory: Path):
    return load_config(environ={"GPUWHY_DB": str(directory / "gpuwhy.db"),
                                "GPUWHY_BUS": f"ipc://{directory}/bus.sock"})


def build_store(directory: Path, host: dict, t0: int, migrated: Path | None = None):
    """``host`` played into a store in ``directory``; ``migrated``: an empty store with every
    migration applied, copied to start from (migrating anew costs half a second of fsyncs)."""
    config = config_for(directory)
    if migrated is not None:
        shutil.copy(migrated, config["store.path"])
    arrive(config, host_events(host, t0), config["bus.endpoint"], event_time=True)
    orphan_incidents(directory / "gpuwhy.db", host["orphan_incidents"], t0)
    return config


# --- every route -------------------------------------------------------------------------

def _ids(path: Path) -> dict[str, list[str]]:
    """The path parameters' values: every id the store holds, and some it does not."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        def column(sql: str) -> list[str]:
            try:
                return [str(r[0]) for r in db.execute(sql) if r[0] is not None]
            except sqlite3.Error:           # an older schema: not there yet
                return []
        gpus = column("select id from gpus") + column("select uuid from gpus")
        keys = column("select pid || '-' || start_time from processes")
        incidents = column("select id from incidents")
    finally:
        db.close()
    return {"gpu_id": [*dict.fromkeys(gpus), "GPU-00000000-dead", "0000:ff:00", "index:9"],
            "key": [*keys, "1-1", "nope", f"{2**63}-1"],
            "incident_id": [*incidents, "999999", str(2**63)],
            "filename": ["overview.js", "nope.js"], "name": ["echarts.min.js", "nope"]}


def every_get_url(app, ids: dict[str, list[str]], query: dict[str, str]) -> list[str]:
    """Every GET route of the app's url_map, each path parameter filled with each value."""
    urls = []
    for rule in app.url_map.iter_rules():
        if "GET" not in rule.methods:
            continue
        filled = [rule.rule]
        for argument in rule.arguments:
            placeholder = re.compile(rf"<(?:[^<>:]+:)?{argument}>")
            filled = [placeholder.sub(value, url) for url in filled for value in ids[argument]]
        suffix = "?" + urlencode(query) if query else ""
        urls += [url + suffix for url in filled]
    return urls


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("migrated") / "gpuwhy.db"
    open_store(path).close()
    return path


_RULES: dict = {}        # the rule set, loaded by the first app (a quarter second each)


def answers(config, query: dict[str, str]) -> list[tuple[str, int, object, bytes]]:
    app = create_app(config)
    app.extensions["gpuwhy.rules"] = _RULES
    client = app.test_client()
    out = []
    for url in every_get_url(app, _ids(Path(config["store.path"])), query):
        response = client.get(url)
        out.append((url, response.status_code, response.headers, response.get_data()))
    return out


def _query(query: dict, t0: int) -> dict[str, str]:
    marks = {"T0": str(t0), "XID": str(t0 + 5 * S)}
    return {k: marks.get(v, v) for k, v in query.items()}


@pytest.mark.slow
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(HOSTS)
@example({"gpus": [], "processes": [], "orphan_incidents": 0, "query": {}})   # empty store
@example({"gpus": [{"uuid": False, "pci": True, "index": False, "counters": None,
                    "samples": 0, "fields": "none", "xid": 79, "state": None}],
          "processes": [{"gpu": None, "exited": False, "calls": True}],
          "orphan_incidents": 1, "query": {}})           # the GPU, and no-GPU others
def test_every_page_and_api_answers_any_store(migrated, host):
    for kind in host_kinds(host):      # what the examples covered (--hypothesis-show-statistics)
        event(kind)
    t0 = now_ns() - 3600 * S
    with tempfile.TemporaryDirectory() as directory:
        config = build_store(Path(directory), host, t0, migrated)
        failed = [(url, status, body[:300]) for url, status, _, body in
                  answers(config, _query(host["query"], t0)) if status >= 500]
    assert not failed, failed


# --- a store whose migrations have not finished ------------------------------------------

LATER = [m.name for m in migrations._migrations[1:]]


@pytest.mark.slow
@settings(max_examples=5, deadline=None, derandomize=True)
@given(st.sampled_from(LATER))
@example(LATER[-1])
def test_a_store_mid_migration_answers_503_with_retry_after_never_500(stop_before):
    with tempfile.TemporaryDirectory() as directory:
        config = config_for(Path(directory))
        old = Database(sqlite3.connect(config["store.path"]))
        migrations.apply(old, stop_before=stop_before)
        old["gpus"].insert({"id": uuid_of(0), "uuid": uuid_of(0), "gpu_index": 0})
        old["incidents"].insert({"id": 1, "opened_at": now_ns(), "kind": "xid",
                                 "gpu_id": uuid_of(0)})
        old.close()
        found = answers(config, {})
    failed = [(url, status, body[:300]) for url, status, headers, body in found
              if status >= 500 and not (status == 503 and headers.get("Retry-After")
                                        and b"being upgraded" in body)]
    assert not failed, failed
    # the pages that read the store say why they cannot: being upgraded, by what
    overview = next(a for a in found if a[0] == "/")
    assert overview[1] == 200 or (b"schema migration" in overview[3] and
                                  stop_before.encode() in overview[3]), overview[3][:300]


def test_a_store_upgraded_from_the_first_schema_answers_everywhere(tmp_path):
    """Rows the first schema allowed and the writer never makes (an incident with no
    severity, title or state; a sample of a GPU with no gpus row), migrated in place."""
    config = config_for(tmp_path)
    old = Database(sqlite3.connect(config["store.path"]))
    migrations.apply(old, stop_before=LATER[0])
    t0 = now_ns() - 600 * S
    old["gpus"].insert({"id": uuid_of(0), "uuid": uuid_of(0), "gpu_index": 0, "minor": 0})
    old["gpu_samples"].insert_all([{"gpu_id": uuid_of(0), "ts": t0, "gpu_util": 90.0},
                                   {"gpu_id": "minor:1", "ts": t0, "gpu_util": 3.0}])
    old["processes"].insert({"pid": 7, "start_time": 70, "comm": "python"})
    old["events"].insert({"ts": t0, "topic": "gpu", "kind": "gpu_state",
                          "gpu_id": uuid_of(0), "body": '{"state": "lost", "detail": "x"}'})
    old["incidents"].insert({"id": 1, "opened_at": t0, "kind": "xid", "gpu_id": uuid_of(0)})
    old.close()
    open_store(config["store.path"]).close()          # migrated, as gpuwhy up does
    failed = [(url, status, body[:300]) for url, status, _, body in answers(config, {})
              if status >= 500]
    assert not failed, failed


# --- defect 1: a GPU known only from one kernel-log line ---------------------------------

@pytest.fixture
def kernel_only(tmp_path):
    """A store that knows one GPU from one real-format Xid line only: no counter source
    read it, so it has no sample, no UUID, no index."""
    t0 = now_ns() - 600 * S
    config = config_for(tmp_path)
    arrive(config, [kernel_line(THE_XID_LINE, t0, 1)], config["bus.endpoint"], event_time=True)
    return config, t0


def test_the_overview_of_a_kernel_log_only_gpu_renders_and_says_no_sample(kernel_only):
    config, _ = kernel_only
    response = create_app(config).test_client().get("/")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert 'data-gpu="0000:0a:00"' in page and "PCI 0000:0a:00" in page
    assert "no sample: never read" in page        # lost, never read: said so
    # not zero: the card's fields say "–" (the heatmap's key names 0 % as a colour)
    card = page[page.index('data-gpu="0000:0a:00"'):]
    card = card[:card.index("</section>")]
    assert 'data-field="gpu_util">–<' in card and "0 %" not in card


def test_a_kernel_log_only_gpus_page_is_dated_at_its_xid_and_marks_it(kernel_only):
    config, xid_at = kernel_only
    client = create_app(config).test_client()
    page = client.get("/gpus/0000:0a:00")
    assert page.status_code == 200
    assert "it was never read" in page.get_data(as_text=True)
    for api in ("/api/gpus/0000:0a:00/series", "/api/gpus/0000:0a:00/events"):
        window = client.get(api).get_json()
        assert window["from"] <= xid_at < window["to"], (api, window["from"], window["to"])
    marks = client.get("/api/gpus/0000:0a:00/events").get_json()["incidents"]
    assert [(m["opened_at"], m["title"]) for m in marks] == \
        [(xid_at, "Xid 79: GPU has fallen off the bus")]
    heat = client.get("/api/heatmap").get_json()
    assert heat["from"] <= xid_at < heat["to"]
    assert [i["opened_at"] for i in heat["gpus"][0]["incidents"]] == [xid_at]


def test_a_live_gpu_with_no_sample_yet_says_so_and_not_zero(tmp_path):
    """A counter source that has named a GPU and not sampled it yet."""
    config = config_for(tmp_path)
    arrive(config, [GpuSeen(ts=now_ns() - 60 * S, gpu_id=uuid_of(1), source="nvml",
                            simulated=False, uuid=uuid_of(1), index=1)],
           config["bus.endpoint"], event_time=True)
    page = create_app(config).test_client().get("/").get_data(as_text=True)
    assert f'data-gpu="{uuid_of(1)}"' in page
    assert "no sample yet" in page and 'data-field="gpu_util">–<' in page
    card = page[page.index(f'data-gpu="{uuid_of(1)}"'):]
    assert "0 %" not in card[:card.index("</section>")]     # the heatmap's key aside
    gpu_page = create_app(config).test_client().get(f"/gpus/{uuid_of(1)}")
    assert "No sample yet" in gpu_page.get_data(as_text=True)


# --- defect 2: integers past what the store holds ----------------------------------------

# The parameters each route reads as a whole number (ns, a cursor, a page): each of HUGE
# gets a 400 that names it.
READS = {
    "/api/gpus/{gpu}/series": ("from", "to", "at", "after"),
    "/api/gpus/{gpu}/events": ("from", "to", "at"),
    "/gpus/{gpu}/series.csv": ("from", "to", "at"),
    "/gpus/{gpu}/lanes.csv": ("from", "to", "at"),
    "/gpus/{gpu}/events.csv": ("from", "to", "at"),
    "/api/heatmap": ("from", "to", "at", "after"),
    "/api/processes/{key}/series": ("from", "to", "at", "after"),
    "/processes/{key}/series.csv": ("from", "to", "at"),
    "/processes/{key}": ("page", "at"),
    "/api/incidents": ("since", "limit"),
}
TAIL = {"after": "1", "grid": "0", "bucket": str(60 * S)}


@pytest.fixture(scope="module")
def busy_store(tmp_path_factory):
    host = {"gpus": [{"uuid": True, "pci": True, "index": True, "counters": "nvml",
                      "samples": 3, "fields": "all", "xid": 79, "state": None}],
            "processes": [{"gpu": 0, "exited": False, "calls": True}], "orphan_incidents": 1,
            "query": {}}
    return build_store(tmp_path_factory.mktemp("busy"), host, now_ns() - 3600 * S)


@pytest.mark.parametrize("route", sorted(READS))
def test_out_of_range_integers_are_400_naming_the_parameter(busy_store, route):
    client = create_app(busy_store).test_client()
    url = route.format(gpu=uuid_of(0), key="4000-90000")
    for name in READS[route]:
        for value in HUGE:
            # the tail's other two, so that the one under test is the one refused
            given_ = {**(TAIL if name in ("after", "grid", "bucket") else {}), name: value}
            if route == "/api/incidents" and name == "limit":
                given_["since"] = "0"
            response = client.get(url, query_string=given_)
            assert response.status_code == 400, (url, given_, response.status_code)
            said = response.get_json()["error"] if url.startswith("/api/") else \
                response.get_data(as_text=True)
            assert said.startswith(name) or f"{name} is" in said, (url, given_, said)


@pytest.mark.slow
def test_every_get_route_answers_out_of_range_integers_without_a_5xx(busy_store):
    """Every route (of ids that exist: a 404 reads no parameter), every whole-number
    parameter any route reads: one past what SQLite holds, a negative one, and its largest."""
    app = create_app(busy_store)
    client = app.test_client()
    ids = {name: values[:1] for name, values in _ids(Path(busy_store["store.path"])).items()}
    params = ("from", "to", "at", "after", "grid", "bucket", "since", "limit", "page")
    failed = [(url, name, value, status) for url in every_get_url(app, ids, {})
              for name in params for value in (str(2**63), "-1", str(2**63 - 1))
              if (status := client.get(url, query_string={**TAIL, name: value}).status_code)
              >= 500]
    assert not failed, failed


@pytest.mark.parametrize("url", [f"/incidents/{2**63}", f"/api/incidents/{2**64}/",
                                 f"/incidents/{'9' * 40}/report", f"/processes/{2**63}-1",
                                 f"/api/processes/1-{2**64}", f"/processes/1-{2**63}/calls.csv",
                                 "/processes/\u0663-1"])
def test_an_id_past_what_the_store_holds_is_404(busy_store, url):
    response = create_app(busy_store).test_client().get(url)
    assert response.status_code == 404
    if url.startswith("/api/"):                  # an API client reads why, as JSON
        assert response.get_json()["error"]


def test_the_filters_show_no_number_rather_than_fail_or_invent_one():
    from jinja2 import Undefined

    from gpuwhy.webui.filters import NO_VALUE, instant, moment, number, rate

    for missing in (None, Undefined(), "n/a", float("nan"), float("inf"), True):
        assert number(missing, 0, " %") == rate(missing) == NO_VALUE, missing
    assert number(0, 0, " %") == "0 %" and number(0.61, 0, " %", 100) == "61 %"
    assert number(2**70) == f"{2**70:,}"
    assert instant(Undefined()) == "-" and moment(None) == "-"
    assert instant("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"        # as stored, escaped
    assert moment(10**30) == str(10**30)                       # past year 9999: as stored


def test_incident_times_past_2_63_are_400(busy_store):
    client = create_app(busy_store).test_client()
    for value in (str(2**63), "9999999999999999999", "99999999999999999999d", "1e400d"):
        for page in ("/incidents", "/api/incidents"):
            response = client.get(page, query_string={"from": value})
            assert response.status_code == 400, (page, value, response.status_code)


# --- defect 3: an error page tries again --------------------------------------------------

def test_a_store_not_there_yet_is_503_that_retries(tmp_path):
    config = config_for(tmp_path)                   # no store written at that path
    client = create_app(config).test_client()
    page = client.get("/")
    assert page.status_code == 503
    assert page.headers["Retry-After"] == "5" and page.headers["Refresh"] == "5"
    text = page.get_data(as_text=True)
    assert "cannot open store" in text and "tries again by itself every 5 s" in text
    api = client.get("/api/gpus")
    assert api.status_code == 503 and api.headers["Retry-After"] == "5"
    assert "Refresh" not in api.headers and "cannot open store" in api.get_json()["error"]


def test_a_failing_query_is_a_500_that_retries_and_says_what_failed(tmp_path):
    """A store whose migrations all ran but whose gpus table is not what they made (a fault,
    not an upgrade in progress): 500, with when to try again."""
    config = config_for(tmp_path)
    db = open_store(config["store.path"])
    db.execute("alter table gpus rename column health_since to health_from")
    db.close()
    response = create_app(config).test_client().get("/")
    assert response.status_code == 500
    assert response.headers["Retry-After"] == "5" and response.headers["Refresh"] == "5"
    assert "reading the store failed" in response.get_data(as_text=True)


def test_a_500_from_a_post_retries_only_when_asked_again(tmp_path):
    """No Refresh after a POST: reloading it would send the change again."""
    (tmp_path / "file").write_text("not a folder")
    config = load_config(environ={"GPUWHY_DB": str(tmp_path / "file" / "gpuwhy.db")})
    app = create_app(config, {"AUTH_TOKEN": "t"})
    response = app.test_client().post("/incidents/1/ack", data={"token": "t"},
                                      headers={"Authorization": "Bearer t"})
    assert response.status_code >= 500 and response.headers["Retry-After"] == "5"
    assert "Refresh" not in response.headers
