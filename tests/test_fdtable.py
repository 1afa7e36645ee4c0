from gpuwhy.events import DeviceClosed, DeviceOpened, IoctlCounts, ProcessExited, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.fdtable import FdTable

CTL, GPU0 = "/dev/nvidiactl", "/dev/nvidia0"
RM_CONTROL, RM_ALLOC = 0xC020462A, 0xC030462B


def _table(start_times=None):
    start_times = start_times or {}

    def resolve(pid, ts):
        if pid in start_times and start_times[pid] is None:
            return None
        return ProcessSeen(ts=ts, process=ProcessKey(pid, start_times.get(pid, 100 + pid)),
                           comm=f"p{pid}")
    return FdTable(resolve)


def _counts(events):
    return {(e.process.pid, e.path): e.counts for e in events if isinstance(e, IoctlCounts)}


def test_open_emits_process_once_then_device():
    table = _table()
    first = table.opened(7, 3, 1, CTL, ts=10)
    second = table.opened(7, 4, 2, GPU0, ts=11)
    assert [type(e) for e in first] == [ProcessSeen, DeviceOpened]
    assert [type(e) for e in second] == [DeviceOpened]
    assert second[0].device == "nvidiaN" and second[0].minor == 0
    assert second[0].process == ProcessKey(7, 107)


def test_counts_are_cumulative_across_reads_and_closed_fds():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    events, retired = table.update_counts([(1, RM_CONTROL, 5)], ts=2)
    assert _counts(events) == {(7, CTL): {str(RM_CONTROL): 5}}
    assert retired == []
    table.closed(7, 3, 1, ts=3)
    table.opened(7, 3, 2, CTL, ts=4)                  # same fd number, new open
    events, retired = table.update_counts([(1, RM_CONTROL, 6), (2, RM_CONTROL, 2),
                                           (2, RM_ALLOC, 1)], ts=5)
    assert retired == [1]
    assert _counts(events) == {(7, CTL): {str(RM_CONTROL): 8, str(RM_ALLOC): 1}}
    # the closed open's entries are gone from the map now; totals must not shrink
    events, _ = table.update_counts([(2, RM_CONTROL, 3), (2, RM_ALLOC, 1)], ts=6)
    assert _counts(events) == {(7, CTL): {str(RM_CONTROL): 9, str(RM_ALLOC): 1}}


def test_unchanged_counts_are_not_republished():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    assert _counts(table.update_counts([(1, RM_CONTROL, 5)], ts=2)[0])
    assert not _counts(table.update_counts([(1, RM_CONTROL, 5)], ts=3)[0])


def test_exit_closes_fds_and_follows_final_counts():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.opened(7, 4, 2, GPU0, ts=1)
    closed = table.exited(7, ts=9)
    assert sorted(e.fd for e in closed if isinstance(e, DeviceClosed)) == [3, 4]
    events, retired = table.update_counts([(1, RM_CONTROL, 4)], ts=10)
    assert retired == [1, 2]
    assert isinstance(events[-1], ProcessExited) and events[-1].ts == 9
    assert _counts(events) == {(7, CTL): {str(RM_CONTROL): 4}}
    assert table.processes == {} and table.fds == {}


def test_pid_reuse_gives_a_new_process_key():
    starts = {7: 500}
    table = _table(starts)
    table.opened(7, 3, 1, CTL, ts=1)
    table.exited(7, ts=2)
    table.update_counts([], ts=3)
    starts[7] = 900
    events = table.opened(7, 3, 2, CTL, ts=4)
    assert events[0].process == ProcessKey(7, 900)


def test_vanished_process_is_counted_as_unresolved():
    table = _table({9: None})
    events = table.opened(9, 3, 1, CTL, ts=1)
    assert events[0].process == ProcessKey(9, 0)
    assert table.unresolved == 1


def test_missed_close_is_repaired_by_a_reopen_of_the_same_fd():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    events = table.opened(7, 3, 2, GPU0, ts=2)
    assert isinstance(events[0], DeviceClosed) and events[0].path == CTL


def test_snapshot_resends_everything():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.update_counts([(1, RM_CONTROL, 5)], ts=2)
    kinds = [type(e) for e in table.snapshot()]
    assert kinds == [ProcessSeen, DeviceOpened]
    # counters are re-sent by the next read even though they did not change
    assert _counts(table.update_counts([(1, RM_CONTROL, 5)], ts=3)[0])
