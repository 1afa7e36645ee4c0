import os
from pathlib import Path

import pytest

from gpuwhy.errors import NoSuchProcess
from gpuwhy.identity import ProcessKey
from gpuwhy.proc import MAX_CMDLINE, process_key, read_process, read_stat

PROC = str(Path(__file__).parent / "data" / "proc")


def test_read_process_from_a_checked_in_tree():
    seen = read_process(4242, ts=1, proc_root=PROC)
    assert seen.process == ProcessKey(4242, 987654)
    assert seen.comm == "evil) name"          # comm with ')' and a space
    assert seen.cmdline == "python3 train.py --batch <script>alert(1)</script>"
    assert seen.ppid == 1 and seen.uid == 1000
    assert seen.cgroup == "0::/system.slice/train.service"
    assert seen.tag == "resnet-nightly"       # GPUWHY_TAG wins over AI_PROFILER_TAG


def test_own_process_matches_procfs():
    key = process_key(os.getpid())
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert key == ProcessKey(os.getpid(), int(fields[19]))


def test_missing_process_raises_no_such_process(tmp_path):
    with pytest.raises(NoSuchProcess) as excinfo:
        read_stat(99999999, proc_root=str(tmp_path))
    assert excinfo.value.pid == 99999999


def test_long_cmdline_is_bounded(tmp_path):
    base = tmp_path / "1"
    base.mkdir()
    (base / "stat").write_text("1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n")
    (base / "cmdline").write_bytes(b"A" * 100_000 + b"\0")
    (base / "cgroup").write_text("0::/\n")
    (base / "status").write_text("Uid:\t0\t0\t0\t0\n")
    seen = read_process(1, ts=1, proc_root=str(tmp_path))
    assert len(seen.cmdline) == MAX_CMDLINE
    assert seen.tag is None
