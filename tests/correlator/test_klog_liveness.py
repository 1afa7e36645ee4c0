"""The kernel-log liveness check: kernel records the printk probe counted that the kernel-log
source never read fail it after the grace, once, and it recovers when it reads again."""

import logging

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.correlator.klog_liveness import KernelLogLiveness
from gpuwhy.events import SourceHealth

S = NS_PER_SECOND
T0 = 1_800_000_000 * S


def printk(t, records):
    return SourceHealth(ts=T0 + int(t * S), source="printk", state="ok",
                        counters={"records": records, "last_ns": 0})


def klog(t, lines, state="ok"):
    return SourceHealth(ts=T0 + int(t * S), source="klog", state=state, detail="journald: x",
                        counters={"lines": lines, "records": 0})


def run(beats, grace_s=30.0):
    liveness = KernelLogLiveness(grace_s)
    return liveness, [liveness.observe(beat) for beat in beats]


def klog_states(stored):
    return [beat.state for beat in stored if beat.source == "klog"]


def test_a_quiet_kernel_is_never_a_failure():
    beats = [printk(t, 5) for t in range(0, 120)] + [klog(t, 40) for t in range(0, 120, 5)]
    _, stored = run(sorted(beats, key=lambda b: b.ts))
    assert set(klog_states(stored)) == {"ok"}


def test_records_the_source_reads_keep_it_ok_whichever_beat_comes_first():
    beats, lines = [], 40
    for t in range(0, 200):
        beats.append(printk(t, 5 + t // 7))            # a record every 7 s
        if t % 5 == 4:
            lines += 1                                 # ... read before printk's next beat
            beats.append(klog(t + 0.5, lines))
    _, stored = run(beats)
    assert set(klog_states(stored)) == {"ok"}


def test_records_never_read_fail_the_source_once_after_the_grace(caplog):
    beats = []
    for t in range(0, 100):
        beats.append(printk(t, 10 + (t >= 20) * 3))      # 3 records at t = 19..20
        if t % 5 == 2:
            beats.append(klog(t, 40))                    # the source reads nothing more
    with caplog.at_level(logging.ERROR, logger="gpuwhy.correlator.klog_liveness"):
        liveness, stored = run(beats)
    states = [(beat.ts - T0) // S for beat in stored if beat.source == "klog"
              and beat.state == "failed"]
    assert states and min(states) == 52          # the first klog beat 30 s after t = 19 (+2)
    failed = [b for b in stored if b.source == "klog" and b.state == "failed"][0]
    assert "3 record(s)" in failed.detail and "printk probe" in failed.detail
    assert failed.detail.endswith("journald: x") and failed.counters["lines"] == 40
    assert len(caplog.records) == 1 and liveness.failures == 1


def test_it_recovers_when_the_source_reads_again(caplog):
    beats = [klog(2, 40), printk(3, 10), printk(4, 12), klog(40, 40), klog(45, 41),
             klog(50, 41)]
    with caplog.at_level(logging.WARNING, logger="gpuwhy.correlator.klog_liveness"):
        liveness, stored = run(beats)
    assert klog_states(stored) == ["ok", "failed", "ok", "ok"]
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    assert not liveness.failing


def test_a_restarted_probes_process_or_source_is_not_mistaken_for_reading():
    # The probes restart (count back to 0): no records are "new" for that drop.
    _, stored = run([printk(0, 500), printk(1, 3), klog(2, 40), klog(60, 40)])
    assert klog_states(stored) == ["ok", "ok"]
    # A source restarted with 0 lines read has not read anything.
    _, stored = run([printk(0, 5), klog(0.5, 40), printk(1, 5), printk(2, 6), klog(10, 0),
                     klog(40, 0)])
    assert klog_states(stored) == ["ok", "ok", "failed"]


def test_lines_read_after_the_records_may_be_them_so_no_verdict_is_drawn():
    # The source read at 0.5; records counted in (0, 1] may be what it read.
    _, stored = run([printk(0, 5), klog(0.5, 40), printk(1, 6), klog(40, 40)])
    assert klog_states(stored) == ["ok", "ok"]


def test_the_sources_own_failure_is_kept():
    _, stored = run([printk(0, 1), printk(1, 2), klog(40, 0, state="failed")])
    assert stored[-1].state == "failed" and stored[-1].detail == "journald: x"


def test_without_the_printk_probe_there_is_no_verdict():
    _, stored = run([klog(t, 40) for t in range(0, 300, 5)])
    assert set(klog_states(stored)) == {"ok"}


def test_a_read_of_the_backlog_excuses_no_more_records_than_it_read():
    # The source read one backlog line (a journal taken from boot) between two printk beats;
    # the kernel then logged 3 records the journal never gets. One read line may be one of
    # them, never all three: the source fails after the grace.
    _, stored = run([printk(0, 5), klog(0.5, 1), printk(1, 8), klog(10, 1), klog(40, 1)])
    assert klog_states(stored) == ["ok", "ok", "failed"]
    assert "2 record(s)" in stored[-1].detail
    # ... and as many lines as records read between the beats are taken as those records.
    _, stored = run([printk(0, 5), klog(0.5, 40), printk(1, 5), klog(1.5, 43), printk(2, 8),
                     klog(40, 43)])
    assert set(klog_states(stored)) == {"ok"}
