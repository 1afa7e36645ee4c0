"""`gpuwhy xid`: plain words by default, one JSON object per recognised line with --json."""

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gpuwhy.app.cli import cli

SAMPLES = Path(__file__).parent / "data" / "klog" / "xid-log-samples.txt"
LINE79 = "NVRM: Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"


def test_json_has_the_promised_keys_and_one_object_per_recognised_line():
    text = "boot noise\n" + LINE79 + "more noise\n" + \
        "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Fatal, Link 32 egress error\n"
    result = CliRunner().invoke(cli, ["xid", "--json"], input=text)
    assert result.exit_code == 0
    objects = [json.loads(line) for line in result.output.splitlines()]
    assert [o["lineno"] for o in objects] == [2, 4]
    xid, sxid = objects
    for key in ("lineno", "kind", "pci", "pid", "name", "gpu_instance", "compute_instance",
                "message", "title", "severity", "origin", "action", "gpu_reset", "reboot"):
        assert key in xid and key in sxid
    assert (xid["kind"], xid["xid"], xid["pci"], xid["pid"], xid["name"]) == \
        ("xid", 79, "0000:0a:00", 1234, "python")
    assert xid["reboot"] is True and xid["origin"] == "hardware"
    assert (sxid["kind"], sxid["sxid"], sxid["severity"], sxid["gpu_reset"]) == \
        ("sxid", 12028, "critical", True)


def test_unknown_pid_and_name_are_null():
    line = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception\n"
    [obj] = [json.loads(x) for x in CliRunner().invoke(cli, ["xid", "--json"],
                                                        input=line).output.splitlines()]
    assert obj["pid"] is None and obj["name"] is None and obj["xid"] == 13


def test_plain_words_by_default():
    result = CliRunner().invoke(cli, ["xid"], input=LINE79)
    assert result.exit_code == 0
    assert "line 1: Xid 79 on GPU 0000:0a:00" in result.output
    assert "fallen off the bus" in result.output and "reboot the node" in result.output


def test_reads_files_and_counts_lines_across_them(tmp_path):
    first = tmp_path / "a.log"
    first.write_text("x\n" * 3)
    second = tmp_path / "b.log"
    second.write_text(LINE79)
    result = CliRunner().invoke(cli, ["xid", "--json", str(first), str(second)])
    assert [json.loads(x)["lineno"] for x in result.output.splitlines()] == [4]


def test_the_whole_samples_file_through_the_real_command():
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "xid", "--json", str(SAMPLES)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    kinds = {json.loads(x)["kind"] for x in result.stdout.splitlines()}
    assert kinds == {"xid", "sxid", "fallen_off_bus", "rm_init_failed", "gpu_uuid",
                     "gpu_serial", "driver_loaded", "gsp_timeout", "gsp_rate_limited",
                     "gsp_rpc_failed"}


def test_garbage_bytes_never_fail_and_control_characters_are_escaped():
    garbage = bytes(range(256)) * 40 + b"\n\xff\xfe\n" + \
        b"NVRM: Xid (PCI:0000:01:00): 31, pid=7, name=ev\x1b[2Jil, Ch 00000008\n"
    result = subprocess.run([sys.executable, "-m", "gpuwhy", "xid"], input=garbage,
                            capture_output=True)
    assert result.returncode == 0, result.stderr
    assert b"\x1b" not in result.stdout
    assert b"ev\\x1b[2Jil" in result.stdout
