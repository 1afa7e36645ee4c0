from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    DriverCallStats,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.fdtable import CLOSE_RANGE_CLOEXEC, WHOLE_EVERY_NS, FdTable, OpStats

CTL, GPU0 = "/dev/nvidiactl", "/dev/nvidia0"
RM_CONTROL, RM_ALLOC = 0xC020462A, 0xC030462B
GET_INFO = 0x20800102
NS = 10**9


def _table(start_times=None):
    start_times = start_times if start_times is not None else {}

    def resolve(pid, ts):
        if pid in start_times and start_times[pid] is None:
            return None
        return ProcessSeen(ts=ts, process=ProcessKey(pid, start_times.get(pid, 100 + pid)),
                           comm=f"p{pid}")
    return FdTable(resolve)


def _stats(count, errors=0, latency=100, bytes_=0):
    log2 = [0] * 32
    log2[latency.bit_length() - 1] = count
    return OpStats(count, errors, latency * count, latency, bytes_, log2)


def _ops(events):
    return {(e.process.pid, e.path): {(o["op"], o["sub"]): o["count"] for o in e.ops}
            for e in events if isinstance(e, DriverCallStats)}


def test_open_emits_process_once_then_device():
    table = _table()
    first = table.opened(7, 3, 1, CTL, ts=10)
    second = table.opened(7, 4, 2, GPU0, ts=11, cloexec=True)
    assert [type(e) for e in first] == [ProcessSeen, DeviceOpened]
    assert [type(e) for e in second] == [DeviceOpened]
    assert second[0].device == "nvidiaN" and second[0].minor == 0 and second[0].cloexec
    assert second[0].process == ProcessKey(7, 107)


def test_kernel_start_time_wins_over_a_recycled_pid_in_proc():
    table = _table({7: 555})              # /proc already shows another process under pid 7
    events = table.opened(7, 3, 1, CTL, ts=1, start_ticks=400)
    assert events[0].process == ProcessKey(7, 400)
    assert table.unresolved == 0


def test_stats_are_cumulative_across_reads_and_closed_fds():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    events, retired = table.update_stats([(1, RM_CONTROL, GET_INFO, _stats(5))], ts=2)
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 5}}
    op = events[0].ops[0]
    assert op["sub_name"] == "NV2080_CTRL_CMD_GPU_GET_INFO_V2"
    assert op["latency_sum_ns"] == 500 and op["latency_log2"][6] == 5
    assert retired == []
    table.closed(7, 3, 1, ts=3)
    table.opened(7, 3, 2, CTL, ts=4)                  # same fd number, a new open
    events, retired = table.update_stats([(1, RM_CONTROL, GET_INFO, _stats(6)),
                                          (2, RM_CONTROL, GET_INFO, _stats(2, errors=1)),
                                          (2, RM_ALLOC, 0x80, _stats(1))], ts=5)
    assert retired == [1]
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 8,
                                       ("NV_ESC_RM_ALLOC", 0x80): 1}}
    control = next(o for o in events[0].ops if o["sub"] == GET_INFO)
    assert control["errors"] == 1
    # the closed open's map entries are deleted now; totals must not shrink (and the
    # operation that did not move is not sent again)
    events, _ = table.update_stats([(2, RM_CONTROL, GET_INFO, _stats(3, errors=1)),
                                    (2, RM_ALLOC, 0x80, _stats(1))], ts=6)
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 9}}


def test_unchanged_stats_are_not_republished():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    assert _ops(table.update_stats([(1, RM_CONTROL, 0, _stats(5))], ts=2)[0])
    assert not _ops(table.update_stats([(1, RM_CONTROL, 0, _stats(5))], ts=3)[0])


def test_exit_closes_fds_and_follows_final_stats():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.opened(7, 4, 2, GPU0, ts=1)
    closed, fds = table.exited(7, ts=9, exit_code=3)
    assert sorted(fds) == [3, 4]
    assert sorted(e.fd for e in closed if isinstance(e, DeviceClosed)) == [3, 4]
    events, retired = table.update_stats([(1, RM_CONTROL, 0, _stats(4))], ts=10)
    assert retired == [1, 2]
    assert isinstance(events[-1], ProcessExited)
    assert (events[-1].ts, events[-1].exit_code) == (9, 3)
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", 0): 4}}
    assert table.processes == {} and table.fds == {}


def test_dup_copies_the_path_and_fork_inherits_everything():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    [dup] = table.duped(7, 10, 2, oldfd=3, ts=2, cloexec=True)
    assert (dup.path, dup.how, dup.cloexec) == (CTL, "dup", True)
    assert table.duped(7, 11, 3, oldfd=99, ts=2) == []    # not a tracked fd
    seqs = iter([100, 101])
    events, inherited = table.forked(7, 8, ts=3, seq_for=lambda fd: next(seqs))
    opened = [e for e in events if isinstance(e, DeviceOpened)]
    assert {(e.process.pid, e.fd, e.how) for e in opened} == {(8, 3, "fork"), (8, 10, "fork")}
    assert sorted(t.open_seq for t in inherited) == [100, 101]
    assert (7, 3) in table.fds and (8, 3) in table.fds


def test_exec_closes_close_on_exec_fds_as_the_kernel_sees_them():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1, cloexec=True)
    table.opened(7, 4, 2, GPU0, ts=1, cloexec=False)
    table.opened(7, 5, 3, GPU0, ts=1, cloexec=True)
    # fcntl(F_SETFD) cleared FD_CLOEXEC on fd 5 since the open; the kernel map knows
    events, closed = table.executed(7, ts=5, cloexec_now={3: True, 4: False, 5: False})
    assert closed == [3]
    assert isinstance(events[0], ProcessSeen)            # read again: a new command line
    assert sorted(fd for owner, fd in table.fds if owner == 7) == [4, 5]


def test_close_range_closes_or_marks():
    table = _table()
    for fd in (3, 4, 9):
        table.opened(7, fd, fd, CTL, ts=1)
    events, closed, marked = table.close_range(7, 4, 2**31 - 1, 0, ts=2)
    assert sorted(closed) == [4, 9] and marked == []
    assert {e.fd for e in events} == {4, 9}
    events, closed, marked = table.close_range(7, 0, 10, CLOSE_RANGE_CLOEXEC, ts=3)
    assert events == [] and closed == [] and marked == [3]
    assert table.fds[(7, 3)].cloexec


def test_pid_reuse_gives_a_new_process_key():
    starts = {7: 500}
    table = _table(starts)
    table.opened(7, 3, 1, CTL, ts=1)
    table.exited(7, ts=2)
    table.update_stats([], ts=3)
    starts[7] = 900
    events = table.opened(7, 3, 2, CTL, ts=4)
    assert events[0].process == ProcessKey(7, 900)


def test_vanished_process_without_kernel_start_time_is_counted():
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
    table.update_stats([(1, RM_CONTROL, 0, _stats(5))], ts=2)
    kinds = [type(e) for e in table.snapshot()]
    assert kinds == [ProcessSeen, DeviceOpened]
    # figures are re-sent by the next read even though they did not change
    assert _ops(table.update_stats([(1, RM_CONTROL, 0, _stats(5))], ts=3)[0])


def test_an_inherited_fd_the_kernel_copied_first_keeps_the_kernels_seq():
    # The child's first call came while user space was copying its table under seq 100:
    # the kernel copied the fd under 55 and counts the child's calls there. Adopting 55
    # makes them the child's (they were dropped as an unknown seq), and its close lands.
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.forked(7, 8, ts=2, seq_for=lambda fd: 100)
    table.adopt_seq(8, 3, 55)
    events, _ = table.update_stats([(1, RM_CONTROL, 0, _stats(1)),
                                    (55, RM_CONTROL, 0, _stats(12))], ts=3)
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", 0): 1},
                            (8, CTL): {("NV_ESC_RM_CONTROL", 0): 12}}
    assert [e.fd for e in table.closed(8, 3, 55, ts=4)] == [3]
    assert table.update_stats([], ts=5)[1] == [55]
    table.adopt_seq(8, 99, 56)          # not tracked: nothing to adopt
    assert (8, 99) not in table.fds


def test_a_process_that_made_no_call_costs_a_flush_nothing(monkeypatch):
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.opened(8, 3, 2, CTL, ts=1)
    built = []
    real = FdTable._op_dict
    monkeypatch.setattr(FdTable, "_op_dict", staticmethod(
        lambda cmd, sub, device, stats: built.append(stats.count) or
        real(cmd, sub, device, stats)))
    table.update_stats([(1, RM_CONTROL, 0, _stats(5)), (2, RM_CONTROL, 0, _stats(9))], ts=2)
    assert sorted(built) == [5, 9]
    built.clear()
    events, _ = table.update_stats([(1, RM_CONTROL, 0, _stats(6)),
                                    (2, RM_CONTROL, 0, _stats(9))], ts=3)
    assert built == [6] and _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", 0): 6}}
    built.clear()
    table.update_stats([(1, RM_CONTROL, 0, _stats(6)), (2, RM_CONTROL, 0, _stats(9))], ts=4)
    assert built == []


def test_a_resync_republishes_figures_that_did_not_move():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=1)
    table.closed(7, 3, 1, ts=2)
    table.opened(7, 4, 2, CTL, ts=2)
    table.update_stats([(1, RM_CONTROL, 0, _stats(5)), (2, RM_ALLOC, 0x80, _stats(1))], ts=3)
    assert not _ops(table.update_stats([(2, RM_ALLOC, 0x80, _stats(1))], ts=4)[0])
    table.snapshot()
    events, _ = table.update_stats([(2, RM_ALLOC, 0x80, _stats(1))], ts=5)
    assert _ops(events) == {(7, CTL): {("NV_ESC_RM_CONTROL", 0): 5, ("NV_ESC_RM_ALLOC", 0x80): 1}}


def test_idle_until_a_device_is_open_and_again_once_its_last_figures_are_out():
    table = _table()
    assert table.idle()
    table.opened(7, 3, 1, CTL, ts=1)
    assert not table.idle()
    table.update_stats([(1, RM_CONTROL, 0, _stats(5))], ts=2)
    table.exited(7, ts=3, exit_code=0)
    assert not table.idle()                       # its final figures and exit not sent yet
    events, _ = table.update_stats([(1, RM_CONTROL, 0, _stats(6))], ts=4)
    assert isinstance(events[-1], ProcessExited) and table.idle()


def test_an_event_holds_the_operations_that_moved_and_every_one_now_and_then():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=0)
    table.opened(7, 4, 2, CTL, ts=0)
    ops = [(1, RM_CONTROL, GET_INFO, _stats(5)), (1, RM_ALLOC, 0x80, _stats(2)),
           (2, RM_CONTROL, 0x1234, _stats(1))]
    first, _ = table.update_stats(ops, ts=NS)
    assert _ops(first) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 5,
                                      ("NV_ESC_RM_ALLOC", 0x80): 2,
                                      ("NV_ESC_RM_CONTROL", 0x1234): 1}}
    # one operation moves, on one of the two fds: only its (summed) figures go out
    ops[0] = (1, RM_CONTROL, GET_INFO, _stats(8))
    ops.append((2, RM_CONTROL, GET_INFO, _stats(1)))
    moved, _ = table.update_stats(ops, ts=2 * NS)
    assert _ops(moved) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 9}}
    assert not table.update_stats(ops, ts=3 * NS)[0]          # nothing moved: no event
    # WHOLE_EVERY_NS after the last whole event, the next one holds every operation
    ops[1] = (1, RM_ALLOC, 0x80, _stats(3))
    later = NS + WHOLE_EVERY_NS
    assert _ops(table.update_stats(ops, ts=later - 1)[0]) == {
        (7, CTL): {("NV_ESC_RM_ALLOC", 0x80): 3}}
    ops[1] = (1, RM_ALLOC, 0x80, _stats(4))
    assert _ops(table.update_stats(ops, ts=later)[0]) == {
        (7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 9, ("NV_ESC_RM_ALLOC", 0x80): 4,
                   ("NV_ESC_RM_CONTROL", 0x1234): 1}}
    ops[1] = (1, RM_ALLOC, 0x80, _stats(5))
    assert _ops(table.update_stats(ops, ts=later + NS)[0]) == {
        (7, CTL): {("NV_ESC_RM_ALLOC", 0x80): 5}}


def test_a_subscriber_that_reconnects_gets_every_operation_again():
    table = _table()
    table.opened(7, 3, 1, CTL, ts=0)
    ops = [(1, RM_CONTROL, GET_INFO, _stats(5)), (1, RM_ALLOC, 0x80, _stats(2))]
    table.update_stats(ops, ts=NS)
    table.snapshot()
    again, _ = table.update_stats(ops, ts=2 * NS)      # nothing moved, all re-sent
    assert _ops(again) == {(7, CTL): {("NV_ESC_RM_CONTROL", GET_INFO): 5,
                                      ("NV_ESC_RM_ALLOC", 0x80): 2}}
