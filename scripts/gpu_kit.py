"""Harness of the real-GPU validation kit (scripts/gpu-kit.sh): workload, probes, summary.

Not product code: nothing in gpuwhy imports it. Standard library only at the top, so that
it runs on the GPU machine's own Python before anything is installed; torch and pynvml are
imported where they are used, and their absence is recorded, never fatal.

    python3 scripts/gpu_kit.py wheel-requirements        # what gpu-kit-wheels.sh carries
    python3 scripts/gpu_kit.py bpf                       # may this host load BPF programs?
    python3 scripts/gpu_kit.py work --dir OUT/work       # the PyTorch load, phase by phase
    python3 scripts/gpu_kit.py nvml --pid PID            # pynvml's own reading, to compare
    python3 scripts/gpu_kit.py summary --out OUT         # OUT/summary.json from OUT/steps.tsv
    python3 scripts/gpu_kit.py cuda-libs --pid PID       # libcuda/libcudart it maps, symbols
    python3 scripts/gpu_kit.py pip-check                 # pip check, less NOT_CARRIED
    python3 scripts/gpu_kit.py nvtrace-rules             # the recorder's pointer rules
    python3 scripts/gpu_kit.py fault --kind trap         # a faulting kernel: a real Xid
    python3 scripts/gpu_kit.py check-layout DIR          # is DIR a recording the tests can read?
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KIT_VERSION = 1

# What the wheels folder must not hold: the GPU machine has its own, or the GPU paths do not
# need it (and it cannot be built without a registry there). Matched on the normalised name.
NOT_CARRIED = {
    "nvidia-ml-py": "the GPU machine has its own nvidia-ml-py (pynvml), matched to its driver",
    "systemd-python": "journald and sd_notify only, imported lazily; the GPU paths run without "
                      "it, and it has no wheel (it builds against libsystemd)",
    "torch": "the GPU machine has its own PyTorch, matched to its CUDA",
}

# The phases of the PyTorch load, in order, each sampled by the kit while it runs.
PHASES = ("matmul", "h2d-pageable", "h2d-pinned")
SAMPLE_STEPS = ("idle", *PHASES, "after")

# The recording's files, relative to its folder; the tests in tests/data/real/<gpu>/ read
# these names. "gpu" files exist only when the host had an NVIDIA GPU.
ALWAYS = ("summary.json", "env.json", "gpuwhy/check-env.json", "host/bpf.json")
WITH_GPU = ("host/nvidia-smi-q.xml", "host/nvidia-smi-topo.txt", "host/dev-nvidia.txt",
            "host/proc/driver/nvidia/version", "host/nvidia_dev_xid.txt",
            "gpuwhy/proc-scan.json", "nvml/processes.json", "work/phases.jsonl",
            *(f"gpuwhy/sample-{s}.jsonl" for s in SAMPLE_STEPS))


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirement_name(spec: str) -> str:
    """``"pyzmq>=25"`` → ``pyzmq``; ``"foo[bar]; python_version<'4'"`` → ``foo``."""
    cut = len(spec)
    for mark in "<>=!~;[ (":
        at = spec.find(mark)
        if at != -1:
            cut = min(cut, at)
    return normalise(spec[:cut].strip())


def wheel_requirements(pyproject: Path) -> tuple[list[str], dict[str, str]]:
    """The project's runtime requirements to carry as wheels, and those left out (name → why).
    Test extras are never carried: the GPU machine runs the kit, not the suite."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    carried, left_out = [], {}
    for spec in deps:
        name = requirement_name(spec)
        if name in NOT_CARRIED:
            left_out[name] = NOT_CARRIED[name]
        else:
            carried.append(spec.strip())
    return carried, left_out


# --- BPF: may this host load programs? -------------------------------------------------------

BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE, BPF_PROG_LOAD = 0, 5
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_SOCKET_FILTER, BPF_PROG_TYPE_TRACEPOINT = 1, 5
# r0 = 0; exit  (struct bpf_insn: code, dst:4|src:4, off s16, imm s32)
RETURN_ZERO = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])
CAPS = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24, "CAP_PERFMON": 38,
        "CAP_BPF": 39}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _bpf(cmd: int, attr: bytes) -> dict:
    nr = BPF_SYSCALL.get(platform.machine())
    if nr is None:
        return {"ok": False, "error": f"no bpf syscall number for {platform.machine()}"}
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, 128)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(128))
    if fd < 0:
        err = ctypes.get_errno()
        return {"ok": False, "errno": err, "error": os.strerror(err)}
    os.close(fd)
    return {"ok": True}


def _prog_load(prog_type: int) -> dict:
    insns = ctypes.create_string_buffer(RETURN_ZERO, len(RETURN_ZERO))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = (prog_type.to_bytes(4, "little") + (len(RETURN_ZERO) // 8).to_bytes(4, "little")
            + ctypes.addressof(insns).to_bytes(8, "little")
            + ctypes.addressof(license_).to_bytes(8, "little"))
    return _bpf(BPF_PROG_LOAD, attr)


def _caps() -> dict:
    status = _read("/proc/self/status") or ""
    eff = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")),
               "0")
    bits = int(eff, 16)
    return {"cap_eff": eff, "held": [n for n, b in CAPS.items() if bits >> b & 1]}


def bpf_probes() -> dict:
    """This process's view: capabilities and whether each kind of load succeeds."""
    map_attr = b"".join(v.to_bytes(4, "little") for v in (BPF_MAP_TYPE_ARRAY, 4, 4, 1))
    return {"euid": os.geteuid(), "capabilities": _caps(),
            "map_create": _bpf(BPF_MAP_CREATE, map_attr),
            "prog_load_socket_filter": _prog_load(BPF_PROG_TYPE_SOCKET_FILTER),
            "prog_load_tracepoint": _prog_load(BPF_PROG_TYPE_TRACEPOINT)}


def _as_nobody() -> dict:
    """The same probes in a child that dropped to uid/gid 65534 (what an unprivileged
    service would see); only possible when we are root."""
    if os.geteuid() != 0:
        return {"skipped": "not root"}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = json.dumps(bpf_probes()).encode()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, never raised
            out = json.dumps({"error": repr(exc)}).encode()
        os.write(write, out)
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"error": "no answer"}')


def bpf_report() -> dict:
    return {"kernel": platform.release(), "machine": platform.machine(),
            "unprivileged_bpf_disabled": _read("/proc/sys/kernel/unprivileged_bpf_disabled"),
            "perf_event_paranoid": _read("/proc/sys/kernel/perf_event_paranoid"),
            "lockdown": _read("/sys/kernel/security/lockdown"),
            "btf_vmlinux": Path("/sys/kernel/btf/vmlinux").exists(),
            "tracefs_events": Path("/sys/kernel/tracing/events").is_dir(),
            "tracefs_mounted": "tracefs" in (_read("/proc/mounts") or ""),
            "this_process": bpf_probes(), "as_nobody": _as_nobody()}


# --- what the CUDA uprobes would attach to -----------------------------------------------------

def cuda_libraries(pid: int) -> dict:
    """The libcuda/libcudart files ``pid`` maps, as gpuwhy's CUDA probe finds them, their
    build ids, and which of its traced functions each exports (dlsym: what a uprobe on
    that symbol would need). Needs gpuwhy importable (the kit's venv)."""
    from gpuwhy.probes.cuda.libraries import FUNCTIONS, build_id, mapped_libraries

    libraries = []
    for library in mapped_libraries(pid):
        entry: dict = {"path": library.path, "kind": library.kind}
        try:
            entry["build_id"] = build_id(library.host_path)
            handle = ctypes.CDLL(library.host_path)
        except Exception as exc:  # noqa: BLE001 - recorded: what failed is the finding
            entry["error"] = f"{type(exc).__name__}: {exc}"
            libraries.append(entry)
            continue
        exported: dict[str, list[str]] = {}
        for function in FUNCTIONS:
            found = [s for s in function.symbols if hasattr(handle, s)]
            if found:
                exported[function.name] = found
        entry["exported"] = exported
        entry["missing"] = sorted({f.name for f in FUNCTIONS} - set(exported))
        libraries.append(entry)
    maps = _read(f"/proc/{pid}/maps") or ""
    cuda_lines = [line for line in maps.splitlines() if "libcud" in line or "nvidia" in line]
    return {"pid": pid, "libraries": libraries, "maps": cuda_lines[:200]}


# --- an application's own GPU fault: a real Xid, the GPU unharmed -------------------------------

# Kernels that fault the way applications' do: the driver kills their context, logs an Xid
# (31, an MMU fault; 13, an SM exception) and the GPU goes on serving the others.
FAULTS = {
    "illegal-address": 'extern "C" __global__ void fault(int *unused) '
                       '{ *(volatile int *)0x10 = 1; }',
    "trap": 'extern "C" __global__ void fault(int *unused) { asm volatile("trap;"); }',
}


def fault(kind: str) -> dict:
    """Run one faulting kernel in this process (CuPy's NVRTC, or for ``torch-assert``
    PyTorch's own device-side assert, an index out of range) and say how CUDA answered."""
    report: dict = {"kind": kind, "pid": os.getpid(), "start_ns": time.time_ns()}
    try:
        if kind == "torch-assert":
            import torch

            values = torch.ones(4, device="cuda")
            values[torch.tensor([1 << 20], device="cuda")] = 2.0
            torch.cuda.synchronize()
        else:
            import cupy

            kernel = cupy.RawKernel(FAULTS[kind], "fault")
            kernel((1,), (1,), (cupy.zeros(1, dtype=cupy.int32),))
            cupy.cuda.runtime.deviceSynchronize()
        report["error"] = None
    except Exception as exc:  # noqa: BLE001 - the fault is what is being recorded
        report["error"] = f"{type(exc).__name__}: {exc}"[:500]
    report["end_ns"] = time.time_ns()
    # what CUDA says of a faulted kernel; anything else (no CuPy, no GPU) is no fault
    report["faulted"] = "cuda" in (report["error"] or "").lower()
    return report


def pip_check(python: str) -> dict:
    """``pip check`` of the kit's venv, less the complaints about what is left out on
    purpose (NOT_CARRIED): anything else is a broken install."""
    import subprocess

    done = subprocess.run([python, "-m", "pip", "check", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    expected = [line for line in lines
                if any(f"requires {name}," in line or f"requires {name} " in line
                       for name in NOT_CARRIED)]
    problems = [] if done.returncode == 0 else [line for line in lines if line not in expected]
    return {"rc": done.returncode, "left_out_on_purpose": expected, "problems": problems}


# --- the PyTorch load -------------------------------------------------------------------------

def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _phase_loop(torch: object, phase: str, stop: Path, max_s: float) -> dict:
    dev = torch.device("cuda:0")
    if phase == "matmul":
        n = 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        step, unit, per = (lambda: a @ b), "TFLOP/s", 2 * n ** 3 / 1e12
    else:
        size = 256 * 2 ** 20
        host = torch.empty(size, dtype=torch.uint8)
        if phase == "h2d-pinned":
            host = host.pin_memory()
        target = torch.empty(size, dtype=torch.uint8, device=dev)
        pinned = phase == "h2d-pinned"
        step, unit, per = (lambda: target.copy_(host, non_blocking=pinned)), "GB/s", size / 1e9
    step()
    torch.cuda.synchronize()
    start, iters = time.monotonic(), 0
    while not stop.exists() and time.monotonic() - start < max_s:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        iters += 10
    elapsed = time.monotonic() - start
    return {"iterations": iters, "seconds": round(elapsed, 3), "unit": unit,
            "rate": round(iters * per / elapsed, 2) if elapsed else None,
            "pinned": host.is_pinned() if phase != "matmul" else None}


def work(folder: Path, max_phase_s: float, wait_s: float) -> int:
    """Run each phase when ``go-<phase>`` appears, until ``stop-<phase>`` (or ``max_phase_s``);
    ``started-<phase>``/``done-<phase>`` answer, ``quit`` ends. ``ready`` says the pid, or
    ``no-gpu`` with why, once CUDA is up (or is known not to be)."""
    folder.mkdir(parents=True, exist_ok=True)
    phases = folder / "phases.jsonl"
    info: dict = {"pid": os.getpid(), "python": sys.version.split()[0]}
    try:
        import torch
    except ImportError as exc:
        info.update(cuda=False, why=f"no PyTorch: {exc}")
    else:
        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
        if not torch.cuda.is_available():
            info.update(cuda=False, why="torch.cuda.is_available() is false")
        else:
            torch.cuda.init()
            torch.zeros(1, device="cuda:0")
            info.update(cuda=True, device=torch.cuda.get_device_name(0),
                        capability=list(torch.cuda.get_device_capability(0)))
    (folder / "work.json").write_text(json.dumps(info, indent=2))
    _write_atomic(folder / "ready", str(os.getpid()) if info["cuda"] else f"no-gpu {info['why']}")
    if not info["cuda"]:
        return 0
    deadline = time.monotonic() + wait_s
    pending = list(PHASES)
    while pending and not (folder / "quit").exists() and time.monotonic() < deadline:
        phase = pending[0]
        if not (folder / f"go-{phase}").exists():
            time.sleep(0.05)
            continue
        pending.pop(0)
        began = time.time_ns()
        _write_atomic(folder / f"started-{phase}", str(began))
        try:
            stats = _phase_loop(torch, phase, folder / f"stop-{phase}", max_phase_s)
        except Exception as exc:  # noqa: BLE001 - recorded; the next phase still runs
            stats = {"error": repr(exc)}
        record = {"phase": phase, "start_ns": began, "end_ns": time.time_ns(), **stats}
        with phases.open("a") as f:
            f.write(json.dumps(record) + "\n")
        _write_atomic(folder / f"done-{phase}", json.dumps(record))
    while not (folder / "quit").exists() and time.monotonic() < deadline:
        time.sleep(0.05)   # stay alive (holding the context) until the kit is done with us
    return 0


# --- pynvml's own reading, beside gpuwhy's --------------------------------------------------

def _call(fn: object, *args: object) -> object:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a field the GPU refuses is a finding
        return {"error": f"{type(exc).__name__}: {exc}"}


def _gpm(nv: object, handle: object, seconds: float) -> dict:
    support = _call(nv.nvmlGpmQueryDeviceSupport, handle)
    if isinstance(support, dict):
        return {"supported": support}
    if not support.isSupportedDevice:
        return {"supported": False}
    names = ("SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "HMMA_TENSOR_UTIL", "DRAM_BW_UTIL",
             "FP16_UTIL", "FP32_UTIL", "FP64_UTIL", "GRAPHICS_UTIL")
    try:
        first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(handle, first)
        time.sleep(seconds)
        nv.nvmlGpmSampleGet(handle, second)
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(names)
        get.sample1, get.sample2 = first, second
        for i, name in enumerate(names):
            get.metrics[i].metricId = getattr(nv, f"NVML_GPM_METRIC_{name}")
        nv.nvmlGpmMetricsGet(get)
        values = {name: (get.metrics[i].value if get.metrics[i].nvmlReturn == 0
                         else {"nvml_return": get.metrics[i].nvmlReturn})
                  for i, name in enumerate(names)}
        nv.nvmlGpmSampleFree(first)
        nv.nvmlGpmSampleFree(second)
    except Exception as exc:  # noqa: BLE001
        return {"supported": True, "error": f"{type(exc).__name__}: {exc}"}
    return {"supported": True, "interval_s": seconds, "metrics": values}


def nvml_report(pid: int | None, gpm_seconds: float) -> dict:
    try:
        import pynvml as nv
    except ImportError as exc:
        return {"error": f"no pynvml: {exc}"}
    init = _call(nv.nvmlInit)
    if isinstance(init, dict):
        return {"error": init["error"]}
    try:
        out: dict = {"driver": _call(nv.nvmlSystemGetDriverVersion),
                     "nvml": _call(nv.nvmlSystemGetNVMLVersion), "pid": pid, "gpus": []}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h)
            utils = _call(nv.nvmlDeviceGetProcessUtilization, h, 0)
            rates = _call(nv.nvmlDeviceGetUtilizationRates, h)
            out["gpus"].append({
                "index": i, "name": _call(nv.nvmlDeviceGetName, h),
                "uuid": _call(nv.nvmlDeviceGetUUID, h),
                "pci_bus_id": _call(lambda h=h: nv.nvmlDeviceGetPciInfo(h).busId),
                "minor": _call(nv.nvmlDeviceGetMinorNumber, h),
                "utilization": rates if isinstance(rates, dict)
                else {"gpu": rates.gpu, "memory": rates.memory},
                "compute_processes": procs if isinstance(procs, dict)
                else [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs],
                "process_utilization": utils if isinstance(utils, dict)
                else [{"pid": s.pid, "ts": s.timeStamp, "sm": s.smUtil, "mem": s.memUtil,
                       "enc": s.encUtil, "dec": s.decUtil} for s in utils],
                "gpm": _gpm(nv, h, gpm_seconds)})
        return json.loads(json.dumps(out, default=str))
    finally:
        _call(nv.nvmlShutdown)


# --- the summary and the layout -------------------------------------------------------------

def read_steps(out: Path) -> list[dict]:
    steps = []
    path = out / "steps.tsv"
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        name, rc, seconds, limit, output, note = (line.split("\t") + [""] * 6)[:6]
        steps.append({"name": name, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                      "seconds": float(seconds) if seconds else None,
                      "limit_s": float(limit) if limit else None,
                      "output": output or None, "note": note or None})
    return steps


def summary(out: Path, gpu_present: bool, gpu_why: str, started: float) -> dict:
    steps = read_steps(out)
    report = {
        "kit_version": KIT_VERSION, "started": started, "finished": time.time(),
        "seconds": round(time.time() - started, 1), "host": platform.node(),
        "kernel": platform.release(),
        "gpu": {"present": gpu_present, "why": gpu_why},
        "message": "NVIDIA GPU present" if gpu_present else f"no NVIDIA GPU: {gpu_why}",
        "steps": steps,
        "failed": [s["name"] for s in steps if s["rc"] not in (0, None)],
        "skipped": [s["name"] for s in steps if s["rc"] is None],
    }
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def layout_problems(folder: Path) -> list[str]:
    """What keeps ``folder`` (a kit's output, or tests/data/real/<gpu>/) from being read by
    the tests; empty when it has the layout. Files that are present must parse."""
    problems = []
    try:
        summary_ = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"summary.json: {exc}"]
    for key in ("gpu", "steps", "message"):
        if key not in summary_:
            problems.append(f"summary.json: no {key!r}")
    for step in summary_.get("steps", []):
        if not {"name", "rc", "seconds"} <= set(step):
            problems.append(f"summary.json: step without name/rc/seconds: {step}")
    wanted = ALWAYS + (WITH_GPU if summary_.get("gpu", {}).get("present") else ())
    for rel in wanted:
        if not (folder / rel).is_file():
            problems.append(f"{rel}: missing")
    for path in sorted(folder.rglob("*.json")):
        try:
            json.loads(path.read_text() or "null")
        except ValueError as exc:
            problems.append(f"{path.relative_to(folder)}: not JSON ({exc})")
    for path in sorted(folder.rglob("sample-*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
            except ValueError:
                problems.append(f"{path.relative_to(folder)}:{n}: not JSON")
                break
            if row.get("kind", "gpu_sample") == "gpu_sample" and "fields" not in row:
                problems.append(f"{path.relative_to(folder)}:{n}: a sample without fields")
                break
    return problems


# The subcommands that print one JSON report: how to make it, and when it says "failed".
JSON_REPORTS = {
    "nvml": (lambda a: nvml_report(a.pid, a.gpm_seconds), lambda r: "error" in r),
    "cuda-libs": (lambda a: cuda_libraries(a.pid), lambda r: not r["libraries"]),
    "pip-check": (lambda a: pip_check(a.python), lambda r: bool(r["problems"])),
    "fault": (lambda a: fault(a.kind), lambda r: not r["faulted"]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wr = sub.add_parser("wheel-requirements", help="requirements gpu-kit-wheels.sh carries")
    wr.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    wr.add_argument("--left-out", action="store_true", help="print what is not carried, why")
    sub.add_parser("bpf", help="may this host load BPF programs (JSON)")
    w = sub.add_parser("work", help="the PyTorch load, driven by files in --dir")
    w.add_argument("--dir", type=Path, required=True)
    w.add_argument("--max-phase-seconds", type=float, default=60)
    w.add_argument("--wait-seconds", type=float, default=200)
    nv = sub.add_parser("nvml", help="pynvml's own reading (JSON)")
    nv.add_argument("--pid", type=int)
    nv.add_argument("--gpm-seconds", type=float, default=1.0)
    sm = sub.add_parser("summary", help="write OUT/summary.json")
    sm.add_argument("--out", type=Path, required=True)
    sm.add_argument("--gpu-present", choices=("yes", "no"), required=True)
    sm.add_argument("--gpu-why", default="")
    sm.add_argument("--started", type=float, default=time.time())
    cu = sub.add_parser("cuda-libs", help="the CUDA libraries PID maps, their symbols (JSON)")
    cu.add_argument("--pid", type=int, required=True)
    pc = sub.add_parser("pip-check", help="pip check, less what is left out on purpose")
    pc.add_argument("--python", default=sys.executable)
    sub.add_parser("nvtrace-rules", help="the recorder's NVTRACE_PTRS, from gpuwhy.nvioctl")
    fa = sub.add_parser("fault", help="one faulting kernel: a real Xid (JSON)")
    fa.add_argument("--kind", choices=(*FAULTS, "torch-assert"), required=True)
    cl = sub.add_parser("check-layout", help="problems that keep DIR from being a fixture")
    cl.add_argument("dir", type=Path)
    args = parser.parse_args(argv)

    if args.command == "wheel-requirements":
        carried, left_out = wheel_requirements(args.pyproject)
        lines = ([f"{n}: {why}" for n, why in left_out.items()] if args.left_out else carried)
        print("\n".join(lines))
    elif args.command == "bpf":
        print(json.dumps(bpf_report(), indent=2))
    elif args.command == "work":
        return work(args.dir, args.max_phase_seconds, args.wait_seconds)
    elif args.command in JSON_REPORTS:
        make, failed = JSON_REPORTS[args.command]
        report = make(args)
        print(json.dumps(report, indent=2))
        return 1 if failed(report) else 0
    elif args.command == "summary":
        report = summary(args.out, args.gpu_present == "yes", args.gpu_why, args.started)
        print(report["message"])
        print(f"{len(report['steps'])} steps, failed: {', '.join(report['failed']) or 'none'}; "
              f"skipped: {', '.join(report['skipped']) or 'none'}")
    elif args.command == "nvtrace-rules":
        from gpuwhy.app.demo.recorded import pointer_rules

        print(pointer_rules())
    elif args.command == "check-layout":
        problems = layout_problems(args.dir)
        print("\n".join(problems) or f"{args.dir}: a recording the tests can read")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
