import zmq

from gpuwhy.bus import Publisher, Subscriber
from gpuwhy.events import ProcessExited, SourceHealth
from gpuwhy.identity import ProcessKey


def _connected(pub, sub, timeout=5.0):
    """Wait for the subscription to reach ``pub`` while keeping ``sub`` polling."""
    for _ in range(int(timeout / 0.02)):
        sub.process_commands()
        if pub.wait_for_subscriber(0.02):
            return True
    return False


def _pair(tmp_path, hwm=1000):
    sub = Subscriber(f"ipc://{tmp_path}/sock/bus.sock", hwm=hwm)
    pub = Publisher(sub.endpoint, src="test", hwm=hwm)
    assert _connected(pub, sub), "subscription never reached the publisher"
    return pub, sub


def test_publish_and_receive_in_order(tmp_path):
    pub, sub = _pair(tmp_path)
    events = [SourceHealth(ts=i, source="s", state="ok") for i in range(50)]
    for event in events:
        assert pub.publish(event)
    received = [sub.receive(timeout=2).event for _ in events]
    assert received == events
    assert sub.counters["received"] == 50
    assert sub.counters["gap_messages"] == 0
    pub.close(), sub.close()


def test_sequence_gaps_and_restarts_are_counted(tmp_path):
    pub, sub = _pair(tmp_path)
    pub.publish(SourceHealth(ts=1, source="s", state="ok"))
    pub.seq += 4   # as if four messages had been dropped on the way
    pub.publish(SourceHealth(ts=2, source="s", state="ok"))
    assert sub.receive(timeout=2).seq == 1
    assert sub.receive(timeout=2).seq == 6
    assert sub.counters["gap_messages"] == 4
    pub.seq = 0    # the publisher restarted
    pub.publish(SourceHealth(ts=3, source="s", state="ok"))
    assert sub.receive(timeout=2).seq == 1
    assert sub.counters["publisher_restarts"] == 1
    pub.close(), sub.close()


def test_garbage_is_counted_not_fatal(tmp_path):
    sub = Subscriber(f"ipc://{tmp_path}/bus.sock")
    raw = zmq.Context.instance().socket(zmq.PUB)
    raw.connect(sub.endpoint)
    good = Publisher(sub.endpoint, src="good")
    assert _connected(good, sub)
    for _ in range(100):  # the raw PUB may still be joining: send until one garbage arrives
        raw.send_multipart([b"proc", b"\x00garbage"])
        good.publish(ProcessExited(ts=1, process=ProcessKey(1, 2)))
        envelope = sub.receive(timeout=0.05)
        if envelope and sub.counters["decode_errors"]:
            break
    assert sub.counters["decode_errors"] >= 1
    assert envelope.event == ProcessExited(ts=1, process=ProcessKey(1, 2))
    raw.close(0), good.close(), sub.close()


def test_resubscription_is_noticed(tmp_path):
    pub, sub = _pair(tmp_path)
    assert not pub.poll_subscriptions()
    endpoint = sub.endpoint
    sub.close()
    again = Subscriber(endpoint)
    seen = False
    for _ in range(100):
        again.process_commands()
        if pub.poll_subscriptions(0.05):
            seen = True
            break
    assert seen, "a restarted subscriber must trigger a re-send of state"
    pub.close(), again.close()


def test_full_queue_drops_are_counted(tmp_path):
    sub = Subscriber(f"ipc://{tmp_path}/bus.sock", hwm=10)
    pub = Publisher(sub.endpoint, src="fast", hwm=10)
    assert _connected(pub, sub)
    sent = sum(pub.publish(SourceHealth(ts=i, source="s", state="ok")) for i in range(20000))
    assert pub.dropped > 0
    assert sent + pub.dropped == 20000
    pub.close(), sub.close()


def test_a_batched_block_keeps_the_order_in_few_messages(tmp_path):
    from gpuwhy.bus import BATCH_EVENTS

    pub, sub = _pair(tmp_path)
    events = [SourceHealth(ts=i, source="s", state="ok") for i in range(BATCH_EVENTS + 10)]
    exited = ProcessExited(ts=1, process=ProcessKey(1, 2))
    events[5:5] = [exited]           # another topic in the middle: a run of its own
    with pub.batched():
        for event in events:
            assert pub.publish(event)
        with pub.batched():          # nested: the outer block sends
            assert pub.publish(exited)
        assert sub.receive(timeout=0.2) is None    # nothing sent before the block ends
    received = sub.receive_many(timeout=2, limit=len(events) + 1)
    while len(received) < len(events) + 1:
        more = sub.receive_many(timeout=2, limit=len(events))
        assert more, f"only {len(received)} events arrived"
        received += more
    assert [e.event for e in received] == [*events, exited]
    assert [e.seq for e in received] == list(range(1, len(events) + 2))
    assert sub.counters["gap_messages"] == sub.counters["decode_errors"] == 0
    pub.close(), sub.close()


def test_batches_are_split_by_topic_count_and_size(tmp_path):
    from gpuwhy.bus import BATCH_BYTES, BATCH_EVENTS

    raw = zmq.Context.instance().socket(zmq.SUB)     # sees the messages themselves
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.bind(f"ipc://{tmp_path}/bus.sock")
    pub = Publisher(f"ipc://{tmp_path}/bus.sock", src="test")
    for _ in range(100):
        raw.getsockopt(zmq.EVENTS)      # let the SUB forward its subscription
        if pub.wait_for_subscriber(0.02):
            break
    big = "x" * (BATCH_BYTES // 3)
    with pub.batched():
        for i in range(BATCH_EVENTS + 1):
            pub.publish(SourceHealth(ts=i, source="s", state="ok"))
        pub.publish(ProcessExited(ts=1, process=ProcessKey(1, 2)))
        for i in range(4):
            pub.publish(SourceHealth(ts=i, source="s", state="ok", detail=big))
    sizes = []
    while raw.poll(2000):
        topic, payload = raw.recv_multipart()
        sizes.append((topic, payload.count(b'"kind"')))
        if len(sizes) == 5:
            break
    assert sizes == [(b"health", BATCH_EVENTS), (b"health", 1), (b"proc", 1),
                     (b"health", 2), (b"health", 2)]
    raw.close(0), pub.close()


def test_a_dropped_batch_counts_every_event(tmp_path):
    sub = Subscriber(f"ipc://{tmp_path}/bus.sock", hwm=2)
    pub = Publisher(sub.endpoint, src="fast", hwm=2)
    assert _connected(pub, sub)
    for _ in range(200):
        with pub.batched():
            for i in range(10):
                pub.publish(SourceHealth(ts=i, source="s", state="ok"))
    assert pub.dropped > 0 and pub.dropped % 10 == 0
    received = 0
    while envelopes := sub.receive_many(timeout=0.5, limit=10_000):
        received += len(envelopes)
    assert received + pub.dropped == 2000
    pub.close(), sub.close()


def test_a_batch_with_garbage_delivers_the_rest(tmp_path):
    sub = Subscriber(f"ipc://{tmp_path}/bus.sock")
    raw = zmq.Context.instance().socket(zmq.PUB)
    raw.connect(sub.endpoint)
    good = SourceHealth(ts=1, source="s", state="ok")
    from gpuwhy.wire import join_payloads, to_payload

    message = [b"health", join_payloads([to_payload(good, src="raw", seq=1), b'{"v":1}',
                                         to_payload(good, src="raw", seq=2)])]
    received = []
    for _ in range(100):   # the raw PUB may still be joining: send until it arrives
        sub.process_commands()
        raw.send_multipart(message)
        received = sub.receive_many(timeout=0.05, limit=10)
        if received:
            break
    assert [(e.seq, e.event) for e in received] == [(1, good), (2, good)]
    assert sub.counters["decode_errors"] == 1
    raw.close(0), sub.close()


def _raw_subscriber_and_publisher(tmp_path, src="probes"):
    """A bare SUB socket that sees the messages themselves, and a publisher that it has
    subscribed to."""
    raw = zmq.Context.instance().socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.bind(f"ipc://{tmp_path}/bus.sock")
    pub = Publisher(f"ipc://{tmp_path}/bus.sock", src=src)
    for _ in range(100):
        raw.getsockopt(zmq.EVENTS)
        if pub.wait_for_subscriber(0.02):
            break
    return raw, pub


def test_a_probes_flush_goes_out_as_batch_messages(tmp_path):
    """Probes.flush batches what its probes publish: every figure arrives, in order, in far
    fewer messages than events (the stand-in probes publish as the real ones do)."""
    from gpuwhy.config import load_config
    from gpuwhy.events import DriverCallStats, SchedStats
    from gpuwhy.probes.privileged import Probes

    raw, pub = _raw_subscriber_and_publisher(tmp_path)
    probes = Probes(load_config(environ={}), pub)
    keys = [ProcessKey(100 + n, 5000 + n) for n in range(40)]
    calls = [DriverCallStats(ts=n, process=k, path="/dev/nvidiactl", device="nvidiactl",
                             ops=[]) for n, k in enumerate(keys)]
    sched = [SchedStats(ts=n, process=k, interval_ns=10**9, own={}, workers={})
             for n, k in enumerate(keys)]
    health = SourceHealth(ts=1, source="fdtrack", state="ok")

    class FdTrack:
        def flush(self):
            for event in calls:
                probes._publish_fd(event)

        def health(self):
            return health

    class Sched:
        def flush(self):
            for event in sched:
                pub.publish(event)

        def counters(self):
            return {}

    probes.fdtrack, probes.sched, probes.cuda, probes.lifecycle = FdTrack(), Sched(), None, None
    probes.flush()
    messages = []
    while raw.poll(1000):
        messages.append(raw.recv_multipart())
    from gpuwhy.wire import decode_message

    events = [e.event for m in messages for e in decode_message(m)[0]]
    assert events[:len(calls) + len(sched) + 1] == [*calls, *sched, health]
    assert len(messages) <= 4         # driver-call stats, sched stats, health (+ sched's)
    raw.close(0), pub.close()


def test_a_closed_subscriber_removes_its_socket_file_and_only_its_own(tmp_path):
    path = tmp_path / "bus.sock"
    first = Subscriber(f"ipc://{path}")
    assert path.exists()
    first.close()
    assert not path.exists(), "a clean stop left the bus socket file"
    old = Subscriber(f"ipc://{path}")
    path.unlink()                       # a newer service took the path over
    new = Subscriber(f"ipc://{path}")
    old.close()
    assert path.exists(), "the old subscriber removed the new one's socket"
    new.close()
    assert not path.exists()


def test_an_optional_probe_whose_flush_fails_is_reported_and_the_rest_runs_on(tmp_path):
    from gpuwhy.config import load_config
    from gpuwhy.probes.privileged import Probes

    raw, pub = _raw_subscriber_and_publisher(tmp_path)
    probes = Probes(load_config(environ={}), pub)
    flushed, closed = [], []

    class FdTrack:
        def flush(self):
            flushed.append("fdtrack")

        def health(self):
            return SourceHealth(ts=1, source="fdtrack", state="ok")

        def idle(self):
            return True

    class BrokenSched:
        def flush(self):
            raise OSError(9, "Bad file descriptor")

        def close(self):
            closed.append("sched")

    probes.fdtrack, probes.sched, probes.cuda, probes.lifecycle, probes.printk = \
        FdTrack(), BrokenSched(), None, None, None
    probes.flush()
    probes.flush()                                   # the next flush runs without it
    assert flushed == ["fdtrack", "fdtrack"] and closed == ["sched"]
    assert probes.sched is None and probes.idle()
    from gpuwhy.wire import decode_message

    health = []
    while raw.poll(1000):
        health += [e.event for e in decode_message(raw.recv_multipart())[0]
                   if isinstance(e.event, SourceHealth)]
    failed = [h for h in health if h.source == "sched"]
    assert failed and failed[0].state == "failed" and "Bad file descriptor" in failed[0].detail
    raw.close(0), pub.close()


def test_one_read_of_eight_gpus_is_one_bus_message(tmp_path):
    """The GPU source sends a read as one batch: the correlator wakes once a read, not once
    a GPU (#23), and every sample arrives."""
    from gpuwhy.config import load_config
    from gpuwhy.events import GpuSample
    from gpuwhy.probes.gpu.runner import GpuRunner
    from gpuwhy.probes.gpu.select import open_source
    from gpuwhy.wire import decode_message

    raw, pub = _raw_subscriber_and_publisher(tmp_path, src="gpu")
    config = load_config(environ={"GPUWHY_GPU_SOURCE": "sim", "GPUWHY_SIM_GPUS": "8"})
    source, steps = open_source(config)
    runner = GpuRunner(source, steps, pub, 1.0)
    try:
        runner.step()
        assert raw.poll(2000)
        messages = [raw.recv_multipart()]
        while raw.poll(200):
            messages.append(raw.recv_multipart())
        assert [topic for topic, _ in messages] == [b"gpu"]
        envelopes, errors = decode_message(messages[0])
        samples = [e.event for e in envelopes if isinstance(e.event, GpuSample)]
        assert not errors
        assert sorted(s.gpu_id for s in samples) == sorted(g.identity.uuid for g in source.gpus)
        assert runner.counters["samples"] == runner.counters["published"] == 8
        assert "dropped" not in runner.counters
    finally:
        source.close()
        pub.close()
        raw.close(0)
