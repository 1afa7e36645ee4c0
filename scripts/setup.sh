#!/usr/bin/env bash
# setup.sh  Install gpuwhy's dependencies into .venv and start the service.
#
# USAGE: sudo scripts/setup.sh [--no-start]
#
# Idempotent: run it again after a pull. It installs what is missing (bcc from the
# distribution, kernel headers, libsystemd-dev, pkg-config), makes .venv/, mounts
# tracefs, then (re)starts `gpuwhy up` in the background with its web view on
# http://127.0.0.1:8000. Every step says what it did.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
start=1
for arg in "$@"; do
  case "$arg" in
    --no-start) start=0 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

say() { printf 'gpuwhy setup: %s\n' "$*"; }
die() { printf 'gpuwhy setup: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (eBPF needs it). Fix: sudo $0"
command -v apt-get >/dev/null || die "only Debian/Ubuntu (apt-get) are automated here; install bcc (python3-bpfcc), kernel headers, libsystemd-dev and pkg-config by hand, then rerun"
[ -e /sys/kernel/btf/vmlinux ] || say "warning: /sys/kernel/btf/vmlinux is missing; bcc will rely on kernel headers alone"
[ -d /proc/sys/kernel ] && grep -q bpf /proc/filesystems 2>/dev/null || say "warning: bpf filesystem not listed in /proc/filesystems"

# --- system packages -------------------------------------------------------
packages=(python3-bpfcc python3-venv python3-dev gcc libsystemd-dev pkg-config systemd-journal-remote cron chromium poppler-utils prometheus prometheus-alertmanager)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the web view's chart library; Debian's nodejs/npm when none is installed.
command -v npm >/dev/null || missing+=(nodejs npm)
kernel=$(uname -r)
if [ ! -e "/lib/modules/$kernel/build/include" ]; then
  if apt-cache show "linux-headers-$kernel" >/dev/null 2>&1; then
    missing+=("linux-headers-$kernel")
  else
    missing+=(linux-headers-amd64)
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed. Fix: check the network or your apt sources, then rerun"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
  # Debian starts the Prometheus and Alertmanager it just installed (on :9090, :9093): the
  # tests start their own on loopback ports, and a set-up must leave nothing listening.
  if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] \
     && printf '%s\n' "${missing[@]}" | grep -qx 'prometheus\|prometheus-alertmanager'; then
    for unit in prometheus prometheus-alertmanager prometheus-node-exporter; do
      if systemctl list-unit-files "$unit.service" --no-legend 2>/dev/null | grep -q .; then
        systemctl disable --now "$unit.service" >/dev/null 2>&1 \
          && say "stopped and disabled $unit.service (Debian started it; gpuwhy's tests run their own)"
      fi
    done
  fi
else
  say "system packages present (${packages[*]})"
fi

# --- kernel headers for bcc --------------------------------------------------
if [ ! -e "/lib/modules/$kernel/build/include" ]; then
  # No headers for this exact kernel (e.g. a VM kernel): Debian's generic headers work for
  # programs that only read tracepoint arguments and call BPF helpers, which is all gpuwhy does.
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  [ -n "$hdr" ] || die "no kernel headers for $kernel. Fix: apt-get install linux-headers-$kernel (or linux-headers-amd64)"
  common=${hdr%-amd64}-common
  mkdir -p "/lib/modules/$kernel"
  ln -sfn "$hdr" "/lib/modules/$kernel/build"
  ln -sfn "$common" "/lib/modules/$kernel/source"
  say "no headers for kernel $kernel: linked /lib/modules/$kernel/build -> $hdr (and source -> $common)"
else
  say "kernel headers present at /lib/modules/$kernel/build"
fi

# --- tracefs ---------------------------------------------------------------------
if [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs tracefs /sys/kernel/tracing || die "cannot mount tracefs. Fix: mount -t tracefs tracefs /sys/kernel/tracing"
  say "mounted tracefs at /sys/kernel/tracing"
fi
if [ ! -e /sys/kernel/debug/tracing ] && [ -d /sys/kernel/debug ]; then
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null && say "mounted debugfs at /sys/kernel/debug" || true
fi

# --- Python environment ------------------------------------------------------------
# Debian's own python3 is the one that has bcc; --system-site-packages lets the venv see it.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import bcc' 2>/dev/null; then
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv
  say "created .venv (Debian python3 with system site-packages, for bcc)"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' \
  || die "pip install into .venv failed"
say "installed gpuwhy into .venv ($(.venv/bin/gpuwhy --version))"
.venv/bin/python -c 'import bcc' || die "bcc does not import in .venv. Fix: apt-get install python3-bpfcc"
# Compile and load a trivial program: proves headers, the bpf() syscall and tracefs together.
if ! err=$(.venv/bin/python - 2>&1 <<'PY'
from bcc import BPF
BPF(text=b"TRACEPOINT_PROBE(syscalls, sys_enter_getppid) { return 0; }").cleanup()
PY
); then
  die "BPF is unavailable: $(printf '%s' "$err" | tail -n 1). Fix: run as root on a kernel with CONFIG_BPF_SYSCALL, and install headers (apt-get install linux-headers-$kernel)"
fi
say "BPF works: compiled and attached a test tracepoint program"

# --- web view's browser libraries (package.json / package-lock.json) -----------------
# Served by gpuwhy itself from node_modules/: GPU hosts are often offline.
if [ ! -f node_modules/echarts/dist/echarts.min.js ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null \
    || die "npm ci failed (the web view's chart library). Fix: check access to the npm registry, then rerun"
  say "installed the web view's chart library into node_modules/ (npm ci: $(node -p 'require("./node_modules/echarts/package.json").version' 2>/dev/null | sed 's/^/echarts /'))"
else
  say "web chart library present (node_modules/echarts, as package-lock.json pins it)"
fi

if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  say "!!! no NVIDIA GPU device (/dev/nvidia0) on this host: gpuwhy runs on and shows the processes it traces; GPU counters stay empty"
fi

# --- start --------------------------------------------------------------------------
[ "$start" -eq 1 ] || { say "done (--no-start: not starting the service)"; exit 0; }
mkdir -p /run/gpuwhy /var/lib/gpuwhy /var/log/gpuwhy
pidfile=/run/gpuwhy/up.pid
if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  say "stopping the running gpuwhy (pid $(cat "$pidfile"))"
  kill -TERM "$(cat "$pidfile")"
  for _ in $(seq 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
fi
setsid .venv/bin/gpuwhy up --pidfile "$pidfile" </dev/null >>/var/log/gpuwhy/gpuwhy.log 2>&1 &
for _ in $(seq 100); do
  if .venv/bin/gpuwhy status --quiet 2>/dev/null; then
    say "gpuwhy is running (pid $(cat "$pidfile")): http://127.0.0.1:8000  log: /var/log/gpuwhy/gpuwhy.log"
    exit 0
  fi
  sleep 0.2
done
tail -n 20 /var/log/gpuwhy/gpuwhy.log >&2 || true
die "gpuwhy did not become healthy within 20 s; see /var/log/gpuwhy/gpuwhy.log"
