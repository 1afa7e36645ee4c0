"""A GPU process's serving frontend and engine loop found over a fake /proc: the engine above
it (the topmost ancestor whose command line is an engine's, a few generations up at most),
the processes between the two (its engine loop) and that engine's tree less the GPU
processes, their workers and the engine loop (its frontend)."""

from pathlib import Path

from gpuwhy.probes.engines.frontend import (
    MAX_ANCESTORS,
    engine_processes,
    engine_root,
    frontend_processes,
)


def _proc(root: Path, pid: int, ppid: int, argv: list[str], children: tuple[int, ...] = (),
          comm: str = "python3") -> None:
    folder = root / str(pid)
    (folder / "task" / str(pid)).mkdir(parents=True)
    rest = " ".join(["0"] * 40)
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {rest}\n")
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "task" / str(pid) / "children").write_text(" ".join(map(str, children)))


def _vllm_tp(root: Path) -> None:
    """bash -> vllm serve (API server) -> EngineCore -> two GPU workers; the first worker
    forked a compile worker of its own."""
    _proc(root, 10, 1, ["bash"], (100,), comm="bash")
    _proc(root, 100, 10, ["/venv/bin/python", "/venv/bin/vllm", "serve", "m",
                          "--tensor-parallel-size", "2"], (200,))
    _proc(root, 200, 100, ["python3", "-c", "from multiprocessing.spawn import spawn_main"],
          (300, 301), comm="VLLM::EngineCor")
    _proc(root, 300, 200, ["python3", "-c", "spawn_main"], (400,), comm="VllmWorker 0")
    _proc(root, 301, 200, ["python3", "-c", "spawn_main"], comm="VllmWorker 1")
    _proc(root, 400, 300, ["python3", "-c", "compile"], comm="inductor")


def test_vllm_api_server_is_the_workers_frontend_and_engine_core_is_not(tmp_path):
    _vllm_tp(tmp_path)
    assert engine_root(300, str(tmp_path)) == 100
    # the other worker is a GPU process too: neither frontend, nor the first's compile
    # worker; EngineCore, between the API server and the workers, runs the engine's loop
    assert frontend_processes(300, [301], str(tmp_path)) == [100]
    assert frontend_processes(301, [300], str(tmp_path)) == [100]


def test_engine_core_between_the_api_server_and_the_workers_is_their_engine_loop(tmp_path):
    _vllm_tp(tmp_path)
    assert engine_processes(300, [301], str(tmp_path)) == ([100], [200])
    assert engine_processes(301, [300], str(tmp_path)) == ([100], [200])
    # EngineCore holding a GPU itself (one GPU, no workers): it is no one's engine loop
    assert engine_processes(300, [200, 301], str(tmp_path)) == ([100], [])
    assert engine_processes(200, [], str(tmp_path)) == ([100], [])


def test_sglang_detokenizer_is_a_sibling_frontend(tmp_path):
    _proc(tmp_path, 100, 1, ["python3", "-m", "sglang.launch_server", "--model-path", "m"],
          (200, 201))
    _proc(tmp_path, 200, 100, ["python3", "-c", "spawn_main"], comm="sglang::schedul")
    _proc(tmp_path, 201, 100, ["python3", "-c", "spawn_main"], comm="sglang::detoken")
    assert engine_processes(200, [], str(tmp_path)) == ([100, 201], [])   # no loop apart


def test_no_engine_above_no_frontend(tmp_path):
    # a training job under a shell; a parent that only names an engine in an argument;
    # a comm holding ") S 100" cannot move the parent read
    _proc(tmp_path, 50, 1, ["grep", "vllm", "serve"], (60,), comm="grep")
    _proc(tmp_path, 60, 50, ["python3", "train.py"], (70,), comm="x) S 100 (y")
    _proc(tmp_path, 70, 60, ["python3", "train.py"])
    assert engine_processes(70, [], str(tmp_path)) == ([], [])
    assert engine_processes(12345, [], str(tmp_path)) == ([], [])      # gone


def test_an_engine_too_far_up_is_not_looked_for(tmp_path):
    pids = list(range(100, 100 + MAX_ANCESTORS + 2))
    _proc(tmp_path, pids[0], 1, ["tritonserver"], (pids[1],))
    for parent, pid in zip(pids, pids[1:], strict=False):
        after = pids.index(pid) + 1
        _proc(tmp_path, pid, parent, ["sh"], tuple(pids[after:after + 1]), comm="sh")
    assert engine_root(pids[MAX_ANCESTORS], str(tmp_path)) == pids[0]
    assert engine_root(pids[MAX_ANCESTORS + 1], str(tmp_path)) is None
