"""Settings table, TOML config file and GPUWHY_* environment overrides."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpuwhy.errors import ConfigError
from gpuwhy.files import FileRefused, kind_of, read_regular


@dataclass(frozen=True)
class Setting:
    """One configurable value: dotted name (TOML section.key), default, env override, help."""

    name: str
    default: Any
    env: str
    help: str

    @property
    def type(self) -> type:
        return type(self.default)


# The probes' kernel maps a setting sizes: a map is created whole, preallocated.
MIN_MAP_ENTRIES, MAX_MAP_ENTRIES = 256, 1 << 20
MAP_SIZES = ("probes.max_threads", "probes.max_call_stats")
# The values of the settings that name a choice. The parts that act on them define the same
# tuples (gpuwhy.probes.gpu.select.SOURCE_NAMES, ...klog.source.BACKENDS and STARTS,
# ...gpu.sim.SCENARIOS); tests/test_config_allowed.py holds them equal.
GPU_SOURCES = ("auto", "dcgm", "nvml", "dcgm-exporter", "sim")
SIM_SCENARIOS = ("healthy-training", "input-starved", "pageable-h2d", "pcie-allreduce",
                 "power-cap", "thermal-throttle", "xid-79", "gpu-reset",
                 "fabric-manager-down", "mig-idle-instance")
KLOG_BACKENDS = ("auto", "journald", "kmsg", "file")
KLOG_STARTS = ("boot", "all", "now")
# The environment variables the shipped rules read with env("NAME") (R08): the probes
# record these of every process by default; tests/test_config.py holds the list complete.
SHIPPED_ENVIRONMENT = ("CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "NCCL_P2P_DISABLE",
                       "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE")
MAX_ENVIRONMENT_NAMES = 64     # each one is searched for in every process's environment
MAX_ENVIRONMENT_NAME = 128
# A long-lived connection's SQLite page cache, KiB (SQLite's own default is 2,000).
MIN_CACHE_KIB, MAX_CACHE_KIB = 64, 1 << 20

SETTINGS: tuple[Setting, ...] = (
    Setting("store.path", "/var/lib/gpuwhy/gpuwhy.db", "GPUWHY_DB",
            "SQLite database file (WAL mode; the -wal and -shm files sit beside it)"),
    Setting("bus.endpoint", "ipc:///run/gpuwhy/bus.sock", "GPUWHY_BUS",
            "ZeroMQ endpoint the correlator binds and every source connects to: ipc://PATH, "
            "or tcp://HOST:PORT on loopback (elsewhere only with bus.allow_remote)"),
    Setting("bus.hwm", 10000, "GPUWHY_BUS_HWM",
            "high-water mark (messages) of each bus socket; past it messages drop, counted"),
    Setting("bus.allow_remote", False, "GPUWHY_BUS_ALLOW_REMOTE",
            "let bus.endpoint be a tcp:// address other than loopback. The bus has no "
            "authentication and no encryption: anyone who reaches that port can publish "
            "events (fake Xids, fake GPU samples) and read every process's command line; "
            "leave it off unless a firewall or a private network guards the port"),
    Setting("web.host", "127.0.0.1", "GPUWHY_HOST",
            "address the web view binds; anything but loopback needs web.auth_token"),
    Setting("web.port", 8000, "GPUWHY_PORT", "TCP port of the web view"),
    Setting("web.refresh_seconds", 2.0, "GPUWHY_REFRESH",
            "how often the web pages refresh their data"),
    Setting("probes.device_glob", "/dev/nvidia*", "GPUWHY_DEVICE_GLOB",
            "paths treated as NVIDIA device files (tests point it at ordinary files)"),
    Setting("probes.poll_interval", 1.0, "GPUWHY_POLL_INTERVAL",
            "seconds between reads of the in-kernel ioctl counters"),
    Setting("probes.proc_root", "/proc", "GPUWHY_PROC_ROOT",
            "where procfs is mounted (containers mount the host's elsewhere)"),
    Setting("probes.sys_root", "/sys", "GPUWHY_SYS_ROOT",
            "where sysfs is mounted: the NUMA nodes of CPUs and of GPUs"),
    Setting("probes.environment", ",".join(SHIPPED_ENVIRONMENT), "GPUWHY_ENVIRONMENT",
            "comma-separated environment variables the probes record of each process they "
            "see (rules read them with env(\"NAME\"); others are never read), at most "
            f"{MAX_ENVIRONMENT_NAMES}; default: those the shipped rules read"),
    Setting("probes.driver_version", "", "GPUWHY_DRIVER_VERSION",
            "the NVIDIA driver's version, for the UVM calls whose layout changed; empty: "
            "read from {probes.sys_root}/module/nvidia/version (none there: the newest)"),
    Setting("correlator.batch_size", 500, "GPUWHY_BATCH_SIZE",
            "events written to the store in one transaction at most"),
    Setting("correlator.flush_interval", 1.0, "GPUWHY_FLUSH_INTERVAL",
            "seconds a batch waits before it is written even when not full: the sources' "
            "per-second figures go in one transaction a second (one with an event that may "
            "open an incident is written 50 ms after it)"),
    Setting("log.level", "info", "GPUWHY_LOG_LEVEL", "debug, info, warning or error"),
    # --- probes settings ---
    Setting("probes.slow_call_ms", 10.0, "GPUWHY_SLOW_CALL_MS",
            "a driver call slower than this is reported on its own"),
    Setting("probes.big_alloc_bytes", 1 << 30, "GPUWHY_BIG_ALLOC_BYTES",
            "an allocation or mapping at least this large is reported on its own"),
    Setting("probes.error_events_per_second", 50, "GPUWHY_ERROR_EVENTS_PER_SECOND",
            "failed or large calls reported one by one a second, host-wide (the rest are counted)"),
    Setting("probes.repeat_seconds", 10.0, "GPUWHY_REPEAT_SECONDS",
            "a failed or large call like one just reported (same process, file, command, "
            "sub-operation and result) is reported again after this long at most; every call "
            "is counted in the statistics (0: report each)"),
    Setting("probes.sched", True, "GPUWHY_SCHED",
            "trace the scheduler for processes that use the GPU, their threads and workers"),
    Setting("probes.max_threads", 16384, "GPUWHY_MAX_THREADS",
            "threads (of GPU processes and their workers) the scheduler probe follows at most: "
            "the size of its kernel map, locked memory whose every slot each flush walks. "
            "Past it new threads are not followed, counted as dropped_watched_map_full "
            f"({MIN_MAP_ENTRIES} to {MAX_MAP_ENTRIES})"),
    Setting("probes.max_call_stats", 16384, "GPUWHY_MAX_CALL_STATS",
            "driver-call statistics (one per process, file, command and sub-operation) the "
            "kernel keeps at most: the size of its map, locked memory whose every slot each "
            "flush walks. Past it a new one is not kept, counted as stats_map_full "
            f"({MIN_MAP_ENTRIES} to {MAX_MAP_ENTRIES})"),
    # --- cuda settings ---
    Setting("probes.cuda_uprobes", False, "GPUWHY_CUDA_UPROBES",
            "attach uprobes to the CUDA libraries (libcuda, libcudart) of GPU processes: "
            "launches, copies, syncs, allocations (opt-in; see probes/README.md)"),
    Setting("probes.cuda_allowed_build_ids", "", "GPUWHY_CUDA_ALLOWED_BUILD_IDS",
            "comma-separated build ids of the CUDA libraries uprobes may be attached to; "
            "empty allows none, * allows any (`gpuwhy cuda allow-build-id PATH` prints one)"),
    Setting("probes.cuda_control_dir", "/run/gpuwhy", "GPUWHY_CUDA_CONTROL_DIR",
            "directory of the CUDA uprobes' kill switch (cuda.disabled) and state file"),
    Setting("probes.cuda_slow_call_ms", 10.0, "GPUWHY_CUDA_SLOW_CALL_MS",
            "a CUDA call (sync, copy, allocation, ...) slower than this is reported on its own"),
    Setting("probes.cuda_big_copy_bytes", 256 << 20, "GPUWHY_CUDA_BIG_COPY_BYTES",
            "a CUDA copy or allocation at least this large is reported on its own"),
    Setting("probes.cuda_max_overhead_pct", 5.0, "GPUWHY_CUDA_MAX_OVERHEAD_PCT",
            "estimated uprobe cost, in % of one CPU, past which a process's CUDA uprobes are "
            "detached"),
    Setting("probes.cuda_max_errors_per_second", 100, "GPUWHY_CUDA_MAX_ERRORS",
            "probe errors (lost records, full maps, unreadable arguments) per second past "
            "which every CUDA uprobe is detached and the kill switch set"),
    # --- GPU source settings ---
    Setting("gpu.source", "auto", "GPUWHY_GPU_SOURCE",
            "GPU counter source: auto (DCGM, then NVML, then dcgm-exporter if a URL is set, "
            "then the simulator), dcgm, nvml, dcgm-exporter or sim"),
    Setting("gpu.interval", 1.0, "GPUWHY_GPU_INTERVAL",
            "seconds between GPU samples (0.1 at least)"),
    Setting("gpu.dcgm_host", "localhost:5555", "GPUWHY_DCGM_HOST",
            "address:port of the nv-hostengine to connect to"),
    Setting("gpu.dcgm_embedded", "auto", "GPUWHY_DCGM_EMBEDDED",
            "auto: start an embedded DCGM hostengine when none answers and no nv-hostengine "
            "or dcgm-exporter process runs (two hostengines can deadlock the driver); never"),
    Setting("gpu.dcgm_bindings",
            "/usr/share/datacenter-gpu-manager-4/bindings/python3:/usr/local/dcgm/bindings/python3",
            "GPUWHY_DCGM_BINDINGS",
            "directories (colon-separated) searched for DCGM's Python bindings (pydcgm)"),
    Setting("gpu.exporter_url", "", "GPUWHY_EXPORTER_URL",
            "dcgm-exporter metrics URL, e.g. http://localhost:9400/metrics (empty: not used)"),
    Setting("gpu.exporter_timeout", 5.0, "GPUWHY_EXPORTER_TIMEOUT",
            "seconds one dcgm-exporter scrape may take in all, from connect to the last byte "
            "of the body; a slower one fails with 'took longer than'"),
    Setting("engines.endpoints", "", "GPUWHY_ENGINE_ENDPOINTS",
            "inference-engine /metrics URLs on loopback scraped besides the engines found "
            "in /proc, comma-separated, each URL or ENGINE=URL (vllm, sglang, tgi, triton)"),
    Setting("gpu.sim_gpus", 2, "GPUWHY_SIM_GPUS", "number of simulated GPUs"),
    Setting("gpu.sim_model", "NVIDIA H100 80GB HBM3", "GPUWHY_SIM_MODEL",
            "model name of the simulated GPUs (H100, A100 and L4 have their own limits)"),
    Setting("gpu.sim_scenario", "healthy-training", "GPUWHY_SIM_SCENARIO",
            "simulator scenario: healthy-training, input-starved, pageable-h2d, "
            "pcie-allreduce, power-cap, thermal-throttle, xid-79, gpu-reset, "
            "fabric-manager-down or mig-idle-instance (80 GB models only)"),
    Setting("gpu.sim_seed", 0, "GPUWHY_SIM_SEED", "seed of the simulator (same seed, same data)"),
    Setting("gpu.sim_event_after", 30.0, "GPUWHY_SIM_EVENT_AFTER",
            "scenario seconds before the simulated Xid 79, GPU reset or thermal slowdown"),
    Setting("gpu.sim_event_file", "", "GPUWHY_SIM_EVENT_FILE",
            "when set, the simulated event also comes as soon as this file exists (how "
            "`gpuwhy demo`'s stand-in reset strikes the simulated GPU)"),
    # --- kernel log and cron settings ---
    Setting("klog.backend", "auto", "GPUWHY_KLOG_BACKEND",
            "where the kernel log is read: auto (journald, else /dev/kmsg, else klog.file), "
            "journald, kmsg or file"),
    Setting("klog.journal_path", "", "GPUWHY_KLOG_JOURNAL",
            "journal directory or file to read instead of the system journal (e.g. the "
            "host's /var/log/journal mounted in a container)"),
    Setting("klog.kmsg_path", "/dev/kmsg", "GPUWHY_KLOG_KMSG",
            "kernel ring buffer device read when journald is absent; with journald, the wake-up "
            "for new kernel lines when gpuwhy-kmsg.socket passes none"),
    Setting("klog.kmsg_socket", "", "GPUWHY_KLOG_KMSG_SOCKET",
            "unix socket where `gpuwhy probes` lends /dev/kmsg to the kernel-log source, "
            "for a service that may not open it and has no gpuwhy-kmsg.socket (a Kubernetes "
            "pod); empty: not lent"),
    Setting("klog.file", "/var/log/kern.log", "GPUWHY_KLOG_FILE",
            "kernel log file tailed when neither journald nor /dev/kmsg can be read"),
    Setting("klog.test_lines", False, "GPUWHY_KLOG_TEST_LINES",
            "take the lines gpuwhy's own test suite writes into the kernel log as root "
            "(marked \"[gpuwhy test line, not a GPU error]\"); off, they are counted "
            "(test_lines in `gpuwhy status`) and otherwise ignored, so a host that ran the "
            "suite has no GPU faults from it. The driver's own lines are never ignored"),
    Setting("klog.start", "boot", "GPUWHY_KLOG_START",
            "where the kernel-log and cron sources' first run (no stored cursor) starts in "
            "the journal: boot (this boot's start), all (everything kept) or now"),
    Setting("cron.etc", "/etc", "GPUWHY_CRON_ETC",
            "directory holding crontab and cron.d/ (containers mount the host's elsewhere)"),
    Setting("cron.spool", "/var/spool/cron/crontabs", "GPUWHY_CRON_SPOOL",
            "directory of the users' crontabs"),
    Setting("cron.unit_dirs",
            "/etc/systemd/system:/run/systemd/system:/lib/systemd/system:/usr/lib/systemd/system",
            "GPUWHY_CRON_UNIT_DIRS", "colon-separated systemd unit directories searched for "
            "timers, first one wins"),
    Setting("cron.rescan_interval", 60.0, "GPUWHY_CRON_RESCAN",
            "seconds between looks at the cron and timer files; the schedule is read again "
            "when they changed or one of its runs came due, and at least hourly"),
    Setting("cron.journal_path", "", "GPUWHY_CRON_JOURNAL",
            "journal directory or file to read CRON lines from instead of the system journal"),
    # --- correlator settings ---
    Setting("correlator.lag_seconds", 5.0, "GPUWHY_LAG",
            "how late an event may arrive and still land in its incident's chain: chains are "
            "rebuilt until this long after their last event"),
    Setting("correlator.pending_max", 10000, "GPUWHY_PENDING_MAX",
            "incidents held open for late events at most (past it the oldest settle, counted)"),
    Setting("correlator.stall_seconds", 5.0, "GPUWHY_STALL_SECONDS",
            "seconds a bound, living process's GPU must stay near idle to be a process stall"),
    Setting("correlator.stall_util_pct", 5.0, "GPUWHY_STALL_UTIL",
            "GPU utilisation (%) at or under which a GPU counts as near idle"),
    Setting("correlator.dedup_seconds", 60.0, "GPUWHY_DEDUP_SECONDS",
            "an incident nothing else resolves (an Xid whose action is none) is resolved "
            "('timeout') this long after it was last seen"),
    Setting("correlator.reopen_seconds", 3600.0, "GPUWHY_REOPEN_SECONDS",
            "a repeat this soon after its incident was resolved reopens it; later, it is a "
            "new incident"),
    Setting("correlator.alerts", True, "GPUWHY_ALERTS",
            "log each new incident to the systemd journal (MESSAGE_ID per kind)"),
    Setting("correlator.url", "http://127.0.0.1:8000", "GPUWHY_URL",
            "base URL of the web view, used for the incident links in alerts"),
    # --- Alertmanager push settings ---
    Setting("alertmanager.url", "", "GPUWHY_ALERTMANAGER_URL",
            "Alertmanager to push open incidents to, e.g. http://alertmanager:9093 (its "
            "/api/v2/alerts); empty: no push"),
    Setting("alertmanager.resend_seconds", 60.0, "GPUWHY_ALERTMANAGER_RESEND",
            "seconds between re-sends of each open incident (1 to 3600); an alert not re-sent "
            "for 4 of these ends by itself"),
    Setting("alertmanager.timeout", 5.0, "GPUWHY_ALERTMANAGER_TIMEOUT",
            "seconds one push may take (0.1 to 60) before it counts as failed and is retried"),
    # --- OTLP export (gpuwhy/app/otlp.py; on when OTEL_EXPORTER_OTLP_*ENDPOINT is set) ---
    Setting("otlp.interval", 10.0, "GPUWHY_OTLP_INTERVAL",
            "seconds between OTLP exports of the /metrics families (1 to 3600), when an "
            "OTEL_EXPORTER_OTLP_ENDPOINT is set"),
    # --- the fleet's Prometheus, asked by `gpuwhy mcp`'s fleet tool (docs/mcp.md) ---
    Setting("fleet.prometheus_url", "", "GPUWHY_FLEET_PROMETHEUS_URL",
            "base URL of the Prometheus that scrapes the fleet, e.g. http://prometheus:9090 "
            "(its /api/v1/query): the MCP fleet tool's PromQL goes there; empty: that tool "
            "answers that no fleet Prometheus is configured"),
    Setting("fleet.prometheus_timeout", 10.0, "GPUWHY_FLEET_PROMETHEUS_TIMEOUT",
            "seconds one fleet query may take in all (0.1 to 60) before it is given up"),
    # --- rules settings ---
    Setting("rules.interval", 10.0, "GPUWHY_RULES_INTERVAL",
            "seconds between evaluations of the rules (a rule's own 'every' can be longer)"),
    Setting("rules.paths", "", "GPUWHY_RULES_PATHS",
            "extra rule files or folders of *.rules files, colon-separated"),
    Setting("rules.builtin", True, "GPUWHY_RULES_BUILTIN", "load the rules shipped with gpuwhy"),
    Setting("rules.shadow", False, "GPUWHY_RULES_SHADOW",
            "every rule in shadow mode: findings are recorded, never alerted"),
    # --- store settings ---
    Setting("store.raw_days", 7.0, "GPUWHY_RAW_DAYS",
            "days raw GPU samples and per-second rows are kept (once rolled up)"),
    Setting("store.rollup_days", 90.0, "GPUWHY_ROLLUP_DAYS",
            "days one-minute rollups (min/mean/max/p95) of the GPU samples are kept"),
    Setting("store.event_days", 365.0, "GPUWHY_EVENT_DAYS",
            "days events, closed incidents, kernel-log and cron rows and exited processes "
            "are kept"),
    Setting("store.max_mb", 10240.0, "GPUWHY_STORE_MAX_MB",
            "size cap of the database in MB: past it the oldest raw samples go first"),
    Setting("store.warn_fraction", 0.8, "GPUWHY_STORE_WARN_FRACTION",
            "share of the size cap at which the store warns (health and log)"),
    Setting("store.maintenance_interval", 60.0, "GPUWHY_MAINTENANCE_INTERVAL",
            "seconds between the writer's rollup, retention and size checks"),
    Setting("store.prune_batch", 500, "GPUWHY_PRUNE_BATCH",
            "rows deleted per retention transaction (small: the writer waits for each)"),
    Setting("store.cache_kib", 2000, "GPUWHY_STORE_CACHE_KIB",
            "KiB of SQLite page cache of each of the service's long-lived connections (the "
            "writer's, the rules' reader's; 64 to 1048576): less saves memory and costs CPU, "
            "pages read again from the kernel's cache (512: about 1.4 MB less, 190 reads a "
            "second more with 8 GPUs)"),
    # --- web settings ---
    Setting("web.auth", False, "ENABLE_AUTH",
            "require the token (web.auth_token) for every page and API call; on by itself "
            "when a token is set. Binding anything but loopback needs it"),
    Setting("web.auth_token", "", "GPUWHY_AUTH_TOKEN",
            "the web view's shared secret: sent as 'Authorization: Bearer TOKEN' or typed "
            "into the login form; changes (rules) always need it"),
    Setting("web.vendor_path", "", "GPUWHY_VENDOR_PATH",
            "folder of the npm packages the pages use (echarts); empty: node_modules/ beside "
            "the source tree (scripts/setup.sh installs it there)"),
    Setting("web.max_points", 720, "GPUWHY_MAX_POINTS",
            "points per chart series at most: longer ranges are averaged into buckets"),
    Setting("web.allowed_hosts", "", "GPUWHY_ALLOWED_HOSTS",
            "comma-separated names (or addresses) the web view answers to besides localhost, "
            "127.0.0.1, [::1], web.host and correlator.url's host; a leading dot allows "
            "subdomains. Any other Host header gets 400 (stops DNS rebinding)"),
    Setting("web.max_connections", 32, "GPUWHY_MAX_CONNECTIONS",
            "requests the web view serves at once (its worker threads, 1 to 1024); as many "
            "more wait for one, past that a client gets 503"),
    Setting("web.hostname", "", "GPUWHY_HOSTNAME",
            "the Hostname label of /metrics (dcgm-exporter's label name, to join both); empty: "
            "the host's name (in a pod set it to the node's name, spec.nodeName)"),
    Setting("web.metrics_owners", 20, "GPUWHY_METRICS_OWNERS",
            "owners (user, pod, container) with their own idle-while-held series on /metrics; "
            "the rest are summed under owner \"other\""),
    # --- checks and reports settings ---
    Setting("checks.progress_seconds", 10.0, "GPUWHY_CHECK_PROGRESS",
            "seconds between the progress lines (on stderr) of `gpuwhy check` and "
            "`gpuwhy baseline` watches"),
    Setting("checks.settle_seconds", 5.0, "GPUWHY_CHECK_SETTLE",
            "seconds a watch waits, once over, for the store to receive its last samples"),
    Setting("checks.threshold", 0.1, "GPUWHY_BASELINE_THRESHOLD",
            "relative change past which `gpuwhy baseline compare` flags a figure that moved "
            "in its bad direction"),
    Setting("checks.chromium", "/usr/bin/chromium", "GPUWHY_CHROMIUM",
            "headless Chromium used by `gpuwhy report --pdf`"),
    Setting("checks.pdf_timeout", 60.0, "GPUWHY_PDF_TIMEOUT",
            "seconds Chromium may take to print a report to PDF"),
    # --- Python stack sampler (docs/decisions/0018-python-stacks-sampler.md) ---
    Setting("stacks.enabled", True, "GPUWHY_STACKS",
            "sample the Python stacks of the processes on a GPU whose answer is host-side "
            "(py-spy, never pausing them) for a while, and say where they spend their time"),
    Setting("stacks.interval_ms", 100, "GPUWHY_STACKS_INTERVAL_MS",
            "milliseconds between two samples of a process's Python stacks"),
    Setting("stacks.window_seconds", 30.0, "GPUWHY_STACKS_WINDOW",
            "seconds of sampling after a host-side answer forms (ends sooner when it clears)"),
    Setting("stacks.targets_path", "/run/gpuwhy/stack-targets.json", "GPUWHY_STACKS_TARGETS",
            "file through which the service names the processes the stack sampler samples"),
)

SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
LOG_LEVELS = ("debug", "info", "warning", "error")


class Config(Mapping[str, Any]):
    """Read-only settings, looked up by dotted name: ``config["web.port"]``."""

    def __init__(self, values: Mapping[str, Any], source: str = "defaults"):
        self._values = dict(values)
        self.source = source

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):  # noqa: ANN204
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def replace(self, overrides: Mapping[str, Any]) -> Config:
        """A copy with some settings changed: ``config.replace({"web.port": 8001})``."""
        values = dict(self._values)
        for name, value in overrides.items():
            if name not in SETTINGS_BY_NAME:
                raise ConfigError("unknown setting", source="override", key=name)
            values[name] = _coerce(SETTINGS_BY_NAME[name], value, "override")
        check_together(values, "override")
        return Config(values, self.source)


MAX_CONFIG_BYTES = 1 << 20     # a settings file is a few kB; more is a mistake or an attack
MAX_KEY_PARTS = 8
MAX_INT = (1 << 63) - 1         # what SQLite, ZeroMQ and the C structs downstream can hold
MAX_WEB_CONNECTIONS = 1024      # a worker thread each: more is a typo, not a host
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HEX = re.compile(r"[0-9a-fA-F]{2,128}")
_VERSION = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){0,3}")
# upper case, as the rules' env("NAME") must be: a lower-case name is a typo here
_ENV_NAME = re.compile(rf"[A-Z_][A-Z0-9_]{{0,{MAX_ENVIRONMENT_NAME - 1}}}")
# web.host reaches the server's bind() and http.client's request line: a name or an address
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _valid_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value.strip("[]") if value.startswith("[") else value)
        return True
    except ValueError:
        return len(value) <= 253 and _HOSTNAME.fullmatch(value) is not None


def bad_http_url(value: str) -> str | None:
    """Why ``value`` is not a plain http(s) URL of a server (None when it is one): what a
    scrape or a push may reach (never file://, ftp://, a bare word)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname or not _valid_host(parts.hostname) or port == 0:
        return "no valid host in the URL"
    if parts.username is not None or parts.query or parts.fragment:
        return "a URL without credentials, query or fragment expected"
    return None


def is_loopback(host: str) -> bool:
    """``host`` names this machine only: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Allowed:
    """The values a setting takes beyond its type: ``text`` says which (in errors and in
    docs/settings.md), ``why_not(value)`` why one is refused (None: it is allowed)."""

    text: str
    why_not: Callable[[Any], str | None]


def _range(low: float, high: float, unit: str = "") -> Allowed:
    def why_not(value: float) -> str | None:
        return None if low <= value <= high else "out of range"
    return Allowed(f"{_number(low)} to {_number(high)}{unit}", why_not)


def _number(value: float) -> str:
    """``value`` as a person writes it: 10000000, not 1e+07."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _one_of(*values: str) -> Allowed:
    return Allowed(f"one of {', '.join(values)}",
                   lambda value: None if value in values else "unknown value")


def _path(optional: bool = False) -> Allowed:
    def why_not(value: str) -> str | None:
        if not value:
            return None if optional else "empty"
        return None if len(value) <= 4096 else "longer than 4096 characters"
    return Allowed("a path" + (" or empty (not used)" if optional else ""), why_not)


def _file_to_create(value: str) -> str | None:
    """A file path SQLite can create or open: not empty, not a folder, not a FIFO or device."""
    if not value or value.endswith("/"):
        return "empty or a folder's name"
    try:
        mode = os.stat(value).st_mode
    except OSError:
        return None                      # not there yet: created at start
    return None if stat.S_ISREG(mode) else f"there is {kind_of(mode)} at that path"


def _url(optional: bool) -> Allowed:
    def why_not(value: str) -> str | None:
        return None if optional and not value else bad_http_url(value)
    return Allowed("an http:// or https:// URL" + (" or empty" if optional else ""), why_not)


def _host_port(value: str) -> str | None:
    """Why ``value`` is not HOST, [IPv6] or HOST:PORT (None when it is)."""
    if _valid_host(value[1:-1] if value.startswith("[") and value.endswith("]") else value):
        return None
    host, colon, port = value.rpartition(":") if ":" in value else (value, "", "")
    if not host or not _valid_host(host.strip("[]")):
        return "no valid host"
    if colon and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "port out of range"
    return None


def _bus_endpoint(value: str) -> str | None:
    """Why ``value`` is no bus endpoint; loopback is checked with bus.allow_remote later."""
    scheme, sep, rest = value.partition("://")
    if scheme == "ipc" and sep:
        return None if rest else "an ipc:// endpoint needs a path"
    if scheme != "tcp" or not sep:
        return "expected ipc://PATH or tcp://HOST:PORT"
    host, colon, port = rest.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "a tcp:// endpoint needs a port from 1 to 65535"
    if host != "*" and not _valid_host(host.strip("[]")):
        return "no valid host"
    return None


def _build_ids(value: str) -> str | None:
    items = [item.strip() for item in value.split(",") if item.strip()]
    bad = [item for item in items if item != "*" and not _HEX.fullmatch(item)]
    return f"not a build id: {_short(bad[0])}" if bad else None


def _environment(value: str) -> str | None:
    """Why the comma-separated environment variable names are not all valid."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if len(items) > MAX_ENVIRONMENT_NAMES:
        return f"{len(items)} names, more than {MAX_ENVIRONMENT_NAMES}"
    bad = [item for item in items if not _ENV_NAME.fullmatch(item)]
    return f"not a variable name: {_short(bad[0])}" if bad else None


def environment_names(value: str) -> frozenset[str]:
    """The names of a ``probes.environment`` value (checked by its loading)."""
    return frozenset(item.strip() for item in value.split(",") if item.strip())


def _host_list(value: str) -> str | None:
    """Why the comma-separated names, addresses or NAME:PORTs are not all valid."""
    items = [item.strip().removeprefix(".") for item in value.split(",") if item.strip()]
    bad = [item for item in items if _host_port(item) is not None]
    return f"not a host name or an address: {_short(bad[0])}" if bad else None


DAY = 86400.0
# What each setting allows beyond its type (every number is also finite and from 0 to
# MAX_INT). Each one is here: tests/test_config_allowed.py fails on a setting without an
# entry. Ranges bound what a typo can cost: an interval of 0 spins a core, a count of 2^63
# allocates until the host runs out, a high-water mark of 0 is no limit at all.
SECONDS_TICK = _range(0.01, 3600, " seconds")
ALLOWED: dict[str, Allowed] = {
    "store.path": Allowed("a path to a regular file (created when missing)", _file_to_create),
    "bus.endpoint": Allowed("ipc://PATH or tcp://HOST:PORT (loopback unless bus.allow_remote)",
                            _bus_endpoint),
    "bus.hwm": _range(1, 10_000_000, " messages"),
    "bus.allow_remote": Allowed("true or false", lambda value: None),
    "web.host": Allowed("a host name or an IP address",
                        lambda value: None if _valid_host(value) else "not a host name or "
                        "an IP address"),
    "web.port": _range(0, 65535),
    "web.refresh_seconds": _range(0.2, 3600, " seconds"),
    "probes.device_glob": _path(),
    "probes.poll_interval": _range(0.01, 600, " seconds"),
    "probes.proc_root": _path(),
    "probes.sys_root": _path(),
    "probes.environment": Allowed(
        f"comma-separated names of the form [A-Z_][A-Z0-9_]*, at most "
        f"{MAX_ENVIRONMENT_NAMES}, or empty", _environment),
    "probes.driver_version": Allowed(
        "a driver version (digits and dots, e.g. 580.95.05) or empty",
        lambda value: None if not value or _VERSION.fullmatch(value) else "not a version"),
    "correlator.batch_size": _range(1, 1_000_000, " events"),
    "correlator.flush_interval": _range(0.01, 60, " seconds"),
    "log.level": _one_of(*LOG_LEVELS),
    "probes.slow_call_ms": _range(0, 3_600_000, " ms"),
    "probes.big_alloc_bytes": _range(0, 1 << 50, " bytes"),
    "probes.error_events_per_second": _range(0, 10_000_000),
    "probes.repeat_seconds": _range(0, DAY, " seconds"),
    "probes.sched": Allowed("true or false", lambda value: None),
    "probes.max_threads": _range(MIN_MAP_ENTRIES, MAX_MAP_ENTRIES),
    "probes.max_call_stats": _range(MIN_MAP_ENTRIES, MAX_MAP_ENTRIES),
    "probes.cuda_uprobes": Allowed("true or false", lambda value: None),
    "probes.cuda_allowed_build_ids": Allowed(
        "comma-separated hexadecimal build ids, * or empty", _build_ids),
    "probes.cuda_control_dir": _path(),
    "probes.cuda_slow_call_ms": _range(0, 3_600_000, " ms"),
    "probes.cuda_big_copy_bytes": _range(0, 1 << 50, " bytes"),
    "probes.cuda_max_overhead_pct": _range(0, 1_000_000, " %"),
    "probes.cuda_max_errors_per_second": _range(0, 10_000_000),
    "gpu.source": _one_of(*GPU_SOURCES),
    "gpu.interval": _range(0.1, 3600, " seconds"),
    "gpu.dcgm_host": Allowed("HOST or HOST:PORT", _host_port),
    "gpu.dcgm_embedded": _one_of("auto", "never"),
    "gpu.dcgm_bindings": _path(optional=True),
    "gpu.exporter_url": _url(optional=True),
    "gpu.exporter_timeout": _range(0.1, 300, " seconds"),
    "engines.endpoints": Allowed("comma-separated [ENGINE=]http:// URLs, or empty", lambda v: next(
        (why for e in v.split(",") if e.strip() and (why := bad_http_url(
            e.split("=", 1)[1].strip() if "=" in e.split("://")[0] else e.strip()))), None)),
    "gpu.sim_gpus": _range(1, 256, " GPUs"),
    "gpu.sim_model": Allowed("a model name of 1 to 96 characters",
                             lambda value: None if 0 < len(value) <= 96 else "empty or too long"),
    "gpu.sim_scenario": _one_of(*SIM_SCENARIOS),
    "gpu.sim_seed": _range(0, MAX_INT),
    "gpu.sim_event_after": _range(0, 365 * DAY, " seconds"),
    "gpu.sim_event_file": _path(optional=True),
    "klog.backend": _one_of(*KLOG_BACKENDS),
    "klog.journal_path": _path(optional=True),
    "klog.kmsg_path": _path(),
    "klog.kmsg_socket": Allowed(
        "a unix socket path of at most 107 bytes, or empty",
        lambda value: None if len(value.encode()) <= 107 else "longer than a unix socket "
        "path may be (107 bytes)"),
    "klog.file": _path(),
    "klog.start": _one_of(*KLOG_STARTS),
    "cron.etc": _path(),
    "cron.spool": _path(),
    "cron.unit_dirs": _path(optional=True),
    "cron.rescan_interval": _range(0.1, DAY, " seconds"),
    "cron.journal_path": _path(optional=True),
    "correlator.lag_seconds": _range(0, 3600, " seconds"),
    "correlator.pending_max": _range(1, 10_000_000, " incidents"),
    "correlator.stall_seconds": _range(0.1, DAY, " seconds"),
    "correlator.stall_util_pct": _range(0, 100, " %"),
    "correlator.dedup_seconds": _range(0, 30 * DAY, " seconds"),
    "correlator.reopen_seconds": _range(0, 365 * DAY, " seconds"),
    "correlator.alerts": Allowed("true or false", lambda value: None),
    "correlator.url": _url(optional=False),
    "alertmanager.url": _url(optional=True),
    "alertmanager.resend_seconds": _range(1, 3600, " seconds"),
    "alertmanager.timeout": _range(0.1, 60, " seconds"),
    "otlp.interval": _range(1, 3600, " seconds"),
    "fleet.prometheus_url": _url(optional=True),
    "fleet.prometheus_timeout": _range(0.1, 60, " seconds"),
    "rules.interval": _range(0.1, DAY, " seconds"),
    "rules.paths": _path(optional=True),
    "rules.builtin": Allowed("true or false", lambda value: None),
    "rules.shadow": Allowed("true or false", lambda value: None),
    "store.raw_days": _range(0.001, 36500, " days"),
    "store.rollup_days": _range(0.001, 36500, " days"),
    "store.event_days": _range(0.001, 36500, " days"),
    "store.max_mb": _range(0.001, 1e9, " MB"),
    "store.warn_fraction": _range(0.01, 1),
    "store.maintenance_interval": _range(1, DAY, " seconds"),
    "store.prune_batch": _range(1, 1_000_000, " rows"),
    "store.cache_kib": _range(MIN_CACHE_KIB, MAX_CACHE_KIB, " KiB"),
    "web.auth": Allowed("true or false", lambda value: None),
    "web.auth_token": Allowed("text of at most 4096 characters",
                              lambda value: None if len(value) <= 4096 else "too long"),
    "web.vendor_path": _path(optional=True),
    "web.max_points": _range(2, 100_000, " points"),
    "web.allowed_hosts": Allowed("comma-separated host names or addresses, each with an "
                                 "optional :PORT (.domain allows its subdomains)", _host_list),
    "web.max_connections": _range(1, MAX_WEB_CONNECTIONS),
    "web.hostname": Allowed("a name of at most 253 characters, or empty",
                            lambda value: None if len(value) <= 253 else "too long"),
    "web.metrics_owners": _range(0, 100_000, " owners"),
    "checks.progress_seconds": _range(0.1, DAY, " seconds"),
    "checks.settle_seconds": _range(0, 3600, " seconds"),
    "checks.threshold": _range(0, 100),
    "checks.chromium": _path(),
    "checks.pdf_timeout": _range(1, 3600, " seconds"),
    "stacks.enabled": Allowed("true or false", lambda value: None),
    "klog.test_lines": Allowed("true or false", lambda value: None),
    "stacks.interval_ms": _range(10, 1000, " ms"),
    "stacks.window_seconds": _range(1, 3600, " seconds"),
    "stacks.targets_path": _path(),
}


def _coerce(setting: Setting, value: Any, source: str) -> Any:
    expected: type[Any] = setting.type      # isinstance() below narrows value to Any
    if isinstance(value, bool) and expected is not bool:
        raise ConfigError(f"expected {expected.__name__}, got a boolean", source=source,
                          key=setting.name)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_INT:
            raise ConfigError(f"number out of range: {_short(value)}", source=source,
                              key=setting.name)
        value = float(value)
    if not isinstance(value, expected):
        raise ConfigError(f"expected {expected.__name__}, got {type(value).__name__} "
                          f"{_short(value)}", source=source, key=setting.name)
    if expected in (int, float) and not (0 <= value <= MAX_INT and math.isfinite(value)):
        raise ConfigError(f"expected a finite number from 0 to {MAX_INT}, got {_short(value)}",
                          source=source, key=setting.name)
    if expected is str and (control := _CONTROL.search(value)):
        raise ConfigError(f"control character {control[0]!r} in "
                          f"{_short(value)}", source=source, key=setting.name)
    allowed = ALLOWED.get(setting.name)
    if allowed is not None and (why := allowed.why_not(value)):
        raise ConfigError(f"{why}: got {_short(value)}; allowed: {allowed.text}",
                          source=source, key=setting.name)
    return value


def check_together(values: Mapping[str, Any], source: str) -> None:
    """The checks that read two settings: a TCP bus beyond loopback needs bus.allow_remote
    (the bus has no authentication: whoever reaches it can publish fake events)."""
    endpoint = values["bus.endpoint"]
    if endpoint.startswith("tcp://") and not values["bus.allow_remote"]:
        host = endpoint[len("tcp://"):].rpartition(":")[0]
        if not is_loopback(host):
            raise ConfigError(
                f"{_short(endpoint)} listens beyond loopback, and the bus has no "
                "authentication; allowed: ipc://PATH or tcp://127.0.0.1:PORT, or set "
                "bus.allow_remote = true to expose it on purpose", source=source,
                key="bus.endpoint")


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error message quotes, never floods
    (``repr`` of an int past Python's 4,300-digit limit raises, so huge ones are sized)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _parse_env(setting: Setting, raw: str) -> Any:
    source = f"environment {setting.env}"
    try:
        if setting.type is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if setting.type is not str and len(raw) > 64:
            raise ValueError(raw)     # no number needs more digits; int() of 4,301+ raises
        return _coerce(setting, setting.type(raw), source)
    except ValueError:
        raise ConfigError(f"expected {setting.type.__name__}, got {_short(raw)}",
                          source=source, key=setting.name) from None


def _flatten(table: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix:     # settings are section.key: one level
            flat.update(_flatten(value, source, f"{name}."))
        elif name in SETTINGS_BY_NAME:
            flat[name] = _coerce(SETTINGS_BY_NAME[name], value, source)
        else:
            raise ConfigError("unknown setting (see `gpuwhy settings`)", source=source,
                              key=_short(name, 100).strip("'"))
    return flat


def _read_config_file(path: str | os.PathLike[str], source: str) -> str:
    """The file's text: a regular file, at most MAX_CONFIG_BYTES, UTF-8.

    Read through gpuwhy.files: a FIFO or a device at the config path would otherwise hang
    the reader (``gpuwhy status`` among them), and ``/proc/self/mem`` fails every read.
    """
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except FileRefused as exc:
        raise ConfigError(f"config file {exc.reason}", source=source) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("config file is not UTF-8 text", source=source) from None


def _check_key_depth(text: str, source: str) -> None:
    """Refuse keys of more than MAX_KEY_PARTS dotted parts before tomllib sees them: it
    takes time quadratic in their number (a 6 kB key of 3,000 parts took 0.5 s)."""
    for number, line in enumerate(text.splitlines(), 1):
        key = line.split("=", 1)[0] if "=" in line else line
        if key.count(".") >= MAX_KEY_PARTS:
            raise ConfigError(f"line {number}: a key of more than {MAX_KEY_PARTS} dotted parts "
                              "(settings are section.key)", source=source)


def parse_config_text(text: str, source: str = "<text>") -> dict[str, Any]:
    """The settings a TOML text sets, checked; raises :class:`ConfigError` naming ``source``."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file is larger than {MAX_CONFIG_BYTES} bytes", source=source)
    _check_key_depth(text, source)
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", source=source) from None
    except ValueError:         # an integer past Python's 4,300-digit conversion limit
        raise ConfigError("invalid TOML: an integer of more than 4300 digits",
                          source=source) from None
    except RecursionError:     # tomllib recurses into nested arrays and inline tables
        raise ConfigError("invalid TOML: nested too deeply", source=source) from None
    return _flatten(table, source)


def load_config(path: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the TOML file (``path`` or ``$GPUWHY_CONFIG``), then ``GPUWHY_*`` variables.

    Raises :class:`ConfigError` with the file and key for anything it cannot use.
    """
    environ = os.environ if environ is None else environ
    values = {s.name: s.default for s in SETTINGS}
    path = path or environ.get("GPUWHY_CONFIG") or None
    source = "defaults"
    if path is not None:
        source = str(path)
        values.update(parse_config_text(_read_config_file(path, source), source))
    for setting in SETTINGS:
        if setting.env in environ:
            values[setting.name] = _parse_env(setting, environ[setting.env])
    bus_env = SETTINGS_BY_NAME["bus.endpoint"].env
    check_together(values, f"environment {bus_env}" if bus_env in environ else source)
    return Config(values, source)
