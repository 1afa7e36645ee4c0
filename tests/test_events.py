import json

import pytest

from gpuwhy.errors import DecodeError
from gpuwhy.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    TOPICS,
    DeviceClosed,
    DeviceOpened,
    IoctlCounts,
    ProcessExited,
    ProcessSeen,
    SourceHealth,
    from_frames,
    to_payload,
)
from gpuwhy.identity import GpuIdentity, ProcessKey, classify_device

KEY = ProcessKey(4242, 987654)
SAMPLES = [
    ProcessSeen(ts=1, process=KEY, comm="python", cmdline="python train.py", tag="t"),
    ProcessExited(ts=2, process=KEY, raw_ts=99),
    DeviceOpened(ts=3, process=KEY, fd=5, path="/dev/nvidia0", device="nvidiaN", minor=0),
    DeviceClosed(ts=4, process=KEY, fd=5, path="/dev/nvidia0"),
    IoctlCounts(ts=5, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
                counts={"3223340586": 11}),
    SourceHealth(ts=6, source="fdtrack", state="ok", counters={"records": 3}),
]


def test_every_kind_has_a_sample():
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES.values())


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
