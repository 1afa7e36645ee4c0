"""Advice that names the line: known slow patterns matched against sampled Python frames.

One small table (:data:`PATTERNS`) of what makes a GPU wait on its host — ``.item()``,
``.cpu()``, ``.numpy()``, ``torch.cuda.synchronize``, ``print(tensor)``, ``Image.open`` and
decoding, a DataLoader without ``pin_memory``, ``torch.tensor(ndarray)`` — matched against
the folded stacks the sampler stored (gpuwhy.pystacks: ``file:line function`` frames), and
for each match one sentence for the rule's fix that names the frame: "the sync comes from
`torch.cuda.synchronize()` at train.py:142 (`step`, 23 % of the main thread's samples):
...". Plain values in, plain values out: `gpuwhy why`, the web view and the report use it
alike.

What a pattern can match on, because of what py-spy gives (docs/decisions/0018): each frame's
file, line and function name; no source text (py-spy reads none, and the sampler reads no
file a process names). A C method such as ``Tensor.item`` has no Python frame, so those
patterns match on (a) the library's Python frames that call them (``Tensor.__format__`` for
an f-string of a tensor, ``Tensor.__array__`` for ``np.asarray(tensor)``), (b) native frames
when the sampler records them (``THPVariable_item``), (c) a frame's source line when a caller
passes it (``sources``: ``{"train.py:142": "loss.item()"}``). Every name is the sampled
process's: the sentences quote it escaped and bounded (gpuwhy.pystacks.escape); pages and
terminals escape again on output.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpuwhy.pystacks import ROLES, SEPARATOR, escape

MIN_SHARE = 0.05        # a pattern below 5 % of a role's samples is not what the GPU waits on
MIN_SAMPLES = 2
MAX_ADVICE = 3          # sentences per answer: the first few are what a person acts on
MAX_QUOTE = 80          # characters of a quoted call

# The host-side rules (gpuwhy/rules/builtin/a_host_starvation.rules) by what they say.
SYNC = ("R04_launch_bound", "R04b_cuda_launch_bound", "R05_gpu_idle_process_blocked",
        "R05b_cuda_sync_bound")
COPY = ("R06_pageable_h2d_copy", "R06b_cuda_pageable_copies", "R07_pcie_saturated_low_sm")
INPUT = ("R01_input_cpu_bound", "R02_input_io_bound", "R03_dataloader_synchronous",
         "R03b_workers_oversubscribed")
# lone symptoms whose cause is not established: any pattern may be the cause
UNEXPLAINED = ("R14_bursty_utilisation", "R14b_low_gpu_utilisation")

_FRAME = re.compile(r"^(.*?):(\d+) (.*)$", re.S)
_ROLE_OF = {"main": "the main thread's", "threads": "the other threads'",
            "workers": "the workers'"}


@dataclass(frozen=True)
class Pattern:
    """A known way host code makes the GPU wait, and how to recognise its frames:
    ``frames`` (a library file below site-packages, a function's last name) that call it,
    ``native`` symbol parts, ``source`` (a regular expression over a line's text, its match
    quoted). ``rules``: the rules whose answer it can explain (any rule outside every
    group below too)."""

    id: str
    what: str
    lead: str
    fix: str
    rules: tuple[str, ...]
    frames: tuple[tuple[str, str], ...] = ()
    native: tuple[str, ...] = ()
    source: str = ""


_DATALOADER_NEXT = tuple(("torch/utils/data/dataloader.py", name)
                         for name in ("__next__", "_next_data"))
PIN_MEMORY_FILE = "torch/utils/data/_utils/pin_memory.py"

PATTERNS: tuple[Pattern, ...] = (
    Pattern("item", "`.item()`", "the sync comes from",
            "read the value every N steps (or keep a running sum on the GPU and read it once "
            "per log interval) instead of every step", SYNC + UNEXPLAINED,
            frames=(("torch/_tensor.py", "__format__"),),
            native=("THPVariable_item", "_local_scalar_dense"),
            source=r"[\w\].)]*\.item\(\s*\)"),
    Pattern("cpu", "`.cpu()`", "the copy to the host, and the sync it waits for, comes from",
            "keep the values on the GPU until they are needed, then copy them every N steps "
            "(`.to('cpu', non_blocking=True)` into pinned memory)", SYNC + COPY + UNEXPLAINED,
            native=("THPVariable_cpu",),
            source=r"[\w\].)]*\.(?:cpu\(\s*\)|to\(\s*['\"]cpu['\"]\s*\))"),
    Pattern("numpy", "`.numpy()`", "the copy to the host, and the sync it waits for, comes from",
            "compute the metric with torch on the GPU and convert to NumPy only when it is "
            "logged, every N steps", SYNC + COPY + UNEXPLAINED,
            frames=(("torch/_tensor.py", "__array__"),),
            native=("THPVariable_numpy",), source=r"[\w\].)]*\.numpy\(\s*\)"),
    Pattern("synchronize", "`torch.cuda.synchronize()`", "the sync comes from",
            "synchronise only where a step is timed (behind a flag), or time with CUDA events",
            SYNC + UNEXPLAINED,
            frames=(("torch/cuda/__init__.py", "synchronize"),),
            native=("cudaDeviceSynchronize", "cudaStreamSynchronize", "cuCtxSynchronize",
                    "cuStreamSynchronize"),
            source=r"(?:torch\.)?cuda\.synchronize\([^)]*\)"),
    Pattern("print_tensor", "`print(tensor)`", "the sync comes from",
            "printing a GPU tensor copies it to the host and waits for the GPU: print a "
            "summary every N steps", SYNC + COPY + UNEXPLAINED,
            frames=(("torch/_tensor.py", "__repr__"), ("torch/_tensor_str.py", "_str"),
                    ("torch/_tensor_str.py", "_str_intern"),
                    ("torch/_tensor_str.py", "_tensor_str")),
            source=r"\bprint\((?!\s*f?['\"]).*\)"),
    Pattern("image_decode", "`Image.open`/decode", "the decoding comes from",
            "decode in more DataLoader workers (num_workers), store the images pre-resized or "
            "in a faster format, or decode on the GPU (torchvision.io.decode_jpeg on 'cuda', "
            "DALI)", INPUT + UNEXPLAINED,
            frames=(("PIL/Image.py", "open"), ("PIL/Image.py", "convert"),
                    ("PIL/ImageFile.py", "load"), ("torchvision/io/image.py", "decode_image"),
                    ("torchvision/io/image.py", "decode_jpeg"),
                    ("torchvision/io/image.py", "read_image")),
            native=("ImagingJpegDecode", "jpeg_read_scanlines", "cv::imread", "cv::imdecode"),
            source=r"(?:Image\.open|imread|imdecode|decode_jpeg|decode_image)\([^)]*\)"),
    # Told by what is absent: a DataLoader iterated with no pin-memory thread anywhere in the
    # sampled process (pin_memory=True starts one); :func:`_no_pin_memory`.
    Pattern("pin_memory_off", "a DataLoader without `pin_memory`",
            "the batches are copied from pageable memory: the DataLoader is iterated at",
            "pass pin_memory=True to the DataLoader and copy with .to(device, "
            "non_blocking=True)", COPY + UNEXPLAINED,
            frames=_DATALOADER_NEXT, source=r"pin_memory\s*=\s*False"),
    Pattern("tensor_from_ndarray", "`torch.tensor(ndarray)`",
            "the copy from pageable memory comes from",
            "use torch.from_numpy(array) (no copy) and .pin_memory() before "
            ".to(device, non_blocking=True), or build the tensors in the Dataset so the "
            "workers pay for them", COPY + INPUT + UNEXPLAINED,
            native=("internal_new_from_data", "THPVariable_tensor"),
            source=r"torch\.tensor\([^)]*\)"),
)
_KNOWN_RULES = frozenset(SYNC + COPY + INPUT + UNEXPLAINED)


@dataclass(frozen=True)
class Site:
    """One parsed frame of a folded stack."""

    file: str
    line: int
    function: str

    @property
    def at(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def library(self) -> bool:
        """Below site-packages or the standard library (gpuwhy.pystacks.short_file keeps a
        package path there, and only a file's name for the user's own code), or native
        (no ``.py``)."""
        return "/" in self.file or self.file.startswith("<") or not self.file.endswith(".py")


@dataclass(frozen=True)
class Advice:
    """A pattern found: where (the user's frame), how much of its role's samples, and the
    sentence for the fix."""

    pattern: str
    what: str
    at: str
    function: str
    role: str
    samples: int
    share: float
    quoted: str
    sentence: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_frame(text: str) -> Site | None:
    """``file:line function`` (gpuwhy.pystacks.frame_text) as a :class:`Site`; None for a
    ``waiting on ...`` frame, a cut (``…``) or anything else."""
    found = _FRAME.match(text)
    if found is None:
        return None
    return Site(found.group(1), int(found.group(2)), found.group(3))


def _last_name(function: str) -> str:
    return function.rsplit(".", 1)[-1]


def _in_library(site: Site, pattern: Pattern) -> bool:
    name = _last_name(site.function)
    return any(name == function and (site.file == file or site.file.endswith("/" + file))
               for file, function in pattern.frames)


def _match(site: Site, pattern: Pattern, sources: Mapping[str, str]) -> str | None:
    """How ``site`` shows ``pattern``: the quoted call (source text), ``""`` (a library or
    native frame), or None."""
    text = sources.get(site.at)
    if text and pattern.source:
        found = re.search(pattern.source, text)
        if found is not None:
            return f"`{escape(found.group(0).strip(), MAX_QUOTE)}`"
    if pattern.id == "pin_memory_off":
        return None                     # told from the whole sample (_no_pin_memory)
    if _in_library(site, pattern) or any(part in site.function for part in pattern.native):
        return ""
    return None


def _caller(sites: list[Site | None], index: int) -> Site | None:
    """The user's own frame at or above ``index`` (the code a person changes), else the
    frame itself."""
    for site in reversed(sites[:index + 1]):
        if site is not None and not site.library:
            return site
    return sites[index]


def _applies(pattern: Pattern, rule_id: str | None) -> bool:
    return rule_id is None or rule_id not in _KNOWN_RULES or rule_id in pattern.rules


def _no_pin_memory(stacks: list[Mapping]) -> bool:
    """Whether no sampled thread ran the DataLoader's pin-memory loop (started only with
    pin_memory=True)."""
    return not any(PIN_MEMORY_FILE in str(row.get("stack", "")) for row in stacks)


def find(stacks: Iterable[Mapping], rule_id: str | None = None,
         sources: Mapping[str, str] | None = None, limit: int = MAX_ADVICE) -> list[Advice]:
    """The patterns found in ``stacks`` (rows of ``{role, stack, count}``, as
    gpuwhy.store.stacks gives them, of any number of processes), each at the user's frame
    that leads to it, with its share of its role's samples, most samples first; only the
    patterns that can explain ``rule_id`` (all when None). ``sources``: a frame's source
    line by ``file:line``, where one is known."""
    sources = sources or {}
    rows = [row for row in stacks if str(row.get("role", "")) in ROLES]
    totals: Counter[str] = Counter()
    found: Counter[tuple[str, str, str, str, str]] = Counter()
    patterns = [p for p in PATTERNS if _applies(p, rule_id)]
    pins_off = _no_pin_memory(rows)
    for row in rows:
        role, count = str(row["role"]), int(row.get("count") or 0)
        totals[role] += count
        sites = [parse_frame(frame) for frame in str(row.get("stack", "")).split(SEPARATOR)]
        hit = _first_hit(sites, patterns, sources, pins_off)
        if hit is not None:
            pattern, index, quoted = hit
            where = _caller(sites, index)
            if where is not None:
                found[(pattern.id, where.at, where.function, role, quoted)] += count
    by_id = {p.id: p for p in PATTERNS}
    out = []
    for (pattern_id, at, function, role, quoted), samples in found.most_common():
        share = samples / totals[role] if totals[role] else 0.0
        if samples < MIN_SAMPLES or share < MIN_SHARE:
            continue
        pattern = by_id[pattern_id]
        said = quoted or pattern.what
        if pattern.id == "pin_memory_off":
            head = f"{pattern.lead} {at}"
        else:
            head = f"{pattern.lead} {said} at {at}"
        sentence = (f"{head} (`{function}`, {round(share * 100)} % of {_ROLE_OF[role]} "
                    f"samples): {pattern.fix}.")
        out.append(Advice(pattern_id, pattern.what, at, function, role, samples,
                          round(share, 3), said, sentence))
    return _one_per_place(out)[:limit]


def _first_hit(sites: list[Site | None], patterns: list[Pattern], sources: Mapping[str, str],
               pins_off: bool) -> tuple[Pattern, int, str] | None:
    """The innermost frame of a stack that shows a pattern: (pattern, its index, quote)."""
    for index in range(len(sites) - 1, -1, -1):
        site = sites[index]
        if site is None:
            continue
        for pattern in patterns:
            quoted = _match(site, pattern, sources)
            if quoted is not None:
                return pattern, index, quoted
    if pins_off:
        pin = next((p for p in patterns if p.id == "pin_memory_off"), None)
        for index in range(len(sites) - 1, -1, -1):
            site = sites[index]
            if pin is not None and site is not None and _in_library(site, pin):
                return pin, index, ""
    return None


def _one_per_place(found: list[Advice]) -> list[Advice]:
    """One sentence per (pattern, frame): the role with the most samples there."""
    seen: set[tuple[str, str]] = set()
    out = []
    for advice in sorted(found, key=lambda a: (-a.samples, a.pattern, a.at)):
        if (advice.pattern, advice.at) not in seen:
            seen.add((advice.pattern, advice.at))
            out.append(advice)
    return out


def sentences(stacks: Iterable[Mapping], rule_id: str | None = None) -> list[str]:
    """The sentences of :func:`find`, for a fix list."""
    return [advice.sentence for advice in find(stacks, rule_id)]
