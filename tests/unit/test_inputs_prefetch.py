"""stepcli.inputs.prefetch: one .gz trace inflated on a thread while `table` imports its analysis; read_input
then hands over exactly what it would have read, or raises the same one-line error."""

from __future__ import annotations

import gzip
import sys
import threading
from pathlib import Path

import pytest

from stepcli import inputs
from stepcli.errors import TraceError


def _prefetched(path: Path) -> bool:
    return str(path.resolve()) in inputs._prefetched


def test_read_input_takes_the_prefetched_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = b'{"traceEvents": [' + b",".join(b'{"name": "x%d"}' % i for i in range(50_000)) + b"]}"
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(gzip.compress(text))
    usual = sys.getswitchinterval()
    inflated_on: list[str] = []
    real = inputs._read_input

    def spy(name: str, gunzip: bool) -> bytes | bytearray:
        inflated_on.append(threading.current_thread().name)
        return real(name, gunzip)

    monkeypatch.setattr(inputs, "_read_input", spy)
    inputs.prefetch(str(path))
    assert _prefetched(path)
    # read by another spelling of the same path: still the prefetched bytes, inflated once, on the thread
    assert inputs.read_input(str(tmp_path / "." / path.name)) == text
    assert inflated_on == ["stepcli-prefetch"]
    assert not _prefetched(path) and sys.getswitchinterval() == usual
    assert inputs.read_input(str(path)) == text  # a second read is an ordinary one
    assert inflated_on == ["stepcli-prefetch", "MainThread"]


def test_a_prefetched_corrupt_file_raises_its_one_line_error_in_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}' * 1000)[:-30])
    inputs.prefetch(str(path))
    with pytest.raises(TraceError, match="truncated"):
        inputs.read_input(str(path))


def test_only_a_gzip_file_is_prefetched(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    plain.write_text("{}")
    folder = tmp_path / "ranks.gz"
    folder.mkdir()
    for path in (plain, folder, tmp_path / "missing.json.gz"):
        inputs.prefetch(str(path))
        assert not _prefetched(path)
