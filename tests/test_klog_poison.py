"""A poison line through the real kernel-log source without root: real journal files
(systemd-journal-remote), the real journald reader, bus, correlator and store. The
privileged twin (tests/privileged/test_klog_poison_live.py) writes through the host's
journald and /dev/kmsg.

An Xid line whose pid has 5 000 digits failed the source before (int() raised), stored no
later line, and failed it again on the same line after each restart.
"""

import json
import subprocess
import threading
import time
from pathlib import Path

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.klog.source import run_klog_source
from gpuwhy.store import open_store
from gpuwhy.store.source_cursors import cursor_reader

REMOTE = Path("/lib/systemd/systemd-journal-remote")
BOOT = "0123456789abcdef0123456789abcdef"
T0_US = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000
POISON = "Xid (PCI:0000:0a:00): 79, pid=" + "9" * 5000 + ", name=x, GPU has fallen off the bus."
GOOD = "Xid (PCI:0000:0a:00): 13, pid=77, name=trainer, Graphics Exception"


def journal(directory: Path, name: str, messages: list[str], after: int = 0) -> None:
    """A journal file of NVRM kernel lines, ``after`` µs after the others."""
    directory.mkdir(exist_ok=True)
    export = directory / f"{name}.export"
    export.write_text("".join(
        f"__REALTIME_TIMESTAMP={T0_US + after + n}\n__MONOTONIC_TIMESTAMP={1_000_000 + after + n}\n"
        f"_BOOT_ID={BOOT}\n_TRANSPORT=kernel\nSYSLOG_IDENTIFIER=NVRM\nMESSAGE={message}\n\n"
        for n, message in enumerate(messages)))
    subprocess.run([str(REMOTE), f"--output={directory / name}.journal", str(export)],
                   check=True, capture_output=True)
    export.unlink()


def run_source_until(config, predicate, timeout=20.0):
    stop = threading.Event()
    failures = []

    def run():
        try:
            run_klog_source(config, stop, cursors=cursor_reader(config["store.path"]))
        except BaseException as exc:  # noqa: BLE001 - the finding: the source died on a line
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not predicate() and not failures:
            assert time.monotonic() < deadline, "the source did not deliver in time"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(5)
    assert not failures, failures
    assert not thread.is_alive()


def test_a_poison_line_is_stored_unparsed_the_next_line_parsed_and_a_restart_goes_on(tmp_config):
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    stop = threading.Event()
    thread = threading.Thread(target=Correlator(tmp_config, db, subscriber).run, args=(stop,),
                              daemon=True)
    thread.start()
    reader = open_store(tmp_config["store.path"], readonly=True)
    try:
        journal_dir = Path(tmp_config["store.path"]).parent / "journal"
        journal(journal_dir, "a", [POISON, GOOD])
        config = tmp_config.replace({"klog.journal_path": str(journal_dir), "klog.start": "all"})

        def rows():
            return reader.execute("select kind, xid, pid, json_extract(details, '$.reason'), "
                                  "substr(line, 1, 40) from kernel_log order by ts").fetchall()

        def health():
            row = reader.execute("select state, detail, counters from source_health "
                                 "where source = 'klog'").fetchone()
            return row and (row[0], row[1], json.loads(row[2]))

        run_source_until(config, lambda: len(rows()) == 2 and health()
                         and health()[2].get("unparsed") == 1)
        assert rows() == [
            ("unparsed", None, None, "pid has 5000 digits (at most 18 are read)",
             "NVRM: Xid (PCI:0000:0a:00): 79, pid=9999"),
            ("xid", 13, 77, None, "NVRM: Xid (PCI:0000:0a:00): 13, pid=77, ")]
        state, detail, counters = health()
        assert state != "failed", detail
        assert (counters["lines"], counters["records"], counters["unparsed"]) == (2, 1, 1)
        # restarted: resumes after both lines, does not meet the poison line again
        journal(journal_dir, "b", [GOOD.replace("13", "31")], after=1000)
        run_source_until(config, lambda: len(rows()) == 3 and "resumed" in health()[1])
        time.sleep(0.3)
        assert [r[:3] for r in rows()] == [("unparsed", None, None), ("xid", 13, 77),
                                           ("xid", 31, 77)]
    finally:
        stop.set()
        thread.join(5)
        subscriber.close()
        reader.close()
        db.close()
