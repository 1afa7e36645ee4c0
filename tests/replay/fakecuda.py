"""Build the fake CUDA libraries and the program that calls them (tests and the benchmark).

``build(directory)`` compiles ``libcuda.so.1`` (fakecuda.c), ``libcudart.so.12``
(fakecudart.c, linked against it, as the real runtime reaches the driver) and ``cudaprog``
with gcc, and returns their paths. ``subdir`` puts the libraries where a Python wheel keeps
them (``site-packages/nvidia/cuda_runtime/lib``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_DIR = "site-packages/nvidia/cuda_runtime/lib"


def build(directory: Path, subdir: str = WHEEL_DIR) -> dict[str, Path]:
    """Compile everything into ``directory``; returns the paths."""
    lib_dir = directory / subdir
    lib_dir.mkdir(parents=True, exist_ok=True)
    cuda, cudart = lib_dir / "libcuda.so.1", lib_dir / "libcudart.so.12"
    prog = directory / "cudaprog"
    common = ["gcc", "-O2", "-fPIC", "-shared", "-Wl,--build-id=sha1", f"-I{HERE}"]
    subprocess.run([*common, "-o", str(cuda), str(HERE / "fakecuda.c")], check=True)
    subprocess.run([*common, "-o", str(cudart), str(HERE / "fakecudart.c"), str(cuda)],
                   check=True)
    subprocess.run(["gcc", "-O2", "-pthread", f"-I{HERE}", "-o", str(prog),
                    str(HERE / "cudaprog.c"), str(cuda), str(cudart),
                    f"-Wl,-rpath,{lib_dir}"], check=True)
    return {"libcuda": cuda, "libcudart": cudart, "prog": prog}
