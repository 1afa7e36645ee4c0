"""Inference engines: found from /proc, /metrics scraped on loopback, samples on the bus, in
the store and in the rules' engine.* signals.

Real processes (tests/engine_standin.py started under the argv each engine shows in /proc,
serving metric text recorded from the engines' docs and source, tests/data/engines/),
real /proc port discovery, real HTTP, the real bus, correlator, store and signals; only the
engine itself is a stand-in (no GPU here).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import EngineSample
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.engines import metric_names as metrics
from gpuwhy.probes.engines import source as engines_source
from gpuwhy.probes.engines.commandline import batch_limit, flag_ports, recognise
from gpuwhy.probes.engines.discover import find_engines
from gpuwhy.probes.engines.netns import can_enter
from gpuwhy.probes.engines.source import EngineSource, ScrapeError, get
from gpuwhy.proc import process_key
from gpuwhy.store import open_store

DATA = Path(__file__).parent / "data" / "engines"
STANDIN = Path(__file__).parent / "engine_standin.py"
RUN_STANDIN = f"import runpy; runpy.run_path({str(STANDIN)!r}, run_name='__main__')\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engines:
    """Stand-in engines started for one test, ended with it."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []

    def _module(self, dotted: str) -> Path:
        root = self.tmp / "modules"
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            package = root.joinpath(*parts[:i])
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
        root.joinpath(*parts[:-1], parts[-1] + ".py").write_text(RUN_STANDIN)
        return root

    def start(self, how: str, frames: str, port: int, mode: str = "",
              decoy: int | None = None, child: bool = False,
              netns: bool = False, user: int | None = None,
              extra: tuple[str, ...] = ()) -> subprocess.Popen:
        """A stand-in under ``how``'s argv; with ``netns`` in a network namespace of its own
        (a container's network: its loopback up, nothing else), the same pid and argv; with
        ``user`` run as that uid and gid, no other group (a binary's argv only: the modules
        in tmp_path are root's alone)."""
        env = {**os.environ, "STANDIN_FRAMES": str(DATA / frames), "STANDIN_MODE": mode}
        if decoy:
            env["STANDIN_DECOY"] = str(decoy)
        if child:
            env["STANDIN_CHILD"] = "1"
        executable = None
        if how in ("vllm.entrypoints.openai.api_server", "sglang.launch_server"):
            # what /proc shows for `python -m vllm.entrypoints.openai.api_server --port P`
            env["PYTHONPATH"] = str(self._module(how))
            argv = [sys.executable, "-m", how, "--port", str(port)]
        elif how in ("vllm serve", "sglang serve"):
            # the console script: /proc shows `python …/bin/vllm serve MODEL --port P`
            script = self.tmp / "bin" / how.split()[0]
            script.parent.mkdir(exist_ok=True)
            script.write_text(f"#!{sys.executable}\n" + RUN_STANDIN)
            script.chmod(0o755)
            model = ["meta-llama/Llama-3.1-8B-Instruct"] if how == "vllm serve" else \
                ["--model-path", "meta-llama/Llama-3.1-8B-Instruct"]
            argv = [str(script), "serve", *model, "--port", str(port)]
        else:   # a binary: tritonserver, text-generation-router (argv[0] is its name)
            executable = sys.executable
            flag = "--metrics-port" if how == "tritonserver" else "--port"
            argv = [how, str(STANDIN), flag, str(port)]
        argv += list(extra)
        if netns:
            # unshare and bash exec in place: the pid is the stand-in's, its argv[0] the same
            argv = ["unshare", "--net", "bash", "-c", 'ip link set lo up && exec -a "$0" "$@"',
                    argv[0], executable or argv[0], *argv[1:]]
            executable = None
        as_user = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        assert user is None or "PYTHONPATH" not in env, "run as another user: a binary's argv"
        proc = subprocess.Popen(argv, executable=executable, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, cwd="/" if user else self.tmp,
                                **as_user)
        self.procs.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready and proc.stdout.readline() == b"ready\n", f"{how} did not start"
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stdin.close()          # the stand-in (and its child) end at EOF
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def engines(tmp_path):
    started = Engines(tmp_path)
    yield started
    started.stop()


def key_of(proc: subprocess.Popen) -> ProcessKey:
    return process_key(proc.pid)


# --- recognising engines from their command lines -------------------------------------------
@pytest.mark.parametrize("argv, engine", [
    (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--port", "8000"], "vllm"),
    (["vllm", "serve", "m"], "vllm"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
    (["/opt/venv/bin/python3.11", "-u", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
    (["python", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
    (["/usr/bin/python3", "/usr/local/bin/sglang", "serve", "--model-path", "m"], "sglang"),
    (["sglang", "generate", "--model-path", "m"], None),   # its other commands serve nothing
    (["text-generation-launcher", "--model-id", "m"], "tgi"),
    (["/usr/local/bin/text-generation-router", "--port", "80"], "tgi"),
    (["/opt/tritonserver/bin/tritonserver", "--model-repository=/models"], "triton"),
    (["vllm", "bench", "serve"], None),                  # the CLI's other commands
    (["grep", "vllm", "serve"], None),                   # a later argument is no program
    (["python3", "train.py", "-m", "vllm.entrypoints.openai.api_server"], None),
    (["python3", "-c", "import vllm"], None),
    (["bash", "-c", "tritonserver --model-repository=/m"], None),
    ([], None),
])
def test_an_engine_is_recognised_by_its_program_never_by_an_argument(argv, engine):
    assert recognise(argv) == engine


def test_the_metrics_port_a_command_line_names_comes_before_the_default():
    assert flag_ports("vllm", ["vllm", "serve", "m", "--port=9000"]) == [9000, 8000]
    assert flag_ports("triton", ["tritonserver", "--metrics-port", "9002"]) == [9002, 8002]
    assert flag_ports("sglang", ["python", "-m", "sglang.launch_server", "--port", "x"]) == \
        [30000]


@pytest.mark.parametrize("engine, argv, limit", [
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs", "128"], 128),
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs=64", "--max-num-seqs", "32"], 32),
    ("sglang", ["sglang", "serve", "--max-running-requests", "48"], 48),
    ("tgi", ["text-generation-launcher", "--max-batch-size=16"], 16),
    ("vllm", ["vllm", "serve", "m"], None),                     # the default: not guessed
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs", "-1"], None),
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs", "9" * 40], None),
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs"], None),
    ("triton", ["tritonserver", "--max-num-seqs", "8"], None),   # not Triton's flag
])
def test_the_batch_limit_is_the_command_lines_never_a_guess(engine, argv, limit):
    assert batch_limit(engine, argv) == limit


# --- discovery through the real /proc ------------------------------------------------------
def test_a_vllm_server_its_ports_and_its_tree_are_read_from_proc(engines):
    port, decoy = free_port(), free_port()
    proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", port,
                         decoy=decoy, child=True)
    found = [e for e in find_engines() if e.process.pid == proc.pid]
    assert len(found) == 1, "the forked child holds the argv too: one engine, the parent"
    engine = found[0]
    assert engine.engine == "vllm" and engine.process == key_of(proc)
    assert engine.ports == [port, decoy]           # its --port first, then its other ports
    assert engine.listeners[port].host == "127.0.0.1" and engine.note == ""
    assert engine.members == [] and engine.gpu_minors == []    # no GPU device files here


def test_an_engine_found_in_proc_is_scraped_on_the_port_that_serves_metrics(engines):
    port, decoy = free_port(), free_port()
    # the decoy answers 404 (an engine's other port); listed first it is tried first
    proc = engines.start("tritonserver", "triton.txt", port, decoy=decoy)
    source = EngineSource()
    events = source.round()
    samples = [e for e in events if isinstance(e, EngineSample)]
    assert [(s.engine, s.process, s.endpoint) for s in samples] == [
        ("triton", key_of(proc), f"http://127.0.0.1:{port}/metrics")]
    assert samples[0].values == {"requests_waiting": 4.0}    # gauges only at the first scrape
    assert samples[0].gpu_ids == ["GPU-8b1c2a3e-0000-4a5b-9c6d-7e8f90a1b2c3"]
    time.sleep(0.2)
    [second] = [e for e in source.round() if isinstance(e, EngineSample)]
    values = second.values
    assert values["requests_waiting"] == 2.0
    assert values["batch_size"] == pytest.approx(4.0)          # 800 inferences / 200 runs
    assert values["queue_mean_s"] == pytest.approx(0.005)      # 500,000 µs / 100 requests
    assert values["e2e_mean_s"] == pytest.approx(0.02)
    assert 100 / 10 < values["requests_per_s"] < 100 / 0.2     # 100 requests in the interval
    health = source.health()
    assert health.state == "ok" and "1 engine(s) found and scraped" in health.detail
    assert source.counters["scrape_errors"] == 0


def test_tgi_sglang_and_a_console_script_vllm_are_found_and_mapped(engines):
    tgi, sglang, vllm = free_port(), free_port(), free_port()
    engines.start("text-generation-router", "tgi.txt", tgi)
    engines.start("sglang.launch_server", "sglang.txt", sglang)
    engines.start("vllm serve", "vllm_v0.txt", vllm)
    source = EngineSource()
    source.round()
    time.sleep(0.2)
    by_engine = {e.engine: e for e in source.round() if isinstance(e, EngineSample)}
    assert set(by_engine) == {"tgi", "sglang", "vllm"}
    t = by_engine["tgi"].values
    assert (t["requests_waiting"], t["requests_running"], t["batch_size"]) == (5, 16, 16)
    assert t["prompt_tokens_per_s"] / t["generation_tokens_per_s"] == pytest.approx(2.5)
    assert (t["e2e_p50_s"], t["e2e_p95_s"], t["e2e_mean_s"]) == pytest.approx((3.0, 4.8, 3.0))
    s = by_engine["sglang"].values
    assert (s["requests_running"], s["requests_waiting"], s["kv_cache_usage"]) == (9, 1, 0.31)
    assert s["preemptions_per_s"] == 0.0
    assert s["ttft_mean_s"] == pytest.approx(0.05)
    v = by_engine["vllm"]
    assert v.version == "v0" and v.values["kv_cache_usage"] == 0.04   # gpu_cache_usage_perc
    assert "tpot_p50_s" not in v.values       # one frame: nothing moved between scrapes
    assert "batch_limit" not in v.values      # its command line sets none


def test_sglang_serve_is_found_and_its_batch_limit_travels_with_its_values(engines):
    """`sglang serve` (the console script of recent SGLang) is an engine, and the limit
    its command line sets is a value of its samples (engine.batch_limit for the rules)."""
    port = free_port()
    proc = engines.start("sglang serve", "sglang.txt", port,
                         extra=("--max-running-requests", "48"))
    source = EngineSource()
    [sample] = [e for e in source.round() if isinstance(e, EngineSample)]
    assert (sample.engine, sample.process) == ("sglang", key_of(proc))
    assert sample.values["batch_limit"] == 48.0


# --- the mapping, on the recorded text ------------------------------------------------------
def _frames(name: str) -> list[str]:
    return (DATA / name).read_text().split("# --- next scrape ---\n")


def test_vllm_v1_names_give_rates_and_the_interval_latencies():
    first, second = (metrics.parse("vllm", f) for f in _frames("vllm_v1.txt"))
    values = metrics.values("vllm", second, first, 5.0)
    assert metrics.dialect("vllm", second) == "v1"
    assert values == pytest.approx({
        "requests_running": 40, "requests_waiting": 30, "kv_cache_usage": 0.97,
        "preemptions_per_s": 10, "prompt_tokens_per_s": 10000,
        "generation_tokens_per_s": 2000, "requests_per_s": 10,
        # the 50 requests of the interval, not the 1,050 since the start
        "ttft_p50_s": 0.75, "ttft_p95_s": 1.0, "ttft_mean_s": 0.8,
        "tpot_p50_s": 0.05, "tpot_p95_s": 0.05, "tpot_mean_s": 0.05,
        "e2e_p50_s": 10.0, "e2e_p95_s": 10.0, "e2e_mean_s": 12.0,
        "queue_p50_s": 1.0, "queue_p95_s": 1.0, "queue_mean_s": 1.0})


def test_a_counter_that_went_down_gives_no_rate_that_round():
    first, second = (metrics.parse("vllm", f) for f in _frames("vllm_v1.txt"))
    values = metrics.values("vllm", first, second, 5.0)     # as after an engine restart
    assert "preemptions_per_s" not in values and "ttft_p50_s" not in values
    assert values["kv_cache_usage"] == 0.95


def test_hostile_lines_are_skipped_and_counted_and_garbage_is_refused():
    text = _frames("vllm_v1.txt")[0] + (
        'vllm:num_requests_running{model_name="' + "x" * 5000 + '"} 7\n'
        "vllm:num_requests_waiting NaN\n"
        "vllm:num_preemptions_total 1e999999\n"
        "not a sample at all {\n")
    parsed = metrics.parse("vllm", text)
    assert parsed.skipped >= 2 and parsed.gauges["vllm:num_requests_running"] == 48
    with pytest.raises(ValueError):
        metrics.parse("vllm", "<html>\n<body>nope</body>\n")


@pytest.mark.parametrize("engine, name", [("vllm", "vllm_v1.txt"), ("vllm", "vllm_v0.txt"),
                                          ("sglang", "sglang.txt"), ("tgi", "tgi.txt"),
                                          ("triton", "triton.txt")])
def test_the_narrow_parse_reads_what_parsing_every_line_reads(engine, name):
    """Families the signals do not read are skipped unparsed (scripts/bench_engines.py):
    the same figures, GPU ids (Triton's gpu_uuid sits on its nv_gpu_* families) and names."""
    others = ('http_requests_total{handler="/v1/completions",status="2xx"} 5\n'
              'vllm:request_prompt_tokens_bucket{le="+Inf"} 3\n'
              'nv_gpu_utilization{gpu_uuid="GPU-00000000-0000-0000-0000-00000000000f"} 0.5\n')
    for frame in _frames(name):
        narrow, full = metrics.parse(engine, frame + others), \
            metrics.parse(engine, frame + others, narrow=False)
        assert (narrow.gauges, narrow.totals, narrow.buckets, narrow.gpu_ids, narrow.names) \
            == (full.gauges, full.totals, full.buckets, full.gpu_ids, full.names)
    assert metrics.parse(engine, "# HELP x\nnot a sample at all\n").skipped == 1


def test_a_command_line_is_read_again_only_for_a_new_process_or_after_rescan_s(engines):
    from gpuwhy.probes.engines.discover import Finder
    finder = Finder()
    finder.find()
    first = finder.argv_reads
    assert first >= 1
    proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", free_port())
    found = finder.find()          # a new pid: its command line read at once
    assert key_of(proc) in [e.process for e in found]
    assert finder.argv_reads - first < first / 2   # not every process's again
    finder.RESCAN_S = 0.0
    before = finder.argv_reads
    finder.find()
    assert finder.argv_reads - before >= first / 2


# --- hostile endpoints cost their own scrape and the source's health, nothing more ----------
def test_slow_huge_garbage_and_redirecting_endpoints_fail_alone(engines, monkeypatch):
    hostile = {}
    for mode in ("slow", "huge", "garbage", "redirect"):
        hostile[mode] = free_port()
        engines.start("sglang.launch_server", "sglang.txt", hostile[mode], mode=mode)
    good = free_port()
    proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", good)
    named = ",".join(f"sglang=http://127.0.0.1:{port}/metrics" for port in hostile.values())
    source = EngineSource(named + ",http://10.1.2.3:8000/metrics", timeout=1.0,
                          max_body=1 << 20)
    started = time.monotonic()
    events = source.round()
    took = time.monotonic() - started
    samples = [e for e in events if isinstance(e, EngineSample)]
    # the good engine is published; each hostile one (found in /proc too) fails its scrapes
    assert [s.process for s in samples] == [key_of(proc)]
    assert took < 1.0 + 1.5, f"a round took {took:.1f} s: one scrape held the others"
    health = source.health()
    assert health.state == "degraded"
    for port, why in ((hostile["slow"], "took longer than 1 s"),
                      (hostile["huge"], "larger than 1048576 bytes"),
                      (hostile["garbage"], "not Prometheus text"),
                      (hostile["redirect"], "redirect (HTTP 302): not followed")):
        assert f"127.0.0.1:{port}/metrics" in health.detail and why in health.detail, why
    assert "http://10.1.2.3:8000/metrics: only http:// on a loopback address" in health.detail
    assert source.counters["scrape_errors"] == 5
    assert "4 engine(s) with no metrics port found yet" in health.detail


def test_the_scrape_refuses_what_is_not_loopback_http():
    for url in ("https://127.0.0.1:1/metrics", "http://192.0.2.1/metrics", "file:///etc/x"):
        with pytest.raises(ScrapeError, match="only http:// on a loopback"):
            get(url)


# --- the whole way: a late engine, the bus, the correlator, the store, the signals ----------
def test_an_engine_started_later_reaches_the_store_and_the_rules_within_10_s(
        engines, tmp_config):
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    correlator = Correlator(tmp_config, db, subscriber)
    stop = threading.Event()
    threads = [threading.Thread(target=correlator.run, args=(stop,)),
               threading.Thread(target=engines_source.run_engine_source,
                                args=(tmp_config, stop))]
    for thread in threads:
        thread.start()
    reader = open_store(tmp_config["store.path"], readonly=True)
    try:
        time.sleep(1.0)                        # gpuwhy runs; then the engine starts
        port = free_port()
        proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", port)
        started = time.monotonic()
        key = key_of(proc)
        rows: list = []
        found_after = None
        while time.monotonic() - started < 16 and len(rows) < 2:
            rows = reader.execute(
                "select engine, endpoint, version, requests_running, kv_cache_usage, "
                "preemptions_per_s, ttft_p50_s from engine_samples where pid = ? and "
                "start_time = ? order by ts", [key.pid, key.start_time]).fetchall()
            if rows and found_after is None:
                found_after = time.monotonic() - started
            time.sleep(0.1)
        assert found_after is not None and found_after < 10.0, found_after
        print(f"engine found and stored {found_after:.2f} s after it started")
        assert rows[0][:5] == ("vllm", f"http://127.0.0.1:{port}/metrics", "v1", 48.0, 0.95)
        assert rows[0][5] is None                       # no rate from one scrape
        assert rows[1][3:5] == (40.0, 0.97) and 5 < rows[1][5] < 15 and rows[1][6] == 0.75
        seen = reader.execute("select cmdline from processes where pid = ? and start_time = ?",
                              [key.pid, key.start_time]).fetchone()
        assert "vllm.entrypoints.openai.api_server" in seen[0]
        health = reader.execute("select state from source_health where source = 'engines'"
                                ).fetchone()
        assert health == ("ok",)
        # the rules read it as engine.* signals, from the store
        signals = StoreSignals(reader)
        now = reader.execute("select max(ts) from engine_samples").fetchone()[0]
        signals.begin(now)
        series = signals.series(Scope("GPU-x", key), "engine.kv_cache_usage", 0, now)
        assert list(series.values) == [0.95, 0.97]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        reader.close()
        db.close()


def test_a_gpu_process_of_the_engine_reads_the_engine_signals_in_both_sources(db):
    """vLLM V1: the API server scrapes, its EngineCore child holds the GPU: the child's
    process rules read the server's figures (MemorySignals and StoreSignals alike)."""
    server, core = ProcessKey(100, 5000), ProcessKey(101, 5001)
    samples = [EngineSample(ts=t * 10**9, engine="vllm", endpoint="http://127.0.0.1:8000/metrics",
                            process=server, processes=[core], values={"kv_cache_usage": v})
               for t, v in ((1, 0.5), (6, 0.99))]
    memory = MemorySignals()
    memory.feed(samples)
    from gpuwhy.events import Envelope
    from gpuwhy.store.writer import StoreWriter
    StoreWriter(db).write_batch([Envelope("engines", i, e) for i, e in enumerate(samples)])
    store = StoreSignals(db)
    store.begin(7 * 10**9)
    for signals in (memory, store):
        for who in (server, core):
            series = signals.series(Scope("GPU-x", who), "engine.kv_cache_usage", 0, 10**10)
            assert list(series.values) == [0.5, 0.99], (signals, who)
        other = signals.series(Scope("GPU-x", ProcessKey(7, 7)), "engine.kv_cache_usage",
                               0, 10**10)
        assert list(other.values) == []


def test_tables_are_read_once_and_not_again_while_an_engine_s_sockets_stay(engines):
    from gpuwhy.probes.engines.discover import Finder
    engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", free_port())
    finder = Finder()
    first = finder.find()
    reads = finder.table_reads
    assert first and reads >= 1
    assert [e.process for e in finder.find()] == [e.process for e in first]
    assert finder.table_reads == reads          # same sockets: the costly tables not read


def _fake_process(root: Path, pid: int, argv: list[str], start: int, ppid: int,
                  netns: str, fds: dict[int, str], children: list[int] = ()) -> None:
    """A /proc/PID as the kernel lays it out, for the cases this host cannot make (a GPU
    device file held, another network namespace)."""
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "ns").mkdir()
    (base / "task" / str(pid)).mkdir(parents=True)
    (base / "net").mkdir()
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (base / "stat").write_text(f"{pid} (x) " + " ".join(fields) + "\n")
    (base / "ns" / "net").symlink_to(netns)
    for fd, target in fds.items():
        (base / "fd" / str(fd)).symlink_to(target)
    (base / "task" / str(pid) / "children").write_text(" ".join(map(str, children)))
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt" \
             "   uid  timeout inode\n"
    (base / "net" / "tcp").write_text(
        header + "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 "
        "00000000     0        0 555 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 "
        "00000000     0        0 556 1 0000000000000000 100 0 0 10 0\n")
    (base / "net" / "tcp6").write_text(header)


def test_the_gpu_processes_of_an_engine_and_another_namespace_are_told(tmp_path):
    from gpuwhy.probes.engines.discover import Finder
    root = tmp_path / "proc"
    # a vLLM V1 server (port 8000 on every address) whose EngineCore child holds GPU 3
    _fake_process(root, 100, ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                  1000, 1, "net:[1]", {3: "socket:[555]"}, [101])
    _fake_process(root, 101, ["VLLM::EngineCore"], 1001, 100, "net:[1]",
                  {5: "/dev/nvidia3", 6: "/dev/nvidiactl"})
    # an SGLang server in another network namespace (a container without host networking)
    _fake_process(root, 200, ["python3", "-m", "sglang.launch_server"], 2000, 1, "net:[2]",
                  {4: "socket:[556]"})
    found = {e.engine: e for e in Finder(str(root), own_netns="net:[1]").find()}
    vllm, sglang = found["vllm"], found["sglang"]
    assert vllm.process == ProcessKey(100, 1000) and vllm.ports == [8000]
    assert vllm.members == [ProcessKey(101, 1001)] and vllm.gpu_minors == [3]
    assert vllm.note == "" and vllm.netns == ""
    # not allowed to enter (no CAP_SYS_ADMIN): told why and what to do, never scraped
    assert sglang.ports == [8001] and "another network namespace" in sglang.note
    assert "CAP_SYS_ADMIN" in sglang.note and "engines.endpoints" in sglang.note
    assert sglang.netns == ""
    # allowed: scraped on its loopback through the namespace found for it
    entered = {e.engine: e for e in
               Finder(str(root), own_netns="net:[1]", enter_netns=True).find()}
    assert entered["sglang"].note == "" and entered["sglang"].netns == "net:[2]"
    assert entered["vllm"].netns == ""


# --- engines in another network namespace (a container's own network, a pod) -----------------
needs_netns = pytest.mark.skipif(
    not can_enter() or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs CAP_SYS_ADMIN (root), unshare and ip: a network namespace per stand-in")


def _thread_namespaces() -> set[str]:
    """The network namespace of every thread of this process."""
    spaces = set()
    for task in os.listdir("/proc/self/task"):
        try:
            spaces.add(os.readlink(f"/proc/self/task/{task}/ns/net"))
        except OSError:
            continue                      # a thread that just ended
    return spaces


@needs_netns
def test_an_engine_in_another_network_namespace_is_scraped_through_it(engines):
    own = os.readlink("/proc/self/ns/net")
    source = EngineSource(enter_netns=True)
    try:
        source.round()                            # gpuwhy runs; then the engine starts
        port = free_port()
        proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", port,
                             netns=True)
        theirs = os.readlink(f"/proc/{proc.pid}/ns/net")
        assert theirs != own
        with pytest.raises(ConnectionRefusedError), socket.socket() as s:
            s.connect(("127.0.0.1", port))        # not on gpuwhy's loopback: only on its own
        key = key_of(proc)
        # found at the next round (a round every 5 s: within the 10 s goal) and scraped
        [sample] = [e for e in source.round()
                    if isinstance(e, EngineSample) and e.process == key]
        assert sample.engine == "vllm" and sample.endpoint == f"http://127.0.0.1:{port}/metrics"
        assert sample.values["requests_running"] == 48 and sample.values["kv_cache_usage"] == 0.95
        [engine] = [e for e in source.engines if e.process == key]
        assert engine.netns == theirs and engine.note == ""
        assert source.namespaces is not None
        maker = source.namespaces._thread         # the thread that made the socket there
        assert maker is not None and maker.is_alive()
        time.sleep(0.2)
        [second] = [e for e in source.round()
                    if isinstance(e, EngineSample) and e.process == key]
        assert second.values["kv_cache_usage"] == 0.97 and second.values["ttft_p50_s"] == 0.75
        health = source.health()
        assert f"through their network namespace (vllm pid {proc.pid} in {theirs})" in \
            health.detail
        assert source.namespaces is not None and source.namespaces.entered >= 2
        assert source.namespaces.stuck == 0
        # one thread made every socket in the engine's namespace, alive between scrapes;
        # every thread of gpuwhy (the scrape workers and it among them) is in its own
        assert source.namespaces._thread is maker and maker.is_alive()
        workers = [t for t in threading.enumerate() if t.name.startswith("gpuwhy-engines")]
        assert workers and _thread_namespaces() == {own}
    finally:
        source.close()
    maker.join(2)
    assert not maker.is_alive()                   # closing the source ends it


@needs_netns
def test_a_reused_pid_or_another_namespace_is_never_entered(engines):
    from gpuwhy.probes.engines.netns import NamespaceError, Namespaces
    port = free_port()
    proc = engines.start("sglang.launch_server", "sglang.txt", port, netns=True)
    key, theirs = key_of(proc), os.readlink(f"/proc/{proc.pid}/ns/net")
    namespaces = Namespaces()
    try:
        with namespaces.socket_in(key, theirs, socket.AF_INET) as sock:
            sock.connect(("127.0.0.1", port))     # its loopback: the stand-in answers there
        with pytest.raises(NamespaceError, match="no longer the engine"):
            namespaces.socket_in(ProcessKey(key.pid, key.start_time + 1), theirs,
                                 socket.AF_INET)
        with pytest.raises(NamespaceError, match="not the net:\\[1\\] it was found in"):
            namespaces.socket_in(key, "net:[1]", socket.AF_INET)
        assert namespaces.entered == 1 and _thread_namespaces() == {namespaces.own}
        [maker] = [t for t in threading.enumerate() if t.name == "gpuwhy-netns"]
    finally:
        namespaces.close()
    maker.join(2)
    assert not maker.is_alive()                  # closing ends the namespace thread
    with pytest.raises(NamespaceError, match="closed"):
        namespaces.socket_in(key, theirs, socket.AF_INET)
    # a scrape through a namespace that is no longer the one found fails, saying why
    source = EngineSource(enter_netns=True)
    try:
        target = engines_source.Target(f"http://127.0.0.1:{port}/metrics", "sglang", key,
                                       netns="net:[1]")
        _, parsed, error = source._scrape(target)
        assert parsed is None and "not the net:[1] it was found in" in error
        assert "not the net:[1]" in target.netns_error
    finally:
        source.close()


@needs_netns
def test_a_hostile_engine_in_a_namespace_costs_only_its_own_scrape(engines):
    own = os.readlink("/proc/self/ns/net")
    slow_port, huge_port = free_port(), free_port()
    slow = engines.start("sglang.launch_server", "sglang.txt", slow_port, mode="slow",
                         netns=True)
    huge = engines.start("sglang.launch_server", "sglang.txt", huge_port, mode="huge",
                         netns=True)
    good = engines.start("tritonserver", "triton.txt", free_port(), netns=True)
    source = EngineSource(timeout=1.0, max_body=1 << 20, enter_netns=True)
    try:
        started = time.monotonic()
        events = source.round()
        took = time.monotonic() - started
        ours = {key_of(p) for p in (slow, huge, good)}
        samples = [e for e in events if isinstance(e, EngineSample) and e.process in ours]
        assert [s.process for s in samples] == [key_of(good)]
        assert took < 1.0 + 1.5, f"a round took {took:.1f} s: one scrape held the others"
        # each was reached through its namespace and failed its own scrape (its port is
        # tried again only after RETRY_S), the source degraded: nothing more
        assert (key_of(slow), slow_port) in source.refused
        assert (key_of(huge), huge_port) in source.refused
        assert source.namespaces is not None and source.namespaces.entered >= 3
        assert not source.entry_errors             # entered each time: the endpoints failed
        assert source.health().state == "degraded"
        assert _thread_namespaces() == {own}
    finally:
        source.close()


@needs_netns
def test_without_cap_sys_admin_an_engine_in_another_namespace_is_told_not_scraped(engines):
    proc = engines.start("vllm.entrypoints.openai.api_server", "vllm_v1.txt", free_port(),
                         netns=True)
    source = EngineSource(enter_netns=False)      # as the shipped unit runs: no capability
    try:
        events = source.round()
        key = key_of(proc)
        assert not [e for e in events if isinstance(e, EngineSample) and e.process == key]
        [engine] = [e for e in source.engines if e.process == key]
        assert engine.netns == "" and "another network namespace" in engine.note
        assert source.namespaces is None and key not in source.targets
        health = source.health()
        assert health.state == "degraded"
        assert f"vllm pid {proc.pid}: in another network namespace, not entered: gpuwhy " \
            "lacks CAP_SYS_ADMIN" in health.detail
        assert "engines.endpoints" in health.detail
    finally:
        source.close()


# --- gpuwhy unprivileged: another user's engine, its fds and ns/net refused -----------------
NOBODY = 65534            # the stand-in engine's user
GPUWHY = 65533            # gpuwhy's side: unprivileged, another user again

# one round of the engines source as run by the test's second uid, told back as JSON
UNPRIVILEGED_ROUND = r"""
import json, os, sys
from gpuwhy.events import EngineSample
from gpuwhy.probes.engines.source import EngineSource
refused = []
for pid in map(int, sys.argv[1:]):
    try:
        os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        refused.append(pid)
source = EngineSource(enter_netns=False)
try:
    events = source.round()
    health = source.health()
    print(json.dumps({
        "uid": os.getuid(), "fds_refused": refused,
        "samples": [[e.engine, e.process.pid, e.endpoint, e.values, e.gpu_ids,
                     len(e.processes)] for e in events if isinstance(e, EngineSample)],
        "engines": {e.process.pid: [e.engine, e.ports, e.owner, e.note, e.info]
                    for e in source.engines},
        "probed_refused": [[k.pid, port] for k, port in source.refused],
        "state": health.state, "detail": health.detail}))
finally:
    source.close()
"""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the stand-in runs as nobody, discovery as another uid")


@needs_root
def test_unprivileged_another_user_s_engine_is_found_by_port_and_owner_and_scraped(engines):
    """The shipped unit's case: gpuwhy is neither root nor the engine's user, so the kernel
    refuses the engine's /proc/PID/fd and ns/net; its port is matched by number and owner."""
    port, other = free_port(), free_port()
    triton = engines.start("tritonserver", "triton.txt", port, user=NOBODY)
    # a process of the same user on a recognised engine's port, serving no engine metrics:
    # matched by number and owner too, then refused by the scrape's probing
    garbage = engines.start("text-generation-router", "tgi.txt", other, mode="garbage",
                            user=NOBODY)
    run = subprocess.run([sys.executable, "-c", UNPRIVILEGED_ROUND, str(triton.pid),
                          str(garbage.pid)], user=GPUWHY, group=GPUWHY, extra_groups=[],
                         cwd="/", env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["uid"] == GPUWHY and out["fds_refused"] == [triton.pid, garbage.pid]
    ours = {triton.pid, garbage.pid}
    samples = [s for s in out["samples"] if s[1] in ours]
    assert samples == [["triton", triton.pid, f"http://127.0.0.1:{port}/metrics",
                        {"requests_waiting": 4.0},
                        # Triton's metrics name its GPUs; its GPU processes stay unknown
                        ["GPU-8b1c2a3e-0000-4a5b-9c6d-7e8f90a1b2c3"], 0]]
    engine, ports, owner, note, info = out["engines"][str(triton.pid)]
    assert (engine, ports, owner, note) == ("triton", [port], NOBODY, "")
    assert f"ports matched by number and owner (uid {NOBODY}), not by its fds" in info
    assert "its GPU processes are unknown" in info
    assert f"triton pid {triton.pid}: ports matched by number and owner" in out["detail"]
    # the same user's port with no engine metrics: probed, refused (tried after RETRY_S)
    assert out["engines"][str(garbage.pid)][:3] == ["tgi", [other], NOBODY]
    assert [garbage.pid, other] in out["probed_refused"]


def _tcp_row(port: int, uid: int, inode: int) -> str:
    return (f"   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 "
            f"00000000 {uid:5d}        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def _fake_other_user(root: Path, pid: int, argv: list[str], uid: int,
                     tables: Path | list[str]) -> Path:
    """A /proc/PID of another user's process as an unprivileged reader sees it: cmdline,
    stat, status and net/ readable (fd/ and ns/ refused: the Finder's readers are swapped).
    ``tables``: its namespace's net/tcp rows, or the net/tcp of a process in the same
    namespace (a hard link: one inode per namespace, as the kernel's)."""
    base = root / str(pid)
    (base / "net").mkdir(parents=True)
    (base / "task" / str(pid)).mkdir(parents=True)
    (base / "task" / str(pid) / "children").write_text("")
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    fields = ["S", "1"] + ["0"] * 17 + [str(pid * 10)] + ["0"] * 10
    (base / "stat").write_text(f"{pid} (x) " + " ".join(fields) + "\n")
    (base / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt" \
             "   uid  timeout inode\n"
    if isinstance(tables, Path):
        os.link(tables, base / "net" / "tcp")
    else:
        (base / "net" / "tcp").write_text(header + "".join(tables))
    (base / "net" / "tcp6").write_text(header)
    return base / "net" / "tcp"


def _refused(pid: int | str, proc_root: str) -> list[str]:
    raise PermissionError(13, "Permission denied", f"{proc_root}/{pid}")


def test_refused_fds_ports_are_matched_by_number_and_owner_never_another_user_s(tmp_path):
    from gpuwhy.probes.engines.discover import Finder
    root = tmp_path / "proc"
    # gpuwhy's own namespace: vLLM (no --port: its default 8000) as uid 1000, listening;
    # SGLang told --port 30001, where only root listens (another user's socket: never its),
    # and uid 1000 on 30000, SGLang's default (not its: it named another)
    host = _fake_other_user(root, 100, ["vllm", "serve", "m"], 1000,
                            [_tcp_row(8000, 1000, 11), _tcp_row(30001, 0, 12),
                             _tcp_row(30000, 1000, 13)])
    _fake_other_user(root, 200, ["python3", "-m", "sglang.launch_server", "--port", "30001"],
                     1000, host)
    (root / "self" / "net").mkdir(parents=True)
    os.link(host, root / "self" / "net" / "tcp")        # gpuwhy in the same namespace
    finder = Finder(str(root))
    finder.fd_links, finder.net_link = _refused, _refused
    finder.RESCAN_S = 0.05
    found = {e.engine: e for e in finder.find()}
    assert set(found) == {"vllm"} and finder.unattributed == []    # not told at once
    vllm = found["vllm"]
    assert vllm.ports == [8000] and vllm.owner == 1000 and vllm.note == ""
    assert vllm.listeners[8000].host == "127.0.0.1" and vllm.netns == ""
    assert "matched by number and owner (uid 1000)" in vllm.info
    assert vllm.members == [] and vllm.gpu_minors == []
    time.sleep(0.1)
    finder.find()
    [(engine, key, why)] = finder.unattributed      # seen longer than RESCAN_S: told, once
    assert (engine, key.pid) == ("sglang", 200)
    assert "none of its ports (30001) listens under its uid 1000" in why
    # the source: both told in its health as information, not a fault
    source = EngineSource(proc_root=str(root), enter_netns=False)
    try:
        source.finder.fd_links, source.finder.net_link = _refused, _refused
        source.finder.RESCAN_S = 0.05
        source.discover()
        time.sleep(0.1)
        source.discover()
        source.targets[vllm.process] = engines_source.Target(
            "http://127.0.0.1:8000/metrics", "vllm", vllm.process)      # as once scraped
        health = source.health()
        assert health.state == "ok", health.detail
        assert "vllm pid 100: ports matched by number and owner (uid 1000)" in health.detail
        assert "sglang pid 200: recognised" in health.detail
    finally:
        source.close()
    # an engine in another namespace (its own net/tcp inode): cannot be entered, told what
    # to grant, whatever gpuwhy's CAP_SYS_ADMIN
    _fake_other_user(root, 300, ["tritonserver", "--model-repository=/m"], 1000,
                     [_tcp_row(8002, 1000, 21)])
    for enter in (False, True):
        finder = Finder(str(root), enter_netns=enter)
        finder.fd_links, finder.net_link = _refused, _refused
        triton = {e.engine: e for e in finder.find()}["triton"]
        assert triton.ports == [8002] and triton.owner == 1000 and triton.netns == ""
        assert "another network namespace" in triton.note
        for grant in ("CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN",
                      "engines.endpoints"):
            assert grant in triton.note


def test_a_port_matched_by_owner_for_two_engines_goes_to_the_one_naming_it_or_neither(
        tmp_path):
    from gpuwhy.probes.engines.discover import Finder
    root = tmp_path / "proc"
    # two vLLMs of one user in one namespace, one listening on 8000: the one started with
    # --port 8000, or, when neither names it (both by default), neither (cannot be told)
    host = _fake_other_user(root, 100, ["vllm", "serve", "a"], 1000,
                            [_tcp_row(8000, 1000, 11)])
    _fake_other_user(root, 200, ["vllm", "serve", "b", "--port", "8000"], 1000, host)
    (root / "self" / "net").mkdir(parents=True)
    os.link(host, root / "self" / "net" / "tcp")
    finder = Finder(str(root))
    finder.fd_links, finder.net_link = _refused, _refused
    by_pid = {e.process.pid: e for e in finder.find()}
    assert by_pid[200].ports == [8000] and by_pid[200].note == ""
    assert by_pid[100].ports == [] and "several engines of one user" in by_pid[100].note
    (root / "200" / "cmdline").write_bytes(b"vllm\0serve\0b\0")
    finder = Finder(str(root))
    finder.fd_links, finder.net_link = _refused, _refused
    assert all(e.ports == [] and "several engines" in e.note for e in finder.find())


def test_an_engine_listening_nowhere_is_told_after_rescan_s_once_per_tree(tmp_path):
    from gpuwhy.probes.engines.discover import Finder
    root = tmp_path / "proc"
    # TGI: the launcher listens nowhere, its router does (socket 555: port 8000): not told
    _fake_process(root, 100, ["text-generation-launcher"], 1000, 1, "net:[1]", {}, [101])
    _fake_process(root, 101, ["text-generation-router", "--port", "8000"], 1001, 100,
                  "net:[1]", {3: "socket:[555]"})
    # a vLLM server loading its model (no socket yet) and its forked worker: one engine
    _fake_process(root, 200, ["vllm", "serve", "m"], 2000, 1, "net:[1]", {}, [201])
    _fake_process(root, 201, ["vllm", "serve", "m"], 2001, 200, "net:[1]", {})
    finder = Finder(str(root), own_netns="net:[1]")
    finder.RESCAN_S = 0.05
    assert [e.engine for e in finder.find()] == ["tgi"] and finder.unattributed == []
    time.sleep(0.1)
    finder.find()
    [(engine, key, why)] = finder.unattributed
    assert (engine, key) == ("vllm", ProcessKey(200, 2000))
    assert "holds no listening TCP socket" in why and "loading its model" in why
