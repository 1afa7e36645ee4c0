"""The probe's reading of NVIDIA driver calls, checked on calls a real CUDA process sent.

Each tests/data/real/<gpu>/nvtrace/calls.nvt.gz holds every ioctl the real-GPU kit's PyTorch
load sent to the driver, with the parameter bytes before and after the driver had them
(scripts/nvtrace.c). :func:`gpuwhy.app.demo.recorded.decode` reads them with the tables the
probe is compiled with (gpuwhy.nvioctl), field for field as ``fdtrack.bpf.c`` does; the
driver's own answers (the status it wrote, the version it checked, the GPU it registered)
say whether those tables are right. tests/privileged/test_fdtrack_recorded.py sends the same
calls through the real probe. Also here: the CUDA libraries the load mapped export every
function the CUDA uprobes attach to.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from gpuwhy.app.demo.recorded import RecordingError, decode, read_calls
from gpuwhy.nvioctl import (
    RM_CLASSES,
    RM_STATUS,
    UVM_DECODE_BEFORE,
    VERSION_STRING_LEN,
    VERSION_STRING_OFFSET,
    parse_driver_version,
)
from gpuwhy.probes.cuda.libraries import FUNCTIONS

REAL = Path(__file__).parent / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/nvtrace/calls.nvt.gz"))
UVM_FREE = 34


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.name)
def recording(request) -> Path:
    return request.param


def _driver(folder: Path) -> tuple[int, ...]:
    version = parse_driver_version((folder / "host/driver-version.txt").read_text())
    assert version is not None
    return version


def _calls(folder: Path):
    return read_calls(folder / "nvtrace/calls.nvt.gz")


def _uuid(folder: Path) -> str:
    text = (folder / "host/nvidia-smi-L.txt").read_text()
    return text.split("UUID: ", 1)[1].split(")", 1)[0]


def test_there_is_a_recording():
    assert RECORDINGS, "no tests/data/real/*/nvtrace/calls.nvt.gz"


def test_a_cuda_start_and_its_work_were_recorded(recording):
    calls = _calls(recording)
    names = {decode(c, _driver(recording)).name for c in calls}
    # what every CUDA context's start sends: the version check, objects, memory, UVM
    assert {"NV_ESC_CHECK_VERSION_STR", "NV_ESC_RM_ALLOC", "NV_ESC_RM_CONTROL",
            "NV_ESC_RM_MAP_MEMORY", "NV_ESC_REGISTER_FD", "UVM_INITIALIZE",
            "UVM_REGISTER_GPU", "UVM_CREATE_EXTERNAL_RANGE",
            "UVM_MAP_EXTERNAL_ALLOCATION"} <= names
    assert {c.device for c in calls} == {"nvidiactl", "nvidiaN", "nvidia-uvm"}
    assert all(c.ret == 0 and c.errno == 0 for c in calls)   # the load ran without error


def test_every_status_the_probe_reads_is_the_drivers_ok(recording):
    """The driver wrote NV_OK into every call that succeeded: a status read at a wrong
    offset reads a handle, a length or an address instead."""
    driver = _driver(recording)
    read = [(c, decode(c, driver)) for c in _calls(recording)]
    with_status = [(c, d) for c, d in read if d.status is not None]
    assert len(with_status) > 0.8 * len(read)
    wrong = {(d.name, hex(d.status)) for _, d in with_status if d.status != 0}
    assert wrong == set()
    assert all(d.status in RM_STATUS for _, d in with_status)


def test_uvm_free_is_read_as_the_recording_drivers_layout(recording):
    """UVM_FREE_PARAMS lost its length in 590.44.01; a UVM command carries no size, so only
    the driver's version tells which layout a call has."""
    driver = _driver(recording)
    frees = [c for c in _calls(recording) if c.device == "nvidia-uvm"
             and c.request == UVM_FREE]
    assert frees           # the kit's load frees each phase's buffers
    since, _ = UVM_DECODE_BEFORE[UVM_FREE]
    for call in frees:
        ours = decode(call, driver)
        assert ours.status == 0
        if driver < since:
            assert ours.nbytes > 0             # {base, length, rmStatus}: the length
            newest = decode(call, None)        # read as the newest layout: the length
            assert newest.status == ours.nbytes


def test_the_version_checked_is_the_loaded_drivers(recording):
    checks = [c for c in _calls(recording)
              if decode(c).name == "NV_ESC_CHECK_VERSION_STR"]
    assert checks
    for call in checks:
        raw = call.buffers[0].before[VERSION_STRING_OFFSET:
                                     VERSION_STRING_OFFSET + VERSION_STRING_LEN]
        assert parse_driver_version(raw.split(b"\0", 1)[0].decode()) == _driver(recording)


def test_uvm_registers_the_gpu_nvidia_smi_lists(recording):
    registered = {str(uuid.UUID(bytes=c.buffers[0].before[:16]))
                  for c in _calls(recording) if decode(c).name == "UVM_REGISTER_GPU"}
    assert registered == {_uuid(recording).removeprefix("GPU-")}


def test_the_gpus_classes_are_named(recording):
    """The objects a CUDA context allocates on this GPU (its channel, compute, copy and
    usermode classes) are named, not shown as bare numbers."""
    classes = {decode(c).sub for c in _calls(recording) if decode(c).name == "NV_ESC_RM_ALLOC"}
    named = {RM_CLASSES[c] for c in classes if c in RM_CLASSES}
    assert len(named) >= 0.9 * len(classes)
    families = {name.split("_", 1)[0] for name in named
                if name.endswith(("_CHANNEL_GPFIFO_A", "_COMPUTE_A", "_DMA_COPY_A"))}
    assert len(families) == 1        # one GPU: one architecture's classes


def test_device_memory_allocations_carry_their_size(recording):
    """RM_ALLOC of NV01_MEMORY_LOCAL_USER: the size in NV_MEMORY_ALLOCATION_PARAMS is read.
    Together they hold at least what NVML says the load used (the kit's trace runs to the
    load's end, so frees after NVML's reading are in it too)."""
    driver = _driver(recording)
    sizes = [decode(c, driver).nbytes for c in _calls(recording)
             if decode(c, driver).name == "NV_ESC_RM_ALLOC" and decode(c, driver).sub == 0x40]
    assert sizes and all(s > 0 and s % 4096 == 0 for s in sizes)
    nvml = json.loads((recording / "nvml/processes.json").read_text())
    used = sum(p["used_memory"] for g in nvml["gpus"] for p in g["compute_processes"])
    assert sum(sizes) >= used * 0.9


def test_a_damaged_recording_is_refused_with_where(tmp_path, recording):
    import gzip

    data = gzip.decompress((recording / "nvtrace/calls.nvt.gz").read_bytes())
    cut = tmp_path / "cut.nvt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordingError, match="byte"):
        read_calls(cut)
    (tmp_path / "other.nvt").write_bytes(b"not a recording")
    with pytest.raises(RecordingError, match="not an nvtrace recording"):
        read_calls(tmp_path / "other.nvt")


@pytest.fixture(params=sorted(p.parent.parent for p in REAL.glob("*/gpuwhy/cuda-libs.json")),
                ids=lambda p: p.name)
def cuda_libs(request) -> dict:
    return json.loads((request.param / "gpuwhy/cuda-libs.json").read_text())


def test_the_cuda_libraries_export_every_traced_function(cuda_libs):
    """The driver API's functions are all in libcuda, the runtime's all in libcudart, under
    the names the uprobes attach to."""
    runtime = {f.name for f in FUNCTIONS if f.name.startswith("cuda")}
    driver = {f.name for f in FUNCTIONS} - runtime
    kinds = {lib["kind"]: lib for lib in cuda_libs["libraries"]}
    assert set(kinds) == {"cuda", "cudart"}
    assert set(kinds["cuda"]["missing"]) == runtime
    assert set(kinds["cudart"]["missing"]) == driver
    for lib in kinds.values():
        assert len(lib["build_id"]) == 40          # an allow-list can name it
