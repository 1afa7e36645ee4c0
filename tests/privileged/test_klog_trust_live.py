"""Kernel lines only from the kernel, and every lost kernel line said, on the real thing:

- a journald of its own (a private mount namespace, so the host's journal is untouched) fed
  by the real /dev/kmsg, and an entry forged as ``NVRM`` by an unprivileged user
  (``setpriv --reuid=65534 systemd-cat -t NVRM``): read by the real source into the real
  store, the forgery is counted with its sender and opens no incident, the kernel's line
  is an Xid;
- the real /dev/kmsg overwriting lines a reader had not read (a reader left behind, and a
  source down while the kernel logs): the lost sequence numbers are reported exactly;
- a private journald stopped (SIGSTOP) while the kernel logs more than its ring holds: its
  own "Missed N kernel messages" is read as a loss.

These tests write into the host's real kernel log (as root, unless GPUWHY_TEST_KMSG=0), and
every line they write says it is a test.
"""

import json
import os
import re
import sqlite3
import subprocess
import threading

import pytest

from gpuwhy.probes.klog.journald import JournalKernelLog
from gpuwhy.probes.klog.kmsg import KmsgKernelLog, current_boot_id
from gpuwhy.probes.klog.source import FORGED, KernelLogPump, LostLines, health_of, run_klog_source
from gpuwhy.store.source_cursors import cursor_reader

from .kernel_lines import MARK, wait_for, write_kmsg

pytestmark = [pytest.mark.root, pytest.mark.kmsg]

# Run in a private mount namespace: a journald whose sockets and journal files are on
# tmpfs mounts nobody else sees. It copies its journal out once it has stopped.
PRIVATE_JOURNALD = r"""
set -eu
for dir in /run/systemd/journal /run/log/journal /var/log/journal; do
    mkdir -p "$dir"; mount -t tmpfs tmpfs "$dir"
done
/lib/systemd/systemd-journald &
journald=$!
for _ in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
seen() { journalctl -q -D /run/log/journal -o cat --no-pager | grep -c -- "$1" || true; }
printf '<6>gpuwhy trust test start run=%s %s\n' "$RUN" "$MARK" > /dev/kmsg
for _ in $(seq 100); do [ "$(seen "start run=$RUN")" = 1 ] && break; sleep 0.05; done
for n in $(seq 20); do
    printf 'Xid (PCI:0000:e8:00): 48, pid=%s, name=t, forged run=%s %s\n' "$n" "$RUN" "$MARK" |
        setpriv --reuid=65534 --regid=65534 --clear-groups systemd-cat -t NVRM
done
printf '<3>NVRM: Xid (PCI:0000:e7:00): 13, pid=1, name=t, kernel run=%s %s\n' "$RUN" "$MARK" \
    > /dev/kmsg
for _ in $(seq 100); do
    [ "$(seen "run=$RUN")" = 22 ] && break; sleep 0.05
done
kill "$journald"; wait "$journald" || true
cp -r /run/log/journal/. "$OUT"
"""


def test_an_nvrm_entry_forged_by_a_user_is_counted_and_opens_no_incident(
        tmp_config, kernel_log_store, tmp_path, monkeypatch):
    monkeypatch.setattr("gpuwhy.probes.klog.source.HEALTH_EVERY_S", 0.2)
    run = os.urandom(4).hex()
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                             PRIVATE_JOURNALD], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "RUN": run, "MARK": MARK,
                                 "OUT": str(journal_dir)})
    assert result.returncode == 0, result.stderr
    # The private journald copied the whole kernel ring: start after this run's first line.
    from systemd import journal

    reader = journal.Reader(path=str(journal_dir))
    reader.add_match(_TRANSPORT="kernel")
    start = next(e["__CURSOR"] for e in reader if f"start run={run} " in e["MESSAGE"])
    reader.close()
    with sqlite3.connect(tmp_config["store.path"], timeout=10) as db:
        db.execute("insert or replace into source_cursors (source, origin, cursor, boot_id, "
                   "updated_at) values ('klog', 'journald', ?, ?, 0)",
                   [start, current_boot_id()])
    config = tmp_config.replace({"klog.journal_path": str(journal_dir),
                                 "klog.backend": "journald"})
    store = kernel_log_store
    stop = threading.Event()
    source = threading.Thread(target=run_klog_source, args=(config, stop), daemon=True,
                              kwargs={"cursors": cursor_reader(config["store.path"])})
    source.start()
    try:
        def counters():
            row = store.execute("select counters from source_health where source = 'klog'"
                                ).fetchone()
            return row and json.loads(row[0]).get("forged") == 20 and json.loads(row[0])
        found = wait_for(counters, 15, "the forgeries to be counted")
        wait_for(lambda: store.execute("select 1 from kernel_log where kind = 'xid' and "
                                       "line like ?", [f"%run={run} %"]).fetchone(), 10,
                 "the kernel's Xid")
    finally:
        stop.set()
        source.join(5)
    assert found["records"] == 1
    rows = store.execute("select kind, xid, pci, details from kernel_log where line like ? "
                         "order by ts", [f"%run={run} %"]).fetchall()
    assert [(kind, xid, pci) for kind, xid, pci, _ in rows] == \
        [(FORGED, None, None), ("xid", 13, "0000:e7:00")]
    sender = json.loads(rows[0][3])
    # the command journald saw (systemd-cat execs cat; gone, it is ''): not asserted
    assert sender["uid"] == 65534 and sender["transport"] == "stdout" and \
        sender["attempts"] == 1 and sender["sender_pid"] > 0
    detail = store.execute("select detail from source_health where source = 'klog'"
                           ).fetchone()[0]
    assert "20 forged NVRM entries" in detail and "uid 65534" in detail
    assert store.execute("select count(*) from incidents where gpu_id = '0000:e8:00' or "
                         "summary like '%e8:00%'").fetchone()[0] == 0
    assert store.execute("select count(*) from gpus where id = '0000:e8:00'").fetchone()[0] == 0


RING_BYTES = 128 * 1024         # this machine's ring; more is written to be sure it wraps


def flood(run, lines=1400):
    """More marked lines than the kernel's ring holds (~150 bytes each)."""
    write_kmsg([f"<6>gpuwhy gap test run={run} n={n} {MARK} " + "." * 60 for n in range(lines)])


def test_lines_the_ring_overwrote_are_reported_with_their_sequence_numbers(
        tmp_config, kernel_log_store, monkeypatch):
    monkeypatch.setattr("gpuwhy.probes.klog.source.HEALTH_EVERY_S", 0.2)
    run = os.urandom(4).hex()
    boot = current_boot_id()
    behind = KmsgKernelLog("/dev/kmsg")         # a reader that falls behind
    behind.seek(None, "now")
    write_kmsg([f"<6>gpuwhy gap test run={run} start {MARK}"])
    [last] = wait_for(lambda: [line for line in behind.lines() if f"run={run} " in line.text],
                      5, "the start line")
    last_seq = int(last.cursor.split(":")[2])
    flood(run)
    # in the run: EPIPE, then the oldest record kept; the sequence numbers give the range
    after = list(behind.lines(10_000))
    first_kept = int(after[0].cursor.split(":")[2])
    assert behind.overwritten >= 1
    assert behind.take_gaps() == [(last_seq + 1, first_kept - 1)]
    assert behind.lost == first_kept - 1 - last_seq > 0
    behind.close()
    # across a restart: the source down through the flood, its stored cursor the start line
    with sqlite3.connect(tmp_config["store.path"], timeout=10) as db:
        db.execute("insert or replace into source_cursors (source, origin, cursor, boot_id, "
                   "updated_at) values ('klog', 'kmsg', ?, ?, 0)", [last.cursor, boot])
    config = tmp_config.replace({"klog.backend": "kmsg"})
    stop = threading.Event()
    source = threading.Thread(target=run_klog_source, args=(config, stop), daemon=True,
                              kwargs={"cursors": cursor_reader(config["store.path"])})
    source.start()
    store = kernel_log_store
    try:
        def health():
            row = store.execute("select state, detail, counters from source_health where "
                                "source = 'klog'").fetchone()
            return row if row and json.loads(row[2]).get("lost_ranges") else None
        state, detail, counters = wait_for(health, 15, "the loss to be reported")
    finally:
        stop.set()
        source.join(5)
    assert state == "degraded"
    first, last_missing = map(int, re.search(rf"\[({last_seq + 1}), (\d+)\]", detail).groups())
    assert last_missing >= first_kept - 1
    assert json.loads(counters)["lost_lines"] == last_missing - first + 1


# journald held still (SIGSTOP) while the kernel overwrites its ring, then let go: it says
# "Missed N kernel messages" (transport "driver") once it reads again.
STALLED_JOURNALD = r"""
set -eu
for dir in /run/systemd/journal /run/log/journal /var/log/journal; do
    mkdir -p "$dir"; mount -t tmpfs tmpfs "$dir"
done
/lib/systemd/systemd-journald &
journald=$!
for _ in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
printf '<6>gpuwhy missed test start run=%s %s\n' "$RUN" "$MARK" > /dev/kmsg
for _ in $(seq 100); do
    journalctl -q -D /run/log/journal -o cat | grep -q "start run=$RUN" && break; sleep 0.05
done
kill -STOP "$journald"
python3 -c "$FLOOD"
kill -CONT "$journald"
printf '<6>gpuwhy missed test end run=%s %s\n' "$RUN" "$MARK" > /dev/kmsg
for _ in $(seq 100); do
    journalctl -q -D /run/log/journal -o cat | grep -q "end run=$RUN" && break; sleep 0.05
done
kill "$journald"; wait "$journald" || true
cp -r /run/log/journal/. "$OUT"
"""


FLOOD = f"""
for start in range(0, 1400, 8):
    with open("/dev/kmsg", "w") as kmsg:
        for n in range(start, start + 8):
            kmsg.write("<6>gpuwhy missed test n=%d {MARK} %s\\n" % (n, "." * 60))
            kmsg.flush()
"""


class Kept:
    """A publisher that keeps what it is given."""

    dropped = 0

    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)
        return True


def test_journalds_own_report_of_missed_kernel_lines_is_read_as_a_loss(tmp_path):
    run = os.urandom(4).hex()
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                             STALLED_JOURNALD], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "RUN": run, "MARK": MARK, "FLOOD": FLOOD,
                                 "OUT": str(journal_dir)})
    assert result.returncode == 0, result.stderr
    reader = JournalKernelLog(str(journal_dir))
    reader.seek(None, "all")
    while (line := next(reader.lines(1), None)) and f"start run={run} " not in line.text:
        pass
    assert line is not None, "the start line is not in the journal"
    publisher = Kept()
    pump = KernelLogPump(reader, publisher, threading.Event())
    while pump.pump():
        pass
    reader.close()
    # more was written than the ring holds while journald stood still: it missed some, and
    # said so; the source counts them and reads degraded
    assert 0 < pump.counters["daemon_missed"] < 2000     # of the 1 400 written (and others')
    assert pump.counters["forged"] == 0
    health = health_of(_Watch(), pump, LostLines(), publisher)
    assert health.state == "degraded"
    assert f"journald missed {pump.counters['daemon_missed']} kernel lines" in health.detail


class _Watch:
    """The liveness part of the source's health: fine (tested elsewhere)."""

    def check(self, lines_read):
        return "ok", "journald (test)"


def test_the_suites_marked_lines_are_counted_not_taken_unless_asked():
    """A host that ran this suite has its marked Xid lines in the kernel log: a service
    (klog.test_lines off, the default) counts them and takes none, so `gpuwhy why` shows no
    GPU fault the suite wrote; with the setting on (as the suite's own services run) they
    are taken. Root's unmarked lines are taken either way (root can load a driver anyway)."""
    run = os.urandom(4).hex()
    line = f"<3>NVRM: Xid (PCI:0000:5c:00): 79, pid=0, GPU has fallen off the bus. {MARK} run={run}"
    readers = {take: KmsgKernelLog() for take in (False, True)}
    for reader in readers.values():
        reader.seek(None, "now")
    write_kmsg([line])
    taken = {}
    for take, reader in readers.items():
        publisher = Kept()
        pump = KernelLogPump(reader, publisher, threading.Event(), take_test_lines=take)

        def arrived(pump=pump, publisher=publisher):
            pump.pump()
            return pump.counters["test_lines"] or \
                any(f"run={run}" in e.line for e in publisher.events)
        wait_for(arrived, 10, "the line written to /dev/kmsg")
        reader.close()
        taken[take] = ([e.record_kind for e in publisher.events if f"run={run}" in e.line],
                       pump.counters["test_lines"])
    assert taken[False] == ([], 1)
    assert taken[True] == (["xid"], 0)
