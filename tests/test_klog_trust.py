"""Kernel lines only from the kernel, and every kernel-log gap said (issue #54, items 1-2).

Real journal files (systemd-journal-remote), the real systemd-python reader, bus, correlator
and store; /dev/kmsg is played by files of its records (the live device is in
tests/privileged/test_klog_trust_live.py).
"""

import json
import threading
import time
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.klog.gpus import GpuBound, nvidia_pci_addresses
from gpuwhy.probes.klog.journald import JournalKernelLog, stamp_of_cursor
from gpuwhy.probes.klog.kmsg import KmsgKernelLog, current_boot_id
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import UNPARSED
from gpuwhy.probes.klog.source import FORGED, KernelLogPump, LostLines, health_of
from gpuwhy.probes.klog.tail import FileKernelLog
from gpuwhy.store import open_store

from .klog_pump import FakeReader, WirePublisher
from .test_klog_journal import T0_US, build_journal, run_source_until

BOOT = "ab" * 16


@pytest.fixture
def correlator(tmp_config):
    """The real correlator writing tmp_config's store in a thread; yields its store."""
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    stop = threading.Event()
    thread = threading.Thread(target=Correlator(tmp_config, db, subscriber).run, args=(stop,),
                              daemon=True)
    thread.start()
    yield db
    stop.set()
    thread.join(5)
    subscriber.close()
    db.close()


@pytest.fixture(autouse=True)
def frequent_health(monkeypatch):
    """Health beats every 0.2 s instead of 5: the tests wait on what a beat says."""
    monkeypatch.setattr("gpuwhy.probes.klog.source.HEALTH_EVERY_S", 0.2)


def entry(message, *, boot=BOOT, mono_us=1_000_000, real_us=T0_US, transport="kernel",
          identifier="NVRM", source_us=None, uid=None, pid=None, comm=None):
    """One journal entry in export format; a kernel one has its printk time (``source_us``)."""
    fields = {"__REALTIME_TIMESTAMP": real_us, "__MONOTONIC_TIMESTAMP": mono_us,
              "_BOOT_ID": boot, "_TRANSPORT": transport, "PRIORITY": 3, "MESSAGE": message,
              "SYSLOG_IDENTIFIER": identifier}
    if transport == "kernel":
        fields["_SOURCE_MONOTONIC_TIMESTAMP"] = source_us if source_us is not None else mono_us
    for key, value in (("_UID", uid), ("_PID", pid), ("_COMM", comm)):
        if value is not None:
            fields[key] = value
    return "".join(f"{k}={v}\n" for k, v in fields.items()) + "\n"


def forged(n, **kw):
    return entry(f"Xid (PCI:0000:18:00): 48, pid={n}, name=x, DBE (forged test line)",
                 transport="stdout", uid=65534, pid=4242, comm="systemd-cat", **kw)


def test_journal_entries_not_from_the_kernel_come_out_forged_with_their_sender(tmp_path):
    journal = build_journal(tmp_path / "j", "a", [
        entry("Xid (PCI:0000:0a:00): 13, pid=1, name=t, from the kernel"),
        forged(1, mono_us=2_000_000, real_us=T0_US + 1),
        entry("Xid (PCI:0000:0a:00): 13, via logger", transport="syslog", uid=1000,
              pid=77, comm="logger\x1b[31m", mono_us=3_000_000, real_us=T0_US + 2)])
    reader = JournalKernelLog(str(journal))
    reader.seek(None, "all")
    lines = list(reader.lines())
    reader.close()
    assert [line.forged_by for line in lines][0] is None
    sender = lines[1].forged_by
    assert (sender.uid, sender.pid, sender.comm, sender.transport) == \
        (65534, 4242, "systemd-cat", "stdout")
    assert lines[2].forged_by.transport == "syslog"
    # the command name is the sender's to choose: escaped wherever it is shown
    assert "\x1b" not in lines[2].forged_by.describe()
    # the cron source reads user-space entries with the same class: nothing forged there
    cron = JournalKernelLog(str(journal), matches=({"SYSLOG_IDENTIFIER": "NVRM"},))
    cron.seek(None, "all")
    assert [line.forged_by for line in cron.lines()] == [None, None, None]
    cron.close()


def test_a_flood_of_forged_nvrm_entries_opens_no_incident_and_is_counted(tmp_config,
                                                                         correlator):
    journal_dir = Path(tmp_config["store.path"]).parent / "journal"
    build_journal(journal_dir, "a", [forged(n, mono_us=1_000_000 + n, real_us=T0_US + n)
                                     for n in range(1000)]
                  + [entry("eth0: link up", identifier="kernel", mono_us=1_002_000,
                           real_us=T0_US + 2000)])
    config = tmp_config.replace({"klog.journal_path": str(journal_dir), "klog.start": "all",
                                 "klog.backend": "journald"})

    def counted(db):
        row = db.execute("select counters from source_health where source = 'klog'").fetchone()
        return row is not None and json.loads(row[0]).get("lines") == 1001
    run_source_until(config, correlator, counted)
    db = correlator
    state, detail, counters = db.execute(
        "select state, detail, counters from source_health where source = 'klog'").fetchone()
    counters = json.loads(counters)
    assert counters["forged"] == 1000 and counters["records"] == 0
    assert "1000 forged NVRM entries" in detail and "uid 65534" in detail
    assert "systemd-cat" in detail
    # one record the store keeps (who, how often), no Xid, no GPU, no incident
    rows = db.execute("select kind, xid, pci, gpu_id, details from kernel_log").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(FORGED, None, None, None)]
    details = json.loads(rows[0][4])
    assert (details["uid"], details["sender_pid"], details["comm"], details["attempts"]) == \
        (65534, 4242, "systemd-cat", 1)
    assert db.execute("select count(*) from incidents").fetchone()[0] == 0
    assert db.execute("select count(*) from gpus").fetchone()[0] == 0


def xid_line(n, pci):
    return RawLine(f"NVRM: Xid (PCI:{pci}): 13, pid={n}, name=t, Graphics Exception",
                   f"kmsg:{BOOT}:{n}", BOOT, 1_000_000 + n)


def test_gpus_named_by_the_kernel_log_are_bounded_by_what_the_host_can_have():
    lines = [xid_line(0, "0000:18:00")] + \
        [xid_line(n, f"0001:{n % 256:02x}:{n // 256:02x}") for n in range(1, 1000)]
    publisher = WirePublisher()
    bound = GpuBound(listed={"0000:18:00"}, unlisted=4)
    pump = KernelLogPump(FakeReader(lines), publisher, threading.Event(), boot_id=BOOT,
                         bound=bound)
    while pump.pump():
        pass
    records = [e.event for e in publisher.envelopes]
    taken = {r.pci for r in records if r.record_kind == "xid"}
    assert taken == {"0000:18:00", "0001:01:00", "0001:02:00", "0001:03:00", "0001:04:00"}
    refused = [r for r in records if r.record_kind == UNPARSED]
    assert len(refused) == 995 == pump.counters["gpus_over_bound"] == pump.counters["unparsed"]
    assert all(r.pci is None and r.xid is None and r.details["parsed_as"] == "xid"
               for r in refused)
    assert "beyond the GPUs this host can have" in refused[0].details["reason"]
    # the listed GPU, and those already admitted, are still taken after the bound is hit
    pump.reader = FakeReader([xid_line(1000, "0000:18:00"), xid_line(1001, "0001:02:00")])
    pump.pump()
    assert [e.event.record_kind for e in publisher.envelopes[-2:]] == ["xid", "xid"]


def test_the_nvidia_functions_are_read_from_sysfs(tmp_path):
    for name, vendor in (("0000:18:00.0", "0x10de"), ("0000:18:00.1", "0x10de"),
                         ("0000:3b:00.0", "0x8086"), ("0000:c1:00.0", "0x10DE")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
    (tmp_path / "junk").mkdir()
    assert nvidia_pci_addresses(str(tmp_path)) == {"0000:18:00", "0000:c1:00"}
    assert nvidia_pci_addresses(str(tmp_path / "missing")) == set()


def kmsg_records(*records):
    """/dev/kmsg records ``(seq, usec, text)`` as the device returns them."""
    return b"".join(f"3,{seq},{usec},-;{text}\n".encode() for seq, usec, text in records)


def test_kmsg_sequence_numbers_show_every_lost_range(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(kmsg_records((20, 100, "a"), (21, 101, "b"), (25, 105, "c"),
                                  (26, 106, "d"), (40, 120, "e")))
    # across a restart: the stored cursor said 10 was the last read; 11-19 are gone
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    assert reader.seek(f"kmsg:{BOOT}:10", "boot")
    assert [line.text for line in reader.lines()] == ["a", "b", "c", "d", "e"]
    assert reader.take_gaps() == [(11, 19), (22, 24), (27, 39)]
    assert reader.lost == 9 + 3 + 13 and reader.take_gaps() == []
    reader.close()
    # a cursor still in the ring: no loss before it
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    assert reader.seek(f"kmsg:{BOOT}:21:101", "boot")
    assert [line.text for line in reader.lines()] == ["c", "d", "e"]
    assert reader.take_gaps() == [(22, 24), (27, 39)]
    reader.close()
    # a first run reads what the ring holds: nothing was expected before it
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    reader.seek(None, "boot")
    list(reader.lines())
    assert reader.take_gaps() == [(22, 24), (27, 39)] and reader.first_seq == 20
    reader.close()


def seed_cursor(path, origin, cursor, boot_id):
    """A cursor as an earlier run left it, written on a connection of its own: the
    correlator's thread holds the fixture's connection (one connection is one transaction)."""
    db = open_store(path)
    try:
        with db.atomic():
            db.execute("insert or replace into source_cursors (source, origin, cursor, "
                       "boot_id, updated_at) values ('klog', ?, ?, ?, 0)",
                       [origin, cursor, boot_id])
    finally:
        db.close()


def test_lines_lost_across_a_restart_degrade_the_source_with_their_range(tmp_config,
                                                                         correlator):
    boot = current_boot_id()
    path = Path(tmp_config["store.path"]).parent / "kmsg"
    path.write_bytes(kmsg_records(
        (500, 9_000_000, "NVRM: Xid (PCI:0000:0a:00): 13, pid=1, name=t, first"),
        (501, 9_000_001, "eth0: up"),
        (720, 9_000_220, "NVRM: Xid (PCI:0000:0a:00): 13, pid=2, name=t, after a gap")))
    seed_cursor(tmp_config["store.path"], "kmsg", f"kmsg:{boot}:389:8999000", boot)
    config = tmp_config.replace({"klog.backend": "kmsg", "klog.kmsg_path": str(path)})

    def reported(db):
        row = db.execute("select counters from source_health where source = 'klog'").fetchone()
        return row is not None and json.loads(row[0]).get("lines") == 3
    run_source_until(config, correlator, reported)
    state, detail, counters = correlator.execute(
        "select state, detail, counters from source_health where source = 'klog'").fetchone()
    counters = json.loads(counters)
    assert state == "degraded"
    assert "[390, 499]" in detail and "[502, 719]" in detail
    assert counters["lost_lines"] == 110 + 218 and counters["lost_ranges"] == 2
    assert correlator.execute("select count(*) from kernel_log where kind = 'xid'"
                              ).fetchone()[0] == 2


def test_a_switch_between_journald_and_kmsg_reads_nothing_twice_and_skips_nothing(
        tmp_config, correlator):
    boot = current_boot_id()
    base = time.monotonic_ns() // 1000 - 60_000_000        # printed a minute ago
    journal_dir = Path(tmp_config["store.path"]).parent / "journal"
    path = Path(tmp_config["store.path"]).parent / "kmsg"

    def text(n):
        return f"Xid (PCI:0000:0a:00): 13, pid={n}, name=t, line {n}"

    def usec(n):
        return base + min(n, 8) * 10 + max(0, n - 9) * 10    # lines 8 and 9: one microsecond

    def journal_entries(numbers, name):
        build_journal(journal_dir, name, [
            entry(text(n), boot=boot, mono_us=usec(n) + 300, source_us=usec(n),
                  real_us=T0_US + n) for n in numbers])

    def stored_pids(db):
        return sorted(r[0] for r in db.execute("select pid from kernel_log"))

    # journald, then down at the next start: /dev/kmsg takes over
    journal_entries(range(10), "a")
    config = tmp_config.replace({"klog.journal_path": str(journal_dir), "klog.start": "all",
                                 "klog.backend": "journald"})
    run_source_until(config, correlator, lambda db: stored_pids(db) == list(range(10)))
    cursor = correlator.execute("select cursor from source_cursors").fetchone()[0]
    assert stamp_of_cursor(cursor, str(journal_dir))[:3] == (boot, usec(9), 1)
    path.write_bytes(kmsg_records(*((1000 + n, usec(n), f"NVRM: {text(n)}")
                                    for n in range(3, 20))))
    config = config.replace({"klog.backend": "kmsg", "klog.kmsg_path": str(path)})
    run_source_until(config, correlator, lambda db: len(stored_pids(db)) >= 20)
    time.sleep(0.3)
    assert stored_pids(correlator) == list(range(20))
    # and back: journald again, resuming from the kmsg cursor's printk time
    journal_entries(range(10, 25), "b")
    config = config.replace({"klog.backend": "journald"})
    run_source_until(config, correlator, lambda db: len(stored_pids(db)) >= 25)
    time.sleep(0.3)
    assert stored_pids(correlator) == list(range(25))
    detail = correlator.execute("select detail from source_health where source = 'klog'"
                                ).fetchone()[0]
    assert "resumed after the stored kmsg position" in detail


@pytest.mark.parametrize("ties", [0, 1])
def test_kmsg_resumes_after_a_stamp_within_one_microsecond(tmp_path, ties):
    path = tmp_path / "kmsg"
    path.write_bytes(kmsg_records((5, 100, "a"), (6, 200, "b"), (7, 200, "c"), (8, 300, "d")))
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    assert reader.seek_stamp(BOOT, 200, ties)
    assert [line.text for line in reader.lines()] == ["c", "d"][ties:]
    assert reader.take_gaps() == [] and reader.unknown_loss_before is None
    reader.close()
    assert not KmsgKernelLog(str(path), boot_id=BOOT).seek_stamp("cd" * 16, 200)


def test_a_syslog_file_line_from_a_user_space_program_is_forged(tmp_path):
    log = tmp_path / "syslog"
    log.write_text(
        "2026-12-07T16:00:00.123456+00:00 host kernel: NVRM: Xid (PCI:0000:0a:00): 79, "
        "pid=1, name=t, GPU has fallen off the bus.\n"
        "2026-12-07T16:00:01.000001+00:00 host NVRM[4242]: Xid (PCI:0000:0b:00): 48, "
        "pid=2, name=t, DBE\n"
        "Dec  7 16:00:02 host NVRM: Xid (PCI:0000:0c:00): 48, pid=3, name=t, DBE\n"
        "[   12.345678] NVRM: Xid (PCI:0000:0d:00): 13, pid=4, name=t, a dmesg dump\n")
    reader = FileKernelLog(str(log))
    reader.seek(None, "all")
    publisher = WirePublisher()
    pump = KernelLogPump(reader, publisher, threading.Event(), boot_id=BOOT,
                         bound=GpuBound(listed=set()))
    assert pump.pump() == 4
    records = [e.event for e in publisher.envelopes]
    assert [(r.record_kind, r.pci) for r in records] == \
        [("xid", "0000:0a:00"), (FORGED, None), ("xid", "0000:0d:00")]
    assert records[1].details["sender_pid"] == 4242 and records[1].details["comm"] == "NVRM"
    assert pump.counters["forged"] == 2 and pump.forgeries.total == 2


def test_a_stamp_older_than_the_ring_says_lines_may_have_been_lost(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(kmsg_records((50, 500, "x"), (51, 501, "y")))
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    assert reader.seek_stamp(BOOT, 100)
    assert [line.text for line in reader.lines()] == ["x", "y"]
    assert reader.unknown_loss_before == 50 and reader.take_gaps() == []
    lost = LostLines()
    lost.take(reader)
    assert lost.recent() and "before sequence number 50 may have been lost" in lost.describe()
    reader.close()


def test_journalds_own_report_of_missed_kernel_lines_is_a_loss_and_not_forgeable(tmp_path):
    missed_id = "e9bf28e6e834481bb6f48f548ad13606"
    journal = build_journal(tmp_path / "j", "a", [
        entry("Missed 386 kernel messages", transport="driver", identifier="systemd-journald")
        .replace("PRIORITY=3\n", f"PRIORITY=3\nMESSAGE_ID={missed_id}\n"),
        entry("Missed 9999 kernel messages", transport="journal", uid=65534, pid=9,
              comm="python3", identifier="systemd-journald", mono_us=2_000_000,
              real_us=T0_US + 1)
        .replace("PRIORITY=3\n", f"PRIORITY=3\nMESSAGE_ID={missed_id}\n")])
    reader = JournalKernelLog(str(journal))
    reader.seek(None, "all")
    publisher = WirePublisher()
    pump = KernelLogPump(reader, publisher, threading.Event(), boot_id=BOOT)
    assert pump.pump() == 2
    reader.close()
    # journald's own entry (transport "driver", which only journald writes) counts; the same
    # words sent by a user are a forgery
    assert pump.counters["daemon_missed"] == 386 and pump.counters["forged"] == 1
    assert [e.event.record_kind for e in publisher.envelopes] == [FORGED]


def test_a_missed_report_degrades_the_source_only_while_it_is_recent():
    """journald's report of missed kernel lines is counted and said whenever it was made;
    the source reads degraded for a while after the loss, not after a start that reads the
    boot's journal and finds an hours-old report (#54: every loss said, none made new)."""
    class Alive:
        def check(self, lines_read):
            return "ok", "journald"

    pump = KernelLogPump(FakeReader([]), WirePublisher(), threading.Event(), boot_id=BOOT)
    pump.missed(386, time.time_ns() - 3600 * 10**9)
    health = health_of(Alive(), pump, LostLines(), WirePublisher())
    assert health.state == "ok" and "journald missed 386 kernel lines" in health.detail
    assert health.counters["daemon_missed"] == 386
    pump.missed(5, time.time_ns() - 10**9)
    assert health_of(Alive(), pump, LostLines(), WirePublisher()).state == "degraded"


def test_a_kmsg_line_root_wrote_is_kept_and_says_so(tmp_path):
    # the kernel gives what user space writes to /dev/kmsg a facility of its own (LOG_USER
    # when the writer names none): "<3>NVRM: ..." arrives as priority 11
    path = tmp_path / "kmsg"
    path.write_bytes(b"3,1,100,-;NVRM: Xid (PCI:0000:0a:00): 13, pid=1, name=t, the driver\n"
                     b"11,2,200,-;NVRM: Xid (PCI:0000:0a:00): 13, pid=2, name=t, root\n")
    reader = KmsgKernelLog(str(path), boot_id=BOOT)
    reader.seek(None, "boot")
    publisher = WirePublisher()
    KernelLogPump(reader, publisher, threading.Event(), boot_id=BOOT).pump()
    reader.close()
    records = [e.event for e in publisher.envelopes]
    assert [(r.record_kind, r.pid) for r in records] == [("xid", 1), ("xid", 2)]
    assert "kmsg_facility" not in records[0].details
    assert records[1].details["kmsg_facility"] == 1


def test_a_journald_cursor_whose_entry_is_gone_gives_its_own_receive_time(tmp_path):
    journal = build_journal(tmp_path / "j", "a", [entry("eth0: up", identifier="kernel")])
    cursor = f"s=0123;i=9;b={BOOT};m=f4240;t=60a24181e4000;x=1"     # of a journal since gone
    boot, usec, ties, how = stamp_of_cursor(cursor, str(journal))
    assert (boot, usec, ties) == (BOOT, 0xF4240, 0) and "receive time" in how
    assert stamp_of_cursor("not a cursor", str(journal)) is None
