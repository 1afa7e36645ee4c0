"""Fuzz of `gpuwhy xid`: mutated real lines as bytes (digit runs past int()'s limit, 1 MB
lines, NUL bytes, bytes that are not UTF-8, control characters, truncation) through what
the command runs, through the command in-process, and through the real command.

Never a traceback: a sane answer per line (an unparsed NVIDIA line says so, with why),
or one clear error line; in bounded time.
"""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.klog_cli import _read_lines, explain, record_json, scan
from gpuwhy.xid import _CATALOGUE

SAMPLES = Path(__file__).parent / "data" / "klog" / "xid-log-samples.txt"
CASES = 12_000
DIGIT = re.compile(rb"[0-9]")
POISON = b"NVRM: Xid (PCI:0000:0a:00): 79, pid=" + b"9" * 5000 + b", name=x, fallen off\n"


def sample_lines() -> list[bytes]:
    lines = [line.encode() for line in SAMPLES.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return lines + [f"NVRM: Xid (PCI:0000:0a:00): {code}, pid=1, name=p, {entry[1]}".encode()
                    for code, entry in _CATALOGUE.items()]


def mutate(rng: random.Random, line: bytes) -> bytes:
    for _ in range(rng.randint(1, 3)):
        how = rng.random()
        at = rng.randrange(len(line) + 1)
        digit = DIGIT.search(line, rng.randrange(len(line) + 1)) or DIGIT.search(line)
        if how < 0.25 and digit:           # a digit run past int()'s 4 300-digit limit
            line = line[:digit.start()] + b"9" * rng.choice((19, 4301, 5000, 9000)) + \
                line[digit.start():]
        elif how < 0.35:                   # truncated
            line = line[:at]
        elif how < 0.6 and line:           # bytes flipped: not UTF-8, NUL, controls, ESC
            data = bytearray(line)
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.choice((0, 0x1B, 0x0D, 0x7F, 0x80, 0xC3,
                                                             0xFF, rng.randrange(256)))
            line = bytes(data)
        elif how < 0.75:                   # inserted: NUL, CR, invalid sequences, ESC
            line = line[:at] + rng.choice((b"\x00", b"\r", b"\xff\xfe", b"\xed\xa0\x80",
                                           b"\xc3", b"\x1b[2J", b"\x00" * 64)) + line[at:]
        else:                              # a piece repeated
            piece = line[at:at + rng.randint(1, 30)] or b"x"
            line = line[:at] + piece * rng.choice((2, 50, 500)) + line[at:]
    if rng.random() < 1 / 500:             # a 1 MB line
        line += rng.choice((b"a", b"9", b"\xff")) * (1 << 20)
    return line


def run_in_process(data: bytes) -> list[str]:
    """What `gpuwhy xid` and `gpuwhy xid --json` print for ``data``, without click."""
    out = []
    for lineno, record in scan(_read_lines(io.BytesIO(data))):
        out.append(explain(lineno, record))
        out.append(json.dumps(record_json(lineno, record), ensure_ascii=True))
    return out


def test_fuzz_what_the_command_runs_never_raises():
    rng = random.Random(2)
    lines = sample_lines()
    started = time.perf_counter()
    slowest = 0.0
    kinds: dict[str, int] = {}
    for _ in range(CASES):
        data = b"\n".join(mutate(rng, rng.choice(lines)) for _ in range(rng.randint(1, 3)))
        began = time.perf_counter()
        out = run_in_process(data)
        slowest = max(slowest, time.perf_counter() - began)
        for text in out[1::2]:
            body = json.loads(text)
            kinds[body["kind"]] = kinds.get(body["kind"], 0) + 1
            if body["kind"] == "unparsed":
                assert body["details"]["reason"]
        assert not any("\x1b" in text for text in out)      # control characters escaped
    elapsed = time.perf_counter() - started
    assert elapsed < 15 and slowest < 0.5, (elapsed, slowest)
    assert kinds.get("xid", 0) > 1000 and kinds.get("unparsed", 0) > 100, kinds
    print(f"{CASES} inputs in {elapsed:.2f} s, slowest {slowest * 1000:.1f} ms; {kinds}")


def test_fuzz_the_command_in_process():
    rng = random.Random(3)
    lines = sample_lines()
    runner = CliRunner()
    for n in range(100):
        data = b"\n".join(mutate(rng, rng.choice(lines)) for _ in range(50))
        result = runner.invoke(cli, ["xid", "--json"] if n % 2 else ["xid"], input=data)
        assert result.exit_code == 0 and result.exception is None, result.output[-500:]
        if n % 2:
            for text in result.output.splitlines():
                json.loads(text)


def test_a_poison_line_is_one_clear_answer_and_the_next_line_is_read():
    result = CliRunner().invoke(cli, ["xid"], input=POISON + b"NVRM: Xid (PCI:0000:0a:00): "
                                b"13, pid=77, name=t, Graphics Exception\n")
    assert result.exit_code == 0, result.output
    first, *rest = result.output.splitlines()
    assert first == "line 1: an NVIDIA xid line that could not be parsed, skipped: pid has " \
        "5000 digits (at most 18 are read)."
    assert rest[0].startswith("line 2: Xid 13 on GPU 0000:0a:00, process 't', pid 77")


def test_an_input_that_cannot_be_read_is_one_clear_error():
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "xid", "/proc/self/mem"],
                            capture_output=True, text=True, timeout=60)
    # refused as the argument it is (exit 2, like every path a command cannot read), no trace
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "Error: Invalid value for '[FILES]...': /proc/self/mem cannot be read: "
        "Input/output error")
    assert "Traceback" not in result.stderr


def test_the_real_command_on_1_mb_lines(tmp_path):
    big = tmp_path / "big.log"
    big.write_bytes(
        b"NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=x, " + b"a" * (1 << 20) + b"\n"
        + b"NVRM: Xid (PCI:0000:0a:00): " + b"9" * (1 << 20) + b"\n"           # a 1 MB code
        + b"\xff\x00" * (1 << 19) + b"\n"                                       # binary
        + POISON
        + b"NVRM: Xid (PCI:0000:0a:00): 13, pid=77, name=t, no newline at the end "
        + b"b" * (1 << 20))
    for args in (["xid", "--json"], ["xid"]):
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "gpuwhy", *args, str(big)],
                                capture_output=True, timeout=60)
        assert time.monotonic() - started < 30
        assert result.returncode == 0 and result.stderr == b"", result.stderr[-2000:]
        if args == ["xid", "--json"]:
            bodies = [json.loads(line) for line in result.stdout.splitlines()]
            assert [(b["lineno"], b["kind"], b["xid"]) for b in bodies] == [
                (1, "xid", 79), (2, "unparsed", None), (4, "unparsed", None), (5, "xid", 13)]
            assert bodies[1]["details"]["reason"].startswith("the Xid code has ")
            assert len(bodies[0]["message"]) <= 2048
    # the same through a pipe, the 1 MB lines on standard input
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "xid"], input=big.read_bytes(),
                            capture_output=True, timeout=60)
    assert result.returncode == 0 and b"Traceback" not in result.stderr
