"""The kernel-log parser on every line of the samples file, on lines it must reject, and
on 20 000 generated lines (fuzz)."""

import random
import time
from pathlib import Path

import pytest

from gpuwhy.probes.klog.parse import KernelLogParser, parse_line

SAMPLES = Path(__file__).parent / "data" / "klog" / "xid-log-samples.txt"

# Expected fields of each sample line, by its line number in the samples file. Fields not
# named must be None (details: only the keys named are checked).
X = "xid"
EXPECTED = {
    11: dict(kind="gpu_uuid", pci="0000:2b:00", uuid="GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae"),
    12: dict(kind=X, xid=79, pci="0000:2b:00", message="GPU has fallen off the bus."),
    13: dict(kind="fallen_off_bus", pci="0000:2b:00"),
    15: dict(kind=X, xid=13, pci="0000:70:00"),
    16: dict(kind=X, xid=13, pci="0000:70:00"),
    18: dict(kind=X, xid=31, pci="0000:03:00", pid=18865, name="llama-server"),
    20: dict(kind=X, xid=31, pci="0000:01:00", pid=80798, name="llama-server"),
    22: dict(kind=X, xid=45, pci="0000:dc:00", pid=1818990, name="python3",
             details={"root_cause_xid": 149}),
    23: dict(kind=X, xid=45, pci="0000:ed:00", pid=1818992, name="python3",
             details={"root_cause_xid": 145}),
    25: dict(kind=X, xid=62, pci="0000:01:00"),
    26: dict(kind=X, xid=154, pci="0000:01:00",
             details={"recovery_from": "None", "recovery_to": "GPU Reset Required"}),
    28: dict(kind=X, xid=154, pci="0000:9c:00", details={"recovery_to": "Drain and Reset",
                                                          "recovery_to_code": 4}),
    30: dict(kind=X, xid=144, pci="0000:01:00",
             details={"subcode": "SAW_MVB", "fatal": False, "link": 0,
                      "intrinfo": "0x00000001", "error_status": "0x00000008"}),
    31: dict(kind=X, xid=149, pci="0000:00:00", details={"subcode": "NETIR_LINK_EVT",
                                                          "fatal": True}),
    32: dict(kind=X, xid=149, pci="0019:01:00", details={"link": -1, "fatal": True,
                                                          "intrinfo": "0x000fe406"}),
    33: dict(kind=X, xid=145, pci="0018:01:00", details={"subcode": "RLW_RXPIPE", "link": 13}),
    35: dict(kind=X, xid=31, pci="0000:3b:00", pid=41235, name="python3", gpu_instance=1,
             compute_instance=0),
    37: dict(kind=X, xid=43, pci="0000:3b:00", gpu_instance=5, message="Ch 00000020"),
    39: dict(kind=X, xid=119, pci="0000:9b:00", pid=2024380, name="nvidia-smi",
             details={"gsp_function": 76, "gsp_function_name": "GSP_RM_CONTROL",
                      "sequence": 4711, "data0": "0x20801813", "timeout_s": 6}),
    41: dict(kind=X, xid=94, pci="0000:9c:00", pid=51234, name="python3",
             details={"contained": True, "unit": "FB DED", "phys_addr": "0x1a2b3c4d0",
                      "reset_required": False}),
    43: dict(kind="driver_loaded", driver_version="595.71.05", details={"flavour": "open"}),
    44: dict(kind="gsp_timeout", details={"rm_gpu": 6}),
    46: dict(kind="gsp_rpc_failed", details={"hClass": "0x0000c86f", "status": "0x00000062"}),
    48: dict(kind=X, xid=79, pci="0000:2b:00"),
    52: dict(kind="gpu_uuid", pci="0000:9b:00", uuid="GPU-509665ad-b600-ac93-3616-d754b23d636d"),
    53: dict(kind="gpu_serial", pci="0000:9b:00", details={"serial": "1650124014249"}),
    54: dict(kind=X, xid=119, pci="0000:9b:00", pid=2024380, name="nvidia-smi",
             details={"gsp_function": 103, "gsp_function_name": "GSP_RM_ALLOC"}),
    55: dict(kind=X, xid=119, pci="0000:9b:00", pid=2024380, name="nvidia-smi",
             details={"gsp_function": 10, "data0": "0xa55a0210"}),
    56: dict(kind="gsp_rate_limited", pci="0000:9b:00", details={"printing_one_of": 30}),
    57: dict(kind=X, xid=119, pci="0000:9b:00", pid=1263500, name="cache_mgr_main"),
    59: dict(kind=X, xid=13, pci="0000:cb:00"),
    60: dict(kind=X, xid=13, pci="0000:cb:00"),
    61: dict(kind=X, xid=13, pci="0000:cb:00"),
    62: dict(kind=X, xid=109, pci="0000:cb:00", pid=1797828, name="pt_main_thread"),
    64: dict(kind=X, xid=13, pci="0000:43:00"),
    66: dict(kind="rm_init_failed", pci="0000:0a:00",
             details={"init_status": "0x24", "rm_status": "0x72", "source_line": 1568}),
    67: dict(kind="rm_init_failed", pci="0000:0a:00", details={"minor": 5}),
    68: dict(kind=X, xid=48, pci="0000:07:00", details={"phys_addr": "0x7fffa8860"}),
    69: dict(kind=X, xid=64, pci="0000:07:00"),
    71: dict(kind=X, xid=74, pci="0003:00:00", details={"link": 14}),
    73: dict(kind=X, xid=79, pci="0000:05:00"),
    75: dict(kind=X, xid=119, pci="0000:9b:00", details={"gsp_function": 76}),
    77: dict(kind=X, xid=43, pci="0000:3b:00", gpu_instance=2, compute_instance=0),
    81: dict(kind=X, xid=63, pci="0000:10:1c", pid=1896),
    83: dict(kind=X, xid=94, pci="0000:01:00", pid=7194, gpu_instance=5,
             details={"unit": "CE User Channel", "contained": True}),
    84: dict(kind=X, xid=94, pci="0000:01:00", pid=7062),
    85: dict(kind=X, xid=95, pci="0000:01:00", pid=7062,
             details={"contained": False, "unit": "LTC TAG", "reset_required": True}),
    87: dict(kind=X, xid=13, pci="0000:41:00"),
    88: dict(kind=X, xid=13, pci="0000:41:00"),
    90: dict(kind="gpu_uuid", pci="0000:03:00", uuid="GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"),
    91: dict(kind=X, xid=14, pci="0000:03:00", message="Channel 00000001"),
    93: dict(kind="fallen_off_bus", pci="0000:01:00"),
    94: dict(kind=X, xid=3, pci="0000:01:00"),
    98: dict(kind="fallen_off_bus", pci="0000:b3:00", details={"pci_id": "10de:26b5"}),
    104: dict(kind="driver_loaded", driver_version="570.195.03"),
    105: dict(kind="sxid", sxid=22013, pci="0000:04:00", details={"switch": 3}),
    106: dict(kind="sxid", sxid=22013, pci="0000:04:00",
              details={"switch": 3, "fatal": False, "link": 44}),
    107: dict(kind="sxid", sxid=22013, pci="0000:04:00"),
    109: dict(kind="sxid", sxid=12028, pci="0000:84:00", details={"switch": 1}),
    111: dict(kind="sxid", sxid=12028, pci="0000:84:00", details={"fatal": True, "link": 32}),
    115: dict(kind=X, xid=13, pci="0000:43:00"),
}
FIELDS = ("xid", "sxid", "pci", "pid", "name", "gpu_instance", "compute_instance", "uuid",
          "driver_version")


def parse_samples():
    parser = KernelLogParser()
    found = {}
    for line in SAMPLES.read_text().splitlines():
        for lineno, record in parser.feed(line):
            assert lineno not in found
            found[lineno] = record
    return found


def test_every_sample_line_parses_to_its_expected_fields():
    found = parse_samples()
    assert sorted(found) == sorted(EXPECTED)
    for lineno, expected in EXPECTED.items():
        record = found[lineno]
        assert record.kind == expected["kind"], lineno
        for name in FIELDS:
            assert getattr(record, name) == expected.get(name), (lineno, name)
        for key, value in expected.get("details", {}).items():
            assert record.details.get(key) == value, (lineno, key)
        if "message" in expected:
            assert record.message == expected["message"], lineno


def test_every_sample_line_is_either_a_comment_blank_or_recognised():
    # The only sample lines that give no record themselves are the first two lines of the
    # three-line fallen-off-the-bus report (its record is credited to line 98).
    found = parse_samples()
    silent = [n for n, line in enumerate(SAMPLES.read_text().splitlines(), 1)
              if line.strip() and not line.startswith("#") and n not in found]
    assert silent == [99, 100]


@pytest.mark.parametrize("line", [
    "",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "NVRM: loading out-of-tree module taints kernel.",
    "nvidia: module license 'NVIDIA' taints kernel.",
    "NVRM: Xid without a parenthesis: 79",
    "Xid (PCI:0000:0a:00): seventy-nine (not the driver's line)",
    "MyXid (PCI:0000:0a:00): 79, not an Xid",
    "The NVIDIA GPU is great",
    "NVRM: GPU at PCI:0000:2b:00: not-a-uuid",
    "GPU 0000:0a:00.0: RmInitAdapter worked fine",
    "kernel: [ 12.3] EXT4-fs (sda1): mounted filesystem",
    "\x00\x01\x02NVRM\xff",
])
def test_lines_that_are_not_nvidia_facts_give_nothing(line):
    assert parse_line(line) is None
    assert KernelLogParser().feed(line) == []


@pytest.mark.parametrize("line,kind", [
    ("NVRM: Xid (PCI:zzzz:0a:00): 79, GPU has fallen off the bus.", "xid"),
    ("NVRM: Xid (PCI:0000:0a:00): seventy-nine", "xid"),
    ("[ 12.3] NVRM: Xid (0000:0a:00) 79 GPU has fallen off the bus", "xid"),
    ("nvidia-nvswitch3: SXid (PCI:0000:04:00.0): not-a-number", "sxid"),
])
def test_a_driver_line_naming_an_xid_in_no_known_format_is_kept_unparsed(line, kind):
    [(_, record)] = KernelLogParser().feed(line)
    assert record == parse_line(line)
    assert record.kind == "unparsed" and record.details["parsed_as"] == kind
    assert "no known format" in record.details["reason"]
    assert (record.xid, record.sxid, record.pci) == (None, None, None)


def test_the_same_xid_in_every_prefix_form_gives_the_same_record():
    body = "NVRM: Xid (PCI:0000:0A:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    forms = [
        body,
        body.removeprefix("NVRM: "),                                  # journald MESSAGE
        f"4,51234,93297027938,-;{body}",                              # /dev/kmsg record
        f"[93297.027938] {body}",                                     # dmesg
        f"[Wed Jun 24 15:44:20 2026] {body}",                         # dmesg -T
        f"kern  :warn  : [93297.027938] {body}",                      # dmesg --decode
        f"Dec  2 11:38:46 worker4 kernel: [  218.250408] {body}",     # kern.log
        f"2026-11-30T09:00:00.123456+00:00 host kernel: {body}",      # rsyslog ISO
    ]
    records = [parse_line(form) for form in forms]
    assert all(r == records[0] for r in records)
    record = records[0]
    assert (record.xid, record.pci, record.pid, record.name) == (79, "0000:0a:00", 1234, "python")


def test_multi_line_fallen_off_bus_needs_its_last_line():
    parser = KernelLogParser()
    assert parser.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") == []
    assert parser.pending
    assert parser.feed("NVRM: (PCI ID: 10de:26b5) installed in this system has") == []
    assert parser.feed("NVRM: some other line") == []      # not the report: dropped
    assert not parser.pending
    merged = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in " \
             "this system has\nNVRM: fallen off the bus and is not responding to commands."
    [(_, record)] = parser.feed(merged)                    # journald may merge the three
    assert (record.kind, record.pci, record.details) == ("fallen_off_bus", "0000:b3:00",
                                                         {"pci_id": "10de:26b5"})


def test_untrusted_fields_are_bounded():
    record = parse_line("NVRM: Xid (PCI:0000:01:00): 31, pid=1, name=" + "n" * 500 + ", "
                        + "m" * 50_000)
    assert len(record.name) <= 64 and len(record.message) <= 2048


def _generated_lines(rng: random.Random, count: int):
    samples = [line for line in SAMPLES.read_text().splitlines() if line.strip()]
    pieces = ["NVRM: ", "Xid (", "PCI:", "0000:0a:00", ".0", " GPU-I:01", " GPU-CI:", "): ",
              "79", ", pid=", "'<unknown>'", ", name=", "<unknown>", ", ", "SXid", "GPU at ",
              "GPU-", "fallen off the bus", "The NVIDIA GPU ", "(PCI ID: 10de:26b5)",
              "RmInitAdapter failed! (", "0x24:0x72:1568)", "loading NVIDIA UNIX ",
              "595.71.05 ", "caused by previous Xid ", "\n", "\x00", "\u202e", "é", ")", "(",
              "[ 12.5] ", "4,1,2,-;", "nvidia-nvswitch3: ", "Timeout after 6s of waiting for "
              "RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) "]
    for _ in range(count):
        choice = rng.random()
        if choice < 0.3:                     # a real sample, mutated
            line = list(rng.choice(samples))
            for _ in range(rng.randint(1, 5)):
                if line:
                    line[rng.randrange(len(line))] = chr(rng.randint(0, 0x2FF))
            yield "".join(line)
        elif choice < 0.8:                   # pieces of the grammar, shuffled
            yield "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        else:                                # noise
            yield "".join(chr(rng.randint(0, 0x10FF)) for _ in range(rng.randint(0, 300)))


def test_fuzz_twenty_thousand_generated_lines_never_raise_and_keep_invariants():
    rng = random.Random(20261130)
    parser = KernelLogParser()
    produced = 0
    for line in _generated_lines(rng, 20_000):
        for _, record in parser.feed(line):
            produced += 1
            assert record.pci is None or len(record.pci) == 10 and record.pci == \
                record.pci.lower()
            assert record.name is None or len(record.name) <= 64
            assert record.xid is None or record.xid >= 0
    assert produced > 1000          # the generator does reach the parser's grammar


def test_parser_is_fast():
    lines = [line for line in SAMPLES.read_text().splitlines()] + \
        ["usb 1-1: new high-speed USB device number 2 using xhci_hcd"] * 400
    parser = KernelLogParser()
    started = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for line in lines:
            parser.feed(line)
    rate = rounds * len(lines) / (time.perf_counter() - started)
    assert rate > 20_000, f"{rate:.0f} lines/s"
