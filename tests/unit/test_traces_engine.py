"""stepcli.traces.engine: how many worker processes, and how many .gz traces inflated at once."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from stepcli.traces import engine


def test_workers_never_exceed_the_files_nor_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "available_cores", lambda: 4)
    assert engine.worker_count(10_000, 300) == 4
    assert engine.worker_count(None, 300) == 4
    assert engine.worker_count(3, 300) == 3
    assert engine.worker_count(10_000, 2) == 2
    assert engine.worker_count(1, 300) == 1
    assert engine.worker_count(None, 0) == 1


def _gz(path: Path, inflated: int) -> str:
    path.write_bytes(gzip.compress(b" " * inflated))
    return str(path)


def test_gzip_reads_at_once_fit_half_the_memory(tmp_path: Path) -> None:
    small = [_gz(tmp_path / f"r{i}.json.gz", 1_000) for i in range(4)]
    # a few KB on disk, 10 MB inflated (its trailer says so)
    big = _gz(tmp_path / "big.json.gz", 10_000_000)
    plain = str(tmp_path / "plain.json")
    # small traces: every worker may inflate one at once
    assert engine.gzip_slots(small, 4, memory=10**9) == 4
    # with a 10 MB trace, 3 x 10 MB per read in half of 70 MB of memory: one at a time
    assert engine.gzip_slots([*small, big], 4, memory=70_000_000) == 1
    assert engine.gzip_slots([*small, big], 4, memory=130_000_000) == 2
    # never less than one, and no bound needed without .gz files
    assert engine.gzip_slots([big], 4, memory=1) == 1
    assert engine.gzip_slots([plain], 4, memory=1) == 4


def _gated_here(path: str) -> bool:
    return engine._gzip_gate is not None


def test_workers_share_a_gzip_semaphore_only_when_memory_is_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [_gz(tmp_path / f"r{i}.json.gz", 1_000) for i in range(4)]
    monkeypatch.setattr(engine, "available_cores", lambda: 2)
    monkeypatch.setattr(engine, "_memory_available", lambda: 10)
    assert engine.map_files(_gated_here, files, 2) == [True] * 4
    monkeypatch.setattr(engine, "_memory_available", lambda: 10**12)
    assert engine.map_files(_gated_here, files, 2) == [False] * 4
