"""Container id, pod uid and systemd unit parsed from /proc/PID/cgroup (v1, v2, runtimes)."""

from pathlib import Path

import pytest

from gpuwhy.events import ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.proc import CgroupIdentity, parse_cgroup, read_process
from gpuwhy.store.writer import StoreWriter
from gpuwhy.wire import from_frames

DATA = Path(__file__).parent / "data" / "cgroup"
CONTAINERD = "8d2b7a9c1e4f6a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b"
DOCKER = "c0ffee00deadbeefc0ffee00deadbeefc0ffee00deadbeefc0ffee00deadbeef"
CRIO = "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988"
K8S_V1 = "4a3c9f0e2b1d8c7a6e5f4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a"


@pytest.mark.parametrize(("name", "expected"), [
    ("v2-containerd-systemd", CgroupIdentity(
        CONTAINERD, "3f1c2a4e-9b7d-4c21-8e3f-0a1b2c3d4e5f", f"cri-containerd-{CONTAINERD}.scope")),
    ("v1-docker-cgroupfs", CgroupIdentity(K8S_V1, "5b0e6f3c-1d2a-4e8f-9a7b-6c5d4e3f2a1b", None)),
    ("v2-crio", CgroupIdentity(CRIO, "0d9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a",
                               f"crio-{CRIO}.scope")),
    # cri-o's monitor runs in the pod but is not the container
    ("v2-crio-conmon", CgroupIdentity(None, "0d9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a",
                                      f"crio-conmon-{CRIO}.scope")),
    ("v2-docker", CgroupIdentity(DOCKER, None, f"docker-{DOCKER}.scope")),
    ("v1-docker", CgroupIdentity(DOCKER, None, None)),
    # read from inside a pod's own cgroup namespace: the host path starts with /../..
    ("v2-cgroupns", CgroupIdentity("abcdef" * 10 + "abcd", "7e6d5c4b-3a29-4180-9f8e-7d6c5b4a3928",
                                   f"cri-containerd-{'abcdef' * 10}abcd.scope")),
    ("v2-user-unit", CgroupIdentity(None, None, "jupyter.service")),
    ("v2-session", CgroupIdentity(None, None, "session-4.scope")),
])
def test_cgroup_layouts(name, expected):
    assert parse_cgroup((DATA / f"{name}.txt").read_text()) == expected


def test_unified_line_wins_over_v1_for_the_unit():
    text = "1:name=systemd:/system.slice/old.service\n0::/system.slice/train.service\n"
    assert parse_cgroup(text).unit == "train.service"


@pytest.mark.parametrize("text", [
    "", "garbage", "0::/", "0::/system.slice", "0::/" + "a" * 63,         # 63 hex: no id
    "0::/kubepods/pod1234/" + "f" * 64 + "0",                           # 65 hex, bad pod uid
    "0::/x\n\n:::\n",
])
def test_paths_that_name_nothing(text):
    owner = parse_cgroup(text)
    assert owner.container_id is None and owner.pod_uid is None
    if text != "0::/x\n\n:::\n":
        assert owner.unit is None


def test_read_process_fills_the_owner_and_the_store_keeps_it(tmp_path, db):
    base = tmp_path / "77"
    base.mkdir()
    (base / "stat").write_text("77 (python) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0\n")
    (base / "cmdline").write_bytes(b"python\0train.py\0")
    (base / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    # v1: the unified line comes last, after more than 512 bytes of other hierarchies
    (base / "cgroup").write_text((DATA / "v1-docker-cgroupfs.txt").read_text())
    seen = read_process(77, ts=5, proc_root=str(tmp_path))
    assert seen.container_id == K8S_V1
    assert seen.pod_uid == "5b0e6f3c-1d2a-4e8f-9a7b-6c5d4e3f2a1b"
    assert seen.unit is None
    assert len(seen.cgroup) == 512            # the stored path stays bounded
    # through the bus encoding and the store writer, as the correlator does it
    from gpuwhy.wire import to_payload

    envelope = from_frames([b"proc", to_payload(seen, src="test", seq=1)])
    StoreWriter(db).write_batch([envelope])
    row = db.execute("select container_id, pod_uid, unit from processes where pid = 77"
                     ).fetchone()
    assert row == (K8S_V1, "5b0e6f3c-1d2a-4e8f-9a7b-6c5d4e3f2a1b", None)


def test_an_older_process_seen_without_the_fields_still_decodes():
    import json

    from gpuwhy.wire import to_payload

    body = json.loads(to_payload(ProcessSeen(ts=1, process=ProcessKey(1, 2)), src="s", seq=1))
    for field in ("container_id", "pod_uid", "unit"):
        del body[field]
    event = from_frames([b"proc", json.dumps(body).encode()]).event
    assert event.container_id is None and event.unit is None
