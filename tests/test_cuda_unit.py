"""The CUDA uprobes' parts that need no privilege: ELF build ids and offsets, library
discovery in /proc/PID/maps, the allow-list, the cookie contract with cuda.bpf.c, the kill
switch files, the CLI, and the store's rows."""

import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app import cuda_cli
from gpuwhy.app.cli import cli
from gpuwhy.events import CudaCall, CudaLibrary, CudaStats, Envelope
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.cuda import control as cudactl
from gpuwhy.probes.cuda import probe as cuda
from gpuwhy.probes.cuda.libraries import (
    FUNCTIONS,
    SHAPES,
    ElfError,
    build_id,
    cookie,
    file_offsets,
    mapped_libraries,
    parse_allowed,
)
from gpuwhy.store.writer import StoreWriter
from gpuwhy.wire import from_frames, to_payload

sys.path.insert(0, str(Path(__file__).resolve().parent / "replay"))
import fakecuda  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BPF_C = (REPO / "probes" / "cuda" / "cuda.bpf.c").read_text()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return fakecuda.build(tmp_path_factory.mktemp("fakecuda"))


def _readelf_build_id(path):
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def test_build_id_is_what_readelf_reads(built):
    for name in ("libcuda", "libcudart", "prog"):
        assert build_id(built[name]) == _readelf_build_id(built[name])
    assert build_id(built["libcuda"]) != build_id(built["libcudart"])


def test_a_library_without_build_id_and_files_that_are_not_elf(tmp_path):
    source = tmp_path / "x.c"
    source.write_text("int f(void) { return 1; }\n")
    bare = tmp_path / "libbare.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id=none", "-o", str(bare),
                    str(source)], check=True)
    assert build_id(bare) is None
    with pytest.raises(ElfError, match="not an ELF"):
        build_id(source)
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(bare.read_bytes()[:40])
    with pytest.raises(ElfError):
        build_id(truncated)
    with pytest.raises(ElfError, match="No such file"):
        build_id(tmp_path / "missing.so")


def test_file_offsets_agree_with_bcc(built):
    from bcc import BPF

    path = str(built["libcuda"]).encode()
    addresses = {n.decode(): a for n, a in BPF.get_user_functions_and_addresses(path, b"^cu")}
    offsets = file_offsets(built["libcuda"], addresses)
    assert set(offsets) == set(addresses) and len(offsets) >= 20
    for name, offset in offsets.items():
        assert BPF._check_path_symbol(path, name.encode(), None, -1)[1] == offset, name


def test_mapped_libraries_finds_system_and_wheel_copies_only(tmp_path):
    maps = tmp_path / "proc" / "42" / "maps"
    maps.parent.mkdir(parents=True)
    wheel = "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    maps.write_text("\n".join([
        f"7f0000000000-7f0000001000 r--p 00000000 08:01 11 {wheel}",
        f"7f0000001000-7f0000002000 r-xp 00001000 08:01 11 {wheel}",
        "7f0000003000-7f0000004000 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "7f0000005000-7f0000006000 r-xp 00000000 08:01 13 /usr/lib/libcudadebugger.so.1",
        "7f0000007000-7f0000008000 r-xp 00000000 08:01 14 /usr/lib/libcuda.so.2 (deleted)",
        "7f0000009000-7f000000a000 r-xp 00000000 08:01 15 /tmp/libcudart_static.a",
        "7f000000b000-7f000000c000 rw-p 00000000 00:00 0 [heap]",
        "7f000000d000-7f000000e000 r-xp 00000000 08:01 16 /usr/local/cuda/lib64/libcudart.so",
    ]) + "\n")
    found = mapped_libraries(42, str(tmp_path / "proc"))
    assert [(lib.path, lib.kind) for lib in found] == [
        (wheel, "cudart"), ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "cuda"),
        ("/usr/local/cuda/lib64/libcudart.so", "cudart")]
    assert found[0].host_path == f"{tmp_path}/proc/42/root{wheel}"
    assert mapped_libraries(43, str(tmp_path / "proc")) == []


def test_allow_list_setting():
    assert parse_allowed("") == frozenset()
    assert parse_allowed(" AB12 , cd34,") == {"ab12", "cd34"}
    assert parse_allowed("ab12,*") is None


def test_cookies_and_shapes_match_the_bpf_program():
    used = set(re.findall(r"\bSH_[A-Z_]+\b", BPF_C))
    assert used - {"SH_CALIBRATE"} <= set(SHAPES) and {f.shape for f in FUNCTIONS} <= set(SHAPES)
    for function in FUNCTIONS:
        value = cookie(function)
        assert (value & 0xFF, (value >> 8) & 0xFF, (value >> 16) & 0xFF) == \
            (function.id, SHAPES.index(function.shape), function.arg)
    assert [f.id for f in FUNCTIONS] == list(range(len(FUNCTIONS))) and len(FUNCTIONS) < 256
    calibrate = int(re.search(r"#define SH_CALIBRATE (0x[0-9A-F]+)", BPF_C).group(1), 16)
    assert (cuda.CALIBRATION_COOKIE >> 8) & 0xFF == calibrate and len(SHAPES) < calibrate
    directions = re.search(r"enum direction \{([^}]*)\}", BPF_C).group(1)
    assert [d.strip().removeprefix("DIR_").lower() for d in directions.split(",")][:-1] == \
        list(cuda.DIRECTIONS)
    drops = re.search(r"enum drop_reason \{([^}]*)\}", BPF_C).group(1)
    assert len([d for d in drops.split(",") if d.strip()]) - 1 == len(cuda.DROP_REASONS)
    syncs = {f.arg: f.name for f in FUNCTIONS if f.shape == "SH_SYNC"}
    assert tuple(syncs[i] for i in range(len(syncs))) == cuda.SYNC_KINDS
    graphs = {f.arg: f.name for f in FUNCTIONS if f.shape == "SH_GRAPH"}
    assert tuple(graphs[i] for i in range(len(graphs))) == cuda.GRAPH_KINDS


def test_kill_switch_files(tmp_config, tmp_path):
    config = tmp_config.replace({"probes.cuda_control_dir": str(tmp_path / "ctl")})
    assert cudactl.disabled_reason(config) is None
    cudactl.disable(config, "x" * 1000)
    assert cudactl.disabled_reason(config) == "x" * cudactl.MAX_REASON
    cudactl.kill_path(config).write_text("")          # made by hand: `touch cuda.disabled`
    assert cudactl.disabled_reason(config) == "set by hand"
    assert cudactl.enable(config) and not cudactl.enable(config)
    assert cudactl.read_state(config) is None
    cudactl.write_state(config, {"enabled": True})
    assert cudactl.read_state(config)["enabled"] is True


def _invoke(config, *args):
    return CliRunner().invoke(cli, list(args), env={
        "GPUWHY_CUDA_CONTROL_DIR": config["probes.cuda_control_dir"],
        "GPUWHY_CUDA_ALLOWED_BUILD_IDS": config["probes.cuda_allowed_build_ids"]})


def test_cli_kill_switch_and_status_without_a_probes_process(tmp_config, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_cli, "CONFIRM_SECONDS", 0.1)
    config = tmp_config.replace({"probes.cuda_control_dir": str(tmp_path / "ctl")})
    result = _invoke(config, "cuda", "disable", "--reason", "maintenance")
    assert result.exit_code == 0 and "no running probes process confirmed it" in result.output
    assert cudactl.disabled_reason(config) == "maintenance"
    result = _invoke(config, "cuda", "status")
    assert "kill switch: maintenance" in result.output
    assert "allowed build ids: none" in result.output
    result = _invoke(config, "cuda", "status", "--json")
    assert json.loads(result.output)["kill_switch"] == "maintenance"
    result = _invoke(config, "cuda", "enable")
    assert "kill switch cleared" in result.output and cudactl.disabled_reason(config) is None


def test_cli_allow_build_id_prints_the_setting(tmp_config, tmp_path, built):
    config = tmp_config.replace({"probes.cuda_control_dir": str(tmp_path / "ctl"),
                                 "probes.cuda_allowed_build_ids": "00ff"})
    result = _invoke(config, "cuda", "allow-build-id", str(built["libcuda"]))
    found = build_id(built["libcuda"])
    assert result.exit_code == 0, result.output
    assert f"{found}  {built['libcuda']}  (new)" in result.output
    assert f'cuda_allowed_build_ids = "{",".join(sorted(["00ff", found]))}"' in result.output
    config = config.replace({"probes.cuda_allowed_build_ids": "*"})
    assert "nothing to add" in _invoke(config, "cuda", "allow-build-id",
                                       str(built["libcuda"])).output
    result = _invoke(config, "cuda", "allow-build-id", str(REPO / "README.md"))
    assert result.exit_code == 1 and "not an ELF file" in result.output
    assert _invoke(config, "cuda", "allow-build-id").exit_code == 2


def _stats_event():
    copies = {d: {"count": 1, "bytes": 100 * (i + 1), "ns": 5, "async_count": 0,
                  "pinned_bytes": 10, "pageable_bytes": 90} for i, d in enumerate(cuda.DIRECTIONS)}
    return CudaStats(ts=2_000, process=ProcessKey(7, 70), interval_ns=1_000_000_000, calls=12,
                     errors=1, launches=dict.fromkeys(cuda.LAUNCH_KINDS, 2),
                     grid_log2=[0] * 32, block_log2=[1] * 16, graph_launches=3, copies=copies,
                     syncs={k: {"count": 1, "blocked_ns": 10} for k in cuda.SYNC_KINDS},
                     sync_log2=[0] * 32, memory=dict.fromkeys(cuda.MEMORY_FIELDS, 4),
                     traced_since_start=False, overhead_ns=999)


def test_events_cross_the_bus_and_land_in_the_store(db):
    events = [_stats_event(),
              CudaCall(ts=3_000, process=ProcessKey(7, 70), tid=8, api="cudaMemcpy",
                       latency_ns=12_000_000, bytes=1 << 30, direction="htod", host="pageable",
                       reasons=["slow", "big"]),
              CudaLibrary(ts=4_000, process=ProcessKey(7, 70), path="/x/libcuda.so.1",
                          build_id="ab", state="refused", reason="build id not allowed")]
    writer = StoreWriter(db)
    envelopes = []
    for seq, event in enumerate(events):
        envelope = from_frames([event.topic.encode(), to_payload(event, src="probes", seq=seq)])
        assert envelope.event == event
        envelopes.append(Envelope("probes", seq, envelope.event))
    assert writer.write_batch(envelopes) == 3 and writer.rejected == 0
    row = db.execute("select calls, errors, launches, graph_launches, htod_bytes, "
                     "htod_pinned_bytes, dtoh_pageable_bytes, unknown_bytes, syncs, "
                     "sync_blocked_ns, allocs, host_alloc_bytes, overhead_ns, "
                     "traced_since_start, detail from cuda_stats").fetchone()
    assert row[:14] == (12, 1, 8, 3, 100, 10, 90, 500, 6, 60, 4, 4, 999, 0)
    assert json.loads(row[14])["block_log2"] == [1] * 16
    assert db.execute("select api, bytes, direction, host, reasons from cuda_calls").fetchall() \
        == [("cudaMemcpy", 1 << 30, "htod", "pageable", "slow,big")]
    body = json.loads(db.execute("select body from events where kind = 'cuda_library'")
                      .fetchone()[0])
    assert body["state"] == "refused" and body["build_id"] == "ab"


def test_a_processs_figures_are_its_values_words(tmp_config):
    """One value a process for all CPUs (the programs add to it atomically): its words as
    they are, each process apart."""
    class Leaf(ctypes.Structure):
        _fields_ = [("hits", ctypes.c_uint64), ("prog_ns", ctypes.c_uint64),
                    ("calls", ctypes.c_uint64)]

    class Key:
        def __init__(self, value):
            self.value = value

    class Stats:
        def items(self):
            return [(Key(4242), Leaf(5, 700, 2 ** 40)), (Key(7), Leaf(1, 2, 3))]

    probe = cuda.CudaProbe(tmp_config, lambda event: None)
    probe._stats = Stats()
    totals = probe._totals()
    assert list(totals[4242]) == [5, 700, 2 ** 40] and list(totals[7]) == [1, 2, 3]
