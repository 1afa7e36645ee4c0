#!/usr/bin/env bash
# check-env.sh  Can this host run gpuwhy? Checks the NVIDIA driver, DCGM, NVML, kernel BTF
# and headers, tracefs, BPF capabilities, Python and free disk, and prints the command
# that fixes each failure on Debian, Ubuntu and RHEL-family hosts.
#
# USAGE: sudo scripts/check-env.sh [--json] [--config FILE]
#
# Exit status 0 when gpuwhy can run, 1 when something failed, 2 on bad usage. It runs
# `gpuwhy check-env` (one implementation: gpuwhy/app/deploy/checkenv.py): the installed one, else the
# repository's .venv, else this checkout's code with the system python3 (before install).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --json) args+=(--json) ;;
    --config) [ $# -ge 2 ] || { echo "check-env.sh: --config needs a file" >&2; exit 2; }
              export GPUWHY_CONFIG=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-env.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

for gpuwhy in "${GPUWHY:-}" "$here/.venv/bin/gpuwhy" /opt/gpuwhy/venv/bin/gpuwhy; do
  if [ -n "$gpuwhy" ] && [ -x "$gpuwhy" ]; then
    exec "$gpuwhy" check-env ${args[@]+"${args[@]}"}
  fi
done

# Not installed yet: run the checkout's code. The component folders install as gpuwhy.probes,
# gpuwhy.store, ...: adding the checkout to gpuwhy's package path maps them the same way.
python=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 || true)  # the distribution's: bcc lives there
[ -n "$python" ] || { echo "check-env.sh: no python3 on PATH. Fix: apt-get install -y python3 (Debian, Ubuntu) or dnf install -y python3.11 (RHEL)" >&2; exit 1; }
exec "$python" - ${args[@]+"${args[@]}"} <<PY
import json, sys
sys.path.insert(0, "$here")
import gpuwhy
gpuwhy.__path__.append("$here")
from gpuwhy.app.deploy.checkenv import Host, render, report, run_checks
host = Host()
result = report(host, run_checks(host))
print(json.dumps(result, indent=2) if "--json" in sys.argv[1:] else render(result))
sys.exit(0 if result["ok"] else 1)
PY
