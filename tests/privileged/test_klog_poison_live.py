"""A poison line through the real kernel-log source: an Xid line whose pid has thousands of
digits (past Python's 4 300-digit int() limit) failed the source, stored no later line,
and failed it again on the same line after every restart. Any local user could log such a
line on journald (``logger -t NVRM``), which is now a forgery, never parsed
(test_klog_trust_live.py); through the kernel (/dev/kmsg, read directly or by journald) a
line holds under 1 024 bytes, and a pid of 850 digits, which int() takes, was then refused
by SQLite and the line lost.

Now the line is stored as an ``unparsed`` record with its reason, the good line after it
is stored as an Xid, the source is not failed, and a restart goes on after both.

These tests write into the host's real kernel log and journal (as root, unless
GPUWHY_TEST_KMSG=0), and every line they write says it is a test.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from .kernel_lines import MARK, wait_for, write_kmsg

pytestmark = [pytest.mark.root, pytest.mark.kmsg]


class Source:
    """The kernel-log source in its own process, as the service runs it."""

    def __init__(self, config, backend):
        self.env = {**os.environ, "GPUWHY_DB": config["store.path"],
                    "GPUWHY_BUS": config["bus.endpoint"], "GPUWHY_KLOG_BACKEND": backend,
                    "GPUWHY_KLOG_START": "now"}
        self.process = None

    def start(self):
        code = ("import signal, threading; from gpuwhy.config import load_config; "
                "from gpuwhy.probes.klog.source import run_klog_source; "
                "from gpuwhy.store.source_cursors import cursor_reader; "
                "stop = threading.Event(); "
                "signal.signal(signal.SIGTERM, lambda *args: stop.set()); "
                "config = load_config(); "
                "run_klog_source(config, stop, cursors=cursor_reader(config['store.path']))")
        self.process = subprocess.Popen([sys.executable, "-c", code], env=self.env,
                                        stderr=subprocess.PIPE, text=True)

    def stop(self):
        self.process.terminate()
        _, stderr = self.process.communicate(timeout=15)
        assert self.process.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
        return stderr


def rows_of(db, run):
    return db.execute("select kind, xid, pid, json_extract(details, '$.reason'), line, cursor "
                      "from kernel_log where line like ? order by ts, cursor",
                      [f"%run={run} %"]).fetchall()


def health(db):
    row = db.execute("select state, detail, counters from source_health where source = 'klog'"
                     ).fetchone()
    return row and (row[0], row[1], json.loads(row[2] or "{}"))


def poison_then_good_then_restart(db, source, write, run, digits):
    """The scenario both backends share; returns the stored rows of ``run``."""
    # the mark first: the store keeps the first 2 048 characters of a line
    poison = f"{MARK} run={run} n=0 Xid (PCI:0000:0a:00): 79, pid={'9' * digits}, name=t, x"
    good = f"{MARK} run={run} n=1 Xid (PCI:0000:0a:00): 13, pid=4242, name=gpuwhy-test, y"
    source.start()
    try:
        wait_for(lambda: health(db), 20, "the source's first health report")
        write([poison, good])
        rows = wait_for(lambda: (r := rows_of(db, run)) and len(r) >= 2 and r, 20,
                        "both lines stored")
        # the poison line is stored as unparsed, with its reason; the good line as an Xid
        assert [(kind, xid, pid) for kind, xid, pid, *_ in rows] == \
            [("unparsed", None, None), ("xid", 13, 4242)]
        assert rows[0][3] == f"pid has {digits} digits (at most 18 are read)"
        assert f"run={run} n=0" in rows[0][4]
        # the source goes on, not failed, and counts the line it could not parse
        state, detail, counters = wait_for(
            lambda: (h := health(db)) and h[2].get("unparsed", 0) >= 1 and h, 20,
            "a health report counting the unparsed line")
        assert state in ("ok", "degraded"), detail
        assert counters["records"] >= 1
    finally:
        source.stop()
    cursor = db.execute("select cursor from source_cursors where source = 'klog'").fetchone()[0]
    assert cursor == rows[1][5]                # stored past both lines
    # restarted, the source resumes after them: it does not fail on the poison line again
    source.start()
    try:
        wait_for(lambda: (h := health(db)) and "resumed after the stored cursor" in h[1], 20,
                 "the restarted source's first health report")
        write([f"{MARK} run={run} n=2 Xid (PCI:0000:0a:00): 31, pid=4343, name=gpuwhy-test, z"])
        rows = wait_for(lambda: (r := rows_of(db, run)) and len(r) >= 3 and r, 20,
                        "the line after the restart")
        time.sleep(1.0)                        # a line read again would have arrived by now
        rows = rows_of(db, run)
        state, detail, counters = wait_for(
            lambda: (h := health(db)) and h[2].get("records", 0) >= 1 and h, 20,
            "a health report of the restarted source")
        assert state in ("ok", "degraded"), detail
        assert counters.get("unparsed") == 0   # the poison line was not read again
    finally:
        source.stop()
    assert [(kind, xid, pid) for kind, xid, pid, *_ in rows] == \
        [("unparsed", None, None), ("xid", 13, 4242), ("xid", 31, 4343)]
    return rows


def test_journald_an_850_digit_pid_from_the_kernel_is_stored_unparsed_and_the_source_goes_on(
        system_journald, tmp_config, kernel_log_store):
    # Only the kernel's lines are parsed: what any user logs as NVRM (logger -t NVRM, a
    # 5 000-digit pid included) is a forgery, counted and never parsed
    # (tests/privileged/test_klog_trust_live.py). The poison line comes through the kernel.
    run = os.urandom(4).hex()
    rows = poison_then_good_then_restart(
        kernel_log_store, Source(tmp_config, "journald"),
        lambda lines: write_kmsg([f"NVRM: {x}" for x in lines]), run, digits=850)
    assert rows[0][5].startswith("s=")       # a journal cursor


def test_kmsg_an_850_digit_pid_is_stored_unparsed_and_the_source_goes_on(tmp_config,
                                                                         kernel_log_store):
    # /dev/kmsg takes lines of fewer than 1 024 bytes: 850 digits fit with the rest
    run = os.urandom(4).hex()
    rows = poison_then_good_then_restart(
        kernel_log_store, Source(tmp_config, "kmsg"),
        lambda lines: write_kmsg([f"NVRM: {x}" for x in lines]), run, digits=850)
    assert rows[0][5].startswith("kmsg:")    # /dev/kmsg sequence numbers
