"""The driver-stack lines of the kernel log: API mismatch (both halves into one record),
adapter initialisation failures (with and without the GPU's address), GPUs not taken at
probe time. Real formats (tests/data/klog/driver-stack-samples.txt), every form a log
carries them in, the bounds, and the paths the other kinds go: `gpuwhy xid`, the source's
pump into the store, and the rules."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.demo.synthetic_signals import Synthetic, run
from gpuwhy.events import KernelLogRecord
from gpuwhy.probes.klog.journald import line_of
from gpuwhy.probes.klog.kmsg import parse_record
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import (
    MAX_MESSAGE,
    MAX_NAME,
    UNPARSED,
    KernelLogParser,
    parse_line,
)
from gpuwhy.probes.klog.source import KernelLogPump
from gpuwhy.rules.loader import load_rules
from gpuwhy.store.writer import StoreWriter

from .klog_pump import FakeReader, WirePublisher

SAMPLES = Path(__file__).parent / "data" / "klog" / "driver-stack-samples.txt"
A, R, P = "api_mismatch", "rm_init_failed", "probe_failed"


def api(client, kernel, **more):
    details = {}
    if client:
        details["client_version"] = client
    if kernel:
        details["kernel_version"] = kernel
    return dict(kind=A, driver_version=kernel, details=details, **more)


# Expected fields by line number of the samples file (the line a report starts on). Fields not
# named must be None; details must be exactly those named.
EXPECTED = {
    13: api("169.12", "71.86.04"),
    18: api("470.129.06", "470.103.01"),
    23: api("295.40", "304.43"),
    25: api("535.154.05", "535.129.03"),
    27: api("1.0-9639", "1.0-9755"),
    32: api("595.84", "595.71.05", pid=4242, name="nvidia-smi"),
    38: api("169.12", None),                       # the first half alone
    41: api(None, "71.86.04"),                     # the second half alone
    46: dict(kind=R, pci="0000:01:00",
              details={"init_status": "0x24", "rm_status": "0x1c", "source_line": 1603}),
    47: dict(kind=R, pci="0000:01:00", details={"minor": 0}),
    50: dict(kind=R, details={"init_status": "0x30", "rm_status": "0xffff", "source_line": 660}),
    51: dict(kind=R, details={"minor": 0}),
    53: dict(kind=R, details={"init_status": "0x26", "rm_status": "0x56", "source_line": 1474}),
    54: dict(kind=R, details={"minor": 0}),
    57: dict(kind=R, pci="000f:01:00",
              details={"init_status": "0x62", "rm_status": "0x65", "source_line": 2028}),
    58: dict(kind=R, pci="000f:01:00", details={"minor": 0}),
    62: dict(kind=P, pci="0000:01:00", driver_version="304.116",
              details={"pci_id": "10de:1292", "reason": "not_supported_by_driver"}),
    66: dict(kind=P, pci="0000:01:00", details={"reason": "probe_error", "error": -1}),
    68: dict(kind=P, pci="0000:05:00", details={"pci_id": "10de:1d81",
                                                "reason": "not_supported_by_open_kernel_modules"}),
    72: dict(kind=P, pci="0000:00:07", details={"pci_id": "10de:1b80",
                                                "reason": "not_supported_by_open_kernel_modules"}),
    76: dict(kind=P, pci="0000:01:00", details={"pci_id": "10de:2f04",
                                                "reason": "needs_open_kernel_modules"}),
    78: dict(kind=R, pci="0000:01:00",
              details={"init_status": "0x22", "rm_status": "0x56", "source_line": 1017}),
    79: dict(kind=R, pci="0000:01:00", details={"minor": 0}),
    83: dict(kind=P, pci="0000:01:00", details={"reason": "probe_error", "error": -1}),
    87: dict(kind=P, pci="0000:01:00", details={"reason": "probe_error", "error": -1}),
    89: dict(kind="fallen_off_bus", pci="0000:3b:00", details={}),
    90: dict(kind=P, pci="0000:3b:00", details={"pci_id": "10de:2330",
                                                "reason": "not_supported_by_driver"}),
    91: dict(kind=P, pci="0000:3b:00", details={"reason": "probe_error", "error": -1}),
}
# Lines that give no record of their own: the rest of a report (its record is on its first
# line), and lines that name no failure.
CONTINUED = {14, 15, 16, 19, 20, 21, 28, 29, 30, 33, 34, 35, 36, 63, 64, 65, 69, 70, 73, 74,
             77}
SILENT = {39, 45, 49, 56, 81, 82, 84, 85}
FIELDS = ("xid", "sxid", "pci", "pid", "name", "gpu_instance", "compute_instance", "uuid",
          "driver_version")


def sample_lines() -> list[str]:
    return SAMPLES.read_text().splitlines()


def parse_samples() -> dict:
    parser = KernelLogParser()
    found = {}
    for line in sample_lines():
        for lineno, record in parser.feed(line):
            assert lineno not in found
            found[lineno] = record
    for lineno, record in parser.flush():
        found[lineno] = record
    assert not parser.pending
    return found


def check(record, expected: dict, where: object = "") -> None:
    assert record is not None and record.kind == expected["kind"], (where, record)
    for name in FIELDS:
        assert getattr(record, name) == expected.get(name), (where, name)
    assert record.details == expected["details"], where


def test_every_sample_line_parses_to_its_expected_fields():
    found = parse_samples()
    assert sorted(found) == sorted(EXPECTED)
    for lineno, expected in EXPECTED.items():
        check(found[lineno], expected, lineno)


def test_the_other_sample_lines_give_nothing_of_their_own():
    found = parse_samples()
    quiet = {n for n, line in enumerate(sample_lines(), 1)
             if line.strip() and not line.startswith("#") and n not in found}
    assert quiet == CONTINUED | SILENT
    for n in SILENT:
        assert parse_line(sample_lines()[n - 1]) is None, n


@pytest.mark.parametrize("line, expected", [
    ("[  176.432772] NVRM: API mismatch: the client has the version 169.12, but",
     api("169.12", None)),
    ("[  176.432777] NVRM: this kernel module has the version 71.86.04.  Please",
     api(None, "71.86.04")),
    ("NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)", api(None, None, pid=4242,
                                                                  name="nvidia-smi")),
    ("NVRM: has the version 595.84, but this kernel module has", api("595.84", None)),
    ("NVRM: the version 595.71.05.  Please make sure that this", api(None, "595.71.05")),
    ("NVRM: RmInitAdapter failed! (0x26:0x56:1474)",
     dict(kind=R, details={"init_status": "0x26", "rm_status": "0x56", "source_line": 1474})),
    ("NVRM: rm_init_adapter failed, device minor number 0", dict(kind=R, details={"minor": 0})),
    ("NVRM: rm_init_adapter failed for device bearing minor number 3",
     dict(kind=R, details={"minor": 3})),
    ("NVRM: probe of 0000:3b:00.0 failed with error -1",
     dict(kind=P, pci="0000:3b:00", details={"reason": "probe_error", "error": -1})),
    ("nvidia: probe of 0000:3B:00.0 failed with error -22",
     dict(kind=P, pci="0000:3b:00", details={"reason": "probe_error", "error": -22})),
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
     dict(kind="fallen_off_bus", pci="0000:3b:00", details={})),
])
def test_each_line_alone_is_recognised(line, expected):
    check(parse_line(line), expected, line)


@pytest.mark.parametrize("line", [
    "NVRM: The NVIDIA probe routine failed for 1 device(s).",
    "NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",
    "nouveau: probe of 0000:01:00.0 failed with error -22",          # not NVIDIA's driver
    "snd_hda_intel: probe of 0000:01:00.1 failed with error -1",
    "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1292)",          # a GPU named: no failure
    "NVRM: installed in this system is not supported by open nvidia.ko",
    "the kernel module has the version 5.1.",                          # no "this kernel module"
    "NVRM: GPU 0000:0a:00.0: RmInitAdapter succeeded",
])
def test_lines_that_say_no_failure_give_nothing(line):
    assert parse_line(line) is None


MERGED = api("535.247.01", "535.230.02")
REPORT = ["NVRM: API mismatch: the client has the version 535.247.01, but",
          "NVRM: this kernel module has the version 535.230.02.  Please",
          "NVRM: make sure that this kernel module and all NVIDIA driver",
          "NVRM: components have the same version."]


def test_one_record_whichever_way_the_log_carries_the_report():
    journald = line_of({"MESSAGE": "\n".join(r.removeprefix("NVRM: ") if i == 0 else r
                                             for i, r in enumerate(REPORT)) + "\n",
                        "SYSLOG_IDENTIFIER": "NVRM", "__CURSOR": "c",
                        "__MONOTONIC_TIMESTAMP": (1, b"\x00" * 16), "_BOOT_ID": "b"})
    assert journald.text.startswith("NVRM: API mismatch: the client")
    kmsg = parse_record(("3,812,93297027938,-;" + "\\x0a".join(REPORT) + "\n").encode())
    forms = [journald.text, kmsg[3],
             "Mar  1 10:00:00 host kernel: [ 1.0] " + "#012".join(REPORT),   # rsyslog escapes
             "[7874777.555649] " + "\n                 ".join(REPORT),        # dmesg, one entry
             " ".join(REPORT)]
    for form in forms:
        check(parse_line(form), MERGED, form)
        assert [(n, r.details) for n, r in KernelLogParser().feed(form)] == \
            [(1, MERGED["details"])]


def test_a_report_cut_short_gives_what_its_first_half_says():
    parser = KernelLogParser()
    assert parser.feed(REPORT[0]) == [] and parser.pending
    xid = "NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=python, GPU has fallen off the bus."
    [(head_at, head), (at, record)] = parser.feed(xid)   # not its second half: it ends here
    assert (head_at, at) == (1, 2)
    check(head, api("535.247.01", None))
    assert (record.kind, record.xid) == ("xid", 79) and not parser.pending
    assert parser.feed(REPORT[0]) == [] and parser.pending
    [(at, at_end)] = parser.flush()                      # the end of the input
    assert at == 3
    check(at_end, api("535.247.01", None))
    assert not parser.pending and parser.flush() == []


def test_a_new_report_ends_the_open_one():
    parser = KernelLogParser()
    assert parser.feed(REPORT[0]) == []
    [(at, first)] = parser.feed("NVRM: API mismatch: the client 'a' (pid 7)")
    assert at == 1
    check(first, api("535.247.01", None))
    assert parser.pending                                  # the second one is open now
    assert parser.feed("NVRM: has the version 595.84, but this kernel module has") == []
    [(at, second)] = parser.feed("NVRM: the version 595.71.05.  Please make sure that this")
    assert at == 2
    check(second, api("595.84", "595.71.05", pid=7, name="a"))


def test_an_unfinished_probe_report_gives_nothing_and_lets_the_next_line_through():
    parser = KernelLogParser()
    assert parser.feed("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1292)") == []
    assert parser.pending
    [(at, record)] = parser.feed("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:1017)")
    assert at == 2 and record.kind == R and not parser.pending
    # the fallen-off-the-bus report with the PCI ID on its first line is still read
    parser.feed("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)")
    parser.feed("NVRM: installed in this system has")
    [(at, fallen)] = parser.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert at == 3 and (fallen.kind, fallen.pci, fallen.details) == ("fallen_off_bus", "0000:b3:00",
                                                         {"pci_id": "10de:26b5"})


@pytest.mark.parametrize("line, reason", [
    ("NVRM: API mismatch: the client has the version " + "5" * 100 + ", but",
     "the client version is 100 characters long (at most 64 are read)"),
    ("NVRM: this kernel module has the version 5" + "." * 99 + "1.  Please",
     "the kernel module version is 101 characters long (at most 64 are read)"),
    ("NVRM: API mismatch: the client 'x' (pid " + "9" * 5000 + ")",
     "pid has 5000 digits (at most 18 are read)"),
    ("nvidia: probe of 0000:3b:00.0 failed with error -" + "9" * 5000,
     "the probe error has 5000 digits (at most 18 are read)"),
    ("NVRM: RmInitAdapter failed! (0x" + "f" * 20 + ":0x56:1474)",
     "the init status has 20 hex digits (at most 16 are read)"),
    ("NVRM: rm_init_adapter failed for device bearing minor number " + "9" * 5000,
     "the device minor has 5000 digits (at most 18 are read)"),
    ("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1292) installed in this system is not "
     "supported by the 304.116", None),
])
def test_fields_are_bounded_before_they_are_read(line, reason):
    record = parse_line(line)
    if reason is None:
        assert record.kind == P
        return
    assert record.kind == UNPARSED and record.details["reason"] == reason, record
    assert (record.pci, record.pid, record.name, record.driver_version) == (None,) * 4


def test_a_client_name_is_bounded():
    record = parse_line("NVRM: API mismatch: the client '" + "n" * 60 + "' (pid 1) has the "
                        "version 1.2, but this kernel module has the version 1.3.  Please")
    assert record.kind == A and len(record.name) <= MAX_NAME
    assert parse_line("NVRM: API mismatch: the client '" + "n" * 500 + "' (pid 1)").kind == A


def test_hostile_repetitions_cost_milliseconds():
    hostile = [
        "NVRM: " + "API mismatch: the client '" * 300,
        "NVRM: " + "has the version 1, but " * 400,
        "NVRM: " + "this kernel module has the version " * 300,
        "NVRM: this kernel module has the version " + "1" * 8000,
        "NVRM: " + "the version 1.  Please make sure that " * 200,
        "NVRM: " + "The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1292) installed in this "
                   "system " * 100,
        "nvidia: " + "probe of 0000:01:00.0 failed with error " * 200,
        "NVRM: " + "RmInitAdapter failed! (0x1:" * 300,
        "NVRM: API mismatch: the client has the version 1, but" + " NVRM:" * 2000,
    ]
    for line in hostile:
        started = time.perf_counter()
        for _ in range(5):
            parse_line(line)
            parser = KernelLogParser()
            for _ in range(6):                  # a report held open as long as it can be
                parser.feed(line)
            parser.flush()
        assert (time.perf_counter() - started) / 5 < 0.05, line[:60]


def test_mutated_samples_never_raise_and_stay_bounded():
    rng = random.Random(20261201)
    lines = [line for line in sample_lines() if line.strip() and not line.startswith("#")]
    parser = KernelLogParser()
    kinds: dict[str, int] = {}
    for _ in range(4000):
        chars = list(rng.choice(lines))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(chars) + 1)
            how = rng.random()
            if how < 0.3 and chars:
                chars[min(at, len(chars) - 1)] = chr(rng.choice((0, 10, 13, 0xDC80, 0x202E,
                                                                 rng.randrange(0x110000))))
            elif how < 0.5:
                chars[at:at] = "9" * rng.choice((19, 5000))
            elif how < 0.7:
                del chars[at:]
            else:
                chars[at:at] = rng.choice(lines)[:rng.randint(1, 60)]
        for _, record in parser.feed("".join(chars)):
            kinds[record.kind] = kinds.get(record.kind, 0) + 1
            assert len(record.message) <= MAX_MESSAGE
            assert record.name is None or len(record.name) <= MAX_NAME
            assert record.pci is None or len(record.pci) == 10
            assert all(not isinstance(v, str) or len(v) <= 64 for v in record.details.values()
                       if record.kind != UNPARSED)
    assert kinds.get(A, 0) > 100 and kinds.get(R, 0) > 50 and kinds.get(P, 0) > 10, kinds
    assert kinds.get(UNPARSED, 0) > 5, kinds          # bounds broken: refused with a reason


# --- `gpuwhy xid` -------------------------------------------------------------------------

def test_the_samples_file_through_the_real_command():
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "xid", "--json", str(SAMPLES)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["lineno"] for o in objects] == sorted(EXPECTED)
    for obj in objects:
        expected = EXPECTED[obj["lineno"]]
        assert obj["kind"] == expected["kind"] and obj["details"] == expected["details"]
        assert obj["pci"] == expected.get("pci")


def test_plain_words_for_the_new_kinds():
    text = "\n".join(["boot noise", *REPORT, "NVRM: probe of 0000:3b:00.0 failed with error -1",
                      "NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)",
                      "NVRM: has the version 595.84, but this kernel module has"]) + "\n"
    result = CliRunner().invoke(cli, ["xid"], input=text)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("line 2: A driver client has the user-space driver version "
                               "535.247.01, but the loaded kernel module is version 535.230.02")
    assert lines[1].startswith("line 6: The driver did not take GPU 0000:3b:00 when it probed "
                               "it (the driver's probe of the GPU failed (error -1))")
    # the last report is cut short by the end of the input: what it said is still told
    assert lines[2].startswith("line 7: Process 'nvidia-smi' (pid 4242) has the user-space "
                               "driver version 595.84, but the loaded kernel module is "
                               "version ?")
    assert len(lines) == 3


# --- the source's pump into the store -----------------------------------------------------

def test_the_pump_stores_one_record_per_report_each_under_its_own_cursor(db):
    texts = sample_lines()
    # a report cut short by an Xid: two records from one line, both stored
    texts += [REPORT[0], "NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=p, GPU has fallen off "
                         "the bus.", REPORT[0], REPORT[0], REPORT[1]]
    boot = "b" * 32
    lines = [RawLine(text, f"file:1:{n}", boot, 1_000_000 + n, None)
             for n, text in enumerate(texts)]
    publisher = WirePublisher()
    pump = KernelLogPump(FakeReader(lines, origin="file"), publisher, threading.Event(),
                         boot_id=boot)
    while pump.pump(limit=50):
        pass
    records = [e.event for e in publisher.envelopes if isinstance(e.event, KernelLogRecord)]
    cursors = [int(r.cursor.rsplit(":", 1)[1]) for r in records]
    assert cursors == sorted(set(cursors))              # one record per cursor, in order
    assert len(records) == len(EXPECTED) + 4
    # a report's record carries the cursor of its last line: a restart reads past all of it
    by_cursor = {int(r.cursor.rsplit(":", 1)[1]) + 1: r for r in records}
    assert by_cursor[14].details == {"client_version": "169.12", "kernel_version": "71.86.04"}
    assert by_cursor[34].record_kind == A and by_cursor[34].pid == 4242
    assert by_cursor[63].record_kind == P and by_cursor[63].details["pci_id"] == "10de:1292"
    end = len(sample_lines())
    assert (by_cursor[end + 1].record_kind, by_cursor[end + 2].record_kind) == (A, "xid")
    assert by_cursor[end + 3].details == {"client_version": "535.247.01"}   # cut by a new one
    assert by_cursor[end + 5].details == {"client_version": "535.247.01",
                                          "kernel_version": "535.230.02"}
    writer = StoreWriter(db)
    writer.write_batch(publisher.envelopes)
    assert writer.rejected == 0
    stored = dict(db.execute("select kind, count(*) from kernel_log group by kind").fetchall())
    assert stored == {A: 11, R: 10, P: 9, "fallen_off_bus": 1, "xid": 1}
    # kernel_log is the records' one home, the driver version a line names included
    assert db.execute("select count(*) from events where kind = 'kernel_log_record'"
                      ).fetchone() == (0,)
    versions = {r.cursor: r.driver_version for r in records if r.driver_version}
    assert versions and dict(db.execute(
        "select cursor, driver_version from kernel_log where driver_version is not null"
    ).fetchall()) == versions


# --- the rules ----------------------------------------------------------------------------

RULES = {rule.id: rule for rule in load_rules()}
GPU0_PCI = "0000:18:00"      # Synthetic's GPU 0


def parsed_record(line: str, pci: str | None = None) -> KernelLogRecord:
    [(_, record)] = KernelLogParser().feed(line)
    return KernelLogRecord(ts=0, cursor="c", origin="journald", boot_id="b",
                           record_kind=record.kind, message=record.message,
                           pci=pci or record.pci, pid=record.pid, name=record.name,
                           driver_version=record.driver_version, details=dict(record.details))


@pytest.mark.parametrize("rule_id, line, fires", [
    ("R41_driver_api_mismatch", " ".join(REPORT), True),
    ("R41_driver_api_mismatch", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.230.02  "
                                "Release Build", False),
    ("R42_gpu_failed_to_initialise", "NVRM: RmInitAdapter failed! (0x26:0x56:1474)", True),
    ("R42_gpu_failed_to_initialise", f"NVRM: GPU {GPU0_PCI}.0: rm_init_adapter failed, device "
                                     "minor number 0", True),
    ("R42_gpu_failed_to_initialise", f"nvidia: probe of {GPU0_PCI}.0 failed with error -1",
     True),
    ("R42_gpu_failed_to_initialise", "nvidia: probe of 0000:3b:00.0 failed with error -1",
     False),                                     # another GPU's
    ("R42_gpu_failed_to_initialise", f"NVRM: GPU {GPU0_PCI}.0: GPU has fallen off the bus.",
     False),                                     # R32's, not this rule's
])
def test_parsed_lines_drive_the_driver_stack_rules(rule_id, line, fires):
    findings, engine = run(Synthetic(extra=[(200, parsed_record(line))]), [RULES[rule_id]])
    firing = [f for f in findings if f.state == "firing"]
    assert bool(firing) is fires, engine.status()
    if fires:
        assert firing[0].severity in ("error", "critical") and 2 <= len(firing[0].fixes) <= 4


def test_the_flavour_advice_only_when_the_driver_said_so():
    unsupported = "NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2330) installed in this " \
                  "system requires use of the NVIDIA open kernel modules."
    probe = "nvidia: probe of 0000:18:00.0 failed with error -1"
    rule = RULES["R42_gpu_failed_to_initialise"]
    [said] = [f for f in run(Synthetic(extra=[(200, parsed_record(unsupported))]), [rule])[0]
              if f.state == "firing"]
    [other] = [f for f in run(Synthetic(extra=[(200, parsed_record(probe))]), [rule])[0]
               if f.state == "firing"]
    assert any("open kernel modules" in fix for fix in said.fixes)
    assert len(other.fixes) == len(said.fixes) - 1
