"""The journald reader's bell: /dev/kmsg wakes it when the kernel logs a line, so that it
sleeps while the kernel is quiet (it looked at the journal ten times a second) and reads
an Xid within a few of its chase waits (journald tells its own readers 0.25-0.5 s late).

Against a real systemd-journald fed through /dev/kmsg; every line written says it is a test.
"""

import os
import time

import pytest

from gpuwhy.probes.klog.journald import CHASE_WAITS_S, IDLE_WAIT_S
from gpuwhy.probes.klog.source import open_reader

from .kernel_lines import MARK, wait_for, write_kmsg

pytestmark = [pytest.mark.root, pytest.mark.kmsg]


class Counting:
    """The reader, with its wait() calls counted."""

    def __init__(self, reader):
        self.reader, self.waits = reader, 0

    def wait(self, timeout):
        self.waits += 1
        self.reader.wait(timeout)

    def read(self, run):
        return [line.text for line in self.reader.lines() if f"run={run}" in line.text]

    def wakes_for_an_xid(self):
        """An Xid written to /dev/kmsg is read once, the reader woken by the kernel, then
        looked at after each chase wait until journald has it (waits counted from here)."""
        self.waits = 0
        run = os.urandom(4).hex()
        write_kmsg([f"NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=bell, {MARK} run={run}"])
        read = wait_for(lambda: self.wait(10) or self.read(run), 15, "the line")
        assert len(read) == 1
        assert self.waits <= 1 + len(CHASE_WAITS_S)


def test_the_bell_lets_the_reader_sleep_and_wakes_it_for_a_kernel_line(system_journald,
                                                                        tmp_config):
    config = tmp_config.replace({"klog.backend": "journald", "klog.start": "now"})
    reader, detail, _ = open_reader(config)
    try:
        assert reader.wakes_on_new_lines and "woken by /dev/kmsg" in detail
        reader.seek(None, "now")
        counting = Counting(reader)
        list(reader.lines())
        quiet_s = 4.0
        started = time.monotonic()
        while time.monotonic() - started < quiet_s:   # as the source waits: long timeouts
            counting.wait(quiet_s)
            list(reader.lines())
        # without the bell: a look every IDLE_WAIT_S (40 in 4 s); with it, the kernel's own
        # lines and journald's file changes only: none on a quiet host, and at most four a
        # second on one that logs all the time (journald's 250 ms post-change timer)
        assert counting.waits < quiet_s / IDLE_WAIT_S * 0.75
        counting.wakes_for_an_xid()
    finally:
        reader.close()


def test_without_a_readable_dev_kmsg_the_reader_looks_every_idle_wait(system_journald,
                                                                      tmp_config, tmp_path):
    config = tmp_config.replace({"klog.backend": "journald",
                                 "klog.kmsg_path": str(tmp_path / "no-kmsg")})
    reader, detail, _ = open_reader(config)
    try:
        assert not reader.wakes_on_new_lines
        assert f"looked at every {IDLE_WAIT_S:g} s" in detail and "no-kmsg" in detail
    finally:
        reader.close()


def _live_journal_directory():
    from pathlib import Path

    for base in (Path("/var/log/journal"), Path("/run/log/journal")):
        for directory in sorted(base.glob("*")):
            if (directory / "system.journal").exists():
                return directory
    raise AssertionError("systemd-journald keeps no system.journal")


def test_a_mounted_journal_directory_of_this_boot_is_rung_too(system_journald, tmp_config):
    """As a Kubernetes pod reads the node's journal: a directory, named by klog.journal_path.
    Once it is shown to hold this boot's kernel lines, /dev/kmsg wakes its reader as it
    wakes the system journal's."""
    directory = _live_journal_directory()
    config = tmp_config.replace({"klog.journal_path": str(directory), "klog.start": "now"})
    reader, detail, unproven = open_reader(config)
    try:
        assert unproven is None
        assert reader.wakes_on_new_lines and "woken by /dev/kmsg" in detail
        assert str(directory) in detail
        reader.seek(None, "now")
        list(reader.lines())
        Counting(reader).wakes_for_an_xid()
    finally:
        reader.close()


def test_a_source_refused_dev_kmsg_borrows_it_once_the_probes_lend_it(system_journald,
                                                                      tmp_config, tmp_path):
    """A Kubernetes pod: the unprivileged container may not open /dev/kmsg, the probes'
    privileged one lends it at klog.kmsg_socket, and may start later than the source."""
    from gpuwhy.probes.klog.lend import KmsgLender
    from gpuwhy.probes.klog.source import ReaderLiveness, _borrow_bell

    lent_at = tmp_path / "kmsg.sock"
    config = tmp_config.replace({"klog.backend": "journald", "klog.start": "now",
                                 "klog.kmsg_path": str(tmp_path / "refused"),
                                 "klog.kmsg_socket": str(lent_at)})
    reader, detail, unproven = open_reader(config)      # nobody lends it yet
    try:
        assert not reader.wakes_on_new_lines
        assert "refused" in detail and f"not lent at {lent_at}" in detail
        watch = ReaderLiveness(config, reader, detail, unproven)
        lender = KmsgLender(str(lent_at))               # the probes are up
        lender.start()
        try:
            _borrow_bell(config, reader, watch)          # the source's next health beat
        finally:
            lender.close()                                # what was lent stays lent
        assert reader.wakes_on_new_lines
        assert f"lent by the probes at {lent_at}" in watch.detail
        assert "not lent" not in watch.detail
        reader.seek(None, "now")
        list(reader.lines())
        Counting(reader).wakes_for_an_xid()
    finally:
        reader.close()
