"""The real-GPU validation kit (scripts/gpu-kit.sh, gpu-kit-wheels.sh, gpu_kit.py) runs here.

There is no NVIDIA GPU here: the kit must finish, exit 0 and say so, with every step listed.
Its GPU branch (the PyTorch load's handshake, the /proc scan of that process) is driven with
a look-alike driver folder and a stand-in ``torch`` module; what NVML and the real driver say
is only learned on a real GPU (tests/data/real/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.events import GpuProcesses

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpu_kit  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"
NO_GPU = not list(Path("/proc/driver/nvidia/gpus").glob("*/information"))
EVERY_STEP = ("env", "pip-check", "nvidia-smi-L", "nvidia-smi-q", "nvidia-smi-topo",
              "driver-version", "dev-nvidia", "xid-tracepoint", "kernel-log", "bpf", "check-env",
              "sample-idle", "work-start", "sample-matmul", "sample-h2d-pageable",
              "sample-h2d-pinned", "nvml-processes", "proc-scan", "sample-after")


def run_kit(out: Path, env_extra: dict | None = None, seconds: int = 1,
            timeout: int = 90, args: tuple[str, ...] = ()
            ) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "GPUWHY_KIT_BUDGET": "80", **(env_extra or {})}
    env.pop("OUT", None)
    began = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPTS / "gpu-kit.sh"), "--venv", str(REPO / ".venv"),
                           "--out", str(out), "--seconds", str(seconds), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
    return done, time.monotonic() - began


@pytest.mark.skipif(not NO_GPU, reason="this host has an NVIDIA GPU: run scripts/gpu-kit.sh")
def test_the_kit_says_no_nvidia_gpu_and_lists_every_step(tmp_path):
    out = tmp_path / "out"
    done, took = run_kit(out)
    assert done.returncode == 0, done.stderr
    assert took < 60
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"]["present"] is False
    assert summary["message"].startswith("no NVIDIA GPU")
    assert "no NVIDIA GPU" in done.stdout
    steps = {s["name"]: s for s in summary["steps"]}
    assert set(EVERY_STEP) <= set(steps)
    assert all({"rc", "seconds", "output"} <= set(s) for s in steps.values())
    # What can run here ran; what needs a GPU failed cleanly, its stderr kept.
    assert steps["bpf"]["rc"] == 0 and steps["proc-scan"]["rc"] == 0
    assert steps["sample-idle"]["rc"] == 1
    assert "nvml" in (out / "logs" / "sample-idle.err").read_text()
    assert steps["sample-matmul"]["rc"] is None and "sample-matmul" in summary["skipped"]
    assert "sample-idle" in summary["failed"]
    check_env = json.loads((out / "gpuwhy" / "check-env.json").read_text())
    assert {c["name"] for c in check_env["checks"]} >= {"nvidia-driver", "nvml", "bpf"}
    bpf = json.loads((out / "host" / "bpf.json").read_text())
    assert "prog_load_tracepoint" in bpf["this_process"]
    assert gpu_kit.layout_problems(out) == []


STAND_IN_TORCH = '''
"""A stand-in for torch: just what scripts/gpu_kit.py's load calls (harness of a test)."""
import os
__version__ = "0.0-stand-in"
bfloat16 = "bf16"
uint8 = "u8"
class version:
    cuda = "0.0"
class _T:
    def __init__(self, pinned=False): self._pinned = pinned
    def __matmul__(self, other): return _T()
    def copy_(self, other, non_blocking=False): return self
    def pin_memory(self): return _T(True)
    def is_pinned(self): return self._pinned
def device(name): return name
def randn(*shape, **kw): return _T()
def empty(*shape, **kw): return _T()
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def init():
        cuda.fd = os.open(os.environ["STAND_IN_DEVICE"], os.O_RDONLY)   # what CUDA holds open
    @staticmethod
    def synchronize(): pass
    @staticmethod
    def get_device_name(i): return "Stand-in GPU"
    @staticmethod
    def get_device_capability(i): return (9, 0)
def zeros(*shape, **kw): return _T()
'''


def test_the_gpu_branch_drives_the_load_phase_by_phase(tmp_path):
    driver = tmp_path / "driver"
    (driver / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (driver / "version").write_text("NVRM version: stand-in\n")
    (driver / "gpus" / "0000:18:00.0" / "information").write_text(
        "Model: \t Stand-in\nDevice Minor: \t 0\nGPU UUID: \t GPU-00000000-0000-0000-0000-0\n")
    fakes = tmp_path / "pkgs"
    (fakes / "torch").mkdir(parents=True)
    (fakes / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidia0").write_text("")
    out = tmp_path / "out"
    done, _ = run_kit(out, {"GPUWHY_KIT_DRIVER_PROC": str(driver), "PYTHONPATH": str(fakes),
                            "STAND_IN_DEVICE": str(devices / "nvidia0"),
                            "GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*"})
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"]["present"] is True
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["work-start"]["rc"] == 0
    phases = [json.loads(line) for line in (out / "work/phases.jsonl").read_text().splitlines()]
    assert [p["phase"] for p in phases] == list(gpu_kit.PHASES)
    assert all(p["iterations"] > 0 and p["end_ns"] > p["start_ns"] for p in phases)
    assert [p["pinned"] for p in phases] == [None, False, True]
    # Each phase ran while gpuwhy sampled it, and stopped when told (not at its cap).
    for p in phases:
        assert p["seconds"] < 1 + 20
    work = json.loads((out / "work/work.json").read_text())
    scan = json.loads((out / "gpuwhy/proc-scan.json").read_text())
    assert scan["pid"] == work["pid"]
    assert [(f["kind"], f["minor"]) for f in scan["device_fds"]] == [("nvidiaN", 0)]
    assert [g["minor"] for g in scan["gpus"]] == [0]
    assert (out / "host/proc/driver/nvidia/gpus/0000:18:00.0/information").is_file()
    # No real NVML here: the NVML steps failed, and said why, without stopping the kit.
    assert steps["nvml-processes"]["rc"] == 1
    assert "error" in json.loads((out / "nvml/processes.json").read_text())
    assert steps["nvidia-smi-q"]["note"] == "nvidia-smi not found"
    # A GPU recording without nvidia-smi's view cannot become a fixture, and the check says so.
    assert gpu_kit.layout_problems(out) == ["host/nvidia-smi-q.xml: missing",
                                            "host/nvidia-smi-topo.txt: missing"]


def test_wheels_dry_run_lists_what_is_carried_and_downloads_nothing(tmp_path):
    dest = tmp_path / "wheels"
    done = subprocess.run(["bash", str(SCRIPTS / "gpu-kit-wheels.sh"), "--dry-run",
                           "--dest", str(dest)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    carried_part, _, rest = done.stdout.partition("# not carried:")
    carried = {gpu_kit.requirement_name(line) for line in carried_part.splitlines()
               if line and not line.startswith("#")}
    assert {"flask", "pyzmq", "orjson", "sqlite-utils", "lark", "google-re2", "croniter",
            "click", "psutil"} <= carried
    assert not carried & {"nvidia-ml-py", "torch", "systemd-python"}
    assert "nvidia-ml-py" in rest and "systemd-python" in rest
    command = rest.partition("# would run:")[2]
    for flag in ("--only-binary=:all:", "--python-version 3.12", "--abi cp312",
                 "manylinux2014_x86_64", "manylinux_2_17_x86_64", "pip wheel --no-deps"):
        assert flag in command
    assert not dest.exists()


def test_wheels_script_refuses_a_bad_python_version(tmp_path):
    done = subprocess.run(["bash", str(SCRIPTS / "gpu-kit-wheels.sh"), "--dry-run",
                           "--python-version", "3.12; rm -rf /"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "not a Python version" in done.stderr


def test_wheel_requirements_leave_out_what_the_gpu_machine_brings(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["Flask>=3", "nvidia_ml_py>=12",'
                         ' "systemd-python>=235", "torch", "google-re2[extra]>=1.1; '
                         'python_version >= \'3\'"]\n')
    carried, left_out = gpu_kit.wheel_requirements(pyproject)
    assert carried == ["Flask>=3", "google-re2[extra]>=1.1; python_version >= '3'"]
    assert set(left_out) == {"nvidia-ml-py", "systemd-python", "torch"}


GPU_PATH_IMPORTS = r'''
import json, sys
import click
from gpuwhy.app.cli import cli
ctx = click.Context(cli)
for name in cli.list_commands(ctx):     # every command's module, as the kit's runs may load
    cli.get_command(ctx, name)
for args in (["gpu", "sample", "--source", "sim", "--once", "--json"], ["check-env", "--json"],
             ["proc", "1", "--json"]):
    try:
        cli.main(args, standalone_mode=False)
    except SystemExit:
        pass
print("\n" + json.dumps(sorted({m.split(".")[0] for m in sys.modules}
                               - set(sys.stdlib_module_names))))
'''


def test_the_carried_wheels_cover_what_the_gpu_paths_import(tmp_path):
    """Every third-party module the GPU paths import comes from a carried requirement (or a
    dependency of one), or is one the GPU machine brings itself."""
    from importlib import metadata

    done = subprocess.run([str(PY), "-c", GPU_PATH_IMPORTS], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    carried, _ = gpu_kit.wheel_requirements(REPO / "pyproject.toml")
    reachable, todo = set(), [gpu_kit.requirement_name(r) for r in carried]
    while todo:
        name = todo.pop()
        if name in reachable:
            continue
        reachable.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:   # a dependency for other platforms
            continue
        for spec in requires:
            if "extra ==" not in spec:
                todo.append(gpu_kit.requirement_name(spec))
    by_module = metadata.packages_distributions()
    brought = set(gpu_kit.NOT_CARRIED) | {"bcc"}   # bcc: check-env's probe, from the distro
    uncovered = []
    for module in modules - {"gpuwhy", "_distutils_hack", "sitecustomize"}:
        dists = {gpu_kit.normalise(d) for d in by_module.get(module, [])}
        if module.startswith("_") or module in brought:
            continue
        if not dists & (reachable | brought):
            uncovered.append((module, sorted(dists)))
    assert "re2" in modules and "click" in modules
    assert uncovered == []


def systemd_blocked_env(tmp_path: Path) -> dict:
    shim = tmp_path / "shim" / "systemd"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("systemd-python blocked by the test")\n')
    return {**os.environ, "PYTHONPATH": str(shim.parent)}


def test_the_gpu_paths_run_where_systemd_python_cannot_be_imported(tmp_path):
    env = systemd_blocked_env(tmp_path)
    blocked = subprocess.run([str(PY), "-c", "import systemd.journal"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=30)
    assert blocked.returncode != 0 and "blocked by the test" in blocked.stderr
    sample = subprocess.run([str(PY), "-m", "gpuwhy", "gpu", "sample", "--source", "sim",
                             "--once", "--json"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert sample.returncode == 0, sample.stderr
    rows = [json.loads(line) for line in sample.stdout.splitlines()]
    assert rows and all(r["simulated"] and "sm_active" in r["fields"] for r in rows)
    check_env = subprocess.run([str(PY), "-m", "gpuwhy", "check-env", "--json"], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check_env.returncode in (0, 1), check_env.stderr   # 1: checks failed (no GPU)
    assert "Traceback" not in check_env.stderr
    assert {c["name"] for c in json.loads(check_env.stdout)["checks"]} >= {"nvml", "bpf"}


def test_sd_notify_without_systemd_python_says_so_and_sends_nothing(monkeypatch, caplog):
    from gpuwhy.sdnotify import Notifier

    monkeypatch.setitem(sys.modules, "systemd", None)   # import systemd → ImportError
    monkeypatch.setitem(sys.modules, "systemd.daemon", None)
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000"})
    assert not notifier.active
    notifier.ready("up")   # must not raise
    assert "systemd-python is not installed" in caplog.text


def test_layout_check_names_what_a_gpu_recording_lacks(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"gpu": {"present": True}, "message": "NVIDIA GPU present",
         "steps": [{"name": "env", "rc": 0, "seconds": 0.1}]}))
    (tmp_path / "gpuwhy").mkdir()
    (tmp_path / "gpuwhy" / "check-env.json").write_text("{not json")
    (tmp_path / "gpuwhy" / "sample-idle.jsonl").write_text('{"ts": 1}\n')
    problems = gpu_kit.layout_problems(tmp_path)
    assert "host/nvidia-smi-q.xml: missing" in problems
    assert "gpuwhy/sample-matmul.jsonl: missing" in problems
    assert any(p.startswith("gpuwhy/check-env.json: not JSON") for p in problems)
    assert "gpuwhy/sample-idle.jsonl:1: a sample without fields" in problems
    assert gpu_kit.layout_problems(tmp_path / "nowhere") != []


def test_ingest_keeps_the_fixture_files_and_caps_their_size(tmp_path):
    out = tmp_path / "out"
    done, _ = run_kit(out)
    assert done.returncode == 0, done.stderr
    (out / "gpuwhy" / "big.txt").write_text("x" * 40000)
    dest = tmp_path / "real" / "stand-in"
    ingest = [sys.executable, str(SCRIPTS / "gpu-kit-ingest.py"), str(out), "--model",
              "stand-in", "--dest", str(dest), "--max-file-kib", "32"]
    first = subprocess.run(ingest, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "left out: gpuwhy/big.txt" in first.stdout
    kept = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert {"summary.json", "gpuwhy/check-env.json", "host/bpf.json"} <= kept
    assert not any(k.startswith(("logs/", "work/quit")) or k == "steps.tsv" for k in kept)
    assert gpu_kit.layout_problems(dest) == []
    again = subprocess.run(ingest, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "exists" in again.stderr
    bad = subprocess.run([*ingest[:4], "../x", "--dest", str(tmp_path / "y")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def test_proc_command_binds_a_process_to_its_gpu_by_its_device_fds(tmp_path):
    devices = tmp_path / "dev"
    devices.mkdir()
    for name in ("nvidiactl", "nvidia1", "nvidia-uvm"):
        (devices / name).write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\n"
         f"fds = [os.open(os.path.join({str(devices)!r}, n), os.O_RDONLY) "
         "for n in ('nvidiactl', 'nvidia1', 'nvidia-uvm')]\nprint('ready', flush=True)\n"
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CUDA_"))},
             "NCCL_DEBUG": "TRACE", "NOT_RECORDED": "x"})
    try:
        assert holder.stdout.readline().strip() == "ready"
        proc_root = tmp_path / "proc"
        info = proc_root / "driver" / "nvidia" / "gpus" / "0000:3b:00.0"
        info.mkdir(parents=True)
        (info / "information").write_text(
            "Model: \t NVIDIA H200\nDevice Minor: \t 1\n"
            "GPU UUID: \t GPU-11111111-2222-3333-4444-555555555555\n"
            "Bus Location: \t 0000:3b:00.0\n")
        (proc_root / str(holder.pid)).symlink_to(f"/proc/{holder.pid}")
        result = CliRunner().invoke(cli, ["proc", str(holder.pid), "--json", "--proc-root",
                                          str(proc_root)],
                                    env={"GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*"})
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["pid"] == holder.pid and report["comm"].startswith("python")
        assert sorted((f["kind"], f["minor"]) for f in report["device_fds"]) == [
            ("nvidia-uvm", None), ("nvidiaN", 1), ("nvidiactl", None)]
        assert report["gpus"] == [{"minor": 1, "gpu_id": "GPU-11111111-2222-3333-4444-555555555555",
                                   "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                                   "pci_bus_id": "0000:3b:00.0", "known_to_driver": True}]
        assert report["cgroup"]
        # the variables the probes record (probes.environment), no other
        assert report["env"] == {"NCCL_DEBUG": "TRACE"}
        text = CliRunner().invoke(cli, ["proc", str(holder.pid), "--proc-root",
                                        str(proc_root)]).output
        assert "env:     NCCL_DEBUG=TRACE" in text and "NOT_RECORDED" not in text
    finally:
        holder.kill()
        holder.wait()
    gone = CliRunner().invoke(cli, ["proc", str(holder.pid)])
    assert gone.exit_code == 1 and f"no process {holder.pid}" in gone.output


def test_sample_processes_prints_nvml_process_rows(capsys):
    from gpuwhy.app.gpu_cli import _print_processes

    rows = [{"pid": 42, "start_time": 7, "used_memory_mib": 1024.0, "sm_util": 88,
             "mem_util": 10, "enc_util": 0, "dec_util": 0}]
    _print_processes([GpuProcesses(ts=1, gpu_id="GPU-x", source="nvml", processes=rows)], True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"kind": "gpu_processes", "ts": 1, "gpu_id": "GPU-x", "source": "nvml",
                       "processes": rows}
    _print_processes([GpuProcesses(ts=1, gpu_id="GPU-x", source="nvml", processes=rows)], False)
    assert "process 42 on GPU-x: 1024.0 MiB, sm 88%" in capsys.readouterr().out


def _recorder(directory: Path) -> Path:
    library = directory / "libnvtrace.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(library),
                    str(SCRIPTS / "nvtrace.c"), "-ldl"], check=True, timeout=60)
    return library


def test_the_recorder_keeps_every_driver_call_with_its_buffers(tmp_path):
    """scripts/nvtrace.c, preloaded into the stand-in replay of a CUDA start (look-alike
    device files, as the probe's own tests use): every call it sends is in the file, with
    the buffers the pointer rules name, and reads back as the replay says the probe should
    count it. The process's other ioctls (its terminal's) are not kept."""
    import tempfile

    from gpuwhy.app.demo.recorded import decode, expected_stats, pointer_rules, read_calls

    devices = Path(tempfile.mkdtemp(prefix="nvt", dir="/tmp"))   # a short path: 63 bytes
    try:
        env = {**os.environ, "LD_PRELOAD": str(_recorder(tmp_path)),
               "NVTRACE_OUT": str(tmp_path / "calls.nvt"), "NVTRACE_DEVICE_DIR": str(devices),
               "NVTRACE_PTRS": pointer_rules()}
        done = subprocess.run([sys.executable, "-c", "import fcntl, os, termios; "
                               "_, tty = os.openpty(); "
                               "fcntl.ioctl(tty, termios.TIOCGWINSZ, bytes(8)); "
                               "from gpuwhy.app.demo.standin import main; "
                               f"main(['replay', '{devices}', '--rounds', '2'])"],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        calls = read_calls(tmp_path / "calls.nvt")
        assert {c.path.rsplit("/", 1)[0] for c in calls} == {str(devices)}
        assert expected_stats(str(devices), calls) == report["expected"]
        assert all(c.ret == -1 and c.errno == 25 for c in calls)     # ENOTTY on plain files
        xfer = next(c for c in calls if decode(c).xferred)
        assert [b.nested for b in xfer.buffers] == [False, True]
        assert decode(xfer).name == "NV_ESC_RM_CONTROL" and decode(xfer).sub == 0x215
        memory = [c for c in calls if decode(c).name == "NV_ESC_RM_ALLOC"
                  and decode(c).sub == 0x40]
        assert memory and all(len(c.buffers) == 2 and c.buffers[1].offset == 16
                              for c in memory)
    finally:
        for leftover in devices.iterdir():
            leftover.unlink()
        devices.rmdir()


def test_the_kit_packs_its_folder_and_ingest_unpacks_it(tmp_path):
    """Under the device tool only 8 files come back: --tar packs the recording into one.
    The ingest takes the packed file, and keeps recorded driver calls gzipped."""
    from gpuwhy.app.demo.recorded import MAGIC, read_calls

    out, packed = tmp_path / "out", tmp_path / "back" / "gpu-kit.tar.gz"
    done, _ = run_kit(out, args=("--tar", str(packed)))
    assert done.returncode == 0, done.stderr
    assert packed.is_file() and (packed.parent / "summary.json").is_file()
    # a recording with calls: repack it with an (empty) calls file, as a GPU host's has
    (out / "nvtrace" / "calls.nvt").write_bytes(MAGIC)
    subprocess.run(["tar", "-czf", str(packed), "-C", str(tmp_path), "out"], check=True)
    dest = tmp_path / "real" / "stand-in"
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu-kit-ingest.py"), str(packed),
                           "--model", "stand-in", "--dest", str(dest)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert read_calls(dest / "nvtrace" / "calls.nvt.gz") == []
    assert gpu_kit.layout_problems(dest) == []
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a tar file")
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu-kit-ingest.py"), str(broken),
                           "--model", "stand-in", "--dest", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "gpu-kit-ingest:" in done.stderr


def test_pip_check_leaves_out_only_what_is_not_carried(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'gpuwhy 0.1.0 requires systemd-python, which is not "
                    "installed.'\necho 'flask 3.1 requires werkzeug, which is not "
                    "installed.'\nexit 1\n")
    fake.chmod(0o755)
    report = gpu_kit.pip_check(str(fake))
    assert report["left_out_on_purpose"] == [
        "gpuwhy 0.1.0 requires systemd-python, which is not installed."]
    assert report["problems"] == ["flask 3.1 requires werkzeug, which is not installed."]
