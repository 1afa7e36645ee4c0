"""Find inference engines from /proc alone, without touching them.

A process is an engine when its command line says so (what /proc/PID/cmdline shows for the
ways each is started): vLLM ``vllm serve`` (a console script: ``python …/bin/vllm serve``),
``python -m vllm.entrypoints.openai.api_server``; SGLang ``python -m sglang.launch_server``;
TGI ``text-generation-launcher`` and ``text-generation-router``; Triton ``tritonserver``.
Its listening TCP ports are its socket inodes (``/proc/PID/fd`` → ``socket:[N]``) looked up
in ``/proc/PID/net/tcp`` and ``tcp6``, the tables of *its* network namespace. An engine
listening on a wildcard or loopback address is reachable on loopback: in gpuwhy's own network
namespace directly, in another (a container with its own network, a Kubernetes pod) only
through that namespace (:mod:`gpuwhy.probes.engines.netns`, CAP_SYS_ADMIN): without it such an
engine is reported with the reason, not scraped. The processes of its tree
(the engine and its descendants, from ``/proc/PID/task/*/children``) that hold
``/dev/nvidiaN`` files name the GPUs it runs on and the processes engine signals belong to.

Everything read here is the process's: command lines are bounded and only compared, never
run or shown unescaped; every read is capped (bytes, fds, processes, lines).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from gpuwhy.identity import ProcessKey

MAX_CMDLINE = 4096        # bytes of a command line read (the engine's words come first)
MAX_ARGS = 64             # arguments looked at
MAX_FDS = 65536           # fds of one process looked at
MAX_NET_TABLE = 4 << 20   # bytes of /proc/PID/net/tcp{,6} read (~27,000 sockets)
MAX_TREE = 64             # processes of one engine's tree looked at
MAX_DEPTH = 4             # generations below the engine
LISTEN = "0A"             # TCP_LISTEN in /proc/net/tcp's st column
# why an engine in another network namespace is not scraped, and what to do
NOT_ENTERED = ("in another network namespace, not entered: gpuwhy lacks CAP_SYS_ADMIN "
               "(grant it to gpuwhy to scrape the engine through its namespace, see "
               "systemd/gpuwhy.service; or publish its port on the host and name it in "
               "engines.endpoints)")
_MINOR = re.compile(r"/dev/nvidia([0-9]{1,4})")
_PYTHON = re.compile(r"python[0-9.]*")
_PORT_VALUE = re.compile(r"[0-9]{1,5}")

# engine -> (program names that are it, python -m modules that are it, default metrics
# ports, command-line flags naming the metrics port, most preferred first)
ENGINES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]] = {
    # vLLM: /metrics on the API server's port (--port, default 8000) [vllm docs, serving/metrics]
    "vllm": (("vllm",), ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
             (8000,), ("--port",)),
    # SGLang: /metrics on the server's port (--port, default 30000) with --enable-metrics
    "sglang": ((), ("sglang.launch_server",), (30000,), ("--port",)),
    # TGI: the router serves /metrics on its HTTP port (--port, default 3000; 80 in the image)
    "tgi": (("text-generation-launcher", "text-generation-router"), (), (3000, 80),
            ("--port",)),
    # Triton: /metrics on its own port (--metrics-port, default 8002) [triton metrics.md]
    "triton": (("tritonserver",), (), (8002,), ("--metrics-port",)),
}


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its port, and the loopback host that reaches it ("" when
    it listens on a specific, non-loopback address only)."""

    port: int
    host: str


@dataclass
class Engine:
    """An engine process as /proc shows it."""

    engine: str
    process: ProcessKey
    ports: list[int]                      # metrics ports to try, most likely first
    listeners: dict[int, Listener] = field(default_factory=dict)
    note: str = ""                        # why it cannot be scraped, if it cannot
    netns: str = ""                       # its network namespace when not gpuwhy's and
                                          # entered for the scrape (/proc/PID/ns/net's link)
    members: list[ProcessKey] = field(default_factory=list)   # its tree's GPU processes
    gpu_minors: list[int] = field(default_factory=list)


def _read(path: str, limit: int) -> bytes:
    # os.open/os.read, not open(): no buffered file object for a read of a few hundred
    # bytes, done for every process every round (half the cost of the /proc scan)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_argv(pid: int, proc_root: str = "/proc") -> list[str]:
    """The first MAX_ARGS words of the process's command line (empty for a kernel thread
    or a process gone)."""
    try:
        raw = _read(f"{proc_root}/{pid}/cmdline", MAX_CMDLINE)
    except OSError:
        return []
    return [a.decode("utf-8", errors="replace") for a in raw.split(b"\0")[:MAX_ARGS] if a]


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
            if name == "vllm" and (not rest or rest[0] != "serve"):
                continue
            return name
    return None


def flag_ports(engine: str, argv: list[str]) -> list[int]:
    """The metrics ports a command line names (``--port 8080``, ``--port=8080``), then the
    engine's defaults."""
    flags = ENGINES[engine][3]
    named = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if _PORT_VALUE.fullmatch(value) and 0 < int(value) < 65536:
                named.append(int(value))
    return list(dict.fromkeys(named + list(ENGINES[engine][2])))


def socket_inodes(pid: int, proc_root: str = "/proc") -> set[int]:
    """Inodes of the sockets the process holds (``socket:[N]`` in /proc/PID/fd)."""
    inodes: set[int] = set()
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        with os.scandir(fd_dir) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_FDS:
                    break
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target.startswith("socket:[") and target.endswith("]"):
                    inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def device_minors(pid: int, proc_root: str = "/proc") -> set[int]:
    """Minors of the ``/dev/nvidiaN`` files the process holds."""
    minors: set[int] = set()
    try:
        with os.scandir(f"{proc_root}/{pid}/fd") as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_FDS:
                    break
                try:
                    match = _MINOR.fullmatch(os.readlink(entry.path))
                except OSError:
                    continue
                if match:
                    minors.add(int(match[1]))
    except OSError:
        pass
    return minors


def _address(hex_address: str) -> str:
    """``wildcard``, ``loopback4``, ``loopback6`` or ``other`` for /proc/net/tcp's address
    (host byte order per 32-bit word, which is little-endian on every host gpuwhy runs on)."""
    if set(hex_address) == {"0"}:
        return "wildcard"
    if len(hex_address) == 8:
        return "loopback4" if hex_address.endswith("7F") else "other"
    words = [hex_address[i:i + 8] for i in range(0, 32, 8)]
    if words[:3] == ["00000000"] * 3 and words[3] == "01000000":
        return "loopback6"
    if words[:2] == ["00000000"] * 2 and words[2] == "FFFF0000":   # ::ffff:a.b.c.d
        return "loopback4" if words[3].endswith("7F") else "other"
    return "other"


def read_tables(pid: int, proc_root: str = "/proc") -> list[tuple[str, str]]:
    """The process's network namespace's TCP tables, /proc/PID/net/tcp and tcp6, as
    (table, text). Reading them costs the kernel a walk of the host's whole socket hash
    (tens of ms on a large host): :class:`Finder` reads them only when it must."""
    tables = []
    for table in ("tcp", "tcp6"):
        try:
            tables.append((table, _read(f"{proc_root}/{pid}/net/{table}", MAX_NET_TABLE)
                           .decode("ascii", errors="replace")))
        except OSError:
            continue
    return tables


def listening(inodes: set[int], tables: list[tuple[str, str]]) -> dict[int, Listener]:
    """The listening TCP ports among ``inodes`` in a namespace's ``tables`` (read_tables),
    with the loopback host that reaches each."""
    found: dict[int, Listener] = {}
    for table, text in tables:
        wildcard_host = "::1" if table == "tcp6" else "127.0.0.1"
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != LISTEN or not parts[9].isdigit() or \
                    int(parts[9]) not in inodes:
                continue
            address, _, port_hex = parts[1].partition(":")
            try:
                port = int(port_hex, 16)
            except ValueError:
                continue
            kind = _address(address)
            host = {"wildcard": wildcard_host, "loopback4": "127.0.0.1",
                    "loopback6": "::1"}.get(kind, "")
            if port not in found or (host and not found[port].host):
                found[port] = Listener(port, host)
    return found


def _children(pid: int, proc_root: str) -> list[int]:
    kids: list[int] = []
    try:
        with os.scandir(f"{proc_root}/{pid}/task") as tasks:
            for task in tasks:
                try:
                    kids += [int(k) for k in _read(f"{task.path}/children", 1 << 16).split()]
                except (OSError, ValueError):
                    continue
                if len(kids) >= MAX_TREE:
                    break
    except OSError:
        pass
    return kids


def tree(pid: int, proc_root: str = "/proc") -> list[int]:
    """The process and its descendants, at most MAX_TREE of them, MAX_DEPTH deep."""
    seen, level = [pid], [pid]
    for _ in range(MAX_DEPTH):
        level = [k for p in level for k in _children(p, proc_root) if k not in seen]
        seen += level[:MAX_TREE - len(seen)]
        if not level or len(seen) >= MAX_TREE:
            break
    return seen


def start_time(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        raw = _read(f"{proc_root}/{pid}/stat", 4096)
        return int(raw[raw.rfind(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def netns(pid: int | str, proc_root: str = "/proc") -> str | None:
    try:
        return os.readlink(f"{proc_root}/{pid}/ns/net")
    except OSError:
        return None


class Finder:
    """Finds the engines, round after round, at the cost of a /proc scan: a namespace's TCP
    tables are read (once a round at most) only for an engine whose set of sockets changed
    since they were last read for it, or RECHECK_S later; a new engine's listening sockets
    are new sockets. A command line is read for a new process at once, and again only
    RESCAN_S later (a process that execs an engine in place: ``exec vllm serve`` at the end
    of a container's entrypoint); a process is new when /proc lists its pid with another
    inode (the kernel's /proc/PID inode belongs to the process: a reused pid gets a new
    one). An engine's ports, tree and GPU processes are read when it is found and again
    RESCAN_S later (a worker that opens a GPU later joins its members then). A round is
    then a readdir of /proc and an engine's start time for most rounds
    (scripts/bench_engines.py: a third of the CPU of reading everything every round)."""

    RECHECK_S = 30.0
    RESCAN_S = 10.0        # within the goal: an engine found ≤ 10 s after it listens

    def __init__(self, proc_root: str = "/proc", own_netns: str | None = None,
                 enter_netns: bool = False):
        self.proc_root = proc_root
        self.own_netns = own_netns if own_netns is not None else netns("self", proc_root)
        # whether an engine in another network namespace is scraped through it (the caller
        # holds CAP_SYS_ADMIN) or reported as not entered
        self.enter_netns = enter_netns
        # per process: (its socket inodes, its listeners, when the tables were read)
        self._ports: dict[ProcessKey, tuple[frozenset[int], dict[int, Listener], float]] = {}
        # per pid: (its /proc inode, when its command line was read, the engine it runs or
        # None, that command line when it is one)
        self._argv: dict[int, tuple[int, float, str | None, list[str]]] = {}
        # per engine found: (when its ports, tree and GPU processes were read, its tree, it)
        self._engines: dict[ProcessKey, tuple[float, list[int], Engine]] = {}
        self.table_reads = 0
        self.argv_reads = 0

    def _listeners(self, key: ProcessKey, now: float,
                   tables: dict[str | None, list[tuple[str, str]]]) -> dict[int, Listener]:
        inodes = frozenset(socket_inodes(key.pid, self.proc_root))
        held = self._ports.get(key)
        if held is not None and held[0] == inodes and now - held[2] < self.RECHECK_S:
            return held[1]
        if not inodes:
            found: dict[int, Listener] = {}
        else:
            space = netns(key.pid, self.proc_root)
            if space not in tables:
                tables[space] = read_tables(key.pid, self.proc_root)
                self.table_reads += 1
            found = listening(set(inodes), tables[space])
        self._ports[key] = (inodes, found, now)
        return found

    def find(self) -> list[Engine]:
        """Every engine process on the host, its ports and its GPU processes. An engine
        whose parent is the same engine (a forked worker keeps the server's argv) is one
        engine, the topmost; one that listens nowhere (TGI's launcher: its router listens)
        is left to its children."""
        proc_root = self.proc_root
        try:
            with os.scandir(proc_root) as entries:
                listed = [(int(e.name), e.inode()) for e in entries if e.name.isdigit()]
        except OSError:
            return []
        now = time.monotonic()
        known: dict[int, tuple[int, float, str | None, list[str]]] = {}
        candidates: dict[int, tuple[str, list[str], int]] = {}
        for pid, inode in listed:
            cached = self._argv.get(pid)
            if cached is None or cached[0] != inode or now - cached[1] >= self.RESCAN_S:
                argv = read_argv(pid, proc_root)
                self.argv_reads += 1
                name = recognise(argv)
                cached = (inode, now, name, argv if name is not None else [])
            known[pid] = cached
            if cached[2] is not None:
                started = start_time(pid, proc_root)
                if started is not None:
                    candidates[pid] = (cached[2], cached[3], started)
        self._argv = known
        tables: dict[str | None, list[tuple[str, str]]] = {}
        engines: list[Engine] = []
        claimed: set[int] = set()
        for pid in sorted(candidates, key=lambda p: candidates[p][2]):
            if pid in claimed:
                continue
            name, argv, started = candidates[pid]
            key = ProcessKey(pid, started)
            found_before = self._engines.get(key)
            if found_before is not None and now - found_before[0] < self.RESCAN_S:
                claimed.update(p for p in found_before[1] if p in candidates)
                engines.append(found_before[2])
                continue
            listeners = self._listeners(key, now, tables)
            if not listeners:
                continue
            members = tree(pid, proc_root)
            claimed.update(p for p in members if p in candidates)
            engine = Engine(name, key, [], listeners)
            preferred = [p for p in flag_ports(name, argv) if p in listeners]
            engine.ports = preferred + sorted(p for p in listeners if p not in preferred)
            space = netns(pid, proc_root)
            if not any(listeners[p].host for p in engine.ports):
                engine.note = "listens on no loopback or wildcard address"
            elif self.own_netns is not None and space != self.own_netns:
                if not self.enter_netns:
                    engine.note = NOT_ENTERED
                elif space is None:
                    engine.note = "its network namespace cannot be read (/proc/PID/ns/net)"
                else:
                    engine.netns = space          # its loopback, reached through it
            minors: set[int] = set()
            for member in members:
                held = device_minors(member, proc_root)
                member_start = start_time(member, proc_root)
                if held and member_start is not None:
                    minors |= held
                    engine.members.append(ProcessKey(member, member_start))
            engine.gpu_minors = sorted(minors)
            engines.append(engine)
            self._engines[key] = (now, members, engine)
        live = {ProcessKey(pid, c[2]) for pid, c in candidates.items()}
        self._engines = {k: v for k, v in self._engines.items() if k in live}
        for gone in [k for k in self._ports if k not in live]:
            del self._ports[gone]
        return engines


def find_engines(proc_root: str = "/proc", own_netns: str | None = None,
                 enter_netns: bool = False) -> list[Engine]:
    """One look through /proc (see :class:`Finder`)."""
    return Finder(proc_root, own_netns, enter_netns).find()
