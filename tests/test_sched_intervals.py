"""probes/sched.py's said_since: what a flush says of a thread for its interval, from the
kernel's cumulative figures and what was said before: never negative, and the time in its
states adding up as the kernel's even when the kernel corrects a state after the fact."""

from gpuwhy.probes.sched import FIELDS, TIMED_STATES, said_since

S = 1_000_000_000


def _figures(**values: int) -> tuple[int, ...]:
    return tuple(values.get(name, 0) for name in FIELDS)


def _named(said: list[int]) -> dict[str, int]:
    return {name: value for name, value in zip(FIELDS, said, strict=True) if value}


def test_an_interval_is_what_grew_since_it_was_said():
    said = _figures(on_cpu_ns=1 * S, sleep_ns=2 * S, voluntary_switches=10)
    now = _figures(on_cpu_ns=2 * S, sleep_ns=2 * S, runqueue_ns=S // 2, voluntary_switches=15)
    assert _named(said_since(now, said)) == {"on_cpu_ns": S, "runqueue_ns": S // 2,
                                             "voluntary_switches": 5}


def test_a_wait_proven_to_be_a_run_stays_said_and_the_run_gives_way():
    # said: 2 s waiting (a runnable thread's slice); then its switch-out proved it ran all
    # along and 0.5 s more: the kernel's totals say 2.5 s on-CPU, no waiting
    said = _figures(runqueue_ns=2 * S)
    now = _figures(on_cpu_ns=5 * S // 2, involuntary_switches=1)
    first = said_since(now, said)
    assert _named(first) == {"on_cpu_ns": S // 2, "involuntary_switches": 1}
    said = tuple(a + b for a, b in zip(said, first, strict=True))
    # one more second on-CPU: said as it is, however far the totals stay apart
    later = said_since(_figures(on_cpu_ns=7 * S // 2, involuntary_switches=1), said)
    assert _named(later) == {"on_cpu_ns": S}


def test_a_loss_larger_than_the_gains_waits_for_more_gains():
    said = _figures(runqueue_ns=2 * S)
    now = _figures(on_cpu_ns=S)              # only 1 s of the 2 came back yet
    first = said_since(now, said)
    assert _named(first) == {}
    said = tuple(a + b for a, b in zip(said, first, strict=True))
    # 4 s on-CPU in the kernel's totals: 2 s said as waiting, 2 s now
    assert _named(said_since(_figures(on_cpu_ns=4 * S), said)) == {"on_cpu_ns": 2 * S}


def test_a_counter_that_went_back_says_nothing_rather_than_less():
    said = _figures(migrations=7, net_rx_bytes=100)
    assert _named(said_since(_figures(migrations=5, net_rx_bytes=160), said)) == \
        {"net_rx_bytes": 60}


def test_a_living_states_time_is_the_field_of_its_number():
    assert [FIELDS[state] for state in TIMED_STATES] == \
        ["on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns"]
