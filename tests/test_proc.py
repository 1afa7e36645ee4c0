import os
from pathlib import Path

import pytest

from gpuwhy.errors import NoSuchProcess
from gpuwhy.identity import ProcessKey
from gpuwhy.proc import (
    MAX_CMDLINE,
    MAX_ENV_VALUE,
    MAX_TAG,
    process_key,
    read_process,
    read_stat,
    read_tag,
)

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


@pytest.mark.parametrize("environ,tag", [
    (b"GPUWHY_TAG=first\0PATH=/bin\0", "first"),                  # the first entry
    (b"PATH=/bin\0GPUWHY_TAG=last", "last"),                       # the last, unterminated
    (b"GPUWHY_TAG=old\0GPUWHY_TAG=new\0", "new"),                  # set twice: the later one
    (b"XGPUWHY_TAG=no\0GPUWHY_TAG\0AI_PROFILER_TAG=yes\0", "yes"),  # not the name, no '='
    (b"AI_PROFILER_TAG=b\0GPUWHY_TAG=a=b\0", "a=b"),               # GPUWHY_TAG first; '=' kept
    (b"GPUWHY_TAG=\0", ""),
    (b"HOME=/root\0", None),
    (b"GPUWHY_TAG=" + b"t" * 1000, "t" * MAX_TAG),
])
def test_the_tag_is_the_variable_in_force(tmp_path, environ, tag):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "environ").write_bytes(environ)
    assert read_tag(7, str(tmp_path)) == tag


def test_read_process_records_only_the_named_variables_bounded(tmp_path):
    base = tmp_path / "1"
    base.mkdir()
    (base / "stat").write_text("1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n")
    (base / "cmdline").write_bytes(b"python3\0")
    (base / "cgroup").write_text("0::/\n")
    (base / "status").write_text("Uid:\t0\t0\t0\t0\n")
    (base / "environ").write_bytes(b"SECRET=x\0CUDA_LAUNCH_BLOCKING=1\0XNCCL_DEBUG=no\0"
                                   b"GPUWHY_TAG=nightly\0NCCL_DEBUG=" + b"T" * 5000 + b"\0")
    names = {"CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "NCCL_P2P_LEVEL"}
    seen = read_process(1, ts=1, proc_root=str(tmp_path), environment=names)
    assert seen.env == {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "T" * MAX_ENV_VALUE}
    assert seen.tag == "nightly"                  # from the same read
    assert read_process(1, ts=1, proc_root=str(tmp_path)).env == {}   # none named: none
    (base / "environ").unlink()                   # unreadable (another user's): none
    assert read_process(1, ts=1, proc_root=str(tmp_path), environment=names).env == {}
