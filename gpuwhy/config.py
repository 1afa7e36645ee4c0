"""Settings table, TOML config file and GPUWHY_* environment overrides."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwhy.errors import ConfigError


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


SETTINGS: tuple[Setting, ...] = (
    Setting("store.path", "/var/lib/gpuwhy/gpuwhy.db", "GPUWHY_DB",
            "SQLite database file (WAL mode; the -wal and -shm files sit beside it)"),
    Setting("bus.endpoint", "ipc:///run/gpuwhy/bus.sock", "GPUWHY_BUS",
            "ZeroMQ endpoint the correlator binds and every source connects to"),
    Setting("bus.hwm", 10000, "GPUWHY_BUS_HWM",
            "high-water mark (messages) of each bus socket; past it messages drop, counted"),
    Setting("web.host", "127.0.0.1", "GPUWHY_HOST",
            "address the web view binds; anything but loopback is refused for now (no auth yet)"),
    Setting("web.port", 8000, "GPUWHY_PORT", "TCP port of the web view"),
    Setting("web.refresh_seconds", 2.0, "GPUWHY_REFRESH",
            "how often the web pages refresh their data"),
    Setting("probes.device_glob", "/dev/nvidia*", "GPUWHY_DEVICE_GLOB",
            "paths treated as NVIDIA device files (tests point it at ordinary files)"),
    Setting("probes.poll_interval", 1.0, "GPUWHY_POLL_INTERVAL",
            "seconds between reads of the in-kernel ioctl counters"),
    Setting("probes.proc_root", "/proc", "GPUWHY_PROC_ROOT",
            "where procfs is mounted (containers mount the host's elsewhere)"),
    Setting("correlator.batch_size", 500, "GPUWHY_BATCH_SIZE",
            "events written to the store in one transaction at most"),
    Setting("correlator.flush_interval", 0.5, "GPUWHY_FLUSH_INTERVAL",
            "seconds a batch waits before it is written even when not full"),
    Setting("log.level", "info", "GPUWHY_LOG_LEVEL", "debug, info, warning or error"),
    # --- probes settings (eBPF probes issue) ---
    # --- end probes settings ---
    # --- GPU source settings (GPU sources issue) ---
    # --- end GPU source settings ---
    # --- kernel log and cron settings (kernel-log and cron issue) ---
    # --- end kernel log and cron settings ---
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
        return Config(values, self.source)


def _coerce(setting: Setting, value: Any, source: str) -> Any:
    expected = setting.type
    if isinstance(value, bool) and expected is not bool:
        raise ConfigError(f"expected {expected.__name__}, got a boolean", source=source,
                          key=setting.name)
    if expected is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, expected):
        raise ConfigError(f"expected {expected.__name__}, got {type(value).__name__} {value!r}",
                          source=source, key=setting.name)
    if setting.name == "log.level" and value not in LOG_LEVELS:
        raise ConfigError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}",
                          source=source, key=setting.name)
    if setting.name == "web.port" and not 0 <= value <= 65535:
        raise ConfigError(f"port out of range: {value}", source=source, key=setting.name)
    return value


def _parse_env(setting: Setting, raw: str) -> Any:
    source = f"environment {setting.env}"
    try:
        if setting.type is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        return _coerce(setting, setting.type(raw), source)
    except ValueError:
        raise ConfigError(f"expected {setting.type.__name__}, got {raw!r}", source=source,
                          key=setting.name) from None


def _flatten(table: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, source, f"{name}."))
        elif name in SETTINGS_BY_NAME:
            flat[name] = _coerce(SETTINGS_BY_NAME[name], value, source)
        else:
            raise ConfigError("unknown setting (see `gpuwhy settings`)", source=source, key=name)
    return flat


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
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file: {exc.strerror}", source=source) from None
        except UnicodeDecodeError:
            raise ConfigError("config file is not UTF-8 text", source=source) from None
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {exc}", source=source) from None
        values.update(_flatten(table, source))
    for setting in SETTINGS:
        if setting.env in environ:
            values[setting.name] = _parse_env(setting, environ[setting.env])
    return Config(values, source)
