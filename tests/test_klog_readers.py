"""The journald fallbacks (a /dev/kmsg-format reader, a kern.log tail), the automatic choice
between them, and the store keeping each record with its cursor in one transaction."""

import sqlite3

import pytest

from gpuwhy.events import Envelope, KernelLogRecord
from gpuwhy.probes.klog.kmsg import KmsgKernelLog, parse_record
from gpuwhy.probes.klog.source import open_reader
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
        ("NVRM: Xid", f"kmsg:{BOOT}:11", 2_000_000), ("NVRM: GPU", f"kmsg:{BOOT}:12", 3_000_000)]
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
    monkeypatch.setattr("gpuwhy.probes.klog.source.JOURNALD_SOCKET", str(tmp_path / "none"))
    reader, detail = open_reader(config)
    assert reader.origin == "file"
    assert "journald is not running" in detail and "No such file" in detail
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    reader, detail = open_reader(config.replace({"klog.kmsg_path": str(kmsg)}))
    assert reader.origin == "kmsg" and "sequence numbers" in detail
    reader.close()


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
    assert db.execute("select gpu_id, kind from events where topic = 'klog'").fetchall() == \
        [(uuid, "kernel_log_record")]
