"""Find a GPU process's serving frontend and engine loop: its engine's processes not its own.

A serving engine's frontend (HTTP, tokenisation, detokenisation) is rarely a child of the
process that holds the GPU. vLLM's V1 engine (0.8+): the API server process (``vllm
serve``) is the parent of EngineCore, which holds the GPU or whose workers do under tensor
parallelism (docs.vllm.ai, design/arch_overview: "V1 process architecture"); SGLang's
``launch_server`` process (TokenizerManager, HTTP) is the parent of its scheduler processes
and of the DetokenizerManager beside them (sgl-project/sglang, python/sglang/srt/entrypoints/
engine.py: _launch_subprocesses); TGI's ``text-generation-launcher`` starts the router (the
Rust HTTP frontend, which tokenises) and the model server shards (huggingface/
text-generation-inference, docs/source/architecture.md). So the sched probe looks up the
GPU process's ancestors (MAX_ANCESTORS up) for the topmost one whose command line is an
engine's (commandline.recognise). The processes between the engine and the GPU process are
its engine loop: vLLM's EngineCore above tensor-parallel workers runs the scheduler's busy
loop and holds no GPU (docs.vllm.ai, design/arch_overview, V1 process architecture: the
engine core process schedules and drives the GPU worker processes); it is R49's, not a
frontend, whose fix (more API servers) would be wrong for it. That engine's tree, less
every GPU process's own subtree (their workers) and less the engine loop, is the frontend.

Everything read is the processes': /proc/PID/stat (gpuwhy.proc.read_stat), command lines
only compared (discover.read_argv, bounded), the tree capped as discover's (MAX_TREE
processes, MAX_DEPTH generations).
"""

from __future__ import annotations

from collections.abc import Collection

from gpuwhy.errors import NoSuchProcess
from gpuwhy.probes.engines.commandline import recognise
from gpuwhy.probes.engines.discover import MAX_DEPTH, MAX_TREE, children, read_argv
from gpuwhy.proc import read_stat

# Generations looked up: the GPU process is EngineCore (vLLM), a scheduler (SGLang) or a
# shard (TGI), one below its engine; a tensor-parallel worker is two below (API server ->
# EngineCore -> worker); a wrapper (a shell, `uv run`, tini) adds one.
MAX_ANCESTORS = 4


def parent(pid: int, proc_root: str = "/proc") -> int | None:
    """The process's parent pid from /proc/PID/stat; None when it is gone or unreadable."""
    try:
        return read_stat(pid, proc_root)[1]
    except (NoSuchProcess, OSError, ValueError, IndexError):
        return None


def ancestors(pid: int, proc_root: str = "/proc") -> list[int]:
    """``pid``'s parent, its parent's parent, …: MAX_ANCESTORS at most, up to init."""
    found, current = [], pid
    for _ in range(MAX_ANCESTORS):
        above = parent(current, proc_root)
        if above is None or above <= 0 or above == current or above in found:
            break
        found.append(above)
        if above == 1:
            break
        current = above
    return found


def engine_root(pid: int, proc_root: str = "/proc") -> int | None:
    """The topmost of ``pid``'s ancestors, MAX_ANCESTORS up at most, whose command line is
    an engine's (vLLM's API server above EngineCore above a tensor-parallel worker: the API
    server); None if none is. The process itself does not count: an engine that holds the
    GPU itself has its frontend among its own threads or workers."""
    engines = [p for p in ancestors(pid, proc_root)
               if recognise(read_argv(p, proc_root)) is not None]
    return engines[-1] if engines else None


def frontend_processes(gpu_pid: int, gpu_pids: Collection[int],
                       proc_root: str = "/proc") -> list[int]:
    """The frontend processes of the engine above ``gpu_pid`` (engine_processes)."""
    return engine_processes(gpu_pid, gpu_pids, proc_root)[0]


def engine_processes(gpu_pid: int, gpu_pids: Collection[int],
                     proc_root: str = "/proc") -> tuple[list[int], list[int]]:
    """(frontend, engine loop) of the engine above ``gpu_pid``. The engine loop: its
    ancestors below the engine root, less the GPU processes ``gpu_pids``. The frontend: its
    engine's tree (the engine root and its descendants, MAX_TREE processes, MAX_DEPTH
    generations below the root) less ``gpu_pid``, the other GPU processes and every
    descendant of theirs (a GPU process's children are its workers), less the engine loop.
    Both empty when no ancestor is an engine."""
    above = ancestors(gpu_pid, proc_root)
    engines = [p for p in above if recognise(read_argv(p, proc_root)) is not None]
    if not engines:
        return [], []
    root = engines[-1]
    skip = {gpu_pid, *gpu_pids}
    # The processes between the engine and the GPU process (vLLM's EngineCore above its
    # tensor-parallel workers) run the engine's loop, not its frontend: R50's "tokenising
    # or detokenising process" and its fix would misname them. They are the engine loop,
    # and the frontend's walk looks through them.
    loop = [p for p in above[:above.index(root)] if p not in skip]
    between = set(above[:above.index(root)])
    found: list[int] = []
    seen = {root}
    level = [root]
    for depth in range(MAX_DEPTH + 1):
        below: list[int] = []
        for pid in level:
            if pid in skip:
                continue          # a GPU process: it and its subtree are not the frontend
            if pid not in between:
                found.append(pid)
            if len(found) >= MAX_TREE:
                return found, loop
            if depth < MAX_DEPTH:
                below += [k for k in children(pid, proc_root) if k not in seen]
                seen.update(below)
        level = below
        if not level:
            break
    return found, loop
