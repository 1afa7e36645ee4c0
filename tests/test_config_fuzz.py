"""Hostile configuration: 10,000+ generated TOML texts and environment values either load or
fail with a ConfigError naming the file (and the key); no other exception, no hang. Plus one
regression test per way a config once broke gpuwhy (huge numbers, deep nesting, a host
that reached http.client, a FIFO at the config path)."""

import os
import random
import string
import threading
import time

import pytest

from gpuwhy.config import MAX_CONFIG_BYTES, SETTINGS, load_config, parse_config_text
from gpuwhy.errors import ConfigError

SEED = 20261202
CASES = 10_000
VALID = """\
[web]
host = "127.0.0.1"
port = 8000
refresh_seconds = 2.0
[store]
path = "/var/lib/gpuwhy/gpuwhy.db"
max_mb = 10240.0
[gpu]
interval = 1.0
exporter_url = "http://localhost:9400/metrics"
[rules]
builtin = true
"""


def hostile_value(rng):
    choice = rng.randrange(14)
    if choice == 0:
        return "9" * rng.choice([19, 20, 310, 4301, 5000])            # past int64 / float / str
    if choice == 1:
        return rng.choice(["inf", "-inf", "nan", "+nan", "1e309", "-0.0", "1e-400"])
    if choice == 2:
        depth = rng.choice([50, 500, 5000])
        return "[" * depth + "1" + "]" * depth                       # nested arrays
    if choice == 3:
        depth = rng.choice([50, 500, 3000])
        return "{a = " * depth + "1" + "}" * depth                   # nested inline tables
    if choice == 4:
        ctrl = rng.choice(["\\u0000", "\\r\\n", "\\n", "\\t", "\\u007f", "\\u001b[2J"])
        return f'"a{ctrl}b"'
    if choice == 5:
        return '"' + "x" * rng.choice([1000, 100_000]) + '"'
    if choice == 6:
        return rng.choice(['"a b"', '"evil.example\\r\\nX: y"', '"-bad-"', '"[::1]"', '"::"',
                           '"0.0.0.0"', '"höst"', '""', '"a..b"', '"' + "a" * 64 + '.x"'])
    if choice == 7:
        return rng.choice(["true", "false", "1979-05-27T07:32:00Z", "07:32:00", "[]", "{}"])
    if choice == 8:
        return str(rng.randint(-(1 << 70), 1 << 70))
    if choice == 9:
        return repr(rng.uniform(-1e308, 1e308))
    if choice == 10:
        return "0x" + "f" * rng.choice([4, 16, 17, 100])
    if choice == 11:
        return rng.choice(['"debug"', '"DEBUG"', '"info\\u0000"', '"verbose"'])
    if choice == 12:
        return "'''" + "".join(rng.choice(string.printable) for _ in range(rng.randrange(40)))
    return str(rng.randint(0, 70000))


def generated_text(rng):
    kind = rng.randrange(6)
    if kind == 0:                                   # a real setting, a hostile value
        section, key = rng.choice(SETTINGS).name.split(".", 1)
        return f"[{section}]\n{key} = {hostile_value(rng)}\n"
    if kind == 1:                                   # byte flips and truncation of a valid one
        data = bytearray(VALID.encode())
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return data[:rng.randrange(len(data) + 1)].decode("utf-8", errors="replace")
    if kind == 2:                                   # deep tables and dotted keys
        depth = rng.choice([3, 30, 300, 3000])
        return rng.choice(["[" + ".".join("a" * 1 for _ in range(depth)) + "]\nx = 1\n",
                           "a" + ".a" * depth + " = 1\n",
                           "web = " + "{ a = " * depth + "1" + " }" * depth + "\n"])
    if kind == 3:                                   # random tokens
        tokens = ["[", "]", "=", '"', "'", "\n", "web", "port", ".", "{", "}", ",", "#", "\\",
                  "1", "true", "[[", "]]", "\x00", "\r"]
        return "".join(rng.choice(tokens) for _ in range(rng.randrange(1, 60)))
    if kind == 4:                                   # unknown keys with long or odd names
        name = rng.choice(["x" * 5000, "\u202e\u0000", "a\nb", "web.port.x"])
        return f'["{name}"]\nkey = 1\n'
    lines = VALID.splitlines()                      # a valid one, one line replaced
    index = rng.randrange(len(lines))
    if "=" in lines[index]:
        lines[index] = lines[index].split("=")[0] + "= " + hostile_value(rng)
    return "\n".join(lines) + "\n"


def check(text, source="fuzz.toml"):
    try:
        values = parse_config_text(text, source)
    except ConfigError as exc:
        assert str(exc).startswith(source), exc
        assert len(str(exc)) < 2000, "an error message must not flood the terminal"
        return "error"
    for name, value in values.items():
        setting = next(s for s in SETTINGS if s.name == name)
        assert type(value) is setting.type
        if isinstance(value, str):
            assert not any(ord(c) < 32 or ord(c) == 127 for c in value)
    return "loaded"


def test_ten_thousand_generated_configs_load_or_fail_clearly():
    rng = random.Random(SEED)
    started = time.monotonic()
    outcomes = {"error": 0, "loaded": 0}
    for _ in range(CASES):
        text = generated_text(rng)
        try:
            outcomes[check(text)] += 1
        except AssertionError:
            raise
        except Exception as exc:   # noqa: BLE001 - the point of the test
            pytest.fail(f"{type(exc).__name__}: {str(exc)[:200]} on {text[:200]!r}")
    # both outcomes happen: the generator reaches past the checks and through them
    assert outcomes["error"] > CASES // 4 and outcomes["loaded"] > CASES // 20, outcomes
    assert time.monotonic() - started < 60


def test_ten_thousand_generated_environment_values_load_or_fail_clearly():
    rng = random.Random(SEED + 1)
    for _ in range(CASES):
        setting = rng.choice(SETTINGS)
        raw = hostile_value(rng).strip('"')
        if rng.random() < 0.3:
            raw = raw.replace("\\u0000", "\x00").replace("\\r\\n", "\r\n")
        try:
            config = load_config(environ={setting.env: raw})
        except ConfigError as exc:
            assert str(exc).startswith(f"environment {setting.env}"), exc
            continue
        value = config[setting.name]
        assert type(value) is setting.type


@pytest.mark.parametrize("text, message", [
    ("[gpu]\ninterval = " + "9" * 400 + "\n", "number out of range"),
    ("[web]\nport = " + "9" * 5000 + "\n", "more than 4300 digits"),
    ("[web]\nport = " + "9" * 400 + "\n", "an integer of"),
    ("[gpu]\ninterval = inf\n", "finite number"),
    ("[gpu]\ninterval = nan\n", "finite number"),
    ("[store]\nmax_mb = -1.0\n", "finite number from 0"),
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
    ("[web.a.b.c]\nx = 1\n", "unknown setting"),
    ("a" + ".a" * 3000 + " = 1\n", "line 1: a key of more than 8 dotted parts"),
    ('[web]\nhost = "a b"\n', "not a host name"),
    ('[web]\nhost = "evil.example\\r\\nX-Injected: 1"\n', "control character"),
    ('[web]\nhost = "x\\u0000y"\n', "control character"),
    ('[gpu]\nexporter_url = "http://h/\\r\\nHost: evil"\n', "control character"),
])
def test_each_way_a_config_broke_gpuwhy_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "0.0.0.0", "gpu-07.example.org",
                                  "localhost", "gpu-07.example.org."])
def test_real_host_names_and_addresses_still_load(tmp_path, host):
    path = tmp_path / "c.toml"
    path.write_text(f'[web]\nhost = "{host}"\n')
    assert load_config(path, environ={})["web.host"] == host


def test_a_fifo_at_the_config_path_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    result = {}

    def load():
        try:
            load_config(fifo, environ={})
        except ConfigError as exc:
            result["error"] = str(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "load_config hung on a FIFO"
    assert result["error"] == f"{fifo}: config file is a FIFO, not a regular file"


def test_a_huge_or_binary_config_file_is_refused(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (MAX_CONFIG_BYTES // 4 + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(big, environ={})
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe[web]\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary, environ={})
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path, environ={})
