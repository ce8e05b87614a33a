"""The ``open`` user code calls: a file opened for writing whose finaliser cannot flush it
says so (``/dev/full`` fails every write with ``ENOSPC``, as a full workspace does), and
otherwise behaves as ``io.open``'s own."""

import errno
import gc
import io
import sys

import pytest


@pytest.fixture
def files(runner):
    return sys.modules["_snakecage_files"]


@pytest.fixture
def reported(monkeypatch):
    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    return reports


@pytest.mark.parametrize(
    ("mode", "data", "shown"),
    [
        ("w", "hé", "<_io.TextIOWrapper name='/dev/full' mode='w' encoding='utf-8'>"),
        ("wb", b"hi", "<BufferedWriter name='/dev/full'>"),
        ("r+b", b"hi", "<BufferedRandom name='/dev/full'>"),
    ],
)
def test_a_write_its_finaliser_cannot_flush_is_reported(files, reported, mode, data, shown):
    encoding = None if "b" in mode else "utf-8"
    files.open("/dev/full", mode, encoding=encoding).write(data)
    gc.collect()
    assert len(reported) == 1, reported
    report = reported[0]
    assert isinstance(report.exc_value, OSError)
    assert report.exc_value.errno == errno.ENOSPC
    assert report.exc_traceback is None
    assert repr(report.object) == shown


def test_io_open_alone_drops_it(reported):
    """Why: CPython 3.12's own files lose the error (3.13 reports it, gh-62948)."""
    if sys.version_info >= (3, 13):
        pytest.skip("CPython 3.13 reports it itself")
    io.open("/dev/full", "w", encoding="utf-8").write("hi")
    gc.collect()
    assert reported == []


def test_closed_files_and_files_only_read_report_nothing(files, reported, tmp_path):
    path = tmp_path / "données.txt"
    with files.open(path, "w", encoding="utf-8") as f:
        f.write("ok")
    f = files.open(path, encoding="utf-8")
    assert type(f) is io.TextIOWrapper  # read-only files are io's own
    assert f.read() == "ok"
    del f
    gc.collect()
    assert reported == []


def test_files_keep_every_setting_io_open_gives_them(files, tmp_path):
    path = tmp_path / "f.txt"
    with files.open(path, "w", encoding="utf-16", newline="\r\n", buffering=1) as f:
        assert isinstance(f, io.TextIOWrapper)
        assert (f.mode, f.encoding, f.line_buffering, f.name) == ("w", "utf-16", True, str(path))
        f.write("a\nb")
    assert path.read_bytes() == "a\r\nb".encode("utf-16")
    # Appending to it writes no second BOM.
    with files.open(path, "a", encoding="utf-16") as f:
        f.write("c")
    assert path.read_bytes() == "a\r\nbc".encode("utf-16")
    with files.open(path, "r+", encoding="utf-16") as f:
        assert f.read() == "a\nbc"
    with files.open(path, "wb") as f:
        assert isinstance(f, io.BufferedWriter) and f.mode == "wb"
        f.write(b"xyz")
    with files.open(path, "r+b", buffering=4) as f:
        assert isinstance(f, io.BufferedRandom)
        assert f.read() == b"xyz"
    assert type(files.open(path, "ab", buffering=0)) is io.FileIO
    with pytest.raises(FileNotFoundError):
        files.open(tmp_path / "missing" / "x", "w")


def test_the_zygote_makes_it_the_open_of_every_child(runner, monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "open", builtins.open)
    monkeypatch.setattr(io, "open", io.open)
    sys.modules["_snakecage_state"].install_reporting_open()
    assert builtins.open is io.open is sys.modules["_snakecage_files"].open
