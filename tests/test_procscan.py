"""The start-up scan: device fds open before gpuwhy started, and which of them a process holds
only because it was forked from a holder (a DataLoader worker), read from a /proc laid out
in a folder."""

from __future__ import annotations

import os

from gpuwhy.probes.procscan import inherited, scan_open_devices


def _process(root, pid: int, ppid: int, fds: dict[int, str], comm: str = "python") -> None:
    folder = root / str(pid)
    (folder / "fd").mkdir(parents=True)
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")
    for fd, target in fds.items():
        os.symlink(target, folder / "fd" / str(fd))


def test_a_worker_forked_before_the_scan_is_told_from_a_gpu_process(tmp_path):
    dev = str(tmp_path / "dev")
    ctl, gpu0, gpu1 = f"{dev}/nvidiactl", f"{dev}/nvidia0", f"{dev}/nvidia1"
    _process(tmp_path, 100, 1, {3: ctl, 4: gpu0})                # the trainer
    _process(tmp_path, 101, 100, {3: ctl, 4: gpu0})              # its forked loader worker
    _process(tmp_path, 102, 100, {3: ctl, 4: gpu0, 9: gpu1})     # forked, then opened a GPU
    _process(tmp_path, 200, 1, {5: ctl, 6: gpu1})                # another job
    _process(tmp_path, 201, 200, {3: ctl, 4: gpu1}, comm="a) S 1 (odd")   # a rank it started
    found = list(scan_open_devices(f"{dev}/nvidia*", str(tmp_path)))
    assert len(found) == 11
    assert inherited(found, str(tmp_path)) == {(101, 3), (101, 4), (102, 3), (102, 4)}


def test_a_vanished_parent_or_process_is_not_an_error(tmp_path):
    dev = str(tmp_path / "dev")
    _process(tmp_path, 300, 299, {3: f"{dev}/nvidiactl"})        # its parent has no entry
    found = list(scan_open_devices(f"{dev}/nvidia*", str(tmp_path)))
    (tmp_path / "300" / "stat").unlink()                          # gone while we looked
    assert inherited(found, str(tmp_path)) == set()
