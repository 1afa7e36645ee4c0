#!/usr/bin/env bash
# install.sh  Install gpuwhy as a system service (the production path), or remove it.
#
# USAGE: sudo scripts/install.sh --mode standalone [--prefix DIR] [--root DIR] [--python PY]
#        sudo scripts/install.sh --uninstall [--keep-data] [--prefix DIR] [--root DIR]
#
#   --mode standalone  a venv under PREFIX (default /opt/gpuwhy) with gpuwhy from this
#                      checkout, config /etc/gpuwhy/config.toml (kept when present), data
#                      /var/lib/gpuwhy, users gpuwhy and gpuwhy-probes, the three systemd
#                      services (enabled and started when systemd is PID 1) and the journald
#                      catalog; then `gpuwhy check-env` says what this host still lacks.
#   --uninstall        stops and removes all of it, data and users too (--keep-data
#                      keeps /var/lib/gpuwhy and /etc/gpuwhy).
#   --root DIR         install into DIR as if it were / (tests, image builds): no users
#                      are created, no units started; paths in the units and config point
#                      into DIR so that its commands run in place.
#   --python PY        the interpreter of the venv (default /usr/bin/python3, the
#                      distribution's, which has bcc).
# Idempotent: run it again after an upgrade. Every step says what it did.
set -euo pipefail
umask 022   # the venv must be readable by the services' users whatever the caller's umask

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode="" uninstall=0 keep_data=0 prefix=/opt/gpuwhy root=/ python=/usr/bin/python3
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode=${2:-}; shift ;;
    --mode=*) mode=${1#--mode=} ;;
    --uninstall) uninstall=1 ;;
    --keep-data) keep_data=1 ;;
    --prefix) prefix=${2:-}; shift ;;
    --root) root=${2:-}; shift ;;
    --python) python=${2:-}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { printf 'gpuwhy install: %s\n' "$*"; }
die() { printf 'gpuwhy install: ERROR: %s\n' "$*" >&2; exit 1; }
[ "$uninstall" -eq 1 ] || [ "$mode" = standalone ] \
  || { echo "install.sh: give --mode standalone or --uninstall (try --help)" >&2; exit 2; }
case "$prefix" in /*) ;; *) die "--prefix must be an absolute path, got '$prefix'" ;; esac
[ -n "$root" ] && [ -d "$root" ] || die "--root '$root' is not a directory"
root=$(cd "$root" && pwd)
[ "$root" = / ] && R="" || R=$root
[ "$(id -u)" -eq 0 ] || [ -n "$R" ] || die "must run as root. Fix: sudo $0 $*"

# Everything this script writes, as seen from the installed system.
venv=$R$prefix/venv
etc=$R/etc/gpuwhy
data=$R/var/lib/gpuwhy
run=$R/run/gpuwhy
unitdir=$R/etc/systemd/system
catalogdir=$R/usr/lib/systemd/catalog
sysusersdir=$R/usr/lib/sysusers.d
manifest=$R$prefix/install-manifest   # directories this script created, to remove them again
units=(gpuwhy.service gpuwhy-probes.service gpuwhy-stacks.service gpuwhy-kmsg.socket)
systemd_running() { [ -z "$R" ] && [ -d /run/systemd/system ]; }

remember_dir() {   # mkdir -p, noting in the manifest each directory that did not exist
  local dir=$1 missing=()
  while [ ! -d "$dir" ]; do missing=("$dir" "${missing[@]}"); dir=$(dirname "$dir"); done
  for dir in "${missing[@]}"; do
    mkdir -m 0755 "$dir"
    created_dirs+=("$dir")
  done
}

# --- uninstall ------------------------------------------------------------------------
if [ "$uninstall" -eq 1 ]; then
  if systemd_running; then
    systemctl disable --now "${units[@]}" 2>/dev/null && say "stopped and disabled ${units[*]}" || true
  else
    say "systemd is not PID 1${R:+ (--root $R)}: no units to stop"
  fi
  for unit in "${units[@]}"; do
    [ -e "$unitdir/$unit" ] && rm -f "$unitdir/$unit" && say "removed $unitdir/$unit"
  done
  systemd_running && systemctl daemon-reload && say "systemctl daemon-reload"
  if [ -e "$catalogdir/gpuwhy.catalog" ]; then
    rm -f "$catalogdir/gpuwhy.catalog"; say "removed $catalogdir/gpuwhy.catalog"
    [ -z "$R" ] && command -v journalctl >/dev/null && journalctl --update-catalog \
      && say "journalctl --update-catalog"
  fi
  [ -e "$sysusersdir/gpuwhy.conf" ] && rm -f "$sysusersdir/gpuwhy.conf" \
    && say "removed $sysusersdir/gpuwhy.conf"
  created=()
  [ -f "$manifest" ] && mapfile -t created < "$manifest"
  [ -d "$R$prefix" ] && rm -rf "$R$prefix" && say "removed $R$prefix (venv)"
  [ -d "$run" ] && rm -rf "$run" && say "removed $run"
  if [ "$keep_data" -eq 1 ]; then
    say "kept $data and $etc (--keep-data)"
  else
    for dir in "$data" "$etc"; do [ -d "$dir" ] && rm -rf "$dir" && say "removed $dir"; done
    if [ -z "$R" ]; then
      for user in gpuwhy-probes gpuwhy; do
        if id -u "$user" >/dev/null 2>&1; then userdel "$user" && say "removed user $user"; fi
        if getent group "$user" >/dev/null; then groupdel "$user" && say "removed group $user"; fi
      done
    fi
  fi
  for ((i=${#created[@]}-1; i>=0; i--)); do     # deepest first, only when empty
    [ -d "${created[i]}" ] && rmdir "${created[i]}" 2>/dev/null && say "removed ${created[i]}"
  done
  say "gpuwhy is uninstalled"
  exit 0
fi

# --- install --------------------------------------------------------------------------
created_dirs=()
[ -f "$manifest" ] && mapfile -t created_dirs < "$manifest"
[ -x "$python" ] || die "no $python. Fix: apt-get install -y python3 python3-venv (Debian, Ubuntu) or dnf install -y python3.11 (RHEL), or pass --python"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$python is older than 3.11. Fix: pass --python with a Python 3.11+ interpreter"

remember_dir "$R$prefix"
same_python() {   # the venv's interpreter is $python (symlinks resolved)
  [ -x "$venv/bin/python" ] && [ "$(readlink -f "$venv/bin/python")" = "$(readlink -f "$python")" ] \
    && "$venv/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'
}
if same_python; then
  say "venv $venv exists (python $python)"
else
  rm -rf "$venv"
  "$python" -m venv --system-site-packages "$venv" \
    || die "cannot create a venv. Fix: apt-get install -y python3-venv (Debian, Ubuntu)"
  say "created venv $venv (system site-packages, for bcc)"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$here" \
  || die "pip install of $here into $venv failed"
say "installed $("$venv/bin/gpuwhy" --version) into $venv"

have_users=0
if [ -z "$R" ]; then
  remember_dir "$sysusersdir"
  install -m 0644 "$here/systemd/gpuwhy.sysusers" "$sysusersdir/gpuwhy.conf"
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$sysusersdir/gpuwhy.conf" && say "users gpuwhy and gpuwhy-probes (systemd-sysusers $sysusersdir/gpuwhy.conf)"
  else
    getent group gpuwhy >/dev/null || groupadd --system gpuwhy
    getent group gpuwhy-probes >/dev/null || groupadd --system gpuwhy-probes
    id -u gpuwhy >/dev/null 2>&1 || useradd --system -g gpuwhy -d /var/lib/gpuwhy -s /usr/sbin/nologin gpuwhy
    id -u gpuwhy-probes >/dev/null 2>&1 || useradd --system -g gpuwhy-probes -d / -s /usr/sbin/nologin gpuwhy-probes
    getent group systemd-journal >/dev/null && usermod -a -G systemd-journal gpuwhy
    usermod -a -G gpuwhy gpuwhy-probes
    say "users gpuwhy and gpuwhy-probes (useradd)"
  fi
  have_users=1
else
  say "--root $R: not creating users gpuwhy and gpuwhy-probes (the host's would be needed: $here/systemd/gpuwhy.sysusers)"
fi

remember_dir "$etc"
if [ -e "$etc/config.toml" ]; then
  say "kept $etc/config.toml"
else
  {
    echo "# gpuwhy settings: every one is listed by \`gpuwhy settings\` and in docs/settings.md."
    echo "# The services read this file; GPUWHY_* variables override it."
    echo "[store]"
    echo "path = \"$data/gpuwhy.db\""
    echo "[bus]"
    echo "endpoint = \"ipc://$run/bus.sock\""
    echo "[web]"
    echo "host = \"127.0.0.1\""
    echo "port = 8000"
  } > "$etc/config.toml"
  say "wrote $etc/config.toml"
fi
chmod 0640 "$etc/config.toml"
[ "$have_users" -eq 1 ] && chgrp gpuwhy "$etc/config.toml"

remember_dir "$data"
chmod 0700 "$data"
[ "$have_users" -eq 1 ] && chown gpuwhy:gpuwhy "$data"
say "data directory $data"

# systemd makes /run/gpuwhy (RuntimeDirectory=); under --root the services run by hand
[ -n "$R" ] && remember_dir "$run"

remember_dir "$unitdir"
for unit in "${units[@]}"; do
  sed -e "s#/opt/gpuwhy/venv/#$venv/#g" -e "s#/etc/gpuwhy/config.toml#$etc/config.toml#g" \
    "$here/systemd/$unit" > "$unitdir/$unit.tmp"
  chmod 0644 "$unitdir/$unit.tmp"
  mv "$unitdir/$unit.tmp" "$unitdir/$unit"
  say "installed $unitdir/$unit"
done

if [ -f "$here/systemd/gpuwhy.catalog" ]; then
  remember_dir "$catalogdir"
  install -m 0644 "$here/systemd/gpuwhy.catalog" "$catalogdir/gpuwhy.catalog"
  say "installed $catalogdir/gpuwhy.catalog"
  if [ -z "$R" ] && command -v journalctl >/dev/null; then
    journalctl --update-catalog && say "journalctl --update-catalog"
  fi
else
  say "no systemd/gpuwhy.catalog in this checkout: no journald catalog installed"
fi
printf '%s\n' "${created_dirs[@]}" | awk '!seen[$0]++' > "$manifest"

if systemd_running; then
  systemctl daemon-reload
  systemctl enable gpuwhy.service gpuwhy-probes.service gpuwhy-stacks.service
  systemctl restart gpuwhy.service gpuwhy-probes.service gpuwhy-stacks.service
  say "enabled and (re)started gpuwhy.service, gpuwhy-probes.service and gpuwhy-stacks.service"
  "$venv/bin/gpuwhy" --config "$etc/config.toml" status || true
else
  say "systemd is not PID 1${R:+ (--root $R)}: not starting anything. On a systemd host this step runs:"
  say "  systemctl daemon-reload && systemctl enable --now gpuwhy.service gpuwhy-probes.service gpuwhy-stacks.service"
  say "to run the three services by hand instead (as root):"
  say "  $(sed -n 's/^ExecStart=//p' "$unitdir/gpuwhy.service") &"
  say "  $(sed -n 's/^ExecStart=//p' "$unitdir/gpuwhy-probes.service") &"
  say "  $(sed -n 's/^ExecStart=//p' "$unitdir/gpuwhy-stacks.service") &"
fi
say "checking this host (gpuwhy check-env):"
"$venv/bin/gpuwhy" --config "$etc/config.toml" check-env | sed 's/^/  /' || true
say "done: web view on http://127.0.0.1:8000 once running; \`$venv/bin/gpuwhy --config $etc/config.toml status\` says how it is"
