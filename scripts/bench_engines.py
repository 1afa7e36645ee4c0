"""Engines source benchmark: the CPU that finding and scraping 4 inference engines costs.

    .venv/bin/python scripts/bench_engines.py [--rounds 40] [--runs 5] [--profile] [--netns]

Four stand-in engines (tests/engine_standin.py: started under the engines' own command lines,
so that the real /proc discovery finds them) serve /metrics bodies shaped like the engines'
under load: the recorded frames of tests/data/engines/ (vLLM V1, SGLang, TGI, Triton) and,
beside them, the families a real server publishes that the engine signals do not read
(vLLM V1's other histograms, vllm/v1/metrics/loggers.py; prometheus-fastapi-instrumentator's
``http_*`` families, which vLLM and SGLang's OpenAI servers mount; the Python client's
``process_*``/``python_*``; Triton's ``nv_gpu_*``/``nv_cpu_*``/per-model duration counters,
docs/user_guide/metrics.md). The stand-ins run in child processes; this process's CPU time
(``time.process_time``: the scrape pool's threads included) is the source's alone. A round
is what the source does every ``INTERVAL_S`` (5 s): discovery, 4 scrapes, parse, values;
the figure is its CPU as a share of one core at that interval.

``before`` is the source as it was: every sample line of a body parsed
(``metrics.parse(..., narrow=False)``), every process's command line (with buffered
``open()``) and every engine's ports, tree and GPU files read every round, a timer thread
started for each scrape's deadline; ``narrow parse only`` skips the lines of families the
engine signals do not read before parsing them; ``after`` (what the source does) also reads
a command line only for a new process or ``Finder.RESCAN_S`` later, with ``os.read``, an
engine's ports, tree and GPU files when it is found and ``RESCAN_S`` later, and keeps every
deadline in one thread. All run in the same process, round by round in turn,
each the median over ``--runs``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "engine_standin.py"
DATA = ROOT / "tests" / "data" / "engines"
FRAME = "# --- next scrape ---\n"
INTERVAL_S = 5.0
GOAL_PCT = 0.1


def _histogram(name: str, labels: str, bounds: list[float], total: float) -> list[str]:
    lines = [f"# HELP {name} a histogram", f"# TYPE {name} histogram"]
    for k, bound in enumerate(bounds):
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {total * (k + 1) / len(bounds)}')
    lines += [f'{name}_bucket{{{labels},le="+Inf"}} {total}', f"{name}_sum{{{labels}}} "
              f"{total * 1.7}", f"{name}_count{{{labels}}} {total}"]
    return lines


SECONDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0, 20.0, 40.0, 80.0]
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]


def _common(scrape: int) -> list[str]:
    """What every Python server's /metrics also holds: the client's process and GC
    families, and the HTTP frontend's (prometheus-fastapi-instrumentator) per handler."""
    n = 1000 * (scrape + 1)
    out = [f'python_gc_objects_collected_total{{generation="{g}"}} {n * 7}' for g in range(3)]
    out += [f'python_gc_collections_total{{generation="{g}"}} {n}' for g in range(3)]
    out += ['python_info{implementation="CPython",major="3",minor="12",patchlevel="3",'
            'version="3.12.3"} 1.0']
    out += [f"process_{m} {n * 1.1}" for m in ("virtual_memory_bytes", "resident_memory_bytes",
                                               "start_time_seconds", "cpu_seconds_total",
                                               "open_fds", "max_fds")]
    for handler in ("/v1/completions", "/v1/chat/completions", "/metrics", "/health",
                    "/v1/models", "/tokenize", "/detokenize", "/version"):
        for status in ("2xx", "4xx", "5xx"):
            out.append(f'http_requests_total{{handler="{handler}",method="POST",'
                       f'status="{status}"}} {n}')
        labels = f'handler="{handler}",method="POST"'
        out += [f"http_request_size_bytes_sum{{{labels}}} {n * 900}",
                f"http_request_size_bytes_count{{{labels}}} {n}",
                f"http_response_size_bytes_sum{{{labels}}} {n * 2000}",
                f"http_response_size_bytes_count{{{labels}}} {n}"]
        out += _histogram("http_request_duration_seconds", labels, [0.1, 0.5, 1.0], n)
    out += _histogram("http_request_duration_highr_seconds", 'method="POST"', SECONDS + [
        120.0, 240.0, 480.0, 960.0, 1920.0], n)
    return out


def _vllm_others(scrape: int) -> list[str]:
    """vLLM V1's families beside those the engine signals read (vllm/v1/metrics/loggers.py)."""
    n = 1000 * (scrape + 1)
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    out = [f"vllm:prefix_cache_queries_total{{{labels}}} {n * 300}",
           f"vllm:prefix_cache_hits_total{{{labels}}} {n * 120}",
           f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",{labels}}} 1.0']
    for name in ("request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
                 "request_max_num_generation_tokens", "request_params_n",
                 "request_params_max_tokens"):
        out += _histogram(f"vllm:{name}", labels, TOKENS, n)
    for name in ("request_inference_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds"):
        out += _histogram(f"vllm:{name}", labels, SECONDS, n)
    return out


def _triton_others(scrape: int) -> list[str]:
    n = 1000 * (scrape + 1)
    out = []
    for g in range(8):
        uuid = f'gpu_uuid="GPU-{g:08d}-0000-0000-0000-000000000000"'
        out += [f"nv_gpu_utilization{{{uuid}}} 0.5", f"nv_gpu_memory_total_bytes{{{uuid}}} 8e10",
                f"nv_gpu_memory_used_bytes{{{uuid}}} 4e10", f"nv_gpu_power_usage{{{uuid}}} 300",
                f"nv_gpu_power_limit{{{uuid}}} 700", f"nv_energy_consumption{{{uuid}}} {n}"]
    out += ["nv_cpu_utilization 0.2", "nv_cpu_memory_total_bytes 1e12",
            "nv_cpu_memory_used_bytes 1e11"]
    for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing"):
        labels = f'model="{model}",version="1"'
        for name in ("request_failure", "inference_compute_input_duration_us",
                     "inference_compute_infer_duration_us",
                     "inference_compute_output_duration_us", "cache_num_hits_per_model",
                     "cache_hit_duration_per_model"):
            out.append(f"nv_{name}{{{labels}}} {n}")
    return out


EXTRA = {"vllm_v1.txt": lambda k: _vllm_others(k) + _common(k),
         "sglang.txt": _common, "tgi.txt": lambda k: [], "triton.txt": _triton_others}
STARTS = {"vllm_v1.txt": ["-m", "vllm.entrypoints.openai.api_server"],
          "sglang.txt": ["-m", "sglang.launch_server"], "tgi.txt": "text-generation-router",
          "triton.txt": "tritonserver"}


def _frames(name: str, rounds: int) -> str:
    """The recorded frames, then ``rounds`` more (the counters going on), each with the
    families the signals do not read."""
    recorded = (DATA / name).read_text().split(FRAME)
    frames = [recorded[min(k, len(recorded) - 1)] + "\n".join(EXTRA[name](k)) + "\n"
              for k in range(rounds)]
    return FRAME.join(frames)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder: Path, rounds: int, netns: bool = False
          ) -> tuple[list[subprocess.Popen], dict[str, int]]:
    """The four stand-ins; ``netns``: each in a network namespace of its own (a container's
    network), reached through it (probes/engines/netns.py; root)."""
    procs, sizes = [], {}
    for name, how in STARTS.items():
        frames = folder / name
        frames.write_text(_frames(name, rounds))
        sizes[name] = len(frames.read_text().split(FRAME)[-1].encode())
        env = {**os.environ, "STANDIN_FRAMES": str(frames)}
        port = str(_free_port())
        if isinstance(how, list):        # python -m MODULE: a package of that name on the path
            package = folder / "mods" / how[1]
            module = package.parent
            for part in how[1].split(".")[:-1]:
                module = module / part
                module.mkdir(parents=True, exist_ok=True)
                (module / "__init__.py").touch()
            (module / f"{how[1].split('.')[-1]}.py").write_text(
                f"import runpy; runpy.run_path({str(STANDIN)!r}, run_name='__main__')\n")
            env["PYTHONPATH"] = str(folder / "mods")
            argv, executable = [sys.executable, *how, "--port", port], None
        else:
            flag = "--metrics-port" if how == "tritonserver" else "--port"
            argv, executable = [how, str(STANDIN), flag, port], sys.executable
        if netns:
            # unshare and bash exec in place: the pid is the stand-in's, its argv[0] the same
            argv = ["unshare", "--net", "bash", "-c", 'ip link set lo up && exec -a "$0" "$@"',
                    argv[0], executable or argv[0], *argv[1:]]
            executable = None
        proc = subprocess.Popen(argv, executable=executable, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, cwd=folder)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready", name
        procs.append(proc)
    return procs, sizes


# each variant: (parse only the families read; read every command line and engine every
# round with buffered open() and start a timer thread a scrape, as the source did before
# scripts/bench_engines.py was written)
VARIANTS = {"before": (False, True), "narrow parse only": (True, True), "after": (True, False)}
NETNS = "after, in namespaces"     # --netns: the source as it is, engines in other namespaces


def _buffered_read(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:      # discover._read as it was (the "before" variants)
        return f.read(limit)


class _TimerDeadline:
    """probes/gpu/scrape.py's Deadline as it was (the "before" variants): a timer thread
    started for each scrape."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _TimerDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                sock.shutdown(socket.SHUT_RDWR)


def measure(rounds: int, runs: int, profile: bool = False, netns: bool = False) -> dict:
    """The variants' CPU, round by round in turn; with ``netns`` a fourth arm: the source as
    it is, on four more stand-ins each in a network namespace of its own (a socket made in
    it by a one-shot thread a scrape), beside the same source on the first four."""
    from gpuwhy.probes.engines import discover
    from gpuwhy.probes.engines import metric_names as metrics
    from gpuwhy.probes.engines import source as engine_source
    from gpuwhy.probes.engines.source import EngineSource

    folder = Path(tempfile.mkdtemp(prefix="gpuwhy-bench-engines-"))
    variants = dict(VARIANTS, **({NETNS: VARIANTS["after"]} if netns else {}))
    total_rounds = (rounds * runs + 2) * len(variants) + rounds + 4
    procs, sizes = start(folder, total_rounds)
    if netns:
        spaced = folder / "netns"
        spaced.mkdir()
        procs += start(spaced, total_rounds, netns=True)[0]
    full_parse, own_read, own_deadline = metrics.parse, discover._read, engine_source.Deadline
    sources: dict[str, EngineSource] = {}
    try:
        figures: dict[str, list[float]] = {how: [] for how in variants}
        parse_ms: dict[str, list[float]] = {how: [] for how in variants}
        parse_cpu = [0.0]

        def use(how: str) -> None:
            narrow, every_round = variants[how]

            def timed(engine: str, text: str) -> metrics.Parsed:
                started = time.thread_time()
                try:
                    return full_parse(engine, text, narrow=narrow)
                finally:
                    parse_cpu[0] += time.thread_time() - started

            metrics.parse = timed          # the source calls metrics.parse(engine, text)
            discover._read = _buffered_read if every_round else own_read
            engine_source.Deadline = _TimerDeadline if every_round else own_deadline

        for how, (_, every_round) in variants.items():
            sources[how] = source = EngineSource()
            if every_round:
                source.finder.RESCAN_S = 0.0
            if netns:
                # each arm scrapes its own four: the netns arm those in namespaces, the
                # others those in this one; every arm's discovery still reads all eight
                find = source.finder.find
                source.finder.find = (  # type: ignore[method-assign]
                    lambda find=find, spaced=how == NETNS:
                    [e for e in find() if bool(e.netns) == spaced])
            use(how)
            for _ in range(2):             # discovery of the 4, ports probed, rates started
                source.round()
            found = sum(1 for t in source.targets.values() if t.previous)
            assert found == 4, f"{how}: {found} of 4 stand-in engines scraped"
        # round by round, the variants in turn: the machine's drift falls on all alike
        for _ in range(runs):
            cpu = dict.fromkeys(variants, 0.0)
            parsed = dict.fromkeys(variants, 0.0)
            for _ in range(rounds):
                for how, source in sources.items():
                    use(how)
                    parse_cpu[0] = 0.0
                    started = time.process_time()
                    source.round()
                    cpu[how] += time.process_time() - started
                    parsed[how] += parse_cpu[0]
            for how in variants:
                figures[how].append(cpu[how] / rounds / INTERVAL_S * 100)
                parse_ms[how].append(parsed[how] / rounds * 1e3)
        metrics.parse, discover._read = full_parse, own_read
        engine_source.Deadline = own_deadline
        if profile:
            import cProfile
            import pstats
            source = EngineSource()
            source.round()
            source.round()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(rounds):
                source.round()
            profiler.disable()
            source.close()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    finally:
        metrics.parse, discover._read = full_parse, own_read
        engine_source.Deadline = own_deadline
        for source in sources.values():
            source.close()
        for proc in procs:
            proc.kill()
            proc.wait()
    out: dict = {"bodies_bytes": sizes, "rounds": rounds, "runs": runs,
                 "processes": sum(1 for p in os.listdir("/proc") if p.isdigit()),
                 "variants": list(variants)}
    for how in variants:
        values = figures[how]
        out[how] = {"pct_of_core": statistics.median(values), "min": min(values),
                    "max": max(values), "parse_ms_per_round": statistics.median(parse_ms[how]),
                    "runs_pct": values}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--netns", action="store_true",
                        help="also four engines each in a network namespace of its own (root)")
    args = parser.parse_args()
    result = measure(args.rounds, args.runs, args.profile, args.netns)
    sizes = ", ".join(f"{k.split('.')[0]} {v / 1024:.0f} KiB" for k, v in
                      result["bodies_bytes"].items())
    print(f"bodies: {sizes}; {result['processes']} processes on the host; {args.rounds} "
          f"rounds × {args.runs} runs")
    for how in result["variants"]:
        r = result[how]
        print(f"{how:20}: {r['pct_of_core']:.3f} % of a core [{r['min']:.3f} – {r['max']:.3f}] "
              f"at one round every {INTERVAL_S:g} s (goal ≤ {GOAL_PCT}); parse "
              f"{r['parse_ms_per_round']:.2f} ms a round")


if __name__ == "__main__":
    main()
