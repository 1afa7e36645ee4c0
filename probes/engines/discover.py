"""Find inference engines from /proc alone, without touching them.

A process is an engine when its command line says so (what /proc/PID/cmdline shows for the
ways each is started, read by :mod:`gpuwhy.probes.engines.commandline`): vLLM ``vllm serve``
(a console script: ``python …/bin/vllm serve``),
``python -m vllm.entrypoints.openai.api_server``; SGLang ``sglang serve`` (a console script)
and ``python -m sglang.launch_server``; TGI ``text-generation-launcher`` and
``text-generation-router``; Triton ``tritonserver``.
Its listening TCP ports are its socket inodes (``/proc/PID/fd`` → ``socket:[N]``) looked up
in ``/proc/PID/net/tcp`` and ``tcp6``, the tables of *its* network namespace. An engine
listening on a wildcard or loopback address is reachable on loopback: in gpuwhy's own network
namespace directly, in another (a container with its own network, a Kubernetes pod) only
through that namespace (:mod:`gpuwhy.probes.engines.netns`, CAP_SYS_ADMIN): without it such an
engine is reported with the reason, not scraped. The processes of its tree
(the engine and its descendants, from ``/proc/PID/task/*/children``) that hold
``/dev/nvidiaN`` files name the GPUs it runs on and the processes engine signals belong to.

Unprivileged (the shipped gpuwhy.service: user ``gpuwhy``, no capability), the kernel refuses
another user's ``/proc/PID/fd`` and ``/proc/PID/ns/net`` (a ptrace access check), and every
engine runs as another user (root, its own account); its cmdline, stat, status and
``net/tcp{,6}`` stay readable. Then an engine's listeners are matched by number and owner
instead: its candidate ports (those its command line names, else its engine's defaults)
that have a LISTEN socket in its namespace's tables owned by its uid (the tables' ``uid``
column against ``Uid:`` in /proc/PID/status), said in its record (:attr:`Engine.info`). Its
network namespace is told by the inode of ``/proc/PID/net/tcp`` (one per namespace) against
gpuwhy's own: an engine in gpuwhy's namespace is scraped as usual; one in another cannot be
entered (opening /proc/PID/ns/net is the refused check), and its note says what to grant. Its
GPU processes are unknown (their fds are refused too): samples carry no member processes,
and GPU ids only where the engine's metrics name them (Triton's ``gpu_uuid``). A port of
another process of the same uid can be matched: the scrape's probing refuses a port whose
body holds no engine metrics (tried again after RETRY_S). A recognised engine with no
port found for longer than RESCAN_S is listed (:attr:`Finder.unattributed`), not skipped
unsaid.

Everything read here is the process's: command lines are bounded and only compared, never
run or shown unescaped; every read is capped (bytes, fds, processes, lines).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuwhy.identity import ProcessKey
from gpuwhy.probes.engines.commandline import (
    batch_limit,
    candidate_ports,
    flag_ports,
    named_ports,
    recognise,
)
from gpuwhy.proc import read_uids

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
# why an engine in another namespace, told by its /proc/PID/net/tcp, cannot be entered
NOT_OPENED = ("in another network namespace (its /proc/PID/net/tcp is not gpuwhy's), not "
              "entered: gpuwhy may not open another user's /proc/PID/ns/net (grant it "
              "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, with CAP_SYS_ADMIN to enter the "
              "namespace, see systemd/gpuwhy.service; or publish its port on the host and "
              "name it in engines.endpoints)")
# what an engine matched by port and owner is told with (information, not an error)
BY_OWNER = ("ports matched by number and owner (uid {uid}), not by its fds (gpuwhy may not "
            "read another user's /proc/PID/fd)")
_MINOR = re.compile(r"/dev/nvidia([0-9]{1,4})")



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
    info: str = ""                        # how it was found, when that is worth saying (its
                                          # ports matched by number and owner): not an error
    owner: int | None = None              # the uid its ports were matched by, when they were
    batch_limit: int | None = None        # requests it runs at once, as its command line sets


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


def fd_links(pid: int, proc_root: str = "/proc") -> list[str]:
    """What the process's fds point at (at most MAX_FDS): ``socket:[N]``, ``/dev/nvidia3``…;
    empty for a process gone. Raises PermissionError when the kernel refuses them (another
    user's process, to a reader without CAP_SYS_PTRACE): not the same as a process gone."""
    links: list[str] = []
    try:
        with os.scandir(f"{proc_root}/{pid}/fd") as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_FDS:
                    break
                try:
                    links.append(os.readlink(entry.path))
                except PermissionError:
                    # a listing allowed (CAP_DAC_READ_SEARCH) but its links refused (the
                    # ptrace check): refused all the same
                    raise
                except OSError:
                    continue             # an fd closed meanwhile
    except PermissionError:
        raise
    except OSError:
        return []
    return links


def _sockets(links: list[str]) -> set[int]:
    return {int(t[8:-1]) for t in links
            if t.startswith("socket:[") and t.endswith("]") and t[8:-1].isdigit()}


def _minors(links: list[str]) -> set[int]:
    return {int(m[1]) for m in map(_MINOR.fullmatch, links) if m}


def socket_inodes(pid: int, proc_root: str = "/proc") -> set[int]:
    """Inodes of the sockets the process holds (``socket:[N]`` in /proc/PID/fd); empty when
    they cannot be read."""
    try:
        return _sockets(fd_links(pid, proc_root))
    except PermissionError:
        return set()


def device_minors(pid: int, proc_root: str = "/proc") -> set[int]:
    """Minors of the ``/dev/nvidiaN`` files the process holds; empty when its fds cannot be
    read (another user's process, unprivileged)."""
    try:
        return _minors(fd_links(pid, proc_root))
    except PermissionError:
        return set()


def tables_inode(pid: int | str, proc_root: str = "/proc") -> int | None:
    """The inode of /proc/PID/net/tcp: one per network namespace, the same for every process
    in it, and readable where /proc/PID/ns/net is not (another user's process)."""
    try:
        return os.stat(f"{proc_root}/{pid}/net/tcp").st_ino
    except OSError:
        return None


def net_link(pid: int | str, proc_root: str = "/proc") -> str | None:
    """/proc/PID/ns/net's link (``net:[4026531833]``), None for a process gone. Raises
    PermissionError when the kernel refuses it (another user's process, unprivileged)."""
    try:
        return os.readlink(f"{proc_root}/{pid}/ns/net")
    except PermissionError:
        raise
    except OSError:
        return None


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


def _listen_rows(tables: list[tuple[str, str]]) -> Iterator[tuple[int, str, int, int]]:
    """(port, loopback host or "", owner uid, inode) of each LISTEN socket in ``tables``."""
    for table, text in tables:
        wildcard_host = "::1" if table == "tcp6" else "127.0.0.1"
        for line in text.splitlines()[1:]:
            parts = line.split()
            # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if len(parts) < 10 or parts[3] != LISTEN or not parts[9].isdigit() or \
                    not parts[7].isdigit():
                continue
            address, _, port_hex = parts[1].partition(":")
            try:
                port = int(port_hex, 16)
            except ValueError:
                continue
            host = {"wildcard": wildcard_host, "loopback4": "127.0.0.1",
                    "loopback6": "::1"}.get(_address(address), "")
            yield port, host, int(parts[7]), int(parts[9])


def _add(found: dict[int, Listener], port: int, host: str) -> None:
    if port not in found or (host and not found[port].host):
        found[port] = Listener(port, host)


def listening(inodes: set[int], tables: list[tuple[str, str]]) -> dict[int, Listener]:
    """The listening TCP ports among ``inodes`` in a namespace's ``tables`` (read_tables),
    with the loopback host that reaches each."""
    found: dict[int, Listener] = {}
    for port, host, _, inode in _listen_rows(tables):
        if inode in inodes:
            _add(found, port, host)
    return found


def owned(ports: list[int], uids: frozenset[int],
          tables: list[tuple[str, str]]) -> dict[int, Listener]:
    """The ``ports`` that have a LISTEN socket owned by one of ``uids`` in a namespace's
    ``tables``: an engine's listeners when its fds cannot be read (matched by number and
    owner; another process of the same uid on one of them cannot be told apart here)."""
    found: dict[int, Listener] = {}
    for port, host, uid, _ in _listen_rows(tables):
        if port in ports and uid in uids:
            _add(found, port, host)
    return found


def children(pid: int, proc_root: str = "/proc") -> list[int]:
    """The process's child processes (/proc/PID/task/*/children), MAX_TREE at most."""
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
    return kids[:MAX_TREE]


def tree(pid: int, proc_root: str = "/proc") -> list[int]:
    """The process and its descendants, at most MAX_TREE of them, MAX_DEPTH deep."""
    seen, level = [pid], [pid]
    for _ in range(MAX_DEPTH):
        level = [k for p in level for k in children(p, proc_root) if k not in seen]
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
    """/proc/PID/ns/net's link, None when gone or refused (:func:`net_link` tells those apart)."""
    try:
        return net_link(pid, proc_root)
    except PermissionError:
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
    (scripts/bench_engines.py: a third of the CPU of reading everything every round).

    An engine whose fds are refused (another user's, to an unprivileged gpuwhy) has no set
    of sockets that changes when it starts listening: its tables are read again every
    PENDING_S while none of its candidate ports listens under its uid, then every
    RECHECK_S. Engines recognised with no port found for longer than RESCAN_S are listed in
    :attr:`unattributed` (an engine still loading its model listens only once loaded)."""

    RECHECK_S = 30.0
    RESCAN_S = 10.0        # within the goal: an engine found ≤ 10 s after it listens
    PENDING_S = 4.0        # at one round per 5 s: every round, for the same goal
    MAX_UNATTRIBUTED = 16  # engines with no port looked at (their trees read) in one round

    def __init__(self, proc_root: str = "/proc", own_netns: str | None = None,
                 enter_netns: bool = False, own_tables: int | None = None):
        self.proc_root = proc_root
        self.own_netns = own_netns if own_netns is not None else netns("self", proc_root)
        # gpuwhy's own namespace by its TCP table's inode: what an engine whose
        # /proc/PID/ns/net is refused is compared by
        self.own_tables = own_tables if own_tables is not None else \
            tables_inode("self", proc_root)
        # whether an engine in another network namespace is scraped through it (the caller
        # holds CAP_SYS_ADMIN) or reported as not entered
        self.enter_netns = enter_netns
        # how fds and namespace links are read: a test swaps in a reader that refuses them
        # as the kernel does for another user's process
        self.fd_links: Callable[[int, str], list[str]] = fd_links
        self.net_link: Callable[[int | str, str], str | None] = net_link
        # per process: (its socket inodes, its listeners, when the tables were read)
        self._ports: dict[ProcessKey, tuple[frozenset[int], dict[int, Listener], float]] = {}
        # per process whose fds are refused: (its listeners by number and owner, its uid,
        # when the tables were read, its namespace as _tables keys it)
        self._owned: dict[ProcessKey, tuple[dict[int, Listener], int | None, float, str]] = {}
        # per pid: (its /proc inode, when its command line was read, the engine it runs or
        # None, that command line when it is one)
        self._argv: dict[int, tuple[int, float, str | None, list[str]]] = {}
        # per engine found: (when its ports, tree and GPU processes were read, its tree, it)
        self._engines: dict[ProcessKey, tuple[float, list[int], Engine]] = {}
        # engines recognised with no port found: since when
        self._portless: dict[ProcessKey, float] = {}
        # (engine, process, why) of those with none for longer than RESCAN_S, this round
        self.unattributed: list[tuple[str, ProcessKey, str]] = []
        self.table_reads = 0
        self.argv_reads = 0

    def _space(self, pid: int) -> str:
        """The process's namespace as its tables are keyed: its ns/net link, or its net/tcp
        inode where the link is refused (the same namespace either way)."""
        try:
            link = self.net_link(pid, self.proc_root)
        except PermissionError:
            link = None
        return link or f"net/tcp:{tables_inode(pid, self.proc_root)}"

    def _tables(self, space: str, pid: int, tables: dict[str, list[tuple[str, str]]]
                ) -> list[tuple[str, str]]:
        """The tables of namespace ``space`` (the process's), read once a round at most."""
        if space not in tables:
            tables[space] = read_tables(pid, self.proc_root)
            self.table_reads += 1
        return tables[space]

    def _listeners(self, key: ProcessKey, name: str, argv: list[str], now: float,
                   tables: dict[str, list[tuple[str, str]]]
                   ) -> tuple[dict[int, Listener], bool, int | None]:
        """Its listening ports, by its fds; by number and owner where its fds are refused:
        (them, whether by owner, the uid they were matched by)."""
        try:
            links = self.fd_links(key.pid, self.proc_root)
        except PermissionError:
            return self._by_owner(key, name, argv, now, tables)
        inodes = frozenset(_sockets(links))
        held = self._ports.get(key)
        if held is not None and held[0] == inodes and now - held[2] < self.RECHECK_S:
            return held[1], False, None
        found = listening(set(inodes), self._tables(self._space(key.pid), key.pid, tables)) \
            if inodes else {}
        self._ports[key] = (inodes, found, now)
        return found, False, None

    def _by_owner(self, key: ProcessKey, name: str, argv: list[str], now: float,
                  tables: dict[str, list[tuple[str, str]]]
                  ) -> tuple[dict[int, Listener], bool, int | None]:
        held = self._owned.get(key)
        if held is not None and now - held[2] < (self.RECHECK_S if held[0] else
                                                 self.PENDING_S):
            return held[0], True, held[1]
        uids = read_uids(key.pid, self.proc_root)
        space = self._space(key.pid)
        found = owned(candidate_ports(name, argv), frozenset(uids),
                      self._tables(space, key.pid, tables)) if uids else {}
        uid = uids[0] if uids else None
        self._owned[key] = (found, uid, now, space)
        return found, True, uid

    def _namespace(self, pid: int) -> tuple[str | None, bool, bool | None]:
        """(its /proc/PID/ns/net link, whether reading it was refused, whether it is
        gpuwhy's own namespace: None when that cannot be told)."""
        try:
            link, refused = self.net_link(pid, self.proc_root), False
        except PermissionError:
            link, refused = None, True
        if link is not None and self.own_netns is not None:
            return link, refused, link == self.own_netns
        if self.own_netns is None and self.own_tables is None:
            return link, refused, True      # gpuwhy's own unknown: taken as every engine's
        theirs = tables_inode(pid, self.proc_root)
        if theirs is not None and self.own_tables is not None:
            return link, refused, theirs == self.own_tables
        return link, refused, None

    def find(self) -> list[Engine]:
        """Every engine process on the host, its ports and its GPU processes. An engine
        whose parent is the same engine (a forked worker keeps the server's argv) is one
        engine, the topmost; one that listens nowhere (TGI's launcher: its router listens)
        is left to its children, and listed in :attr:`unattributed` after RESCAN_S when none
        of its tree is found."""
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
        tables: dict[str, list[tuple[str, str]]] = {}
        engines: list[Engine] = []
        claimed: set[int] = set()
        found_trees: set[int] = set()      # the processes of the engines found
        portless: list[tuple[int, ProcessKey, bool, int | None]] = []
        for pid in sorted(candidates, key=lambda p: candidates[p][2]):
            if pid in claimed:
                continue
            name, argv, started = candidates[pid]
            key = ProcessKey(pid, started)
            found_before = self._engines.get(key)
            if found_before is not None and now - found_before[0] < self.RESCAN_S:
                claimed.update(p for p in found_before[1] if p in candidates)
                found_trees.update(found_before[1])
                engines.append(found_before[2])
                continue
            listeners, by_owner, uid = self._listeners(key, name, argv, now, tables)
            if not listeners:
                portless.append((pid, key, by_owner, uid))
                continue
            members = tree(pid, proc_root)
            claimed.update(p for p in members if p in candidates)
            found_trees.update(members)
            engine = Engine(name, key, [], listeners, batch_limit=batch_limit(name, argv))
            preferred = [p for p in flag_ports(name, argv) if p in listeners]
            engine.ports = preferred + sorted(p for p in listeners if p not in preferred)
            info = []
            if by_owner:
                engine.owner = uid
                info.append(BY_OWNER.format(uid=uid))
            link, refused, own = self._namespace(pid)
            if not any(listeners[p].host for p in engine.ports):
                engine.note = "listens on no loopback or wildcard address"
            elif own is None:
                engine.note = "its network namespace cannot be told (neither " \
                              "/proc/PID/ns/net nor /proc/PID/net/tcp can be read)"
            elif not own:
                if refused:
                    engine.note = NOT_OPENED
                elif not self.enter_netns:
                    engine.note = NOT_ENTERED
                elif link is None:
                    engine.note = "its network namespace cannot be read (/proc/PID/ns/net)"
                else:
                    engine.netns = link           # its loopback, reached through it
            minors: set[int] = set()
            refusing = 0
            for member in members:
                try:
                    held = _minors(self.fd_links(member, proc_root))
                except PermissionError:
                    refusing += 1
                    continue
                member_start = start_time(member, proc_root)
                if held and member_start is not None:
                    minors |= held
                    engine.members.append(ProcessKey(member, member_start))
            engine.gpu_minors = sorted(minors)
            if refusing:
                # their /dev/nvidiaN files are in the fds refused: no member, no minor
                info.append(f"its GPU processes are unknown ({refusing} process(es) of its "
                            "tree refuse their fds)")
            engine.info = "; ".join(info)
            engines.append(engine)
            self._engines[key] = (now, members, engine)
        self._shared_ports(engines, candidates)
        self._unattributed(portless, candidates, found_trees, now)
        live = {ProcessKey(pid, c[2]) for pid, c in candidates.items()}
        self._engines = {k: v for k, v in self._engines.items() if k in live}
        for held_by in (self._ports, self._owned):
            for gone in [k for k in held_by if k not in live]:
                del held_by[gone]
        return engines

    def _shared_ports(self, engines: list[Engine],
                      candidates: dict[int, tuple[str, list[str], int]]) -> None:
        """A port matched by number and owner for two engines of one namespace (one named
        it, the other has it as its default; both had it as default) is only one's: the
        one whose command line names it when one alone does, else neither's (which one
        listens on it cannot be told from the tables); an engine left with no port says
        why and is not scraped (a scrape would publish another engine's figures as its)."""
        claims: dict[tuple[str, int], list[Engine]] = {}
        for engine in engines:
            held = self._owned.get(engine.process)
            if engine.owner is None or held is None:
                continue
            for port in engine.ports:
                claims.setdefault((held[3], port), []).append(engine)
        for (_, port), claimants in claims.items():
            if len(claimants) < 2:
                continue
            naming = [e for e in claimants if e.process.pid in candidates and
                      port in named_ports(e.engine, candidates[e.process.pid][1])]
            keep = naming[0] if len(naming) == 1 else None
            for engine in claimants:
                if engine is keep or port not in engine.ports:
                    continue
                engine.ports = [p for p in engine.ports if p != port]
                if not engine.ports and not engine.note:
                    engine.note = (f"port {port} matched by number and owner for several "
                                   "engines of one user: which listens on it cannot be told "
                                   "without its /proc/PID/fd (name its endpoint in "
                                   "engines.endpoints)")

    def _unattributed(self, portless: list[tuple[int, ProcessKey, bool, int | None]],
                      candidates: dict[int, tuple[str, list[str], int]],
                      found_trees: set[int], now: float) -> None:
        """:attr:`unattributed`: the engines with no port found for longer than RESCAN_S,
        one per tree (a vLLM server's forked workers, TGI's launcher and its router are one
        engine), none whose tree holds an engine found (TGI's launcher, its router found)."""
        since = {key: self._portless.get(key, now) for _, key, _, _ in portless}
        self._portless = since
        self.unattributed = []
        told: set[int] = set()
        looked = 0
        for pid, key, by_owner, uid in portless:      # oldest first: the topmost
            if pid in told or now - since[key] <= self.RESCAN_S:
                continue
            if looked >= self.MAX_UNATTRIBUTED:
                break
            looked += 1
            members = tree(pid, self.proc_root)
            told.update(members)
            if found_trees.intersection(members):
                continue
            name, argv, _ = candidates[pid]
            seen = f"recognised {now - since[key]:.0f} s ago"
            if by_owner:
                ports = ", ".join(map(str, candidate_ports(name, argv)))
                why = (f"{seen}, but none of its ports ({ports}) listens under its uid "
                       f"{uid if uid is not None else '?'} (matched by number and owner: "
                       "gpuwhy may not read its /proc/PID/fd); not scraped")
            else:
                why = f"{seen}, but it holds no listening TCP socket; not scraped"
            why += (" (an engine loading its model listens only once loaded; one listening "
                    "elsewhere can be named in engines.endpoints)")
            self.unattributed.append((name, key, why))


def find_engines(proc_root: str = "/proc", own_netns: str | None = None,
                 enter_netns: bool = False) -> list[Engine]:
    """One look through /proc (see :class:`Finder`)."""
    return Finder(proc_root, own_netns, enter_netns).find()
