"""The journald fallbacks (a /dev/kmsg-format reader, a kern.log tail), the automatic choice
between them, and the store keeping each record with its cursor in one transaction."""

import logging
import socket
import sqlite3
import subprocess

import pytest

from gpuwhy.events import Envelope, KernelLogRecord
from gpuwhy.probes.klog.journald import has_kernel_line_this_boot, line_of
from gpuwhy.probes.klog.kmsg import KmsgKernelLog, current_boot_id, parse_record
from gpuwhy.probes.klog.source import ReaderLiveness, open_reader
from gpuwhy.probes.klog.tail import FileKernelLog
from gpuwhy.store.writer import StoreWriter

BOOT = "ab" * 16


def test_kmsg_records_continuation_lines_and_cursor_of_this_boot(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"6,10,1000,-;usb 1-1: new device\n SUBSYSTEM=usb\n DEVICE=c189:1\n"
                     b"4,11,2000,-;NVRM: Xid (PCI:0000:43:00): 13, x\n"
                     b"garbage without header\n"
                     b"4,12,3000,c;NVRM: GPU at PCI:0000:43:00: GPU-1234\n")
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    assert reader.seek(f"kmsg:{BOOT}:10", "boot") is True
    lines = list(reader.lines())
    assert [(line.text[:9], line.cursor, line.monotonic_ns) for line in lines] == [
        ("NVRM: Xid", f"kmsg:{BOOT}:11:2000", 2_000_000),
        ("NVRM: GPU", f"kmsg:{BOOT}:12:3000", 3_000_000)]
    reader.close()
    other = KmsgKernelLog(str(path), boot_id=BOOT)
    assert other.seek("kmsg:" + "cd" * 16 + ":11", "boot") is False    # another boot: reread
    assert len(list(other.lines())) == 3
    other.close()


def test_kmsg_record_parser_rejects_malformed_headers():
    assert parse_record(b"x,1,2,-;text") is None and parse_record(b"no header") is None
    assert parse_record(b"14,1,2,-;text") == (6, 1, 2, "text")        # facility stripped


def test_file_tail_resumes_and_restarts_after_rotation(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("one\ntwo\npartial")
    reader = FileKernelLog(str(log))
    reader.seek(None, "all")
    first = list(reader.lines())
    assert [line.text for line in first] == ["one", "two"]
    cursor = first[-1].cursor
    with open(log, "a") as f:
        f.write(" line\nthree\n")
    resumed = FileKernelLog(str(log))
    assert resumed.seek(cursor, "all") is True
    assert [line.text for line in resumed.lines()] == ["partial line", "three"]
    log.rename(tmp_path / "kern.log.1")
    log.write_text("fresh\n")
    assert [line.text for line in resumed.lines()] == ["fresh"]


def test_automatic_choice_falls_back_and_says_why(tmp_config, tmp_path, monkeypatch):
    kern = tmp_path / "kern.log"
    kern.write_text("")
    config = tmp_config.replace({"klog.kmsg_path": str(tmp_path / "missing"),
                                 "klog.file": str(kern)})
    monkeypatch.setattr("gpuwhy.probes.klog.journald.JOURNALD_SOCKET", str(tmp_path / "none"))
    reader, detail, _ = open_reader(config)
    assert reader.origin == "file"
    assert "journald is not running" in detail and "No such file" in detail
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    reader, detail, _ = open_reader(config.replace({"klog.kmsg_path": str(kmsg)}))
    assert reader.origin == "kmsg" and "sequence numbers" in detail
    reader.close()


def test_a_journald_that_answers_but_keeps_no_kernel_line_is_passed_over(tmp_config, tmp_path,
                                                                        monkeypatch):
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listening.bind(str(tmp_path / "socket"))
    monkeypatch.setattr("gpuwhy.probes.klog.journald.JOURNALD_SOCKET", str(tmp_path / "socket"))
    # the journal's contents are the boundary here: journald_unproven reads the system journal
    monkeypatch.setattr("gpuwhy.probes.klog.journald.has_kernel_line_this_boot",
                        lambda path=None: False)
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    config = tmp_config.replace({"klog.kmsg_path": str(kmsg)})
    reader, detail, unproven = open_reader(config)
    assert reader.origin == "kmsg" and unproven is None
    assert "holds no kernel line of this boot" in detail
    reader.close()
    # named, it is read anyway, and says why it is not shown live
    reader, detail, unproven = open_reader(config.replace({"klog.backend": "journald"}))
    assert reader.origin == "journald" and "no kernel line of this boot" in unproven
    reader.close()
    listening.close()


def test_the_reader_fails_when_journald_stops_answering_and_recovers(tmp_config, tmp_path,
                                                                    monkeypatch, caplog):
    path = tmp_path / "socket"
    monkeypatch.setattr("gpuwhy.probes.klog.journald.JOURNALD_SOCKET", str(path))

    class Journal:
        origin = "journald"

    listening = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listening.bind(str(path))
    watch = ReaderLiveness(tmp_config, Journal(), "journald: from the system journal")
    with caplog.at_level(logging.WARNING, logger="gpuwhy.probes.klog.source"):
        assert watch.check(5) == ("ok", "journald: from the system journal")
        listening.close()                 # journald died: its socket file stays
        states = [watch.check(5) for _ in range(3)]
        path.unlink()
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listening.bind(str(path))         # ... and came back
        back = watch.check(6)
    listening.close()
    assert {state for state, _ in states} == {"failed"}
    assert "journald is not running" in states[0][1] and "Connection refused" in states[0][1]
    assert back[0] == "ok"
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]   # once each


def test_journal_holds_a_kernel_line_of_this_boot_or_not(tmp_path):
    def journal(name, boot):
        export = tmp_path / f"{name}.export"
        export.write_text(f"__REALTIME_TIMESTAMP=1700000000000000\n__MONOTONIC_TIMESTAMP=5\n"
                          f"_BOOT_ID={boot}\n_TRANSPORT=kernel\nMESSAGE=x\n\n")
        out = tmp_path / f"{name}.journal"
        subprocess.run(["/lib/systemd/systemd-journal-remote", f"--output={out}", str(export)],
                       check=True, capture_output=True)
        return str(out)

    assert has_kernel_line_this_boot(journal("this", current_boot_id())) is True
    assert has_kernel_line_this_boot(journal("other", "cd" * 16)) is False


def record(cursor, **fields):
    return Envelope("klog", 1, KernelLogRecord(ts=1, cursor=cursor, origin="kmsg", boot_id=BOOT,
                                               record_kind="xid", xid=79, pci="0000:0a:00",
                                               **fields))


def test_cursor_is_committed_with_the_record_or_not_at_all(db):
    writer = StoreWriter(db)
    writer.write_batch([record("kmsg:b:1")])
    db.execute("create trigger fail before insert on kernel_log when new.cursor = 'kmsg:b:3' "
               "begin select raise(abort, 'disk full'); end")
    with pytest.raises(sqlite3.IntegrityError):
        writer.write_batch([record("kmsg:b:2"), record("kmsg:b:3")])
    assert db.execute("select cursor from source_cursors").fetchall() == [("kmsg:b:1",)]
    assert [r[0] for r in db.execute("select cursor from kernel_log")] == ["kmsg:b:1"]


def test_uuid_line_maps_pci_to_gpu_for_later_xids_and_duplicates_are_ignored(db):
    writer = StoreWriter(db)
    uuid = "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae"
    writer.write_batch([
        Envelope("klog", 1, KernelLogRecord(ts=1, cursor="c1", origin="journald", boot_id=BOOT,
                                            record_kind="gpu_uuid", pci="0000:0a:00",
                                            uuid=uuid)),
        record("c2"), record("c2")])
    assert db.execute("select gpu_id from kernel_log where cursor = 'c2'").fetchone() == (uuid,)
    assert db.execute("select count(*) from kernel_log").fetchone() == (2,)
    assert db.execute("select gpu_id, kind from kernel_log where cursor = 'c2'").fetchall() == \
        [(uuid, "xid")]
    assert db.execute("select count(*) from events where topic = 'klog'").fetchone() == (0,)


def test_a_journal_line_is_timed_when_its_sender_logged_it():
    """journald's receive stamp can fall after what the sender did next (cron's job exec'ing
    its command, ~2 ms later on a busy host): the sender's own stamp comes first."""
    entry = {"MESSAGE": "(root) CMD ([7] nvidia-smi -r)", "SYSLOG_IDENTIFIER": "CRON",
             "__CURSOR": "c", "_BOOT_ID": "b", "__MONOTONIC_TIMESTAMP": (5, b"\x00" * 16),
             "__REALTIME_TIMESTAMP": 1_700_000_000_002_300}
    assert line_of(entry).realtime_ns == 1_700_000_000_002_300_000
    sent = line_of({**entry, "_SOURCE_REALTIME_TIMESTAMP": 1_700_000_000_000_100})
    assert sent.realtime_ns == 1_700_000_000_000_100_000
