#!/usr/bin/env bash
# gpu-kit.sh: one short run on a real NVIDIA GPU host that records what gpuwhy's GPU paths
# see there (issue 26). Writes everything under one folder; never stops at a failing step.
#
#   scripts/gpu-kit.sh                          # → $OUT/gpu-kit.tar.gz, else build/gpu-kit/out-<time>
#   scripts/gpu-kit.sh --out DIR --seconds 10   # seconds of each sampled phase (default 10)
#   scripts/gpu-kit.sh --tar FILE               # also pack the folder into FILE (.tar.gz)
#   scripts/gpu-kit.sh --venv .venv             # use this venv, install nothing
# When $OUT is set (a remote runner that brings back what it finds there) and no --out, the
# folder is recorded in $TMPDIR and packed into $OUT/gpu-kit.tar.gz, summary.json beside it.
#
# On the GPU machine (Python 3.12, PyTorch, nvidia-ml-py, no registry): first, here,
# scripts/gpu-kit-wheels.sh; then run this with build/gpu-kit/wheels carried. It makes a
# venv with --system-site-packages (the machine's torch and pynvml stay visible) in
# $TMPDIR, installs the carried wheels with --no-index, and records, each step under a
# `timeout`, its stdout in the named file, its stderr in logs/<step>.err, and a line
# (name, rc, seconds) in steps.tsv:
#   host/      nvidia-smi -q -x, topo -m, -L; /proc/driver/nvidia/version and
#              gpus/*/information (as host/proc/...); ls -l /dev/nvidia*; the nvidia_dev_xid
#              tracepoint and its format; the kernel log's NVIDIA lines; bpf.json (may
#              BPF programs load: sysctls, capabilities, raw bpf() as root and as nobody)
#   gpuwhy/    check-env --json; gpu sample --source nvml --json --processes while idle,
#              during a bf16 matmul loop, pageable and pinned host-to-device copy loops,
#              and after; `gpuwhy proc PID --json` of the PyTorch process
#   nvml/      pynvml's own reading (process list, per-process utilisation, GPM metrics),
#              nvidia-smi's process list; work/ the load's phases with their rates;
#              gpuwhy/cuda-libs.json the libcuda/libcudart the load maps and the traced
#              functions they export
#   xid/       three kernels that fault as applications' do (an illegal address, a trap, a
#              PyTorch device-side assert; only their own contexts die): the kernel log's
#              NVRM lines after them, NVML's Xid events (gpuwhy's sampler: its stderr), the
#              nvidia_dev_xid tracepoint's record, nvidia-smi -q -x after
#   service/   gpuwhy serve (NVML; journald, else /dev/kmsg) running through the faults: its
#              status, incidents and each incident's chain after them, its log; and a capture
#              of the GPU and kernel-log sources' traffic (gpuwhy record), for the rules here
#   nvtrace/   calls.nvt: every ioctl the load sent to an NVIDIA device, its parameters
#              before and after (scripts/nvtrace.c, preloaded into the kit's own load only;
#              built by gpu-kit-wheels.sh, else here with gcc, else left out)
#   probes/    only where the wheels folder holds bcc.tar.xz (gpu-kit-wheels.sh --bcc) and the
#              kit runs as root: gpuwhy's eBPF probes on the real driver. bcc-check.txt;
#              trace.jsonl, `gpuwhy trace --json` over the PyTorch load (the same calls
#              nvtrace/ records, as the probe decodes them); the service above becomes
#              `gpuwhy up` (probes in) and a second `gpuwhy probes` feeds the capture;
#              p1.md/p1.json, bench_probes.py --device /dev/nvidiactl (P1 on a real RM
#              control); floors.md, bench_attach.py (what each attachment costs this kernel)
#   summary.json  every step, its rc and seconds; whether there was an NVIDIA GPU
# Without an NVIDIA GPU it says so, runs what can run, and still exits 0.
# Budget: about 2 minutes at --seconds 10, 4 at most (GPUWHY_KIT_BUDGET, seconds); with the
# probes about 4, 6 at most.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_EACH="${GPUWHY_KIT_SECONDS:-10}"
WHEELS="$REPO/build/gpu-kit/wheels"
VENV=""
DEST=""
TAR=""
while (($#)); do
    case "$1" in
        --out) DEST="$2"; shift 2 ;;
        --seconds) SECONDS_EACH="$2"; shift 2 ;;
        --wheels) WHEELS="$2"; shift 2 ;;
        --tar) TAR="$2"; shift 2 ;;
        --venv) VENV="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-kit.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$SECONDS_EACH" =~ ^[0-9]+$ && "$SECONDS_EACH" -ge 1 ]] \
    || { echo "gpu-kit.sh: --seconds wants a whole number ≥ 1, not $SECONDS_EACH" >&2; exit 2; }
WHEELS=$(realpath -m "$WHEELS")
BUNDLE="$WHEELS/bcc.tar.xz"
if [[ -f "$BUNDLE" ]]; then BUDGET="${GPUWHY_KIT_BUDGET:-360}"; else BUDGET="${GPUWHY_KIT_BUDGET:-230}"; fi
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu-kit.sh: GPUWHY_KIT_BUDGET: not seconds" >&2; exit 2; }
[[ -n "$VENV" ]] && VENV=$(realpath -m "$VENV")
if [[ -z "$DEST" && -n "${OUT:-}" ]]; then
    DEST="$(mktemp -d "${TMPDIR:-/tmp}/gpu-kit.XXXXXX")/gpu-kit"
    TAR="${TAR:-$OUT/gpu-kit.tar.gz}"
fi
DEST="${DEST:-$REPO/build/gpu-kit/out-$(date -u +%Y%m%dT%H%M%SZ)}"
[[ -n "$TAR" ]] && TAR=$(realpath -m "$TAR")
mkdir -p "$DEST"/{host,gpuwhy,nvml,nvtrace,xid,service,probes,work,logs}
DEST="$(cd "$DEST" && pwd)"
# Never from the checkout: `python -m gpuwhy` there would import its source folders, not
# the installed wheel (and its systemd/ folder of units would pass for systemd-python);
# nor from $DEST, whose gpuwhy/ folder would pass for a namespace package.
cd "$DEST/logs" || exit 1
STEPS="$DEST/steps.tsv"
LAST_RC=0
: > "$STEPS"
STARTED=$EPOCHREALTIME
DEADLINE=$(( $(date +%s) + BUDGET ))
KIT="$REPO/scripts/gpu_kit.py"
echo "gpu-kit: recording into $DEST (${SECONDS_EACH}s a phase, ${BUDGET}s at most)"

record() {   # name rc seconds limit output note
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6:-}" >> "$STEPS"
    printf 'gpu-kit: %-22s rc=%-4s %6ss %s\n' "$1" "${2:-skip}" "${3:-0}" "${6:-}"
}

since() {   # seconds from $1 to $2 (EPOCHREALTIME values), 2 decimals; no bc on GPU hosts
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'
}

# step NAME LIMIT OUTPUT CMD...: CMD under `timeout`, stdout → OUTPUT, stderr → logs/NAME.err
step() {
    local name=$1 limit=$2 output=$3 left t0 t1 rc
    shift 3
    left=$(( DEADLINE - $(date +%s) ))
    if (( left < 2 )); then record "$name" "" "" "$limit" "$output" "kit budget spent"; return; fi
    (( limit > left )) && limit=$left
    t0=$EPOCHREALTIME
    timeout -k 5 "$limit" "$@" > "$DEST/$output" 2> "$DEST/logs/$name.err" < /dev/null
    rc=$?
    LAST_RC=$rc
    t1=$EPOCHREALTIME
    record "$name" "$rc" "$(since "$t0" "$t1")" "$limit" "$output" \
        "$( ((rc == 124 || rc == 137)) && echo "timed out after ${limit}s")"
}

skip() {   # name output why
    record "$1" "" "" "" "$2" "$3"
}

# sample NAME: gpuwhy's NVML source for SECONDS_EACH, stopped with SIGINT (its clean stop)
sample() {
    local name=$1 t0 t1 rc
    if (( DEADLINE - $(date +%s) < SECONDS_EACH + 2 )); then
        record "sample-$name" "" "" "$SECONDS_EACH" "gpuwhy/sample-$name.jsonl" "kit budget spent"
        return
    fi
    t0=$EPOCHREALTIME
    timeout --preserve-status -s INT -k 5 "$SECONDS_EACH" \
        "$PY" -m gpuwhy gpu sample --source nvml --json --processes --interval 0.5 \
        > "$DEST/gpuwhy/sample-$name.jsonl" 2> "$DEST/logs/sample-$name.err" < /dev/null
    rc=$?
    t1=$EPOCHREALTIME
    record "sample-$name" "$rc" "$(since "$t0" "$t1")" \
        "$SECONDS_EACH" "gpuwhy/sample-$name.jsonl"
}

# --- the Python that has torch, and gpuwhy's venv on top of it ---
pick_python() {
    local c first=""
    if [[ -n "${GPUWHY_KIT_PYTHON:-}" ]]; then command -v "$GPUWHY_KIT_PYTHON"; return; fi
    for c in python3 python3.12 python3.11 python /usr/bin/python3; do
        command -v "$c" > /dev/null 2>&1 || continue
        "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2> /dev/null || continue
        [[ -z "$first" ]] && first=$(command -v "$c")
        if "$c" -c 'import torch' 2> /dev/null; then command -v "$c"; return; fi
    done
    echo "$first"
}
BASE_PY=$(pick_python)
NOTE=""
if [[ -n "$VENV" ]]; then
    PY="$VENV/bin/python"
    NOTE="given venv $VENV, nothing installed"
elif [[ ! -d "$WHEELS" || -z "$(ls "$WHEELS"/gpuwhy-*.whl 2> /dev/null)" ]] \
        && [[ -x "$REPO/.venv/bin/python" ]]; then
    PY="$REPO/.venv/bin/python"
    NOTE="no wheels in $WHEELS: the checkout's .venv, nothing installed"
else
    KITVENV="${TMPDIR:-/tmp}/gpuwhy-kit-venv"
    PY="$KITVENV/bin/python"
    if [[ -z "$BASE_PY" ]]; then
        skip venv "logs/venv.out" "no Python 3.11+ found"
    else
        rm -rf "$KITVENV"
        step venv 60 logs/venv.out "$BASE_PY" -m venv --system-site-packages "$KITVENV"
        if ((LAST_RC != 0)); then   # no ensurepip (Debian's python3-venv not installed)
            rm -rf "$KITVENV"
            step venv-without-pip 60 logs/venv-without-pip.out "$BASE_PY" -m venv \
                --without-pip --system-site-packages "$KITVENV"
        fi
        # A venv made from a venv's Python sees the base's site-packages, not that venv's
        # (where torch may be): hand them on with a .pth file.
        PURELIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2> /dev/null)
        if [[ -d "$PURELIB" ]]; then
            "$BASE_PY" -c 'import site, sys
if sys.prefix != sys.base_prefix: print("\n".join(site.getsitepackages()))' \
                > "$PURELIB/gpuwhy-kit-base.pth"
        fi
        # pip runs from its carried wheel where the venv has none
        PIP=("$PY" -m pip)
        "$PY" -m pip --version > /dev/null 2>&1 \
            || PIP=("$PY" "$(ls "$WHEELS"/pip-*.whl 2> /dev/null | head -n 1)/pip")
        step install 120 logs/install.out "${PIP[@]}" install --no-index --no-deps \
            --disable-pip-version-check --find-links "$WHEELS" "$WHEELS"/*.whl
    fi
fi
[[ -n "$NOTE" ]] && echo "gpu-kit: $NOTE"
step env 30 env.json "$PY" -c '
import importlib, importlib.util, json, platform, sys
def version(name):
    try:
        m = importlib.import_module(name)
    except Exception as exc:
        return f"not importable: {type(exc).__name__}: {exc}"
    return getattr(m, "__version__", "importable")
print(json.dumps({"python": sys.version, "executable": sys.executable, "prefix": sys.prefix,
    "kernel": platform.release(), "machine": platform.machine(), "note": sys.argv[1],
    "base_python": sys.argv[2], "gpuwhy_from": getattr(importlib.util.find_spec("gpuwhy"), "origin", None),
    "versions": {n: version(n) for n in ("gpuwhy", "torch", "pynvml", "systemd", "zmq",
                                         "flask", "orjson", "sqlite_utils", "lark", "re2",
                                         "croniter", "psutil", "click")}}, indent=2))' \
    "$NOTE" "$BASE_PY"
step pip-check 60 logs/pip-check.json "$PY" "$KIT" pip-check --python "$PY"

# --- the host, as the driver shows it ---
GPU_WHY=""
# The driver's /proc folder; another only in the kit's own test (look-alike GPU host).
NV="${GPUWHY_KIT_DRIVER_PROC:-/proc/driver/nvidia}"
if ls "$NV"/gpus/*/information > /dev/null 2>&1; then
    GPU=yes
else
    GPU=no
    GPU_WHY="no $NV/gpus/*/information (the nvidia driver is not loaded)"
fi
if command -v nvidia-smi > /dev/null; then
    step nvidia-smi-L 30 host/nvidia-smi-L.txt nvidia-smi -L
    step nvidia-smi-q 60 host/nvidia-smi-q.xml nvidia-smi -q -x
    step nvidia-smi-topo 30 host/nvidia-smi-topo.txt nvidia-smi topo -m
else
    GPU_WHY="${GPU_WHY:+$GPU_WHY; }nvidia-smi not found"
    for s in L q topo; do skip "nvidia-smi-$s" "" "nvidia-smi not found"; done
fi
step driver-version 10 host/driver-version.txt cat "$NV/version"
if [[ -f "$NV/version" ]]; then
    mkdir -p "$DEST/host/proc/driver/nvidia"
    cp "$NV/version" "$DEST/host/proc/driver/nvidia/version"
    for info in "$NV"/gpus/*/information; do
        [[ -f "$info" ]] || continue
        bus=$(basename "$(dirname "$info")")
        mkdir -p "$DEST/host/proc/driver/nvidia/gpus/$bus"
        cp "$info" "$DEST/host/proc/driver/nvidia/gpus/$bus/information"
    done
fi
step dev-nvidia 10 host/dev-nvidia.txt bash -c 'ls -l /dev/nvidia* /dev/nvidia-caps 2>&1; echo; grep -i nvidia /proc/devices'
# Where no tracefs is mounted (a VM's minimal root), root mounts one for the look, then not.
step xid-tracepoint 10 host/nvidia_dev_xid.txt bash -c '
mounted=""
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ] \
        && [ "$(id -u)" = 0 ]; then
    mounted=$(mktemp -d) && mount -t tracefs tracefs "$mounted" 2>&1 \
        && echo "tracefs: none mounted; mounted one at $mounted for this step" \
        || { echo "tracefs: none mounted, and mounting one failed"; rmdir "$mounted"; mounted=""; }
fi
found=1
for t in /sys/kernel/tracing /sys/kernel/debug/tracing $mounted; do
    [ -d "$t/events" ] || continue
    echo "tracefs: $t"; ls "$t/events/nvidia" 2>&1
    f="$t/events/nvidia/nvidia_dev_xid/format"
    if [ -f "$f" ]; then echo "nvidia_dev_xid: present"; cat "$f"; found=0; break; fi
done
[ $found = 0 ] || echo "nvidia_dev_xid: absent"
[ -n "$mounted" ] && { umount "$mounted"; rmdir "$mounted"; }
exit $found'
step kernel-log 10 host/kernel-log-nvidia.txt bash -c \
    'dmesg 2>&1 | grep -iE "nvrm|nvidia|xid" | tail -n 300'
step bpf 30 host/bpf.json "$PY" "$KIT" bpf
step check-env 60 gpuwhy/check-env.json "$PY" -m gpuwhy check-env --json

# --- bcc, carried: gpuwhy's eBPF probes on the real driver ---
# Its libraries go on LD_LIBRARY_PATH only where this host has none of that name (the host's
# own libffi, libz... stay), and only for the probes' commands. Its kernel headers are
# linked where bcc looks, if nothing is there, and unlinked at the end.
PROBES=no
PROBE_ENV=()
LINKED=()
if [[ -f "$BUNDLE" && $(id -u) == 0 ]]; then
    BCC_DIR="${TMPDIR:-/tmp}/gpuwhy-kit-bcc"
    rm -rf "$BCC_DIR"
    mkdir -p "$BCC_DIR/spare"
    step bcc-unpack 60 logs/bcc-unpack.out "$PY" -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$BUNDLE" "$BCC_DIR"
    for f in "$BCC_DIR"/lib/*; do
        [[ -f "$f" ]] || continue
        ldconfig -p | awk -v n="$(basename "$f")" '$1 == n { found = 1 } END { exit !found }' \
            && mv "$f" "$BCC_DIR/spare/"
    done
    MODULES="/lib/modules/$(uname -r)"
    mkdir -p "$MODULES"
    link=build
    while read -r root; do
        if [[ -n "$root" && ! -e "$MODULES/$link" && -d "$BCC_DIR/headers$root" ]]; then
            ln -s "$BCC_DIR/headers$root" "$MODULES/$link" && LINKED+=("$MODULES/$link")
        fi
        link=source
    done < "$BCC_DIR/headers/ROOTS"
    PROBE_ENV=(env "LD_LIBRARY_PATH=$BCC_DIR/lib" "PYTHONPATH=$BCC_DIR/py")
    # bcc attaches through tracefs at its usual place; a VM's minimal root mounts none there
    TRACEFS_MOUNTED=""
    if [[ ! -d /sys/kernel/tracing/events ]] \
            && mount -t tracefs tracefs /sys/kernel/tracing 2> "$DEST/logs/tracefs.err"; then
        TRACEFS_MOUNTED=/sys/kernel/tracing
        record tracefs 0 "" "" "" "mounted at /sys/kernel/tracing for the probes"
    fi
    step bcc-check 60 probes/bcc-check.txt "${PROBE_ENV[@]}" "$PY" -c '
from bcc import BPF
b = BPF(text="TRACEPOINT_PROBE(syscalls, sys_enter_getppid) { return 0; }")
print("bcc", __import__("bcc").__file__, "compiled and attached a tracepoint program")
print("carried libraries used:", sorted(__import__("os").listdir(__import__("sys").argv[1])))' \
        "$BCC_DIR/lib"
    ((LAST_RC == 0)) && PROBES=yes
else
    skip bcc-unpack probes/bcc-check.txt "no $BUNDLE (gpu-kit-wheels.sh --bcc), or not root"
fi

# --- gpuwhy's NVML source: idle, under load, after ---
sample idle
WORK="$DEST/work"
WPID=""
# The recorder of the load's driver calls: carried, else built here, else none.
NVTRACE="$WHEELS/libnvtrace.so"
if [[ ! -f "$NVTRACE" ]]; then
    NVTRACE="${TMPDIR:-/tmp}/gpuwhy-kit-libnvtrace.so"
    gcc -O2 -shared -fPIC -o "$NVTRACE" "$REPO/scripts/nvtrace.c" -ldl \
        2> "$DEST/logs/nvtrace-build.err" || NVTRACE=""
fi
PRELOAD=()
if [[ -n "$NVTRACE" && $GPU == yes ]]; then
    PRELOAD=(env "LD_PRELOAD=$NVTRACE" "NVTRACE_OUT=$DEST/nvtrace/calls.nvt"
             "NVTRACE_PTRS=$("$PY" "$KIT" nvtrace-rules 2> "$DEST/logs/nvtrace-rules.err")")
    record nvtrace 0 "" "" nvtrace/calls.nvt "$NVTRACE"
else
    skip nvtrace nvtrace/calls.nvt "no recorder: not carried, no gcc here, or no GPU"
fi
TRACER=""
if [[ $PROBES == yes && $GPU == yes ]]; then
    # The probe's view of the same load nvtrace records, from its first open of a device.
    "${PROBE_ENV[@]}" timeout -s INT -k 5 $(( DEADLINE - $(date +%s) )) "$PY" -m gpuwhy trace \
        --json > "$DEST/probes/trace.jsonl" 2> "$DEST/probes/trace.err" < /dev/null &
    TRACER=$!
    for _ in $(seq 1 600); do   # bcc's compile: up to 30 s
        grep -q "Tracing driver calls" "$DEST/probes/trace.err" 2> /dev/null && break
        kill -0 "$TRACER" 2> /dev/null || break
        sleep 0.05
    done
    record trace-start "$(grep -q "Tracing driver calls" "$DEST/probes/trace.err" && echo 0 || echo 1)" \
        "" "" probes/trace.jsonl
fi
if [[ $GPU == yes ]]; then
    timeout -k 5 $(( DEADLINE - $(date +%s) )) "${PRELOAD[@]}" "$PY" "$KIT" work --dir "$WORK" \
        --max-phase-seconds $(( SECONDS_EACH + 30 )) --wait-seconds $(( BUDGET )) \
        > "$DEST/logs/work.out" 2> "$DEST/logs/work.err" &
    WORKER=$!
    for _ in $(seq 1 1200); do   # torch import and CUDA start: up to 60 s
        [[ -f "$WORK/ready" ]] && break
        kill -0 "$WORKER" 2> /dev/null || break
        sleep 0.05
    done
    READY=$(cat "$WORK/ready" 2> /dev/null || echo "no-gpu the load did not start")
    [[ "$READY" =~ ^[0-9]+$ ]] && WPID=$READY
    record work-start "$([[ -n "$WPID" ]] && echo 0 || echo 1)" "" "" work/work.json "$READY"
else
    skip work-start work/work.json "no NVIDIA GPU"
fi

wait_for() {   # file, seconds: false at once when the load has died
    local i
    for i in $(seq 1 $(( $2 * 20 ))); do
        [[ -f "$1" ]] && return 0
        kill -0 "$WORKER" 2> /dev/null || return 1
        sleep 0.05
    done
    return 1
}
for phase in matmul h2d-pageable h2d-pinned; do
    if [[ -z "$WPID" ]]; then
        skip "sample-$phase" "gpuwhy/sample-$phase.jsonl" "no PyTorch load: ${READY:-no NVIDIA GPU}"
        continue
    fi
    touch "$WORK/go-$phase"
    wait_for "$WORK/started-$phase" 30 || record "phase-$phase" 1 "" "" "" "did not start"
    sleep 1   # past the first kernel launches / allocations
    sample "$phase"
    if [[ $phase == matmul ]]; then
        step nvml-processes 30 nvml/processes.json "$PY" "$KIT" nvml --pid "$WPID"
        step nvidia-smi-apps 20 nvml/nvidia-smi-apps.csv nvidia-smi \
            --query-compute-apps=pid,process_name,used_memory --format=csv
        step nvidia-smi-pmon 20 nvml/nvidia-smi-pmon.txt nvidia-smi pmon -c 1 -s um
        step proc-scan 30 gpuwhy/proc-scan.json "$PY" -m gpuwhy proc "$WPID" --json
        step proc-raw 10 gpuwhy/proc-raw.txt bash -c \
            "cat /proc/$WPID/cgroup; echo; ls -l /proc/$WPID/fd | grep -i nvidia"
        step cuda-libs 30 gpuwhy/cuda-libs.json "$PY" "$KIT" cuda-libs --pid "$WPID"
    fi
    touch "$WORK/stop-$phase"
    wait_for "$WORK/done-$phase" 60 || record "phase-$phase" 1 "" "" "" "did not finish"
done
if [[ -z "$WPID" ]]; then
    skip nvml-processes nvml/processes.json "no PyTorch load"
    # Still exercise the command (and its clean "no fd" answer) on this shell.
    step proc-scan 30 gpuwhy/proc-scan.json "$PY" -m gpuwhy proc "$$" --json
fi
touch "$WORK/quit"
[[ -n "${WORKER:-}" ]] && wait "$WORKER" 2> /dev/null
if [[ -n "$TRACER" ]]; then
    sleep 1   # the last calls' records out of the ring buffer
    kill -INT "$TRACER" 2> /dev/null
    wait "$TRACER"
    record trace "$?" "" "" probes/trace.jsonl "$(wc -l < "$DEST/probes/trace.jsonl") calls"
fi
sample after

# --- a real Xid: kernels that fault as applications' do (their context dies, not the GPU) ---
# Seen three ways, each kept in xid/: the kernel log's NVRM lines, NVML's Xid events (gpuwhy's
# own sampler) and the driver's nvidia_dev_xid tracepoint (enabled for it where root can
# mount tracefs).
if [[ $GPU == yes && -n "$WPID" ]]; then
    TRACE=""
    MOUNTED=""
    for t in /sys/kernel/tracing /sys/kernel/debug/tracing; do
        [[ -d "$t/events/nvidia" ]] && { TRACE=$t; break; }
    done
    if [[ -z "$TRACE" && $(id -u) == 0 ]]; then
        MOUNTED=$(mktemp -d)
        if mount -t tracefs tracefs "$MOUNTED" 2> /dev/null; then
            [[ -d "$MOUNTED/events/nvidia" ]] && TRACE=$MOUNTED
        else
            rmdir "$MOUNTED"; MOUNTED=""
        fi
    fi
    XID_EVENT="$TRACE/events/nvidia/nvidia_dev_xid/enable"
    if [[ -n "$TRACE" && -f "$XID_EVENT" ]]; then
        : > "$TRACE/trace"
        echo 1 > "$XID_EVENT"
    fi
    # gpuwhy itself, end to end, while they fault: the service (its GPU source NVML, its
    # kernel-log source journald, else /dev/kmsg), and a capture of the same sources' traffic
    # for `gpuwhy rules test --replay` and the tests here. Both in a folder of their own.
    RUNDIR=$(mktemp -d)
    SVCENV=(env "GPUWHY_DB=$RUNDIR/gpuwhy.db" "GPUWHY_BUS=ipc://$RUNDIR/bus.sock"
            "GPUWHY_GPU_SOURCE=nvml" "GPUWHY_PORT=18765")
    SERVICE=("$PY" -m gpuwhy serve)
    [[ $PROBES == yes ]] && SERVICE=("${PROBE_ENV[@]}" "$PY" -m gpuwhy up)
    "${SVCENV[@]}" timeout -k 5 $(( 6 * SECONDS_EACH + 60 )) "${SERVICE[@]}" \
        > "$DEST/service/serve.log" 2>&1 < /dev/null &
    SERVER=$!
    CAPTURE_PROBES=""
    if [[ $PROBES == yes ]]; then
        "${SVCENV[@]}" "GPUWHY_BUS=ipc://$RUNDIR/record.sock" "${PROBE_ENV[@]}" \
            timeout -k 5 $(( 6 * SECONDS_EACH + 60 )) "$PY" -m gpuwhy probes \
            > "$DEST/service/probes.log" 2>&1 < /dev/null &
        CAPTURE_PROBES=$!
    fi
    "${SVCENV[@]}" timeout -k 5 $(( 6 * SECONDS_EACH + 60 )) "$PY" -m gpuwhy record \
        --duration $(( 4 * SECONDS_EACH + 5 )) --sources gpu,klog \
        --endpoint "ipc://$RUNDIR/record.sock" "$DEST/service/capture.jsonl" \
        > "$DEST/service/record.log" 2>&1 < /dev/null &
    RECORDER=$!
    timeout --preserve-status -s INT -k 5 $(( 4 * SECONDS_EACH + 30 )) \
        "$PY" -m gpuwhy gpu sample --source nvml --json --interval 0.5 \
        > "$DEST/xid/sample-xid.jsonl" 2> "$DEST/xid/sample-xid.err" < /dev/null &
    SAMPLER=$!
    t0=$EPOCHREALTIME
    sleep 5   # the sampler's Xid event set registered, the service and recorder started
    if [[ $PROBES == yes ]]; then   # and the probes compiled and attached, both sets
        for _ in $(seq 1 300); do
            grep -q "sleeping on the ring buffers" "$DEST/service/serve.log" \
                && grep -q "sleeping on the ring buffers" "$DEST/service/probes.log" && break
            sleep 0.1
        done
    fi
    for kind in illegal-address trap torch-assert; do
        step "fault-$kind" 60 "xid/fault-$kind.json" "$PY" "$KIT" fault --kind "$kind"
        sleep 1
    done
    sleep 3   # the last Xid's event read
    kill -INT "$SAMPLER" 2> /dev/null
    wait "$SAMPLER"
    record sample-xid "$?" "$(since "$t0" "$EPOCHREALTIME")" "" xid/sample-xid.jsonl
    sleep $(( SECONDS_EACH + 2 ))   # the rules' next rounds (every 10 s)
    step service-status 30 service/status.json "${SVCENV[@]}" "$PY" -m gpuwhy status --json
    step service-incidents 30 service/incidents.json "${SVCENV[@]}" "$PY" -m gpuwhy incidents \
        --json
    for id in $("$PY" -c 'import json, sys
print(" ".join(str(i["id"]) for i in json.load(open(sys.argv[1]))[:8]))' \
            "$DEST/service/incidents.json" 2> /dev/null); do
        step "service-incident-$id" 30 "service/incident-$id.json" "${SVCENV[@]}" "$PY" -m gpuwhy \
            incident "$id" --json
    done
    kill -TERM "$SERVER" 2> /dev/null
    wait "$SERVER"
    record service "$?" "" "" service/serve.log
    wait "$RECORDER"
    record capture "$?" "" "" service/capture.jsonl
    if [[ -n "$CAPTURE_PROBES" ]]; then
        kill -TERM "$CAPTURE_PROBES" 2> /dev/null
        wait "$CAPTURE_PROBES"
        record capture-probes "$?" "" "" service/probes.log
    fi
    rm -rf "$RUNDIR"
    if [[ -f "$XID_EVENT" ]]; then
        step xid-trace 10 xid/tracepoint.txt cat "$TRACE/trace"
        echo 0 > "$XID_EVENT"
    else
        skip xid-trace xid/tracepoint.txt "no nvidia_dev_xid tracepoint (or no tracefs)"
    fi
    [[ -n "$MOUNTED" ]] && { umount "$MOUNTED"; rmdir "$MOUNTED"; }
    step kernel-log-xid 10 xid/kernel-log.txt bash -c \
        'dmesg 2>&1 | grep -iE "nvrm|xid" | tail -n 300'
    step nvidia-smi-q-after 60 xid/nvidia-smi-q-after.xml nvidia-smi -q -x
else
    skip faults xid/fault-illegal-address.json "no PyTorch load: no GPU to fault on"
fi

# --- P1 on the real driver: what a traced RM control costs, beside the attachments' floor ---
if [[ $PROBES == yes && $GPU == yes ]]; then
    BENCH_BIN="${TMPDIR:-/tmp}/gpuwhy-kit-bench_probes"
    cp "$WHEELS/bench_probes" "$BENCH_BIN" 2> /dev/null && chmod +x "$BENCH_BIN" || BENCH_BIN=""
    BENCHENV=("${PROBE_ENV[@]}" ${BENCH_BIN:+"GPUWHY_BENCH_BIN=$BENCH_BIN"})
    step p1-driver 150 probes/p1.md "${BENCHENV[@]}" "$PY" "$REPO/scripts/bench_probes.py" \
        --device /dev/nvidiactl --repeat 5 --calls 300000 --round-trips 20000 \
        --json "$DEST/probes/p1.json"
    step p1-floors 120 probes/floors.md "${BENCHENV[@]}" "$PY" "$REPO/scripts/bench_attach.py" \
        --repeat 5 --device /dev/nvidiactl --json "$DEST/probes/floors.json"
else
    skip p1-driver probes/p1.md "no probes here (no bcc carried, not root) or no GPU"
fi
for link in "${LINKED[@]}"; do rm -f "$link"; done
[[ -n "${TRACEFS_MOUNTED:-}" ]] && umount "$TRACEFS_MOUNTED"

# --- the manifest ---
"$PY" "$KIT" summary --out "$DEST" --gpu-present "$GPU" --gpu-why "$GPU_WHY" \
    --started "$STARTED" 2> "$DEST/logs/summary.err" \
    || python3 "$KIT" summary --out "$DEST" --gpu-present "$GPU" --gpu-why "$GPU_WHY" \
        --started "$STARTED"
echo "gpu-kit: done in $(( $(date +%s) - ${STARTED%.*} ))s: $DEST/summary.json"
if [[ -n "$TAR" ]]; then
    mkdir -p "$(dirname "$TAR")"
    tar -czf "$TAR" -C "$(dirname "$DEST")" "$(basename "$DEST")" \
        && cp "$DEST/summary.json" "$(dirname "$TAR")/" \
        && echo "gpu-kit: packed into $TAR ($(du -h "$TAR" | cut -f1))" \
        || echo "gpu-kit: packing into $TAR failed" >&2
fi
exit 0
