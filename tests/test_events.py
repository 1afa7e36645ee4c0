import json

import pytest

from gpuwhy.errors import DecodeError
from gpuwhy.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    TOPICS,
    DeviceClosed,
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    ProcessExec,
    ProcessExited,
    ProcessForked,
    ProcessSeen,
    SchedStats,
    SourceHealth,
)
from gpuwhy.identity import GpuIdentity, ProcessKey, classify_device
from gpuwhy.wire import from_frames, to_payload

KEY = ProcessKey(4242, 987654)
SAMPLES = [
    ProcessSeen(ts=1, process=KEY, comm="python", cmdline="python train.py", tag="t"),
    ProcessExited(ts=2, process=KEY, raw_ts=99, exit_code=None, signal=9),
    DeviceOpened(ts=3, process=KEY, fd=5, path="/dev/nvidia0", device="nvidiaN", minor=0,
                 how="dup", cloexec=True),
    DeviceClosed(ts=4, process=KEY, fd=5, path="/dev/nvidia0"),
    DriverCallStats(ts=5, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
                    ops=[{"cmd": 3223340586, "op": "NV_ESC_RM_CONTROL", "sub": 0x20800102,
                          "count": 11, "latency_log2": [0, 1]}]),
    DriverCall(ts=6, process=KEY, tid=4243, fd=3, path="/dev/nvidiactl", device="nvidiactl",
               cmd=0xC020462A, nr=0x2A, size=32, op="NV_ESC_RM_CONTROL", latency_ns=1200,
               ret=0, status=0x51, status_name="NV_ERR_NO_MEMORY", gpu_ids=[256],
               reasons=["error"]),
    ProcessExec(ts=7, process=KEY, filename="/usr/bin/python3", ppid=1),
    ProcessForked(ts=8, parent=KEY, child=ProcessKey(4300, 987700)),
    SchedStats(ts=9, process=KEY, interval_ns=10**9, own={"on_cpu_ns": 5}, workers={},
               worker_processes=0),
    SourceHealth(ts=10, source="fdtrack", state="ok", counters={"records": 3}),
]


def test_every_kind_is_documented_and_on_a_known_topic():
    for kind, cls in EVENT_TYPES.items():
        assert cls.kind == kind
        assert cls.topic in TOPICS, cls
        assert cls.__doc__ and len(cls.__doc__) > 20, cls


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_round_trip(event):
    envelope = from_frames([event.topic.encode(), to_payload(event, src="test", seq=7)])
    assert envelope.event == event
    assert (envelope.src, envelope.seq) == ("test", 7)


def test_payload_is_versioned_json_with_realtime_ts():
    body = json.loads(to_payload(SAMPLES[2], src="fdtrack", seq=1))
    assert body["v"] == SCHEMA_VERSION
    assert body["kind"] == "device_opened"
    assert body["process"] == {"pid": 4242, "start_time": 987654}


def test_no_topic_is_a_prefix_of_another():
    for a in TOPICS:
        for b in TOPICS:
            assert a == b or not b.startswith(a), (a, b)
    assert {cls.topic for cls in EVENT_TYPES.values()} <= set(TOPICS)


@pytest.mark.parametrize("frames, message", [
    ([b"proc"], "2 frames"),
    ([b"proc", b"not json"], "not JSON"),
    ([b"proc", b'{"v": 1, "comm": "\xff\xfe"}'], "not JSON"),
    ([b"proc", b'{"v": 1, "comm": "\\udcff'], "not JSON"),
    ([b"proc", b"[1]"], "not a JSON object"),
    ([b"proc", b'{"v": 99, "kind": "process_seen"}'], "schema version"),
    ([b"proc", b'{"v": 1, "kind": "nope", "src": "x", "seq": 1}'], "unknown event kind"),
    ([b"fd", to_payload(SAMPLES[0], src="x", seq=1)], "topic"),
    ([b"proc", b'{"v": 1, "kind": "process_exited", "ts": 1}'], "src or seq"),
    ([b"proc", b'{"v":1,"kind":"process_exited","src":"x","seq":1,"ts":1,"process":7}'],
     "process key"),
    ([b"proc", b'{"v":1,"kind":"process_exited","src":"x","seq":1}'], "process_exited"),
])
def test_malformed_messages_raise_decode_error(frames, message):
    with pytest.raises(DecodeError, match=message):
        from_frames(frames)


def test_process_key_text_form():
    assert str(KEY) == "4242-987654"
    assert ProcessKey.parse("4242-987654") == KEY
    with pytest.raises(ValueError):
        ProcessKey.parse("4242")


def test_gpu_identity_prefers_uuid_then_pci_then_index():
    assert GpuIdentity(uuid="GPU-1", pci_bus_id="0000:0a:00", index=0).id == "GPU-1"
    assert GpuIdentity(pci_bus_id="0000:0a:00", index=0).id == "0000:0a:00"
    assert GpuIdentity(index=2).id == "index:2"
    assert GpuIdentity(minor=3).id == "minor:3"
    with pytest.raises(ValueError):
        _ = GpuIdentity().id


@pytest.mark.parametrize("path, expected", [
    ("/dev/nvidiactl", ("nvidiactl", None)),
    ("/dev/nvidia0", ("nvidiaN", 0)),
    ("/dev/nvidia17", ("nvidiaN", 17)),
    ("/dev/nvidia-uvm", ("nvidia-uvm", None)),
    ("/dev/nvidia-uvm-tools", ("nvidia-uvm-tools", None)),
    ("/dev/nvidia-modeset", ("nvidia-modeset", None)),
    ("/dev/nvidia-caps/nvidia-cap2", ("nvidia-caps", None)),
    ("/dev/nvidia-nvswitchctl", ("other", None)),
])
def test_classify_device(path, expected):
    assert classify_device(path) == expected


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_event_fields_are_asdict_without_the_copy(event):
    import dataclasses

    from gpuwhy.events import event_fields

    assert event_fields(event) == dataclasses.asdict(event)


def test_attacker_controlled_text_that_is_not_utf8_survives_the_bus():
    # psutil reads a command line that is not UTF-8 with surrogateescape; the fast encoder
    # refuses lone surrogates, so such an event takes the standard library's way, both ends
    odd = ProcessSeen(ts=1, process=KEY, comm="x\udcff", cmdline="run \udcfe\x00 --\u202e")
    payload = to_payload(odd, src="t", seq=1)
    assert b"\\udcff" in payload
    assert from_frames([b"proc", payload]).event == odd
    huge = SourceHealth(ts=2, source="s", state="ok", counters={"big": 2**70})
    assert from_frames([b"health", to_payload(huge, src="t", seq=2)]).event == huge


def test_not_a_number_is_sent_as_null():
    sample = SourceHealth(ts=2, source="s", state="ok", counters={"nan": float("nan")})
    assert json.loads(to_payload(sample, src="t", seq=1))["counters"] == {"nan": None}


def test_the_bus_works_without_orjson_as_before_install(monkeypatch):
    import gpuwhy.wire

    monkeypatch.setattr(gpuwhy.wire, "orjson", None)    # check-env.sh's bare checkout
    for event in SAMPLES:
        assert from_frames([event.topic.encode(), to_payload(event, src="t", seq=1)]).event \
            == event


def test_a_batch_decodes_in_order_and_a_bad_element_costs_only_itself():
    from gpuwhy.wire import decode_message, join_payloads

    good = [SourceHealth(ts=i, source="s", state="ok", counters={"n": i}) for i in range(3)]
    odd = SourceHealth(ts=9, source="s\udcff", state="ok")   # the standard library's form
    payloads = [to_payload(e, src="t", seq=n + 1) for n, e in enumerate([*good, odd])]
    wrong_topic = to_payload(SAMPLES[0], src="t", seq=5)
    message = join_payloads([payloads[0], b"7", payloads[1], wrong_topic, payloads[2],
                             payloads[3]])
    envelopes, errors = decode_message([b"health", message])
    assert [e.event for e in envelopes] == [*good, odd]
    assert [e.seq for e in envelopes] == [1, 2, 3, 4]
    assert len(errors) == 2
    assert "not a JSON object" in errors[0] and "topic" in errors[1]
    with pytest.raises(DecodeError, match="not a JSON object"):
        from_frames([b"health", message])      # one event was asked for
    with pytest.raises(DecodeError, match="neither"):
        decode_message([b"health", b'"text"'])


def test_decoded_events_get_their_own_defaults():
    frames = [b"health", b'{"v":1,"kind":"source_health","src":"t","seq":1,"ts":1,'
                         b'"source":"s","state":"ok"}']
    first, second = from_frames(frames).event, from_frames(frames).event
    assert first == SourceHealth(ts=1, source="s", state="ok")
    assert first.counters == {} and first.counters is not second.counters
    with pytest.raises(Exception, match="frozen|cannot assign"):
        first.state = "failed"
    newer = [b"health", frames[1][:-1] + b',"from_a_newer_sender":1}']
    assert from_frames(newer).event == first
    with pytest.raises(DecodeError, match="missing field.*source, state"):
        from_frames([b"health", b'{"v":1,"kind":"source_health","src":"t","seq":1,"ts":1}'])


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_json_text_is_compact_json_with_or_without_orjson(fast, monkeypatch):
    import gpuwhy.wire
    from gpuwhy.wire import json_text

    if not fast:
        monkeypatch.setattr(gpuwhy.wire, "orjson", None)
    assert json_text({"b": [1, 2], "a": "é"}, sort_keys=True) in ('{"a":"é","b":[1,2]}',
                                                                 '{"a":"\\u00e9","b":[1,2]}')
    assert json_text({"key": KEY}, default=str) == '{"key":"4242-987654"}'
    # what orjson refuses takes the standard library's ASCII form, still JSON and storable
    odd = json_text({"cmdline": "run \udcfe", "big": 2**70})
    assert json.loads(odd) == {"cmdline": "run \udcfe", "big": 2**70}
    odd.encode()     # no lone surrogate left for SQLite's UTF-8
