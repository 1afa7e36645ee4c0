"""File descriptors systemd passes (sd_listen_fds(3)): taken by name, once, the environment
unset; and the kernel-line bell refusing what is not the kernel's log device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuwhy.probes.klog.kmsg import KernelLineBell

CHILD = """
import os
from gpuwhy.passed_fds import take_passed_fd
fd = take_passed_fd("kmsg")
print(fd, os.read(fd, 5).decode() if fd is not None else "",
      take_passed_fd("kmsg"), take_passed_fd("other"),
      [k for k in os.environ if k.startswith("LISTEN_")])
"""


def run_child(names: str, count: str, pid_is_child: bool = True) -> str:
    """A child started as systemd starts a service: the fds from 3 on, LISTEN_* set."""
    read, write = os.pipe()
    os.write(write, b"hello")
    os.close(write)
    code = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ['LISTEN_PID'] = "
            + ("str(os.getpid())" if pid_is_child else "'1'")
            + "; exec(sys.argv[2])")
    env = {**os.environ, "LISTEN_FDS": count, "LISTEN_FDNAMES": names}
    try:
        return subprocess.run([sys.executable, "-c", code, str(read), CHILD], env=env,
                              pass_fds=(read,), capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
    finally:
        os.close(read)


def test_the_fd_named_kmsg_is_handed_out_once_and_the_environment_unset():
    assert run_child("kmsg", "1") == "3 hello None None []"


def test_fds_meant_for_another_process_or_named_otherwise_are_not_taken():
    assert run_child("kmsg", "1", pid_is_child=False).startswith("None")
    assert run_child("web", "1").startswith("None")


def test_the_bell_refuses_a_plain_file_and_leaves_no_fd_open(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,1,1,-;a record\n")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        KernelLineBell(str(path))     # always readable: it would wake its reader for ever
    with pytest.raises(OSError):
        KernelLineBell(fd=os.open(path, os.O_RDONLY))
    assert len(os.listdir("/proc/self/fd")) == before
