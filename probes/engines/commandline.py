"""What an inference engine's command line says: the engine, its ports, its batch limit.

A process is an engine when its program (or the script or module Python runs) is one, never
when a later argument names one (``grep vllm serve`` is no engine). Command lines are the
process's: bounded by whoever read them, only compared here, never run or shown.
"""

from __future__ import annotations

import os
import re

_PYTHON = re.compile(r"python[0-9.]*")
_PORT_VALUE = re.compile(r"[0-9]{1,5}")

# engine -> (program names that are it, python -m modules that are it, default metrics
# ports, command-line flags naming the metrics port, most preferred first)
ENGINES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]] = {
    # vLLM: /metrics on the API server's port (--port, default 8000) [vllm docs, serving/metrics]
    "vllm": (("vllm",), ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
             (8000,), ("--port",)),
    # SGLang: /metrics on the server's port (--port, default 30000) with --enable-metrics;
    # started as `sglang serve` (the console script sglang = sglang.cli.main:main, the
    # recommended entry of recent releases) or `python -m sglang.launch_server` (still
    # supported) [sgl-project/sglang python/pyproject.toml, python/sglang/cli/main.py]
    "sglang": (("sglang",), ("sglang.launch_server",), (30000,), ("--port",)),
    # TGI: the router serves /metrics on its HTTP port (--port, default 3000; 80 in the image)
    "tgi": (("text-generation-launcher", "text-generation-router"), (), (3000, 80),
            ("--port",)),
    # Triton: /metrics on its own port (--metrics-port, default 8002) [triton metrics.md]
    "triton": (("tritonserver",), (), (8002,), ("--metrics-port",)),
}
# engine -> the subcommand its program must be given to serve (`vllm bench`, `vllm chat`,
# `sglang generate`, `sglang version` serve nothing)
SERVE_SUBCOMMAND = {"vllm": "serve", "sglang": "serve"}
# engine -> the command-line flags that set how many requests it runs at once, its batch
# limit: vLLM --max-num-seqs [vllm docs, engine args], SGLang --max-running-requests
# [sglang docs, server arguments], TGI --max-batch-size (the launcher's and the router's;
# optional: its batch is mostly bounded by --max-batch-total-tokens) [TGI docs, launcher].
# Without the flag the limit is the engine's default, which depends on its version and GPU:
# not guessed.
BATCH_LIMIT_FLAGS = {"vllm": ("--max-num-seqs",), "sglang": ("--max-running-requests",),
                     "tgi": ("--max-batch-size",)}
MAX_BATCH_LIMIT = 1 << 20


def recognise(argv: list[str]) -> str | None:
    """Which engine a command line runs, or None. Only the program (or the script or module
    Python runs) counts, never a later argument: ``grep vllm serve`` is no engine."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    rest = argv[1:]
    module = None
    if _PYTHON.fullmatch(program):
        i = 0
        while i < len(rest) and rest[i].startswith("-") and rest[i] != "-m":
            i += 2 if rest[i] in ("-W", "-X") else 1     # interpreter options
        if i < len(rest) and rest[i] == "-m":
            module = rest[i + 1] if i + 1 < len(rest) else None
            rest = rest[i + 2:]
        elif i < len(rest):
            program, rest = os.path.basename(rest[i]), rest[i + 1:]
        else:
            return None
    for name, (programs, modules, _, _) in ENGINES.items():
        if module is not None:
            if module in modules:
                return name
        elif program in programs:
            # `vllm serve`: the CLI's other commands (bench, chat, complete) serve nothing
            wanted = SERVE_SUBCOMMAND.get(name)
            if wanted is not None and (not rest or rest[0] != wanted):
                continue
            return name
    return None


def _flag_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """The values given to ``flags`` (``--port 8080`` and ``--port=8080``), in order."""
    values = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            values.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
    return values


def named_ports(engine: str, argv: list[str]) -> list[int]:
    """The metrics ports a command line names, without the engine's defaults."""
    named = [int(v) for v in _flag_values(argv, ENGINES[engine][3])
             if _PORT_VALUE.fullmatch(v) and 0 < int(v) < 65536]
    return list(dict.fromkeys(named))


def batch_limit(engine: str, argv: list[str]) -> int | None:
    """The batch limit the command line sets (``--max-num-seqs 256``, ``=256``; the last one
    given wins, as argparse's), None when it sets none or no number."""
    found = None
    for value in _flag_values(argv, BATCH_LIMIT_FLAGS.get(engine, ())):
        if value.isdigit() and len(value) <= 7 and 0 < int(value) <= MAX_BATCH_LIMIT:
            found = int(value)
    return found


def flag_ports(engine: str, argv: list[str]) -> list[int]:
    """The metrics ports a command line names (``--port 8080``, ``--port=8080``), then the
    engine's defaults."""
    return list(dict.fromkeys(named_ports(engine, argv) + list(ENGINES[engine][2])))


def candidate_ports(engine: str, argv: list[str]) -> list[int]:
    """The ports an engine listens on for its metrics, by its command line alone: those it
    names, else its engine's defaults (a default of an engine told to listen elsewhere is
    more likely another engine's, of the same user, than its own)."""
    return named_ports(engine, argv) or list(ENGINES[engine][2])
