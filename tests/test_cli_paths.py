"""Every path a command reads or writes refuses FIFOs, devices, folders and unreadable files
with a usage error (exit 2, one message naming the option and the path): no hang, no
traceback. And URLs given on the command line are http(s) or refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.files import FileRefused, check_directory, check_readable, open_regular, read_regular


@pytest.fixture
def specials(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"fifo": (str(fifo), "is a FIFO, not a regular file"),
            "device": ("/dev/null", "is a character device, not a regular file"),
            "folder": (str(tmp_path), "is a directory, not a regular file"),
            "unreadable": ("/proc/self/mem", "cannot be read: Input/output error")}


def test_the_file_helpers_refuse_special_files_without_blocking(specials, tmp_path):
    for path, reason in specials.values():
        with pytest.raises(FileRefused) as caught:
            check_readable(path)
        assert str(caught.value) == f"{path} {reason}"
    plain = tmp_path / "plain.txt"
    plain.write_text("hello\n")
    check_readable(plain)
    assert read_regular(plain, 100) == b"hello\n"
    with open_regular(plain) as file:
        assert file.read() == b"hello\n"
    with pytest.raises(FileRefused, match="is larger than 3 bytes"):
        read_regular(plain, 3)
    with pytest.raises(FileRefused, match="is a regular file, not a directory"):
        check_directory(plain)


# Each command, with where the path goes: {} is the path.
READERS = [
    ["xid", "{}"],
    ["db", "schema", "--check", "{}"],
    ["rules", "lint", "{}"],
    ["cuda", "allow-build-id", "{}"],
    ["rules", "test", "--replay", "{}"],
]


@pytest.mark.parametrize("args", READERS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("kind", ["fifo", "device", "unreadable"])
def test_a_command_that_reads_a_file_refuses_a_special_one(specials, args, kind, tmp_path):
    path, reason = specials[kind]
    result = CliRunner().invoke(cli, [a.replace("{}", path) for a in args],
                                env={"GPUWHY_DB": str(tmp_path / "x.db")})
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Invalid value for" in result.output and f"{path} {reason}" in result.output


@pytest.mark.parametrize("args", [["report", "--gpu", "0", "-o", "{}"], ["up", "--pidfile", "{}"],
                                  ["check", "--expect", "count(xid) == 0", "--pid", "1",
                                   "--junit", "{}"]], ids=lambda a: a[0])
def test_a_command_that_writes_a_file_refuses_a_fifo(specials, args, tmp_path):
    path, reason = specials["fifo"]
    result = CliRunner().invoke(cli, [a.replace("{}", path) for a in args],
                                env={"GPUWHY_DB": str(tmp_path / "x.db")})
    assert result.exit_code == 2 and f"{path} {reason}" in result.output, result.output


def test_a_proc_root_that_is_no_folder_is_refused(specials):
    path, _ = specials["fifo"]
    result = CliRunner().invoke(cli, ["proc", "1", "--proc-root", path])
    assert result.exit_code == 2 and f"{path} is a FIFO, not a directory" in result.output


@pytest.mark.parametrize("url", ["\u0663", "file:///etc/passwd", "ftp://h/x", "http://"])
def test_gpu_sample_takes_only_an_http_url(url):
    result = CliRunner().invoke(cli, ["gpu", "sample", "--once", "--url", url])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--url'" in result.output and result.exception is not None \
        and isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("args", [["xid"], ["db", "schema", "--check"], ["--config"]])
def test_a_fifo_never_hangs_a_real_process(specials, args, tmp_path):
    """The reported hangs, end to end: `gpuwhy xid FIFO`, `gpuwhy db schema --check FIFO`."""
    path, reason = specials["fifo"]
    command = [sys.executable, "-m", "gpuwhy", *args, path] + (["status"] if args == ["--config"]
                                                               else [])
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path,
                            env={**os.environ, "GPUWHY_DB": str(tmp_path / "x.db")})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert reason in result.stderr, result.stderr


def test_every_command_line_path_goes_through_the_shared_types():
    """One helper checks every path: no module declares a bare click.Path or click.File."""
    repo = Path(__file__).resolve().parent.parent
    found = [f"{path.relative_to(repo)}:{number}"
             for folder in ("gpuwhy", "probes", "correlator", "store", "webui")
             for path in sorted((repo / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "click.Path(" in line or "click.File(" in line]
    assert found == []
