"""What a run ran on: GPU model and driver (store), CUDA and PyTorch versions (the process).

The process reveals its CUDA runtime and PyTorch through the libraries it maps
(``/proc/PID/maps``: ``libcudart.so.12.4.127``, ``.../site-packages/torch/lib/libtorch.so``)
and PyTorch's ``torch/version.py`` beside them. Every read is bounded; paths and versions are
process-controlled text and are only ever shown, never run.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey
from gpuwhy.store import queries

MAX_MAPS_BYTES = 4 << 20
MAX_LIBRARIES = 64
MAX_VERSION_CHARS = 64
_LIBRARY = re.compile(r"/(libcudart|libcuda|libcublas|libcudnn|libnccl|libtorch[a-z_]*)"
                      r"\.so(?:\.([0-9][0-9.]*))?$")
_TORCH_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"\n]{1,64})['"]""", re.MULTILINE)
_CUDA_VERSION = re.compile(r"""^cuda\s*(?::[^=\n]{0,40})?=\s*['"]([0-9.]{1,16})['"]""",
                           re.MULTILINE)


def process_libraries(pid: int, proc_root: str = "/proc") -> list[str]:
    """The GPU-related shared libraries the process maps (paths, bounded); [] when gone."""
    try:
        with open(Path(proc_root, str(pid), "maps"), "rb") as maps:
            raw = maps.read(MAX_MAPS_BYTES)
    except OSError:
        return []
    found: list[str] = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        fields = line.split(None, 5)
        path = fields[5].strip() if len(fields) == 6 else ""
        if path and _LIBRARY.search(path) and path not in found:
            found.append(path[:4096])
            if len(found) >= MAX_LIBRARIES:
                break
    return found


def _torch_version(library: str) -> tuple[str | None, str | None]:
    """(torch version, CUDA it was built for) from torch/version.py next to torch/lib."""
    parts = Path(library).parts
    if "torch" not in parts:
        return None, None
    root = Path(*parts[:len(parts) - parts[::-1].index("torch")])
    try:
        with open(root / "version.py", "rb") as f:
            text = f.read(16384).decode("utf-8", errors="replace")
    except OSError:
        return None, None
    version, cuda = _TORCH_VERSION.search(text), _CUDA_VERSION.search(text)
    return (version[1] if version else None), (cuda[1] if cuda else None)


def versions_from_libraries(libraries: list[str]) -> dict[str, str]:
    """``cuda_runtime``, ``cuda_driver_lib``, ``torch``, ``torch_cuda`` where revealed."""
    out: dict[str, str] = {}
    for library in libraries:
        match = _LIBRARY.search(library)
        if not match:
            continue
        name, version = match[1], match[2]
        if name == "libcudart" and version:
            out.setdefault("cuda_runtime", version[:MAX_VERSION_CHARS])
        elif name == "libcuda" and version:
            out.setdefault("cuda_driver_lib", version[:MAX_VERSION_CHARS])
        elif name.startswith("libtorch") and "torch" not in out:
            torch, cuda = _torch_version(library)
            if torch:
                out["torch"] = torch
            if cuda:
                out["torch_cuda"] = cuda
    return out


def environment(db: Database, gpu_id: str | None, process: ProcessKey | None,
                libraries: list[str]) -> dict[str, object]:
    """GPU model, driver (the process's own version check first, else the GPU source's),
    whether the GPU is simulated, the process's command line, and library versions."""
    env: dict[str, object] = {}
    if gpu_id:
        row = queries.gpu(db, gpu_id)
        if row:
            env.update(gpu_model=row["model"], driver=row["driver_version"],
                       simulated=bool(row["simulated"]))
        env["gpu"] = gpu_id
    if process is not None:
        version = queries.process_driver_version(db, process)
        if version:
            env["driver"] = version[:MAX_VERSION_CHARS]
        row = queries.process(db, process)
        if row:
            env.update(comm=row["comm"], cmdline=(row["cmdline"] or "")[:1024])
    env.update(versions_from_libraries(libraries))
    return env
