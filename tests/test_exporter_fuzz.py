"""Fuzz of the dcgm-exporter scrape parser: the fixtures' lines mutated (digit runs, NaN and
±Inf, broken quotes and braces, backslashes, NUL/CR, truncation, repeated pieces, label
values of 1 MB), garbage bodies and bodies of very many series.

Never a traceback: a sample over a bound or not in the text format is skipped and counted;
a body that holds no Prometheus text at all is one clear error naming the line; every value
kept is finite and plausible; bounded time.
"""

from __future__ import annotations

import math
import random
import re
import time
from pathlib import Path

import pytest

from gpuwhy.events import GpuSample
from gpuwhy.probes.gpu.exporter import (
    MAX_ID_LABEL,
    MAX_LABEL_VALUE,
    MAX_LINES,
    MAX_SERIES,
    ExporterSource,
    parse_scrape,
)
from gpuwhy.probes.gpu.source import SourceUnavailable

DATA = Path(__file__).parent / "data" / "gpu"
CASES = 12_000
DIGIT = re.compile(r"[0-9]")
PIECES = ['"', "{", "}", ",", "=", "\\", '\\"', "\\n", " ", "\t", "\x00", "\r", "#", "NaN",
          "+Inf", "-Inf", "1e999", "_total", 'UUID="', 'gpu="', "}}", "{{", "\u202e", "\ufffd"]
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
LINE = ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="' + UUID + '",pci_bus_id="00000000:1B:00.0",'
        'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",hostname="node1"} ')


def fixture_lines() -> tuple[list[str], list[str]]:
    """(sample lines, HELP/TYPE lines) of the fixtures."""
    lines = [line for f in sorted(DATA.glob("*.prom")) for line in f.read_text().splitlines()]
    return ([line for line in lines if line and not line.startswith("#")],
            [line for line in lines if line.startswith(("# HELP", "# TYPE"))])


def mutate(rng: random.Random, line: str) -> str:
    for _ in range(rng.randint(1, 3)):
        how = rng.random()
        at = rng.randrange(len(line) + 1)
        digit = DIGIT.search(line, rng.randrange(len(line) + 1)) or DIGIT.search(line)
        if how < 0.2 and digit:            # a digit run: 20 digits to past int()'s limit
            line = line[:digit.start()] + "9" * rng.choice((20, 64, 65, 400, 5000)) + \
                line[digit.start():]
        elif how < 0.3:                    # the value replaced by a special one
            line = line.rsplit(" ", 1)[0] + " " + rng.choice(
                ("NaN", "+Inf", "-Inf", "1e999", "-1e999", "0x10", "1_0", "", "--1", ".",
                 "1e", "9" * 5000, "-" + "9" * 400, "inf", "nan", "1 2 3"))
        elif how < 0.4:                    # truncated
            line = line[:at]
        elif how < 0.6 and line:           # characters flipped
            chars = list(line)
            for _ in range(rng.randint(1, 6)):
                chars[rng.randrange(len(chars))] = rng.choice(PIECES + [chr(rng.randrange(
                    0x110000))])
            line = "".join(chars)
        elif how < 0.75:                   # a piece inserted
            line = line[:at] + rng.choice(PIECES) + line[at:]
        else:                              # a piece repeated
            piece = rng.choice(PIECES + [line[at:at + rng.randint(1, 30)] or "x"])
            line = line[:at] + piece * rng.choice((2, 20, 300, 3000)) + line[at:]
    if rng.random() < 1 / 1000:            # a label value of 1 MB
        line = line.replace('hostname="', 'hostname="' + "h" * (1 << 20), 1)
    return line


def check(series, counts) -> None:
    for s in series:
        assert math.isfinite(s.value) and s.field.low <= s.value <= s.field.high
        assert len(s.instance) <= MAX_ID_LABEL and len(s.info.id) <= MAX_ID_LABEL
        assert all(len(v) <= MAX_LABEL_VALUE for _, v in s.labels)
    assert counts.skipped >= 0 and counts.dropped >= 0
    assert not counts.skipped or counts.first_skip.startswith("line ")


def test_fuzz_parse_scrape_never_raises_but_a_clear_value_error():
    rng = random.Random(7)
    samples, headers = fixture_lines()
    started = time.perf_counter()
    slowest = 0.0
    outcome = {"series": 0, "skipped": 0, "dropped": 0, "not prometheus": 0}
    for _ in range(CASES):
        body = "\n".join(rng.sample(headers, 2) + [
            mutate(rng, rng.choice(samples)) if rng.random() < 0.7 else rng.choice(samples)
            for _ in range(rng.randint(1, 5))])
        if rng.random() < 0.05:            # no HELP/TYPE: possibly nothing valid at all
            body = body.split("\n", 2)[-1]
        began = time.perf_counter()
        try:
            series, counts = parse_scrape(body)
        except ValueError as exc:
            assert str(exc).startswith("line "), exc
            outcome["not prometheus"] += 1
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - began)
        check(series, counts)
        outcome["series"] += len(series)
        outcome["skipped"] += counts.skipped
        outcome["dropped"] += counts.dropped
    elapsed = time.perf_counter() - started
    assert elapsed < 15 and slowest < 0.5, (elapsed, slowest)
    assert outcome["series"] > 5000 and outcome["skipped"] > 2000 and outcome["dropped"] > 500
    print(f"{CASES} bodies in {elapsed:.2f} s, slowest {slowest * 1000:.1f} ms; {outcome}")


def source_serving(text: str) -> ExporterSource:
    source = ExporterSource("http://127.0.0.1:9/metrics")
    source.fetch = lambda: text        # the parse is under test here, not the transfer
    return source


def test_fuzz_whole_scrapes_through_the_source_are_events_or_one_clear_error():
    rng = random.Random(8)
    bodies = [f.read_text() for f in sorted(DATA.glob("*.prom"))]
    for _ in range(300):
        lines = rng.choice(bodies).splitlines()
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(lines))
            lines[i] = mutate(rng, lines[i])
        source = source_serving("\n".join(lines))
        try:
            events = source.read()
        except SourceUnavailable as exc:
            assert "is not Prometheus text: line " in str(exc) or \
                "no DCGM GPU metrics" in str(exc), exc
            continue
        for event in events:
            if isinstance(event, GpuSample):
                assert all(math.isfinite(v) for v in event.fields.values())
        if source.skipped:
            assert any("skipped" in note and "line " in note for note in source.notes())


@pytest.mark.parametrize("value, kept", [
    ("61", 61), ("61.5", 61.5), ("6.1e1", 61), ("NaN", None), ("+Inf", None), ("-Inf", None),
    ("1e999", None), ("9" * 64, None), ("-" + "9" * 63, None)])
def test_special_and_huge_values_are_dropped_and_counted(value, kept):
    series, counts = parse_scrape(LINE + value)
    assert [s.value for s in series] == ([kept] if kept is not None else [])
    assert counts.dropped == (kept is None) and counts.skipped == 0


@pytest.mark.parametrize("value, why", [
    ("9" * 65, "value is 65 characters long (at most 64)"),
    ("9" * 5000, "value is 5000 characters long (at most 64)"),
    ("0x10", "value '0x10' is not a number"),
    ("1_0", "value '1_0' is not a number"),
    ("", "no value"),
    ("1 2 3", "text after the value and timestamp"),
])
def test_values_that_are_not_numbers_or_too_long_are_skipped_with_why(value, why):
    series, counts = parse_scrape("# HELP x y\n" + LINE + value)
    assert series == [] and counts.skipped == 1
    assert counts.first_skip == f"line 2: DCGM_FI_DEV_GPU_TEMP: {why}"


def test_long_labels_and_bad_identities_are_skipped_the_rest_kept():
    good = LINE + "61"
    body = "\n".join([
        good.replace('hostname="node1"', 'hostname="' + "h" * (1 << 20) + '"'),  # 1 MB line
        good.replace('hostname="node1"', 'hostname="' + "h" * 5000 + '"'),       # long value
        good.replace(UUID, "GPU-" + "a" * 100),                                  # long UUID
        good.replace(UUID, "GPU-<script>"),                                      # not a UUID
        good.replace("00000000:1B:00.0", "x" * 30),                               # not PCI
        good.replace('gpu="0"', 'gpu="' + "9" * 5000 + '"'),                     # huge index
        good.replace('device="nvidia0"', 'device="nvidia' + "9" * 5000 + '"'),   # huge minor
        good.replace('gpu="0"', 'gpu="0",gpu="1"'),                              # twice
        good.replace('{gpu="0"', "{" + ",".join(f'l{i}="v"' for i in range(70)) + ',gpu="0"'),
        good.replace('"}', '\\"}'),                                               # unclosed
        good])
    series, counts = parse_scrape(body)
    assert [s.value for s in series] == [61]
    assert counts.skipped == 10 and counts.first_skip == \
        f"line 1: line is {len(body.split(chr(10))[0])} characters long (at most 16384)"


def test_escaped_label_values_are_read_as_the_format_says():
    [s] = parse_scrape(LINE.replace('pod="', "").replace(
        '}', ',pod="a\\"b\\\\c\\nd"}') + "61")[0]
    assert dict(s.labels) == {"pod": 'a"b\\c\nd'}


def test_garbage_bodies_are_one_clear_error():
    for body, first in [
        ("<html><body>502 Bad Gateway</body></html>", "line 1: not a sample: '<html>"),
        ("\x00\xff" * 10_000, "line 1: line is 20000 characters long"),
        ("{}" * 100, "line 1: not a sample: '{}{}"),
        ("502 Bad Gateway\n\nsorry", "line 1: not a sample: '502 Bad Gateway'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(first)):
            parse_scrape(body)
        with pytest.raises(SourceUnavailable, match="is not Prometheus text: " + re.escape(first)):
            source_serving(body).read()


def test_very_many_series_are_bounded_in_count_and_time(monkeypatch):
    import gpuwhy.probes.gpu.exporter as exporter

    # the bounds, made small here so that the test is quick
    monkeypatch.setattr(exporter, "MAX_SERIES", 1000)
    monkeypatch.setattr(exporter, "MAX_LINES", 5000)
    many = "\n".join(LINE.replace('gpu="0"', f'gpu="0",n="{n}"') + "61" for n in range(1050))
    series, counts = parse_scrape(many)
    assert len(series) == 1000 and counts.skipped == 50
    assert counts.first_skip == "line 1001: more than 1000 GPU samples"
    series, counts = parse_scrape("x 1\n" * 5010)
    assert series == [] and counts.skipped == 11
    assert counts.first_skip == "line 5001: more than 5000 lines"
    # and the real bounds' cost: 2 MiB of real series, an eighth of the largest body taken
    monkeypatch.undo()
    assert MAX_SERIES >= 10_000 and MAX_LINES >= 100_000
    body = "\n".join([LINE + "61"] * ((2 << 20) // len(LINE)))
    started = time.perf_counter()
    series, counts = parse_scrape(body)
    assert time.perf_counter() - started < 5
    assert len(series) == (2 << 20) // len(LINE) and counts.skipped == 0


def test_hostile_text_costs_little():
    # prometheus_client's parser took 0.13 s for one 64 KiB comment of spaces (quadratic)
    for body in ["# HELP x" + " " * (1 << 20) + "y\n" + LINE + "61",
                 'x{a="' + '\\"' * 8000 + '"} 1\n' + LINE + "61",
                 ('x{a="' + "\\" * 8000 + '"} 1\n') * 100 + LINE + "61"]:
        started = time.perf_counter()
        series, _ = parse_scrape(body)
        assert time.perf_counter() - started < 0.5
        assert [s.value for s in series] == [61]
