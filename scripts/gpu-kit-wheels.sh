#!/usr/bin/env bash
# gpu-kit-wheels.sh: the wheels scripts/gpu-kit.sh installs on a GPU machine with no registry.
#
# The GPU machine (see issue 26) has Python 3.12, PyTorch and nvidia-ml-py, and no package
# registry. This downloads, here, cp312 manylinux x86_64 wheels of gpuwhy's runtime
# requirements (pyproject.toml [project].dependencies, with their own dependencies) and
# builds a gpuwhy wheel from this checkout, all into one folder; the kit installs them with
# `pip install --no-index --find-links`. Left out on purpose (scripts/gpu_kit.py NOT_CARRIED):
# nvidia-ml-py and torch (the machine's own, matched to its driver and CUDA) and
# systemd-python (journald only, imported lazily; it has no wheel). pip is carried too: the
# kit runs it from its wheel where the machine's venv module cannot install one. Beside the
# wheels: libnvtrace.so, the kit's recorder of its own load's driver calls (scripts/nvtrace.c),
# and bench_probes (scripts/bench_probes.c, for P1 on the real driver).
#
# --bcc adds bcc.tar.xz: this host's bcc (Debian's python3-bpfcc), the libraries libbcc.so
# loads (LLVM and clang among them; glibc and libstdc++ are the GPU host's own) and the
# kernel headers the probes' compile reads, found by compiling them here and keeping the
# files whose access time moved (every header where the file system keeps none). The GPU
# host has no bcc and no headers; with this the kit runs gpuwhy's eBPF probes there. Its
# kernel is the same as this VM's (6.18), so the headers that serve here serve there.
#
#   scripts/gpu-kit-wheels.sh                   # → build/gpu-kit/wheels (git-ignored)
#   scripts/gpu-kit-wheels.sh --dry-run         # what it would download, and the command
#   scripts/gpu-kit-wheels.sh --dest DIR --python-version 3.12
#   scripts/gpu-kit-wheels.sh --bcc             # and the bcc bundle (about 50 MB, 3 minutes)
#
# Needs PyPI (pip download) here. Fails when the folder is 64 MiB or more (what the device
# tool carries at most, with everything else); prints the size. Then, on the GPU machine:
#   run(command="scripts/gpu-kit.sh", carry=["build/gpu-kit/wheels"])
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$REPO/build/gpu-kit/wheels"
PYVER=3.12
DRY=0
BCC=0
LIMIT=$((64 * 1024 * 1024))
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi

while (($#)); do
    case "$1" in
        --dest) DEST="$2"; shift 2 ;;
        --python-version) PYVER="$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --bcc) BCC=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-kit-wheels.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || { echo "gpu-kit-wheels.sh: not a Python version: $PYVER" >&2; exit 2; }

mapfile -t REQS < <("$PY" "$REPO/scripts/gpu_kit.py" wheel-requirements)
ABI="cp${PYVER/./}"
DOWNLOAD=("$PY" -m pip download --dest "$DEST" --only-binary=:all: --python-version "$PYVER"
          --implementation cp --abi "$ABI" --abi abi3 --abi none
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any "${REQS[@]}" pip)
WHEEL=("$PY" -m pip wheel --no-deps --wheel-dir "$DEST" "$REPO")

if ((DRY)); then
    echo "# carried (with their dependencies), for CPython $PYVER ($ABI) manylinux x86_64:"
    printf '%s\n' "${REQS[@]}"
    echo "# not carried:"
    "$PY" "$REPO/scripts/gpu_kit.py" wheel-requirements --left-out | sed 's/^/#   /'
    echo "# would run:"
    printf '%q ' "${DOWNLOAD[@]}"; echo
    printf '%q ' "${WHEEL[@]}"; echo
    exit 0
fi

rm -rf "$DEST"
mkdir -p "$DEST"
"${DOWNLOAD[@]}"
# The checkout's setuptools builds it when it can (no second download of the build backend).
if "$PY" -c 'import setuptools, wheel' 2>/dev/null; then
    WHEEL+=(--no-build-isolation)
fi
"${WHEEL[@]}"

# Never carry what the machine must bring itself (a dependency could have pulled it in).
for name in nvidia_ml_py torch systemd_python; do
    if compgen -G "$DEST/${name}-*" >/dev/null; then
        echo "gpu-kit-wheels.sh: $name must not be carried, removing it" >&2
        rm -f "$DEST/${name}"-*
    fi
done
# The kit's recorder of the load's driver calls, built here (the GPU machine may have no gcc).
if command -v gcc > /dev/null; then
    gcc -O2 -Wall -shared -fPIC -o "$DEST/libnvtrace.so" "$REPO/scripts/nvtrace.c" -ldl
else
    echo "gpu-kit-wheels.sh: no gcc: the kit builds scripts/nvtrace.c there, or goes without" >&2
fi
if command -v gcc > /dev/null; then
    gcc -O2 -Wall -o "$DEST/bench_probes" "$REPO/scripts/bench_probes.c"
fi

bcc_bundle() {   # → $DEST/bcc.tar.xz
    local stage lib build source since f
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' RETURN
    lib=$(/usr/bin/python3 -c 'import bcc.libbcc
print(next(l.split()[-1] for l in open("/proc/self/maps") if "/libbcc.so" in l))' 2> /dev/null) \
        || { echo "gpu-kit-wheels.sh: --bcc: no bcc here (python3-bpfcc)" >&2; return 1; }
    mkdir -p "$stage/lib" "$stage/py" "$stage/headers"
    cp -L "$lib" "$stage/lib/libbcc.so.0"   # the name bcc's ctypes loads
    for f in $(ldd "$lib" | awk '$3 ~ /^\// { print $3 }'); do
        case "$(basename "$f")" in
            libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
            *) cp -L "$f" "$stage/lib/" ;;   # named as ldd found it: the soname
        esac
    done
    cp -r "$(/usr/bin/python3 -c 'import bcc, os; print(os.path.dirname(bcc.__file__))')" \
        "$stage/py/"
    find "$stage/py" -name __pycache__ -prune -exec rm -rf {} +
    build=$(realpath "/lib/modules/$(uname -r)/build")
    source=$(realpath "/lib/modules/$(uname -r)/source" 2> /dev/null || echo "$build")
    # The headers the compile reads: atimes set back, every probe compiled, the moved kept.
    since=$(date +%s)
    find "$build/" "$source/" -type f -exec touch -a -d 2000-01-01 {} +
    for f in "$REPO"/probes/*.bpf.c "$REPO"/probes/*/*.bpf.c "$REPO"/scripts/*.bpf.c; do
        /usr/bin/python3 -c 'import sys
from bcc import BPF
try:
    BPF(src_file=sys.argv[1].encode())
except Exception:
    pass   # an undefined constant fails late: the headers were read by then' "$f" \
            > /dev/null 2>&1 || true
    done
    (cd / && find "${build#/}/" "${source#/}/" -type f -newerat "@$((since - 1))" -print0 \
        | tar -cf - --null -T - | tar -xf - -C "$stage/headers")
    if [[ -z "$(find "$stage/headers" -name ptrace.h)" ]]; then
        echo "gpu-kit-wheels.sh: no access times kept here: every header carried" >&2
        (cd / && tar -cf - "${build#/}" "${source#/}/include" "${source#/}/arch/x86/include" \
            | tar -xf - -C "$stage/headers")
    fi
    printf '%s\n%s\n' "$build" "$source" > "$stage/headers/ROOTS"
    tar -C "$stage" -cf - lib py headers | xz -6 -T0 > "$DEST/bcc.tar.xz"
    echo "gpu-kit-wheels.sh: bcc.tar.xz $(du -h "$DEST/bcc.tar.xz" | cut -f1)" \
        "($(ls "$stage/lib" | wc -l) libraries, $(find "$stage/headers" -type f | wc -l) headers)"
}
if ((BCC)); then
    bcc_bundle || exit 1
fi
(cd "$DEST" && sha256sum ./*.whl > SHA256SUMS)

SIZE=$(du -sb "$DEST" | cut -f1)
COUNT=$(find "$DEST" -name '*.whl' | wc -l)
printf 'gpu-kit-wheels.sh: %d wheels, %.1f MiB in %s\n' "$COUNT" \
    "$(echo "$SIZE / 1048576" | bc -l)" "$DEST"
if ((SIZE >= LIMIT)); then
    echo "gpu-kit-wheels.sh: $SIZE bytes is not under 64 MiB: the device tool cannot carry it" >&2
    exit 1
fi
