"""Python stacks behind a GPU's idle time: folded frames, their bounds, the targets file.

One definition of what the stack sampler (gpuwhy.probes.stack_sampler), the store and `gpuwhy why`
share: how a sampled frame is written (``file:line function``, escaped and bounded: a
process controls every name in its frames), how frames inside the interpreter's queues and
locks fold into one ``waiting on ...`` frame, how an aggregate is bounded, how its top
frames are said, which answers are host-side (the only ones that start sampling) and the
small targets file through which the service tells the sampler which processes to sample.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# --- bounds (docs/decisions/0018-python-stacks-sampler.md) ---
MAX_FRAMES = 48            # frames kept per stack: the outermost ones (where the job is)
MAX_STACKS = 200           # distinct stacks kept per (process, role); the rest counted
MAX_FILE_CHARS = 96        # a frame's file, its tail kept
MAX_FUNCTION_CHARS = 80    # a frame's function name
MAX_TARGETS = 64           # processes one targets file may name
MAX_TARGETS_BYTES = 64 * 1024
SEPARATOR = ";"            # between frames of a folded stack, escaped inside names
ROLES = ("main", "threads", "workers")   # main thread, its other threads, child processes

HOST_SIDE_GROUP = "host_starvation"
# lone symptoms whose cause is not established: the stacks may tell it
HOST_SIDE_SYMPTOMS = ("R14_bursty_utilisation", "R14b_low_gpu_utilisation")

# Where the interpreter waits: (the standard library file, below ``lib/pythonX.Y/``, or
# None for any file; function names; what a person reads). A frame matching one, and every
# frame it called, fold into "waiting on <what>": the code above it is what waits.
_WAITS: tuple[tuple[str | None, tuple[str, ...], str], ...] = (
    ("queue.py", ("Queue.get", "Queue.put", "get", "put"), "queue.Queue"),
    ("multiprocessing/queues.py", ("Queue.get", "Queue.put", "SimpleQueue.get", "get"),
     "multiprocessing queue"),
    ("multiprocessing/connection.py", ("_ConnectionBase.recv", "_ConnectionBase.recv_bytes",
                                       "_ConnectionBase.poll", "wait", "recv", "recv_bytes",
                                       "poll", "Connection._recv", "Connection._recv_bytes",
                                       "Connection._poll"), "multiprocessing pipe"),
    ("multiprocessing/synchronize.py", (), "multiprocessing lock"),
    ("multiprocessing/pool.py", ("ApplyResult.get", "ApplyResult.wait", "IMapIterator.next"),
     "multiprocessing pool"),
    ("concurrent/futures/_base.py", ("Future.result", "wait", "as_completed"), "a future"),
    ("threading.py", ("Condition.wait", "Event.wait", "Semaphore.acquire", "Thread.join",
                      "Barrier.wait", "Thread._wait_for_tstate_lock", "wait", "join",
                      "acquire"), "a lock"),
    ("selectors.py", (), "selectors (I/O)"),
    ("socket.py", ("socket.accept", "SocketIO.readinto", "accept", "readinto"), "a socket"),
    ("subprocess.py", ("Popen.wait", "Popen._wait", "Popen.communicate"), "a subprocess"),
)
_STDLIB = re.compile(r"/lib(?:64)?/python3\.\d+/(?!site-packages/|dist-packages/)(.+)$")
_LIB_PREFIX = re.compile(r"^.*/(?:site-packages|dist-packages|lib(?:64)?/python3\.\d+)/")
_ESCAPES = {SEPARATOR: "\\x3b", "\\": "\\\\"}


def escape(text: str, limit: int, keep_tail: bool = False) -> str:
    """``text`` from a traced process made safe to store and print: control and other
    non-printable characters (and the frame separator, and backslashes) as escapes, at most
    ``limit`` characters, an ellipsis marking a cut (at the start when ``keep_tail``).
    Markup is left as text: every page escapes on output (Jinja), the terminal needs none.

    >>> escape("a;b\\x1b[31m", 40)
    'a\\\\x3bb\\\\x1b[31m'
    """
    text = "".join(_ESCAPES.get(c, c) if c.isprintable() else
                   c.encode("unicode_escape").decode("ascii") for c in str(text))
    if len(text) > limit:
        text = ("…" + text[-(limit - 1):]) if keep_tail else (text[:limit - 1] + "…")
    return text


def short_file(path: str) -> str:
    """A file as a person reads it in a frame: below site-packages or the standard
    library's directory, else its last component (``/home/ada/job/train.py`` is train.py)."""
    shortened = _LIB_PREFIX.sub("", path)
    if shortened != path:
        return shortened
    return path.rsplit("/", 1)[-1] or path


def waiting_on(file: str, function: str) -> str | None:
    """What a frame waits on when it is one of the interpreter's queues, locks, pipes or
    selectors (a standard-library file), else None."""
    found = _STDLIB.search(file)
    if found is None:
        return None
    name = found.group(1)
    for wait_file, functions, what in _WAITS:
        if name == wait_file and (not functions or function in functions):
            return what
    return None


def frame_text(file: str, line: int | None, function: str) -> str:
    """One frame as stored: ``file:line function``, escaped and bounded."""
    where = escape(short_file(str(file)), MAX_FILE_CHARS, keep_tail=True)
    number = line if isinstance(line, int) and not isinstance(line, bool) and line >= 0 else 0
    return f"{where}:{number} {escape(str(function), MAX_FUNCTION_CHARS)}"


@dataclass(frozen=True)
class Frame:
    """A frame as the sampler reads it (untrusted: the process wrote every field)."""

    file: str
    line: int | None
    function: str


def fold(frames: Iterable[Frame]) -> tuple[str, bool]:
    """A stack, outermost frame first, as one folded string: frames from the first that waits
    inside the interpreter's queues and locks on become one ``waiting on ...`` frame; at
    most MAX_FRAMES frames (the innermost cut, the second value then True)."""
    out: list[str] = []
    for frame in frames:
        what = waiting_on(str(frame.file), str(frame.function))
        if what is not None:
            out.append(f"waiting on {what}")
            break
        out.append(frame_text(frame.file, frame.line, frame.function))
    cut = len(out) > MAX_FRAMES
    if cut:
        out = [*out[:MAX_FRAMES - 1], "…"]
    return SEPARATOR.join(out), cut


# A stack's samples per second of the window (``seconds``: [[second, samples], ...]), kept
# for the first MAX_SECONDS seconds: what lines them up with the GPU's 1 s samples (idle or
# busy). The default window is 30 s; a longer one is split for its first two minutes only.
MAX_SECONDS = 120


class Aggregate:
    """Folded stacks of one sampled process tree, counted per (pid, start_time, role), with
    at most MAX_STACKS distinct stacks per (process, role); what did not fit is counted.
    Each stack's samples are also counted per second of the window, where known."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int, str], Counter[str]] = {}
        self.seconds: dict[tuple[int, int, str, str], Counter[int]] = {}
        self.dropped: Counter[str] = Counter()

    def add(self, pid: int, start_time: int, role: str, stack: str, count: int = 1,
            second: int | None = None) -> None:
        held = self.counts.setdefault((pid, start_time, role), Counter())
        if stack not in held and len(held) >= MAX_STACKS:
            self.dropped["stacks_over_limit"] += count
            return
        held[stack] += count
        if second is not None and 0 <= second < MAX_SECONDS:
            self.seconds.setdefault((pid, start_time, role, stack), Counter())[second] += count

    def rows(self) -> list[dict]:
        """The aggregate as the event carries it: one dict per (process, role, stack)."""
        out = []
        for (pid, start, role), held in sorted(self.counts.items()):
            for stack, n in held.most_common():
                row: dict[str, Any] = {"pid": pid, "start_time": start, "role": role,
                                       "stack": stack, "count": n}
                seconds = self.seconds.get((pid, start, role, stack))
                if seconds:
                    row["seconds"] = sorted([s, c] for s, c in seconds.items())
                out.append(row)
        return out

    def __bool__(self) -> bool:
        return bool(self.counts)


MAX_STACK_CHARS = MAX_FRAMES * (MAX_FILE_CHARS + MAX_FUNCTION_CHARS + 12)
MAX_ROWS = 16 * len(ROLES) * MAX_STACKS     # rows one aggregate may hold (16 processes)


def clean_rows(rows: object) -> list[dict]:
    """An aggregate's rows as the store keeps them, whoever sent them: known roles, whole
    numbers, printable stacks of bounded length, at most MAX_ROWS rows, most samples first
    (the sampler's rows pass unchanged)."""
    out: list[dict[str, Any]] = []
    for row in rows if isinstance(rows, list) else []:
        try:
            role, stack = str(row["role"]), str(row["stack"])
            pid, start, count = int(row["pid"]), int(row["start_time"]), int(row["count"])
        except (KeyError, TypeError, ValueError):
            continue
        if role not in ROLES or count <= 0:
            continue
        if not stack.isprintable():
            stack = escape(stack, MAX_STACK_CHARS)
        cleaned: dict[str, Any] = {"pid": pid, "start_time": start, "role": role,
                                   "stack": stack[:MAX_STACK_CHARS], "count": count}
        seconds = _clean_seconds(row.get("seconds"), count)
        if seconds:
            cleaned["seconds"] = seconds
        out.append(cleaned)
    out.sort(key=lambda r: -r["count"])
    return out[:MAX_ROWS]


_FRAME_FILE = re.compile(r"^(.*?):\d+ ")


def _library(frame: str) -> bool:
    """Whether a stored frame is a library's (a package path below site-packages or the
    standard library, or native: not a ``.py`` file) rather than the user's own code."""
    found = _FRAME_FILE.match(frame)
    if found is None:
        return False
    file = found.group(1)
    return "/" in file or file.startswith("<") or not file.endswith(".py")


def _clean_seconds(seconds: object, count: int) -> list[list[int]]:
    """A row's ``seconds`` as the store keeps them: [second, samples] pairs of whole numbers,
    seconds in [0, MAX_SECONDS), no more samples than the row's count; [] for anything
    else."""
    if not isinstance(seconds, list):
        return []
    out: dict[int, int] = {}
    for pair in seconds[:MAX_SECONDS]:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            return []
        second, samples = pair
        if not 0 <= second < MAX_SECONDS or samples <= 0:
            return []
        out[second] = out.get(second, 0) + samples
    if sum(out.values()) > count:
        return []
    return [[second, samples] for second, samples in sorted(out.items())]


def split_by_gpu(stacks: Iterable[Mapping], idle: Mapping[int, bool]
                 ) -> dict[str, list[dict]]:
    """The stacks' samples split by what the GPU did in each second of the window (``idle``:
    second -> True when idle, False when busy; a second it has no sample of is neither):
    ``{"idle": rows, "busy": rows}``, rows as the stacks' with their counts in those
    seconds (stacks without ``seconds`` are in neither)."""
    out: dict[str, list[dict]] = {"idle": [], "busy": []}
    for row in stacks:
        counts = {"idle": 0, "busy": 0}
        for second, samples in row.get("seconds") or []:
            state = idle.get(second)
            if state is not None:
                counts["idle" if state else "busy"] += samples
        for name, n in counts.items():
            if n:
                out[name].append({**row, "count": n})
    return out


def _leaf(stack: str) -> str:
    """What a stack's samples say a person should look at: its innermost frame (for a wait,
    the frame that waits and what it waits on), and when that frame is a library's, the
    user's own frame that called into it first (``dataset.py:41 load → PIL/Image.py:3236
    open``): the line a person can change."""
    frames = stack.split(SEPARATOR)
    waits = frames[-1].startswith("waiting on ") and len(frames) > 1
    leaf, rest = (frames[-2], frames[:-2]) if waits else (frames[-1], frames[:-1])
    said = f"{leaf}, {frames[-1]}" if waits else leaf
    if _library(leaf):
        caller = next((f for f in reversed(rest) if not _library(f)
                       and not f.startswith("waiting on ")), None)
        if caller is not None:
            return f"{caller} → {said}"
    return said


def top_frames(rows: Iterable[Mapping], limit: int = 3) -> dict[str, list[tuple[str, float]]]:
    """Per role (main thread, other threads, workers), the ``limit`` innermost frames that
    took most samples, with their share of that role's samples (0-1)."""
    by_role: dict[str, Counter[str]] = {}
    for row in rows:
        role = str(row.get("role", ""))
        if role not in ROLES:
            continue
        by_role.setdefault(role, Counter())[_leaf(str(row.get("stack", "")))] += int(
            row.get("count") or 0)
    out = {}
    for role in ROLES:
        counts = by_role.get(role)
        total = sum(counts.values()) if counts else 0
        if counts and total:
            out[role] = [(leaf, n / total) for leaf, n in counts.most_common(limit)]
    return out


ROLE_WORDS = {"main": "main thread", "threads": "other threads", "workers": "workers"}


def summary_line(rows: Iterable[Mapping]) -> str:
    """One line for a person: ``main thread 71 % in train.py:88 <module>; workers 64 % in
    dataset.py:41 load`` (the top frame of the main thread and of the workers: the other
    threads are mostly the libraries' helpers, waiting); "" when there is nothing."""
    parts = [f"{ROLE_WORDS[role]} {round(found[0][1] * 100)} % in {found[0][0]}"
             for role, found in top_frames(rows, 1).items() if role != "threads"]
    return "; ".join(parts)


# --- which answers are host-side ---
def host_side(rule_id: str, group: str, kind: str, cause_established: bool = True) -> bool:
    """Whether an answer is host-side: a cause of group ``host_starvation`` (the input is
    CPU- or IO-bound, launch- or sync-bound, pageable copies, ...), or a lone symptom of low
    or bursty use whose cause is not established (the stacks may establish it)."""
    if group == HOST_SIDE_GROUP:
        return True
    return rule_id in HOST_SIDE_SYMPTOMS and not cause_established


# --- the targets file: the service says, the sampler reads ---
@dataclass(frozen=True)
class Target:
    """Sample ``pid`` (started at ``start_time``, clock ticks since boot, as /proc says) and
    its children, bound to ``gpu_id`` while ``finding_id`` holds, until ``until`` (realtime
    ns): the window after the answer formed."""

    pid: int
    start_time: int
    gpu_id: str
    finding_id: str
    rule_id: str
    until: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.finding_id, self.pid, self.start_time)


def write_targets(path: str, targets: Iterable[Target], written_at: int) -> None:
    """Replace the targets file at ``path`` at once (a reader sees the old or the new one),
    readable by its owner and group only."""
    body = {"version": 1, "written_at": written_at,
            "targets": [t.__dict__ for t in list(targets)[:MAX_TARGETS]]}
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".stack-targets.", dir=directory)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TargetsRefused(ValueError):
    """The targets file is not one the service wrote: wrong owner, writable by others, too
    large, or not the format."""


def read_targets(path: str) -> list[Target]:
    """The targets the service wrote at ``path``; [] when there is no file. Raises
    :class:`TargetsRefused` for a file anyone but root, this process's user or the owner of
    its directory could have written (it chooses whose memory the sampler reads)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TargetsRefused(f"cannot open {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        folder = os.stat(os.path.dirname(os.path.abspath(path)))
        trusted = {0, os.geteuid(), folder.st_uid}
        if not stat.S_ISREG(info.st_mode):
            raise TargetsRefused(f"{path} is not a regular file")
        if info.st_uid not in trusted or info.st_mode & stat.S_IWOTH or \
                info.st_mode & stat.S_IWGRP:
            raise TargetsRefused(f"{path} may have been written by another user "
                                 f"(owner uid {info.st_uid}, mode {info.st_mode & 0o777:o})")
        if folder.st_mode & stat.S_IWOTH and not folder.st_mode & stat.S_ISVTX:
            raise TargetsRefused(f"the directory of {path} is writable by every user")
        data = file.read(MAX_TARGETS_BYTES + 1)
    if len(data) > MAX_TARGETS_BYTES:
        raise TargetsRefused(f"{path} is larger than {MAX_TARGETS_BYTES} bytes")
    try:
        body = json.loads(data)
        return [Target(pid=int(t["pid"]), start_time=int(t["start_time"]),
                       gpu_id=str(t["gpu_id"])[:256], finding_id=str(t["finding_id"])[:256],
                       rule_id=str(t["rule_id"])[:128], until=int(t["until"]))
                for t in body["targets"][:MAX_TARGETS]]
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetsRefused(f"{path} is not a targets file: {exc}") from None
