"""Cron schedules (crontab, cron.d, user crontabs, timers), cron log lines, GPU-acting
commands, and tying a logged job pid to its process."""

import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from gpuwhy.clock import ClockConverter
from gpuwhy.config import load_config
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.probes.cron import reread
from gpuwhy.probes.cron.logline import parse_cron_line
from gpuwhy.probes.cron.reread import ScheduleReader
from gpuwhy.probes.cron.schedule import parse_crontab, read_cron_jobs
from gpuwhy.probes.cron.source import execution_event, job_start_time
from gpuwhy.probes.cron.timers import parse_unit, read_timers
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.proc import read_stat

NOW = datetime(2026, 11, 30, 9, 7, 30, tzinfo=UTC)


def ns(*args):
    return int(datetime(*args, tzinfo=UTC).timestamp()) * 1_000_000_000


def test_system_crontab_with_user_field_and_next_last_runs():
    text = "SHELL=/bin/sh\n# comment\n\n*/15 * * * * root nvidia-smi -r -i 0\n" \
           "@hourly   alice   /usr/bin/backup --all\n@reboot root nvidia-smi -pm 1\n"
    jobs = parse_crontab(text, origin="crontab", file="/etc/crontab", user=None, now=NOW)
    assert [(j.user, j.schedule, j.command) for j in jobs] == [
        ("root", "*/15 * * * *", "nvidia-smi -r -i 0"),
        ("alice", "@hourly", "/usr/bin/backup --all"),
        ("root", "@reboot", "nvidia-smi -pm 1")]
    reset, hourly, reboot = jobs
    assert (reset.next_run, reset.last_run) == (ns(2026, 11, 30, 9, 15), ns(2026, 11, 30, 9, 0))
    assert reset.gpu_action == "nvidia-smi -r: GPU reset" and hourly.gpu_action is None
    assert hourly.next_run == ns(2026, 11, 30, 10, 0)
    assert reboot.next_run is None and "boot" in reboot.note
    assert reset.ident == "/etc/crontab:4"


def test_user_crontab_has_no_user_field():
    [job] = parse_crontab("0 3 * * 1 dcgmi diag -r 3\n", origin="user",
                          file="/var/spool/cron/crontabs/bob", user="bob", now=NOW)
    assert (job.user, job.command, job.gpu_action) == \
        ("bob", "dcgmi diag -r 3", "dcgmi diag: GPU diagnostics (loads the GPUs)")


def test_invalid_schedule_is_kept_with_a_note():
    [job] = parse_crontab("61 * * * * root true\n", origin="cron.d", file="f", user=None,
                          now=NOW)
    assert job.next_run is None and "invalid" in job.note


def test_read_cron_jobs_walks_crontab_cron_d_and_spool(tmp_path):
    etc, spool = tmp_path / "etc", tmp_path / "spool"
    (etc / "cron.d").mkdir(parents=True)
    spool.mkdir()
    (etc / "crontab").write_text("0 * * * * root echo hourly\n")
    (etc / "cron.d" / "gpu-maint").write_text("30 2 * * * root rmmod nvidia_uvm\n")
    (etc / "cron.d" / "ignored.dpkg-old").write_text("* * * * * root nvidia-smi -r\n")
    (spool / "carol").write_text("*/5 * * * * nvidia-smi -pl 250\n")
    jobs = read_cron_jobs(str(etc), str(spool), now=NOW)
    assert [(j.origin, j.user, j.gpu_action is not None) for j in jobs] == [
        ("crontab", "root", False), ("cron.d", "root", True), ("user", "carol", True)]


def test_timer_units_with_calendar_monotonic_and_service_command(tmp_path):
    units, stamps = tmp_path / "units", tmp_path / "stamps"
    units.mkdir()
    stamps.mkdir()
    (units / "gpu-reset.timer").write_text("[Timer]\nOnCalendar=*-*-* 04:00:00\n"
                                           "Persistent=true\n")
    (units / "gpu-reset.service").write_text("[Service]\nExecStart=-/usr/bin/nvidia-smi \\\n"
                                             "  --gpu-reset -i 0\n")
    (units / "tick.timer").write_text("[Timer]\nOnBootSec=5min\nOnUnitActiveSec=1h\n"
                                      "Unit=other.service\n")
    (units / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    (units / "tmpl@.timer").write_text("[Timer]\nOnCalendar=daily\n")
    (stamps / "stamp-gpu-reset.timer").write_text("")
    jobs = {j.ident: j for j in read_timers((str(units),), str(stamps))}
    assert set(jobs) == {"gpu-reset.timer", "tick.timer"}
    reset = jobs["gpu-reset.timer"]
    assert reset.gpu_action == "nvidia-smi --gpu-reset: GPU reset"
    assert reset.schedule == "*-*-* 04:00:00"
    assert reset.next_run is not None and 0 < reset.next_run - time.time_ns() <= 86400e9
    assert reset.last_run == (stamps / "stamp-gpu-reset.timer").stat().st_mtime_ns
    tick = jobs["tick.timer"]
    assert tick.schedule == "OnBootSec=5min; OnUnitActiveSec=1h" and tick.next_run is None
    assert tick.command == "/bin/true" and tick.gpu_action is None


def test_unit_parser_resets_lists_on_empty_assignment():
    unit = parse_unit("[Timer]\nOnCalendar=daily\nOnCalendar=\nOnCalendar=weekly\n")
    assert unit["Timer"]["OnCalendar"] == ["weekly"]


@pytest.mark.parametrize("command,flagged", [
    ("nvidia-smi -r", True), ("nvidia-smi --gpu-reset -i 1", True), ("nvidia-smi -pm 1", True),
    ("nvidia-smi -pl 300", True), ("nvidia-smi -lgc 1400,1400", True), ("nvidia-smi -rgc", True),
    ("nvidia-smi -mig 1", True), ("nvidia-smi --persistence-mode=1", True),
    ("/usr/bin/nvidia-persistenced --user nvidia", True), ("modprobe -r nvidia_uvm", True),
    ("rmmod nvidia_drm nvidia", True), ("systemctl restart nvidia-fabricmanager", True),
    ("systemctl stop nvidia-persistenced.service", True), ("dcgmi diag -r 2", True),
    ("dcgmi policy -g 1 --set 0,0", True), ("sudo -u root nvidia-smi -r", True),
    ("cd /x && timeout 60 nvidia-smi -r", True), ("bash -c 'nvidia-smi -pm 0'", True),
    ("nvidia-smi", False), ("nvidia-smi -q -d POWER", False), ("modprobe nvidia", False),
    ("systemctl status nvidia-persistenced", False), ("dcgmi discovery -l", False),
    ("echo nvidia-smi -r", False), ("rmmod snd_hda", False), ("'unbalanced quote", False),
])
def test_gpu_acting_commands_are_flagged(command, flagged):
    assert (gpu_action(command) is not None) is flagged


@pytest.mark.parametrize("text,expected", [
    ("(root) CMD ([15615] /bin/echo hi)", ("started", "root", "/bin/echo hi", 15615, None)),
    ("(root) END ([15615] /bin/echo hi)", ("ended", "root", "/bin/echo hi", 15615, None)),
    ("(alice) CMD (run-parts /etc/cron.hourly)", ("started", "alice",
                                                   "run-parts /etc/cron.hourly", None, None)),
    ("Nov 30 09:17:01 h CRON[812]: (root) CMD (echo (x))", ("started", "root", "echo (x)",
                                                              None, 812)),
])
def test_cron_log_lines(text, expected):
    line = parse_cron_line(text)
    assert (line.phase, line.user, line.command, line.job_pid, line.cron_pid) == expected


@pytest.mark.parametrize("text", ["(CRON) INFO (pidfile fd = 3)", "(root) MAIL (mailed 1 byte)",
                                  "pam_unix(cron:session): session opened for user root", ""])
def test_other_cron_lines_are_not_executions(text):
    assert parse_cron_line(text) is None


def test_execution_is_tied_to_the_live_job_process_and_not_to_a_later_one():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        clock = ClockConverter()
        raw = RawLine(f"(root) CMD ([{job.pid}] nvidia-smi -r)", "c1", "boot", None,
                      time.time_ns(), sender_pid=99)
        event = execution_event(raw, raw.realtime_ns, clock)
        assert (event.job_pid, event.job_start_time) == (job.pid, read_stat(job.pid)[2])
        assert event.cron_pid == 99 and event.gpu_action == "nvidia-smi -r: GPU reset"
        # A log line from before the process started names another (earlier) process.
        assert job_start_time(job.pid, time.time_ns() - 60 * 10**9, clock) is None
    finally:
        job.kill()
        job.wait()
    assert job_start_time(job.pid, time.time_ns(), ClockConverter()) is None


def _schedule_dirs(tmp_path):
    etc, spool, units, stamps = (tmp_path / n for n in ("etc", "spool", "units", "stamps"))
    for directory in (etc / "cron.d", spool, units, stamps):
        directory.mkdir(parents=True)
    config = load_config(environ={"GPUWHY_CRON_ETC": str(etc), "GPUWHY_CRON_SPOOL": str(spool),
                                  "GPUWHY_CRON_UNIT_DIRS": str(units)})
    return config, etc, spool, units, stamps


def test_the_schedule_is_read_again_only_when_its_files_change(tmp_path):
    config, etc, spool, units, stamps = _schedule_dirs(tmp_path)
    (etc / "crontab").write_text("0 4 * * * root echo daily\n")
    (units / "gpu-reset.timer").write_text("[Timer]\nOnCalendar=*-*-* 04:00:00\n")
    (units / "gpu-reset.service").write_text("[Service]\nExecStart=/bin/true\n")
    reader = ScheduleReader(config, str(stamps))
    first = reader.read_if_changed()
    assert [j.ident for j in first] == [f"{etc}/crontab:1", "gpu-reset.timer"]
    assert reader.read_if_changed() is None and reader.read_if_changed() is None

    def changed(edit):
        edit()
        jobs = reader.read_if_changed()
        assert jobs is not None, edit
        assert reader.read_if_changed() is None
        return jobs

    # a file added to cron.d, a user's crontab, an edited crontab (same size, new time)
    jobs = changed(lambda: (etc / "cron.d" / "maint").write_text("30 2 * * * root rmmod x\n"))
    assert len(jobs) == 3
    jobs = changed(lambda: (spool / "carol").write_text("*/5 * * * * nvidia-smi -pl 250\n"))
    assert [j.user for j in jobs if j.origin == "user"] == ["carol"]
    changed(lambda: os.utime(etc / "crontab", ns=(1, 1)))
    # the service a timer starts, rewritten in place; a timer run (its stamp); a new timer
    jobs = changed(lambda: (units / "gpu-reset.service").write_text(
        "[Service]\nExecStart=/usr/bin/nvidia-smi -r\n"))
    assert [j.gpu_action for j in jobs if j.origin == "timer"] == ["nvidia-smi -r: GPU reset"]
    changed(lambda: (stamps / "stamp-gpu-reset.timer").write_text(""))
    jobs = changed(lambda: (units / "tick.timer").write_text("[Timer]\nOnBootSec=5min\n"))
    assert {j.ident for j in jobs if j.origin == "timer"} == {"gpu-reset.timer", "tick.timer"}
    # a file that goes away
    jobs = changed(lambda: (spool / "carol").unlink())
    assert not [j for j in jobs if j.origin == "user"]
    # an unrelated unit file is not looked at
    (units / "unrelated.service").write_text("[Service]\nExecStart=/bin/true\n")
    assert reader.read_if_changed() is not None      # the directory's listing changed
    (units / "unrelated.service").write_text("[Service]\nExecStart=/bin/false\n")
    assert reader.read_if_changed() is None
    assert reader.reads == 9


def test_the_schedule_is_read_again_when_a_run_comes_due(tmp_path, monkeypatch):
    """Next and last runs move once the earliest next run has passed, files or not."""
    config, etc, *_ , stamps = _schedule_dirs(tmp_path)
    (etc / "crontab").write_text("17 * * * * root echo hourly\n")
    reader = ScheduleReader(config, str(stamps))
    (job,) = reader.read_if_changed()
    assert reader.read_if_changed() is None
    monkeypatch.setattr(reread, "now_ns", lambda: job.next_run + 1)
    assert reader.read_if_changed() is not None
    monkeypatch.setattr(reread, "now_ns", lambda: job.next_run - 1)
    assert reader.read_if_changed() is None
    # and once an hour whatever happened: an edit in the same second, of the same size
    monkeypatch.setattr(reread.time, "monotonic", lambda: reader.read_at + 3601)
    assert reader.read_if_changed() is not None
