"""Lending /dev/kmsg over a unix socket: what a lender refuses, and a borrower that is
answered without a fd. (The real device lent and borrowed: tests/privileged/test_klog_bell.py.)"""

import errno
import fcntl
import os
import socket
import threading
import time

import pytest

from gpuwhy.probes.klog.lend import KmsgLender, borrow_kmsg


def test_a_lender_refuses_what_is_not_the_kernel_log_device(tmp_path):
    plain = tmp_path / "kmsg"
    plain.write_bytes(b"")
    with pytest.raises(OSError) as refused:
        KmsgLender(str(tmp_path / "kmsg.sock"), str(plain))
    assert refused.value.errno == errno.ENOTTY
    with pytest.raises(FileNotFoundError):
        KmsgLender(str(tmp_path / "kmsg.sock"), str(tmp_path / "missing"))
    assert not (tmp_path / "kmsg.sock").exists()


def test_a_lender_replaces_a_stale_socket_and_leaves_other_files_alone(tmp_path):
    stale = tmp_path / "kmsg.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(str(stale))
    old.close()                                 # the file stays, as after a crash
    lender = KmsgLender(str(stale), "/dev/null")   # a character device stands in
    try:
        assert stale.stat().st_mode & 0o777 == 0o660
    finally:
        lender.close()
    assert not stale.exists()
    stale.write_text("not a socket")
    with pytest.raises(OSError):
        KmsgLender(str(stale), "/dev/null")
    assert stale.read_text() == "not a socket"


def test_a_borrower_answered_without_a_fd_gets_a_clear_error(tmp_path):
    path = str(tmp_path / "impostor.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"kmsg")         # the words, no fd

    thread = threading.Thread(target=answer)
    thread.start()
    with pytest.raises(OSError) as failed:
        borrow_kmsg(path)
    thread.join(5)
    listener.close()
    assert failed.value.errno == errno.EPROTO and "without a kernel-log fd" in str(failed.value)
    with pytest.raises(OSError):
        borrow_kmsg(str(tmp_path / "nobody.sock"))


def test_each_borrower_gets_its_own_open_file(tmp_path):
    """A fresh open for each: two borrowers sharing one open file would share (and fight
    over) one read position. File status flags belong to the open file, so a change made
    through one fd shows through the other only if they share it."""
    lender = KmsgLender(str(tmp_path / "kmsg.sock"), "/dev/null")   # a character device
    lender.start()
    try:
        first, second = borrow_kmsg(lender.socket_path), borrow_kmsg(lender.socket_path)
        try:
            assert os.path.samestat(os.fstat(first), os.stat("/dev/null"))
            assert fcntl.fcntl(first, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
            assert fcntl.fcntl(second, fcntl.F_GETFL) & os.O_NONBLOCK
            fcntl.fcntl(first, fcntl.F_SETFL,
                        fcntl.fcntl(first, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            assert fcntl.fcntl(second, fcntl.F_GETFL) & os.O_NONBLOCK
            # counted by the lender's thread once sent, maybe after the borrower has it
            deadline = time.monotonic() + 5
            while lender.lent < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert lender.lent == 2
        finally:
            os.close(first)
            os.close(second)
    finally:
        lender.close()


def test_the_probes_lend_only_when_asked_and_say_when_they_cannot(tmp_config, tmp_path,
                                                                   caplog):
    from gpuwhy.probes.privileged import lend_kmsg

    assert lend_kmsg(tmp_config) is None                  # klog.kmsg_socket unset
    plain = tmp_path / "kmsg"
    plain.write_bytes(b"")
    refused = tmp_config.replace({"klog.kmsg_socket": str(tmp_path / "kmsg.sock"),
                                  "klog.kmsg_path": str(plain)})
    assert lend_kmsg(refused) is None
    assert f"cannot lend {plain}" in caplog.text
    lender = lend_kmsg(refused.replace({"klog.kmsg_path": "/dev/null"}))
    try:
        os.close(borrow_kmsg(str(tmp_path / "kmsg.sock")))
    finally:
        lender.close()
