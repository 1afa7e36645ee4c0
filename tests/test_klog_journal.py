"""The journald path on private journal files built by systemd-journal-remote from export
format (real journal files, real systemd-python reader, real bus, real store)."""

import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.clock import ClockConverter
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.klog.journald import JournalKernelLog
from gpuwhy.probes.klog.kmsg import current_boot_id
from gpuwhy.probes.klog.source import run_klog_source
from gpuwhy.store import open_store
from gpuwhy.store.source_cursors import cursor_reader

REMOTE = Path("/lib/systemd/systemd-journal-remote")
OTHER_BOOT = "0123456789abcdef0123456789abcdef"
# an hour ago on a whole second: a fixed date would one day fall out of store.event_days and
# be pruned by the store's retention (a fixed 2025-11-30 did, on 2026-11-30)
T0_US = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000
XID79 = "Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def export_entry(message, *, boot=OTHER_BOOT, mono_us=1_000_000, real_us=T0_US,
                 transport="kernel", identifier=None):
    fields = {"__REALTIME_TIMESTAMP": real_us, "__MONOTONIC_TIMESTAMP": mono_us,
              "_BOOT_ID": boot, "_TRANSPORT": transport, "PRIORITY": 4, "MESSAGE": message}
    if transport == "kernel":
        fields["_SOURCE_MONOTONIC_TIMESTAMP"] = mono_us - 7
    if identifier:
        fields["SYSLOG_IDENTIFIER"] = identifier
    return "".join(f"{k}={v}\n" for k, v in fields.items()) + "\n"


def build_journal(directory: Path, name: str, entries: list[str]) -> Path:
    directory.mkdir(exist_ok=True)
    source = directory / f"{name}.export"
    source.write_text("".join(entries))
    output = directory / f"{name}.journal"
    result = subprocess.run([str(REMOTE), f"--output={output}", str(source)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    source.unlink()
    return output


def test_reader_keeps_kernel_and_nvrm_lines_and_puts_the_prefix_back(tmp_path):
    journal = build_journal(tmp_path / "j", "a", [
        export_entry(XID79, identifier="NVRM", mono_us=1_000_000),
        export_entry("Accepted publickey for root", transport="syslog", identifier="sshd",
                     mono_us=2_000_000, real_us=T0_US + 1),
        export_entry("SXid (PCI:0000:84:00.0): 12028, Fatal, Link 32 egress",
                     identifier="nvidia-nvswitch1", mono_us=3_000_000, real_us=T0_US + 2),
        export_entry("NVRM: forwarded", transport="syslog", identifier="NVRM",
                     mono_us=4_000_000, real_us=T0_US + 3),
    ])
    reader = JournalKernelLog(str(journal))
    reader.seek(None, "all")
    lines = list(reader.lines())
    assert [line.text for line in lines] == [
        f"NVRM: {XID79}", "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Fatal, Link 32 "
        "egress", "NVRM: forwarded"]
    first = lines[0]
    assert first.boot_id == OTHER_BOOT
    assert first.monotonic_ns == (1_000_000 - 7) * 1000        # _SOURCE_MONOTONIC_TIMESTAMP
    assert first.realtime_ns == T0_US * 1000
    assert first.cursor.startswith("s=") and len({line.cursor for line in lines}) == 3
    reader.close()


@pytest.fixture
def correlator(tmp_config):
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    stop = threading.Event()
    corr = Correlator(tmp_config, db, subscriber)
    thread = threading.Thread(target=corr.run, args=(stop,), daemon=True)
    thread.start()
    yield db
    stop.set()
    thread.join(5)
    subscriber.close()
    db.close()


def run_source_until(config, db, predicate, timeout=15.0):
    stop = threading.Event()
    thread = threading.Thread(target=run_klog_source, args=(config, stop), daemon=True,
                              kwargs={"cursors": cursor_reader(config["store.path"])})
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not predicate(db):
            assert time.monotonic() < deadline, "source did not deliver in time"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive(), "source did not stop within 5 s"


def stored(db):
    return db.execute("select line, kind, xid, pci, pid, ts, raw_ts, boot_id from kernel_log "
                      "order by ts").fetchall()


def test_source_resumes_after_the_cursor_committed_with_the_data(tmp_config, correlator):
    journal_dir = tmp_path = Path(tmp_config["store.path"]).parent / "journal"
    first = [export_entry(f"Xid (PCI:0000:0a:00): 13, pid={n}, name=t, first batch",
                          identifier="NVRM", mono_us=1_000_000 + n, real_us=T0_US + n)
             for n in range(20)]
    first.append(export_entry("eth0: link up", mono_us=1_000_100, real_us=T0_US + 100))
    build_journal(tmp_path, "a", first)
    config = tmp_config.replace({"klog.journal_path": str(journal_dir), "klog.start": "all"})
    db = correlator

    def checkpointed(db):
        row = db.execute("select cursor from source_cursors where source = 'klog'").fetchone()
        return len(stored(db)) == 20 and row is not None and "eth0" in _line_at(journal_dir,
                                                                                 row[0])
    run_source_until(config, db, checkpointed)
    # More lines arrive while the source is down (a new journal file), one of another boot.
    build_journal(tmp_path, "b", [
        export_entry(f"Xid (PCI:0000:0b:00): 48, pid={n}, name=t, second batch",
                     identifier="NVRM", mono_us=2_000_000 + n, real_us=T0_US + 1000 + n)
        for n in range(5)])
    run_source_until(config, db, lambda db: len(stored(db)) >= 25)
    time.sleep(0.5)                       # anything re-sent would have arrived by now
    rows = stored(db)
    assert len(rows) == 25
    assert sorted(r[4] for r in rows if r[3] == "0000:0a:00") == list(range(20))
    assert sorted(r[4] for r in rows if r[3] == "0000:0b:00") == list(range(5))
    # Lines of another boot keep journald's realtime; raw_ts keeps the printk time.
    first_row = rows[0]
    assert first_row[5] == T0_US * 1000 and first_row[6] == (1_000_000 - 7) * 1000
    health = db.execute("select state, detail from source_health where source = 'klog'"
                        ).fetchone()
    assert health[0] == "ok" and "journald" in health[1] and "resumed" in health[1]


def _line_at(journal_dir: Path, cursor: str) -> str:
    reader = JournalKernelLog(str(journal_dir), matches=({"_TRANSPORT": "kernel"},))
    reader.seek(cursor, "all")
    # seek() positions *after* the cursor: step back to read the entry itself.
    reader._reader.get_previous()
    entry = reader._reader.get_next()
    reader.close()
    return entry.get("MESSAGE", "")


def test_records_resent_after_a_restart_are_stored_once(tmp_config, correlator):
    journal_dir = Path(tmp_config["store.path"]).parent / "journal"
    build_journal(journal_dir, "a", [export_entry(XID79, identifier="NVRM")])
    config = tmp_config.replace({"klog.journal_path": str(journal_dir), "klog.start": "all"})
    run_source_until(config, correlator, lambda db: len(stored(db)) == 1)
    # Forget the cursor, as if the source died after publishing but before the store
    # committed: the line is read and published again, and must not be stored twice.
    with correlator.atomic():
        correlator.execute("delete from source_cursors")
        correlator.execute("delete from source_health")

    def published_again(db):
        row = db.execute("select counters from source_health where source = 'klog'").fetchone()
        return row is not None and json.loads(row[0]).get("records") == 1
    run_source_until(config, correlator, published_again)
    time.sleep(0.3)
    assert len(stored(correlator)) == 1


def test_this_boots_lines_are_timed_by_their_printk_clock(tmp_path):
    boot = current_boot_id()
    mono_us = time.monotonic_ns() // 1000 - 5_000_000      # printed five seconds ago
    journal = build_journal(tmp_path / "j", "a", [
        export_entry(XID79, identifier="NVRM", boot=boot, mono_us=mono_us + 7,
                     real_us=T0_US)])                      # journald's receive time: ignored
    reader = JournalKernelLog(str(journal))
    reader.seek(None, "all")
    [line] = list(reader.lines())
    reader.close()
    from gpuwhy.probes.klog.source import KernelLogPump

    pump = KernelLogPump(reader, publisher=None, stop=threading.Event(),
                         clock=ClockConverter(), boot_id=boot)
    expected = time.time_ns() - 5_000_000_000
    assert abs(pump.realtime(line) - expected) < 500_000_000
    other = type(line)(line.text, line.cursor, uuid.uuid4().hex, line.monotonic_ns,
                       line.realtime_ns)
    assert pump.realtime(other) == T0_US * 1000           # another boot: journald's time


class PipeBell:
    """A stand-in for /dev/kmsg's KernelLineBell (that needs root): a pipe, readable when
    written to; ``ring`` counts the bytes waiting, or fails as told."""

    def __init__(self, fails: bool = False):
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)
        self.fails, self.closed = fails, False

    def fileno(self):
        return self.read_end

    def ring(self):
        if self.fails:
            raise OSError(5, "Input/output error")
        try:
            return len(os.read(self.read_end, 4096))
        except BlockingIOError:
            return 0

    def close(self):
        self.closed = True
        os.close(self.read_end)
        os.close(self.write_end)


def test_a_rung_bell_chases_the_journal_until_it_has_the_kernel_lines(tmp_path):
    from gpuwhy.probes.klog.journald import CHASE_WAITS_S

    journal = build_journal(tmp_path / "j", "a", [export_entry(XID79, identifier="NVRM")])
    bell = PipeBell()
    reader = JournalKernelLog(str(journal), bell=bell)
    reader.seek(None, "all")
    assert reader.wakes_on_new_lines
    os.write(bell.write_end, b"xx")            # the kernel logged two records
    reader.wait(5)
    assert reader._owed == 2
    assert len(list(reader.lines())) == 1      # journald has handed one over so far
    for _ in CHASE_WAITS_S:                    # looked at again soon, a bounded number of times
        started = time.monotonic()
        reader.wait(5)
        assert time.monotonic() - started < 1
    started = time.monotonic()
    reader.wait(0.3)                           # given up on: back to waiting for the bell
    assert reader._owed == 0 and time.monotonic() - started >= 0.25
    reader.close()
    assert bell.closed


def test_a_failing_bell_is_dropped_and_the_journal_looked_at_as_without_one(tmp_path,
                                                                             caplog):
    journal = build_journal(tmp_path / "j", "a", [export_entry(XID79, identifier="NVRM")])
    bell = PipeBell(fails=True)
    reader = JournalKernelLog(str(journal), bell=bell)
    os.write(bell.write_end, b"x")
    reader.wait(5)
    assert not reader.wakes_on_new_lines and bell.closed
    assert "kernel-line bell failed" in caplog.text
    reader.seek(None, "all")
    assert len(list(reader.lines())) == 1
    reader.close()


def test_a_named_journal_not_shown_to_be_this_boots_gets_no_bell(tmp_config, tmp_path):
    """A journal copied from elsewhere (another boot's lines only) is read, but no kernel of
    ours rings for it: it is looked at every IDLE_WAIT_S, and the status says why."""
    from gpuwhy.probes.klog.journald import IDLE_WAIT_S
    from gpuwhy.probes.klog.source import open_reader

    directory = tmp_path / "copied"
    build_journal(directory, "a", [export_entry(XID79, identifier="NVRM")])
    kmsg_stand_in = "/dev/null"     # a character device: a bell could be made of it
    config = tmp_config.replace({"klog.journal_path": str(directory),
                                 "klog.kmsg_path": kmsg_stand_in})
    reader, detail, unproven = open_reader(config)
    try:
        assert reader.origin == "journald" and "no kernel line of this boot" in unproven
        assert not reader.wakes_on_new_lines
        assert f"looked at every {IDLE_WAIT_S:g} s (not shown to be this boot's" in detail
    finally:
        reader.close()
