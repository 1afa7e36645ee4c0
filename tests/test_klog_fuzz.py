"""Fuzz of the kernel-log parser and of the source's pump: real sample lines and the Xid
catalogue mutated (digit runs past Python's 4 300-digit int() limit, truncation, flipped
characters, NUL/CR/control characters, 1 MB lines, repeated pieces, lone surrogates).

Nothing may raise, no line may take long, every bound holds; through the pump (a fake
reader, a publisher that goes through the real wire format, the real store writer) every
line's cursor is stored and a line the parser cannot read is an ``unparsed`` record with
its reason.
"""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

from gpuwhy.events import KernelLogRecord
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import (
    MAX_DIGITS,
    MAX_LINE,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_REASON,
    UNPARSED,
    KernelLogParser,
    parse_line,
)
from gpuwhy.probes.klog.source import MAX_LINE_STORED, KernelLogPump
from gpuwhy.store.writer import StoreWriter
from gpuwhy.xid import _CATALOGUE

from .klog_pump import FakeReader, WirePublisher

SAMPLES = Path(__file__).parent / "data" / "klog" / "xid-log-samples.txt"
KINDS = {"xid", "sxid", "fallen_off_bus", "rm_init_failed", "gpu_uuid", "gpu_serial",
         "driver_loaded", "gsp_timeout", "gsp_rate_limited", "gsp_rpc_failed", UNPARSED}
INT64 = 1 << 63
CASES = 12_000
DIGIT = re.compile(r"[0-9]")
PIECES = ["NVRM: ", "Xid (PCI:0000:0a:00): ", ", pid=", ", name=", "SXid (PCI:0000:84:00.0): ",
          "GPU at PCI:0000:2b:00: GPU-", "The NVIDIA GPU 0000:b3:00.0 ", "(PCI ID: 10de:26b5) ",
          "fallen off the bus and is not responding", "loading NVIDIA UNIX ", "rpcRmApi",
          "GspRmControl failed: ", "hClass=0x", "Contained: ", " caused by previous Xid ",
          "Expected function ", "GPU recovery action changed from 0x", "NVLink: ", " on link ",
          "\\", "\"", "(", ")", ",", "=", " "]


def sample_lines() -> list[str]:
    lines = [line for line in SAMPLES.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    # one Xid line per catalogue code, in the modern form, so that every code's details run
    lines += [f"NVRM: Xid (PCI:0000:0a:00): {code}, pid=4242, name=python3, {title}"
              for code, (_, title, *_rest) in _CATALOGUE.items()]
    return lines


def mutate(rng: random.Random, line: str) -> str:
    """One to three mutations of a line; now and then it is padded to 1 MB as well."""
    for _ in range(rng.randint(1, 3)):
        how = rng.random()
        at = rng.randrange(len(line) + 1)
        digit = DIGIT.search(line, rng.randrange(len(line) + 1)) or DIGIT.search(line)
        if how < 0.25 and digit:           # a digit run far past int()'s 4 300-digit limit
            i = digit.start()
            line = line[:i] + "9" * rng.choice((19, 20, 4300, 4301, 5000, 20_000)) + line[i:]
        elif how < 0.35:                   # truncated
            line = line[:at]
        elif how < 0.55 and line:          # characters flipped: any code point, controls
            chars = list(line)
            for _ in range(rng.randint(1, 6)):
                chars[rng.randrange(len(chars))] = chr(rng.choice(
                    (0, 9, 10, 13, 27, 0x7F, 0x85, 0x2028, 0x202E, 0xFFFD, 0xDC80,
                     rng.randrange(0x110000))))
            line = "".join(chars)
        elif how < 0.65:                   # NUL / CR / control characters inserted
            line = line[:at] + rng.choice(("\x00", "\r", "\r\n", "\x1b[2J", "\t", "\x00" * 50)) \
                + line[at:]
        elif how < 0.8:                    # a piece of the grammar, repeated
            piece = rng.choice(PIECES + [line[at:at + rng.randint(1, 40)] or "x"])
            line = line[:at] + piece * rng.choice((2, 10, 300, 3000)) + line[at:]
        else:                              # spliced with a piece of the grammar
            line = line[:at] + rng.choice(PIECES) + line[at:]
    if rng.random() < 1 / 400:             # a 1 MB line
        line += rng.choice(("a", "9", " ", "(PCI ID: 10de:26b5) ")) * (1 << 20)
    return line


def generated(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = sample_lines()
    return [mutate(rng, rng.choice(lines)) for _ in range(count)]


def assert_bounded(record) -> None:
    assert record.kind in KINDS
    assert len(record.message) <= MAX_MESSAGE
    assert record.name is None or len(record.name) <= MAX_NAME
    assert record.pci is None or len(record.pci) == 10
    for value in (record.xid, record.sxid, record.pid, record.gpu_instance,
                  record.compute_instance, *record.details.values()):
        assert not isinstance(value, int) or -INT64 < value < INT64
        assert not isinstance(value, str) or len(value) <= MAX_MESSAGE
    if record.kind == UNPARSED:
        reason = record.details["reason"]
        assert 0 < len(reason) <= MAX_REASON
        assert (record.xid, record.sxid, record.pci, record.pid, record.name, record.uuid) == \
            (None,) * 6                    # nothing of a line that lies is kept as a fact


def test_fuzz_parser_never_raises_and_every_record_is_bounded():
    lines = generated(CASES, seed=20)
    parser = KernelLogParser()
    started = time.perf_counter()
    slowest = 0.0
    kinds: dict[str, int] = {}
    for line in lines:
        began = time.perf_counter()
        records = parser.feed(line)
        slowest = max(slowest, time.perf_counter() - began)
        for _, record in records:
            assert_bounded(record)
            kinds[record.kind] = kinds.get(record.kind, 0) + 1
        assert_bounded(parse_line(line) or parse_line("NVRM: Xid (PCI:0000:0a:00): 13, x"))
    elapsed = time.perf_counter() - started
    assert elapsed < 10, f"{CASES} lines took {elapsed:.1f} s"
    assert slowest < 0.25, f"one line took {slowest * 1000:.0f} ms"
    # the mutations reach both sides: facts still found, and lines refused with a reason
    assert kinds.get("xid", 0) > 1000 and kinds.get(UNPARSED, 0) > 200, kinds
    print(f"{CASES} lines in {elapsed:.2f} s, slowest {slowest * 1000:.1f} ms; {kinds}")


def test_every_integer_field_past_the_bound_is_unparsed_with_its_reason():
    # One line per integer field the parser reads, each far past the bound: before, int()
    # raised on those of 4 301+ digits and failed the kernel-log source. Fields read from
    # the message (cut to MAX_MESSAGE) get 1 000 digits, the others 5 000.
    big, mid = "9" * 5000, "9" * 1000
    lines = {
        "pid": f"NVRM: Xid (PCI:0000:0a:00): 79, pid={big}, name=x, GPU has fallen off the bus.",
        "the Xid code": f"NVRM: Xid (PCI:0000:0a:00): {big}, pid=1, name=x, y",
        "the GPU instance": f"NVRM: Xid (PCI:0000:3b:00 GPU-I:{big}): 43, Ch 00000020",
        "the compute instance": f"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:{big}): 43, Ch 2",
        "the root-cause Xid": f"NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=p, Ch 1 caused by "
                              f"previous Xid {mid}",
        "the GSP function": f"NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=n, Timeout after 6s "
                            f"of waiting for RPC response from GPU4 GSP! Expected function "
                            f"{mid} (GSP_RM_CONTROL)",
        "the GSP timeout": f"NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=n, Timeout after "
                           f"{mid}s of waiting for RPC response from GPU4 GSP! Expected "
                           f"function 76 (GSP_RM_CONTROL)",
        "the link": f"NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link {mid} (0x1)",
        "the SXid code": f"nvidia-nvswitch1: SXid (PCI:0000:84:00.0): {big}, Fatal, Link 32",
        "the NVSwitch number": f"nvidia-nvswitch{big}: SXid (PCI:0000:84:00.0): 12028, Fatal",
        "the source line": f"NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:{big})",
        "the device minor": f"NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor "
                            f"number {big}",
        "the GPU number": f"NVRM: GPU{big} _kgspLogRpcTimeout: ***** GSP Timeout *****",
        "the rate": f"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 "
                    f"(printing 1 of every {big})",
        "the recovery action": f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed "
                               f"from 0x{mid} (None) to 0x1 (GPU Reset Required)",
    }
    for field, line in lines.items():
        record = parse_line(line)
        assert record is not None and record.kind == UNPARSED, (field, record)
        digits = len(big) if big in line else len(mid)
        unit = "hex digits (at most 16" if field == "the recovery action" else \
            f"digits (at most {MAX_DIGITS}"
        assert record.details["reason"] == f"{field} has {digits} {unit} are read)"
        assert_bounded(record)
    assert parse_line(lines["pid"]).details == {
        "reason": "pid has 5000 digits (at most 18 are read)", "parsed_as": "xid"}
    # at the bound itself the line is read
    record = parse_line(f"NVRM: Xid (PCI:0000:0a:00): 79, pid={'1' * MAX_DIGITS}, name=x, y")
    assert record.kind == "xid" and record.pid == int("1" * MAX_DIGITS)


def test_identifiers_over_their_bound_are_unparsed_and_free_text_is_cut():
    # the line is cut to MAX_LINE first: 8 192 - 29 characters of it are the UUID
    assert parse_line("NVRM: GPU at PCI:0000:2b:00: GPU-" + "ab" * 5000).details["reason"] == \
        "the UUID is 8163 characters long (at most 64 are read)"
    assert parse_line("NVRM: GPU Board Serial Number: " + "7" * 100).kind == UNPARSED
    record = parse_line("NVRM: Xid (PCI:0000:01:00): 31, pid=1, name=" + "n" * 500 + ", "
                        + "m" * (1 << 20))
    assert record.kind == "xid" and len(record.name) == MAX_NAME
    assert len(record.message) == MAX_MESSAGE


def test_hostile_repetitions_cost_milliseconds_not_seconds():
    # Unbounded lazy gaps and "\w+=" tried at every offset made these quadratic: 0.9 s and
    # 0.6 s for one 8 KiB line before.
    hostile = [
        "NVRM: " + "The NVIDIA GPU 00:00 (PCI ID: 0000:0000) " * 400,
        "NVRM: rpcRmApiControl_GSP: GspRmControl failed: " + "a" * MAX_LINE,
        "NVRM: " + "loading NVIDIA UNIX " * 500,
        "NVRM: Xid (PCI:0000:0a:00): 94, " + "Contained: " * 800,
        "NVRM: Xid (PCI:0000:0a:00): 74, NVLink: " + " on link" * 1000,
        "NVRM: " + "rpcRmApi" * 1200,
        "NVRM: Xid " + "9" * (1 << 20),
    ]
    for line in hostile:
        started = time.perf_counter()
        for _ in range(5):
            assert_bounded(parse_line(line) or parse_line("NVRM: Xid (PCI:0000:0a:00): 1, x"))
        assert (time.perf_counter() - started) / 5 < 0.05, line[:60]


def test_a_failing_parser_is_one_unparsed_line_not_an_exception(monkeypatch):
    import gpuwhy.probes.klog.parse as parse

    def broken(match):
        raise RuntimeError("boom")

    monkeypatch.setattr(parse, "_RULES", ((("xid", "Xid (", parse._XID, broken),)
                                          + parse._RULES[1:]))
    [(lineno, record)] = KernelLogParser().feed("NVRM: Xid (PCI:0000:0a:00): 79, pid=1, x")
    assert lineno == 1 and record.kind == UNPARSED
    assert record.details["reason"] == "parser error: RuntimeError: boom"


# --- the pump: fake reader, the real wire format, the real store writer --------------------

def raw_lines(texts: list[str], boot: str = "b" * 32) -> list[RawLine]:
    return [RawLine(text, f"kmsg:{boot}:{n}", boot, 1_000_000 + n, None)
            for n, text in enumerate(texts)]


def test_fuzz_pump_stores_every_line_and_moves_the_cursor_past_each(db):
    texts = generated(CASES, seed=21)
    # poison lines like the finding's, at known places, each followed by a good Xid
    poison = "NVRM: Xid (PCI:0000:0a:00): 79, pid=" + "9" * 5000 + ", name=x, fallen off"
    good = "NVRM: Xid (PCI:0000:0a:00): 13, pid=77, name=trainer, Graphics Exception"
    for at in range(0, CASES, 997):
        texts[at:at] = [poison, good]
    lines = raw_lines(texts)
    publisher = WirePublisher()
    pump = KernelLogPump(FakeReader(lines), publisher, threading.Event(), boot_id="b" * 32)
    started = time.perf_counter()
    while pump.pump(limit=500):
        pass
    pump.checkpoint()
    elapsed = time.perf_counter() - started
    assert pump.counters["lines"] == len(lines)
    assert elapsed < 15, f"{len(lines)} lines took {elapsed:.1f} s"
    events = [e.event for e in publisher.envelopes]
    records = [e for e in events if isinstance(e, KernelLogRecord)]
    assert pump.counters["records"] + pump.counters["unparsed"] == len(records)
    assert pump.counters["unparsed"] == sum(r.record_kind == UNPARSED for r in records) > 0
    for record in records:
        assert len(record.line) <= MAX_LINE_STORED
        if record.record_kind == UNPARSED:
            assert record.details["reason"] and record.message
    by_cursor = {r.cursor: r for r in records}
    for n, text in enumerate(texts):
        if text == poison:
            bad, after = by_cursor[f"kmsg:{'b' * 32}:{n}"], by_cursor[f"kmsg:{'b' * 32}:{n + 1}"]
            assert bad.record_kind == UNPARSED and "pid has 5000 digits" in bad.details["reason"]
            assert (after.record_kind, after.xid, after.pid) == ("xid", 13, 77)
    # cursors only move forward, and the last one stored is at (or just before) the end
    cursors = [int(e.cursor.rsplit(":", 1)[1]) for e in events]
    assert cursors == sorted(cursors)
    assert cursors[-1] >= len(lines) - 3       # at most a pending two-line report left open
    # the store takes every event (bounded integers, no lone surrogates) and the cursor
    writer = StoreWriter(db)
    for start in range(0, len(publisher.envelopes), 500):
        writer.write_batch(publisher.envelopes[start:start + 500])
    assert writer.rejected == 0
    stored = dict(db.execute("select kind, count(*) from kernel_log group by kind").fetchall())
    assert stored[UNPARSED] == pump.counters["unparsed"]
    assert sum(stored.values()) == len(records)
    assert db.execute("select cursor from source_cursors where source = 'klog'").fetchone() == \
        (events[-1].cursor,)
    reason = db.execute("select json_extract(details, '$.reason') from kernel_log where "
                        "cursor = ?", [f"kmsg:{'b' * 32}:0"]).fetchone()
    assert reason == ("pid has 5000 digits (at most 18 are read)",)
    print(f"{len(lines)} lines through the pump in {elapsed:.2f} s; {stored}")


def test_pump_turns_any_failure_into_an_unparsed_record_and_goes_on(monkeypatch):
    lines = raw_lines(["NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=a, x",
                       "NVRM: Xid (PCI:0000:0a:00): 31, pid=2, name=b, y",
                       "NVRM: Xid (PCI:0000:0a:00): 13, pid=3, name=c, z"])
    publisher = WirePublisher()
    pump = KernelLogPump(FakeReader(lines), publisher, threading.Event(), boot_id="b" * 32)
    feed = pump.parser.feed

    def sometimes_broken(text):
        if "pid=2" in text:
            raise RuntimeError("parser bug")
        return feed(text)

    monkeypatch.setattr(pump.parser, "feed", sometimes_broken)
    assert pump.pump() == 3
    records = [e.event for e in publisher.envelopes]
    assert [(r.cursor.rsplit(":", 1)[1], r.record_kind) for r in records] == \
        [("0", "xid"), ("1", UNPARSED), ("2", "xid")]
    assert records[1].details["reason"] == "RuntimeError: parser bug"
    assert records[1].line == lines[1].text
    assert pump.counters == {"lines": 3, "records": 2, "unparsed": 1, "checkpoints": 0,
                             "forged": 0, "gpus_over_bound": 0, "daemon_missed": 0,
                             "test_lines": 0}
