"""sched: on-CPU, run-queue, sleep and blocked time of GPU processes and their workers.

Loads ``sched.bpf.c`` and keeps its ``watched`` map filled: every thread of a process
that holds NVIDIA fds, and every thread of the processes it forked (the kernel adds
threads and children born after that itself); where the GPU process runs under a serving
engine that is no child of it (vLLM's API server above EngineCore, SGLang's launch_server
above its schedulers, TGI's launcher and router), the engine's other processes too: those
between the engine and the GPU process (vLLM's EngineCore above its tensor-parallel
workers) as its engine loop, the rest as its frontend (gpuwhy.probes.engines.frontend).
Each flush turns the per-thread counters into one SchedStats event per GPU process: its own
threads, its workers, its engine loop and its frontend; on a host with several NUMA nodes,
also its on-CPU time per node (which socket it ran on; its own threads' and workers', not
its engine's other processes'). Bytes received from TCP/IP sockets,
and the sleep that ended right before a receive (waiting for the network), are counted
where the kernel lets us (:func:`net_rx_hook`).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import operator
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwhy.clock import now_ns
from gpuwhy.config import SETTINGS_BY_NAME, Config
from gpuwhy.events import Event, SchedStats
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.bpfdefs import Define, cflags, enum_defines
from gpuwhy.probes.bpfmaps import MapReader
from gpuwhy.probes.engines.frontend import engine_processes
from gpuwhy.probes.fdtrack import TRACEFS, load_bpf
from gpuwhy.proc import read_tgid
from gpuwhy.topology import cpu_nodes

log = logging.getLogger(__name__)

NAME = "sched"
BPF_SOURCE = Path(__file__).with_name("sched.bpf.c")
HINT_SLOTS = 1 << 16       # a power of two: the C masks
MAX_CPUS = 4096            # CPUs the node map holds (a CPU above it counts as node 0)
MAX_NODE_KEYS = 8192       # (GPU process, node) pairs


class ThreadState(enum.IntEnum):
    """A watched thread's state (``thread_t.state``; ST_<NAME> in sched.bpf.c)."""

    RUNNING = 0
    RUNNABLE = 1
    SLEEPING = 2
    BLOCKED = 3
    DEAD = 4


class NetRx(enum.IntEnum):
    """Where sched.bpf.c counts received socket bytes (NET_RX_<NAME>)."""

    NONE = 0            # nowhere: the figures are unknown, not 0
    TRACEPOINT = 1      # sock:sock_recv_length (Linux 6.4+): every socket family, filtered
    KPROBE = 2          # tcp_cleanup_rbuf (what bcc's tcptop reads): TCP only


NET_RX_TRACEPOINT = ("sock", "sock_recv_length")
# A sleep counts as a wait for the network when the thread receives from a TCP/IP socket
# within this long of going on a CPU: a Python loader returns from poll() to recv() in tens
# of microseconds; a thread that ran longer was doing something else first. Not 1 ms: a
# VM's vCPU loses milliseconds unseen between the switch-in and the receive's end (in one
# slow hour of this project's VM, a 1 ms window missed the wait of half the test workers').
NET_WAIT_WINDOW_NS = 10_000_000
NET_RX_KPROBE = "tcp_cleanup_rbuf"


def net_rx_hook(tracefs: tuple[str, ...] = TRACEFS) -> NetRx:
    """Where this kernel lets the probe count received bytes: its tracepoint where there is
    one, else the kprobe (whether tcp_cleanup_rbuf can be probed shows only at attach)."""
    group, name = NET_RX_TRACEPOINT
    if any(os.path.isdir(f"{root}/{group}/{name}") for root in tracefs):
        return NetRx.TRACEPOINT
    return NetRx.KPROBE


def bpf_defines(numa_nodes: int = 1, net_rx: NetRx = NetRx.TRACEPOINT,
                max_watched: int = SETTINGS_BY_NAME["probes.max_threads"].default
                ) -> dict[str, Define]:
    """Every constant sched.bpf.c shares with Python, by its C name; ``numa_nodes`` is the
    host's (the per-node accounting is compiled in only where there are several), ``net_rx``
    the hook the kernel offers for received bytes, ``max_watched`` the threads it follows
    at most (probes.max_threads)."""
    return {"HINT_SLOTS": HINT_SLOTS, "MAX_WATCHED": max_watched, "NUMA_NODES": numa_nodes,
            "MAX_CPUS": MAX_CPUS, "MAX_NODE_KEYS": MAX_NODE_KEYS,
            **enum_defines("ST_", ThreadState), **enum_defines("NET_RX_", NetRx),
            "NET_RX": net_rx, "NET_WAIT_WINDOW_NS": NET_WAIT_WINDOW_NS,
            "FAMILY_INET": socket.AF_INET, "FAMILY_INET6": socket.AF_INET6,
            "FLAG_PEEK": socket.MSG_PEEK}


CFLAGS = cflags(bpf_defines())
FIELDS = ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns", "voluntary_switches",
          "involuntary_switches", "migrations", "net_rx_bytes", "net_wait_ns")
NET_FIELDS = ("net_rx_bytes", "net_wait_ns")       # absent where nothing counts them
# A living state's time is FIELDS[state]: RUNNING to BLOCKED are numbered as their fields.
TIMED_STATES = (ThreadState.RUNNING, ThreadState.RUNNABLE, ThreadState.SLEEPING,
                ThreadState.BLOCKED)


# thread_t's fields behind FIELDS, in that order
_THREAD_FIELDS = ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns", "voluntary",
                  "involuntary", "migrations", "net_rx_bytes", "net_wait_ns")


class ThreadLayout:
    """Where thread_t's fields sit in its 8-byte words (little-endian, as x86-64 and arm64):
    a flush reads thousands of threads on a big host, and a ctypes value an entry cost it
    more than the rest of its work."""

    def __init__(self, struct: type) -> None:
        def at(name: str) -> tuple[int, int, int]:
            field = getattr(struct, name)
            return field.offset // 8, field.offset % 8 * 8, (1 << 8 * field.size) - 1

        self.last_ns, self.state, self.owner, self.seeded, self.cpu, self.role = (
            at(name) for name in ("last_ns", "state", "owner", "seeded", "cpu", "role"))
        figures = [at(name) for name in _THREAD_FIELDS]
        if any(shift or mask != (1 << 64) - 1 for _, shift, mask in figures):
            raise ValueError(f"{struct.__name__}: a figure is not a whole 8-byte word")
        self.figures = operator.itemgetter(*(word for word, _, _ in figures))


# A Seen's credit beside the TIMED_STATES indexes: a thread credited no time between flushes
# (its state is still the one read from /proc); one that ended.
NO_CREDIT = len(TIMED_STATES)
DEAD = NO_CREDIT + 1


# What a flush keeps of a thread, a tuple (a thread read in full costs its making, once a
# second for each of thousands on a big host): a thread whose entry has the same bytes at
# the next flush did nothing but stay in its state, and is said without a step of its own.
#   raw     its entry as read; b"" where the next flush must read it in full anyway
#   owner   the GPU process it is accounted to
#   side    OWN: a thread of the GPU process, WORKER: of a worker, FRONTEND: of its
#           frontend, ENGINE_LOOP: of its engine loop
#   credit  the TIMED_STATES index its time goes to while it stays; NO_CREDIT; DEAD
#   tgid    its process
#   totals  what was said of it up to the flush ``at`` (monotonic ns) that read it
Seen = tuple[bytes, int, int, int, int, list[int], int]
OWN, WORKER, FRONTEND, ENGINE_LOOP = 0, 1, 2, 3
SIDES = 4
# A thread entry's role (thread_t.role), set by user space and inherited at fork: 0, the GPU
# process's own or a worker's (told apart by its process); or a process of its serving
# engine that is no child of it
ROLE_FRONTEND, ROLE_ENGINE_LOOP = 1, 2
_ROLE_SIDES = {ROLE_FRONTEND: FRONTEND, ROLE_ENGINE_LOOP: ENGINE_LOOP}
# What a flush says of a GPU process's frontend (SchedStats.frontend) and engine loop
# (SchedStats.engine_loop): a few figures, not all of FIELDS: which thread of it is
# saturated is the question each answers.
FRONTEND_FIELDS = ("on_cpu_ns", "busiest_on_cpu_ns", "threads", "processes")


def _field(words: list[int], where: tuple[int, int, int]) -> int:
    word, shift, mask = where
    return words[word] >> shift & mask


def said_since(totals: Sequence[int], said: Sequence[int]) -> list[int]:
    """What to say of a thread for an interval: its ``totals`` (as of the flush) less what was
    ``said`` of it before, never negative, the time in its states adding up as the kernel's.

    A flush credits a runnable thread's slice so far to waiting; if its switch-in was lost,
    its next switch-out proves it ran (settle() in sched.bpf.c), and the kernel's totals move
    that slice from waiting to on-CPU. Said as waiting, it stays so: what a state lost is
    taken from what the others gained (rather than a negative wait, or the slice counted
    twice). The counters (switches, migrations, bytes) only grow."""
    delta = [now - before for now, before in zip(totals, said, strict=True)]
    states = range(len(TIMED_STATES))
    owed = -sum(delta[i] for i in states if delta[i] < 0)
    for i in range(len(delta)):
        if delta[i] < 0:
            delta[i] = 0
    for i in states:
        if not owed:
            break
        taken = min(delta[i], owed)
        delta[i] -= taken
        owed -= taken
    return delta


def _descendants(pid: int, proc_root: str) -> list[int]:
    """The child processes of ``pid``, recursively (from /proc/PID/task/*/children)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"{proc_root}/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"{proc_root}/{current}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    pending.append(child)
    return found


_PROC_STATES = {b"R": ThreadState.RUNNING, b"S": ThreadState.SLEEPING,
                b"D": ThreadState.BLOCKED, b"I": ThreadState.SLEEPING}


def _current_state(proc_root: str, pid: int, tid: int) -> int:
    """The thread's state now, from /proc (the switches we missed cannot tell us)."""
    try:
        raw = Path(f"{proc_root}/{pid}/task/{tid}/stat").read_bytes()
    except OSError:
        return ThreadState.SLEEPING
    state = raw[raw.rfind(b")") + 2:][:1]
    return _PROC_STATES.get(state, ThreadState.SLEEPING)


def _group() -> list:
    """A GPU process's figures in a flush (see SchedProbe.flush)."""
    return [[[] for _ in range(SIDES)], [0] * SIDES, [set() for _ in range(SIDES)],
            [[0] * (NO_CREDIT + 1) for _ in range(SIDES)], 0, [0] * SIDES]


def _figures(said: list[list[int]], quiet: list[int], interval: int) -> list[int]:
    """The FIELDS of one side of a GPU process for a flush: what was ``said`` of each thread
    read in full, added up, and the ``interval`` of each that stayed in a state (``quiet``:
    how many, by the state credited) added to that state's time."""
    figures = [sum(column) for column in zip(*said, strict=True)] if said else [0] * len(FIELDS)
    return [figure + quiet[i] * interval if i < NO_CREDIT else figure
            for i, figure in enumerate(figures)]


class SchedProbe:
    """``watch(process)`` a GPU process; ``flush()`` publishes a SchedStats per process."""

    def __init__(self, config: Config, publish: Callable[[Event], object]):
        self.proc_root: str = config["probes.proc_root"]
        self.max_threads: int = config["probes.max_threads"]
        self.cpu_nodes = cpu_nodes(config["probes.sys_root"])
        self.numa_nodes = max(self.cpu_nodes.values(), default=0) + 1
        self._node_last: dict[tuple[int, int], int] = {}  # (owner, node) -> ns at last flush
        self._running_last: dict[int, list[int]] = {}      # owner -> unsettled ns per node
        self._publish = publish
        self._bpf: Any = None      # the loaded bcc.BPF (bcc has no types); None before load()
        self.owners: dict[int, ProcessKey] = {}          # tgid -> GPU process being watched
        self._seen: dict[bytes, Seen] = {}         # the tid's bytes (the map's key) -> Seen
        self._tgid: dict[int, int] = {}                  # tid -> its process
        # frontend or engine-loop process -> the GPU process it is accounted to (the first
        # one watched of those under its engine: see watch); the processes it forks are
        # flagged in the map
        self._frontends: dict[int, int] = {}
        self._last_flush = time.monotonic_ns()
        self.net_rx = NetRx.NONE

    def load(self) -> None:
        hook = net_rx_hook()
        self._bpf = bpf = load_bpf(NAME, BPF_SOURCE, cflags(bpf_defines(self.numa_nodes, hook,
                                                                        self.max_threads)))
        if hook == NetRx.KPROBE:
            try:
                bpf.attach_kprobe(event=NET_RX_KPROBE.encode(), fn_name=b"on_tcp_cleanup_rbuf")
            except Exception as exc:  # bcc raises bare Exception: inlined, or not traceable
                log.warning("sched: received bytes not counted (%s cannot be probed: %s)",
                            NET_RX_KPROBE, exc)
                hook = NetRx.NONE
        self.net_rx = hook
        self._watched = bpf[b"watched"]
        self._watched_reader = MapReader(self._watched)    # a flush reads it in batches
        self._layout = ThreadLayout(self._watched.Leaf)
        self._hint_user = bpf[b"watch_hint_user"]
        self._drops = bpf[b"drops"]
        self._missed = {name: bpf[name.encode()]
                        for name in ("missed_switch_in", "missed_switch_out")}
        self._node_time = None
        if self.numa_nodes > 1:
            nodes = bpf[b"cpu_node"]
            for cpu, node in self.cpu_nodes.items():
                if cpu < MAX_CPUS:
                    nodes[ctypes.c_int(cpu)] = ctypes.c_uint32(node)
            self._node_time = bpf[b"node_time"]

    def _hint(self, tid: int, delta: int) -> None:
        slot = ctypes.c_int(tid % HINT_SLOTS)
        self._hint_user[slot] = ctypes.c_int(self._hint_user[slot].value + delta)

    def _add(self, tid: int, owner: int, state: int, role: int = 0) -> None:
        key = ctypes.c_uint32(tid)
        if key in self._watched:
            thread = self._watched[key]     # born in another watched process's tree
            if thread.owner != owner or thread.role != role:
                thread.owner = owner
                thread.role = role
                self._watched[key] = thread
            return
        leaf = self._watched.Leaf()
        leaf.last_ns = time.monotonic_ns()
        leaf.state = state
        leaf.owner = owner
        leaf.role = role
        leaf.seeded = 1        # the kernel's first event on it says what the state really was
        self._watched[key] = leaf
        self._hint(tid, 1)

    def watch(self, process: ProcessKey) -> None:
        """Watch every thread of ``process`` and of the processes it forked, and of its
        serving engine's frontend and engine-loop processes (see _watch_frontend)."""
        if process.pid in self.owners:
            return
        if self.idle():      # the flushes were far apart: its first interval starts now
            self._last_flush = time.monotonic_ns()
        self.owners[process.pid] = process
        # Its own threads first: from then on the kernel watches what they fork, and the
        # children listed after that are those forked before (none falls in between).
        self._add_threads(process.pid, process.pid)
        self._frontends.pop(process.pid, None)    # a GPU process now: no one's frontend
        for pid in _descendants(process.pid, self.proc_root):
            if pid not in self.owners:      # else a GPU process of its own, not a worker
                self._add_threads(pid, process.pid)
                self._frontends.pop(pid, None)
        self._watch_frontend(process.pid)

    def _watch_frontend(self, owner: int) -> None:
        """Watch the other processes of the engine above GPU process ``owner``, accounted to
        it: those between the engine and it (vLLM's EngineCore above its tensor-parallel
        workers) as its engine loop, the rest of its engine's tree less the GPU processes
        and their workers as its frontend (engine_processes). One already watched stays
        with the GPU process that has it: the first one watched of those under the engine
        (tensor parallel: vLLM's API server and EngineCore, above four GPU workers, go to
        the worker that opened its GPU first; the others' figures have none), so its time
        is said once, not once per GPU."""
        frontend, loop = engine_processes(owner, self.owners, self.proc_root)
        for role, pids in ((ROLE_ENGINE_LOOP, loop), (ROLE_FRONTEND, frontend)):
            for pid in pids:
                # another's; or forked by one: a frontend's child stays its, but a process
                # above the GPU process is its engine loop whoever forked it
                if pid in self.owners or pid in self._frontends or \
                        role == ROLE_FRONTEND and ctypes.c_uint32(pid) in self._watched:
                    continue
                self._frontends[pid] = owner
                self._add_threads(pid, owner, role)

    def _add_threads(self, pid: int, owner: int, role: int = 0) -> None:
        try:
            tids = [int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task")]
        except OSError:
            return
        for tid in tids:
            self._add(tid, owner, _current_state(self.proc_root, pid, tid), role)
            self._tgid[tid] = pid

    def unwatch(self, pid: int) -> None:
        """The GPU process exited: publish its last figures, then forget its threads (its
        frontend's and engine loop's too: another GPU process of the engine still watched
        takes them over)."""
        if pid in self.owners:
            self.flush(only_owner=pid)
            self._forget(lambda owner: owner == pid)
            del self.owners[pid]
            had_frontend = pid in self._frontends.values()
            self._frontends = {p: o for p, o in self._frontends.items() if o != pid}
            if had_frontend:      # bounded: a process exit, MAX_ANCESTORS reads per owner
                for owner in list(self.owners):
                    self._watch_frontend(owner)
            self._running_last.pop(pid, None)
            if self._node_time is not None:
                for key in [k for k in self._node_time.keys() if k.owner == pid]:
                    del self._node_time[key]
                    self._node_last.pop((pid, key.node), None)

    def _forget(self, which: Callable[[int], bool]) -> None:
        for key, thread in list(self._watched.items()):
            if which(thread.owner):
                del self._watched[key]
                self._hint(key.value, -1)
                self._seen.pop(bytes(key), None)
                self._tgid.pop(key.value, None)

    def idle(self) -> bool:
        """Nothing watched, nothing left to report."""
        return not self.owners and not self._seen

    def flush(self, only_owner: int | None = None) -> None:
        """Publish, per watched GPU process, what its threads, workers, frontend and engine
        loop did since the last flush; drop the entries of threads that ended.

        Most threads of a GPU process wait at any moment (pools between parallel sections,
        runtime threads): an entry read with the same bytes as at the last flush stayed in
        its state all along, and is only counted, the interval credited to its state once
        for all such threads of its process and side."""
        now_ktime = time.monotonic_ns()
        interval = now_ktime - self._last_flush
        # owner -> [by side (OWN, WORKER, FRONTEND, ENGINE_LOOP): what was said of each
        # thread read in full; threads; processes; quiet threads by credit; then the on-CPU
        # ns of its main thread; by side, of its busiest thread (own: but the main one)]
        # (one thread on a CPU all the time: a serving engine's Python loop on its main
        # thread or EngineCore's, a frontend's or tokeniser's on another; the sums cannot
        # tell)
        per_owner: dict[int, list] = {}
        running: dict[int, list[int]] = {}     # owner -> the running slices not yet settled
        dead = []
        seen_before = self._seen
        for key, raw in self._watched_reader.raw():
            seen = seen_before.get(key)
            said = None                    # None: it stayed in its state since the last flush
            if seen is None or seen[0] != raw:
                seen, said = self._read(key, raw, seen, now_ktime, running)
            _, owner, side, credit, tgid, _, _ = seen
            if only_owner is not None and owner != only_owner:
                continue
            group = per_owner.get(owner)
            if group is None:
                group = per_owner[owner] = _group()
            on_cpu = interval if said is None and credit == ThreadState.RUNNING else \
                said[0] if said is not None else 0
            if on_cpu:
                if not side and int.from_bytes(key, "little") == owner:
                    group[4] = on_cpu
                elif on_cpu > group[5][side]:
                    group[5][side] = on_cpu
            if said is None:
                group[3][side][credit] += 1
            else:
                seen_before[key] = seen
                group[0][side].append(said)
                if credit == DEAD:
                    dead.append(int.from_bytes(key, "little"))
                    continue
            group[1][side] += 1
            group[2][side].add(tgid)
        for tid in dead:
            del self._watched[ctypes.c_uint32(tid)]
            self._hint(tid, -1)
            self._seen.pop(tid.to_bytes(4, "little"), None)
            self._tgid.pop(tid, None)
        if dead and self._frontends:      # an engine's process that ended is no one's now
            alive = set(self._tgid.values())
            self._frontends = {p: o for p, o in self._frontends.items() if p in alive}
        if only_owner is None:
            self._last_flush = now_ktime
        ts = now_ns()
        by_node = self._node_deltas(only_owner, running)
        for owner, group in per_owner.items():
            process = self.owners.get(owner)
            if process is None:
                continue
            own, workers = ({**dict(zip(FIELDS, _figures(group[0][side], group[3][side],
                                                         interval), strict=True)),
                             "threads": group[1][side], "busiest_on_cpu_ns": group[5][side]}
                            for side in (OWN, WORKER))
            own["main_on_cpu_ns"] = group[4]
            if self.net_rx == NetRx.NONE:     # not counted: unknown, never 0
                for name in NET_FIELDS:
                    del own[name], workers[name]
            frontend, loop = (
                # None where none is watched for it: unknown, not an idle one
                dict(zip(FRONTEND_FIELDS, (
                    _figures(group[0][side], group[3][side], interval)[0], group[5][side],
                    group[1][side], len(group[2][side])), strict=True))
                if group[1][side] or group[0][side] else None     # living, or ended since
                for side in (FRONTEND, ENGINE_LOOP))
            self._publish(SchedStats(ts=ts, process=process, interval_ns=interval, own=own,
                                     workers=workers, worker_processes=len(group[2][WORKER]),
                                     node_on_cpu_ns=by_node.get(owner, []),
                                     frontend=frontend, engine_loop=loop))

    def _read(self, key: bytes, raw: bytes, seen: Seen | None, now_ktime: int,
              running: dict[int, list[int]]) -> tuple[Seen, list[int]]:
        """A thread's entry that moved since the last flush (or is new), read in full at
        ``now_ktime``: what to keep of it, and what it did since it was last said (``seen``:
        what the last flush kept). Its running slice so far goes to ``running`` by node."""
        layout = self._layout
        (owner_at, owner_shift, owner_mask), (state_at, state_shift, state_mask), \
            (seeded_at, seeded_shift, seeded_mask) = layout.owner, layout.state, layout.seeded
        words = memoryview(raw).cast("Q").tolist()
        owner = words[owner_at] >> owner_shift & owner_mask
        state = words[state_at] >> state_shift & state_mask
        role = _field(words, layout.role)
        totals = list(layout.figures(words))
        # The time in its current state so far counts (a thread alone on a CPU may not
        # switch for seconds); not for a thread whose state is still the one read from
        # /proc: until the kernel's first event on it proves the state (settle() in
        # sched.bpf.c), crediting it could be undone.
        if state >= len(TIMED_STATES):
            credit = DEAD
        elif words[seeded_at] >> seeded_shift & seeded_mask:
            credit = NO_CREDIT
        else:
            credit = state
            last_ns = words[layout.last_ns[0]]
            if now_ktime > last_ns:
                totals[state] += now_ktime - last_ns
            else:              # settled after this flush began: read it in full next time
                raw = b""
            if self._node_time is not None and state == ThreadState.RUNNING and not role:
                node = self.cpu_nodes.get(_field(words, layout.cpu), 0)
                running.setdefault(owner, [0] * self.numa_nodes)[node] += \
                    max(0, now_ktime - last_ns)
                raw = b""          # its running slice goes to a node at each flush
        if seen is None:
            previous = [0] * len(FIELDS)
            tid = int.from_bytes(key, "little")
            tgid = self._tgid.get(tid)
            if tgid is None:
                tgid = self._tgid[tid] = read_tgid(tid, self.proc_root) or tid
        else:           # what was said of it up to the last flush, quiet ones included
            previous, tgid = seen[5], seen[4]
            if seen[3] < NO_CREDIT and self._last_flush > seen[6]:
                previous = list(previous)
                previous[seen[3]] += self._last_flush - seen[6]
        said = list(map(operator.sub, totals, previous))
        if min(said) < 0:              # a state corrected after it was said: said_since
            said = said_since(totals, previous)
            totals = list(map(operator.add, previous, said))
        side = _ROLE_SIDES.get(role, OWN if tgid == owner else WORKER)
        return (raw, owner, side, credit, tgid, totals, now_ktime), said

    def _node_deltas(self, only_owner: int | None,
                     running: dict[int, list[int]]) -> dict[int, list[int]]:
        """Per GPU process, its on-CPU ns per NUMA node since the last flush: what the
        kernel settled at switches, plus the slices running now (a thread alone on a CPU
        may not switch for seconds) less those counted at the last flush. Nothing on a
        single-node host."""
        if self._node_time is None:
            return {}
        out: dict[int, list[int]] = {}
        for key, value in self._node_time.items():
            owner, node = key.owner, key.node
            if (only_owner is not None and owner != only_owner) or node >= self.numa_nodes:
                continue
            before = self._node_last.get((owner, node), 0)
            self._node_last[(owner, node)] = value.value
            out.setdefault(owner, [0] * self.numa_nodes)[node] = value.value - before
        for owner in set(running) | set(self._running_last):
            if only_owner is not None and owner != only_owner:
                continue
            now = running.get(owner, [0] * self.numa_nodes)
            last = self._running_last.pop(owner, [0] * self.numa_nodes)
            if owner in running:
                self._running_last[owner] = now
            figures = out.setdefault(owner, [0] * self.numa_nodes)
            for node in range(self.numa_nodes):
                figures[node] = max(0, figures[node] + now[node] - last[node])
        return out

    @property
    def bpf(self) -> Any:
        """The loaded bcc program (None before ``load()``)."""
        return self._bpf

    def counters(self) -> dict[str, int]:
        return {"watched_processes": len(self.owners), "watched_threads": len(self._seen),
                "dropped_watched_map_full": int(self._drops.sum(ctypes.c_int(0)).value),
                # sched_switch events the kernel did not hand over (sched.bpf.c settle())
                **{name: int(table.sum(ctypes.c_int(0)).value)
                   for name, table in self._missed.items()}}

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
