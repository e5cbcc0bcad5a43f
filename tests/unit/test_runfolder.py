"""A run folder read back (stepcli.runfolder.runs): paths kept inside the folder given, links
followed included."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from stepcli.runfolder.runs import contained, rerooted
from stepcli.runfolder.summaryfile import RunSummary
from stepcli.safefile import why_not_replace


def test_a_summary_read_back_names_only_traces_inside_the_folder(tmp_path: Path) -> None:
    folder, outside = tmp_path / "artifact", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "secret.pt.trace.json").write_text("{}")
    (folder / "own.pt.trace.json").write_text("{}")
    # (an unpacked artifact's link)
    (folder / "escape.pt.trace.json").symlink_to(outside / "secret.pt.trace.json")
    (folder / "sub").symlink_to(outside)
    old = "/ci/run/out"
    doc: dict[str, Any] = {
        "out_dir": old,
        "traces": [
            f"{old}/own.pt.trace.json",
            f"{old}/escape.pt.trace.json",
            f"{old}/sub/secret.pt.trace.json",
        ],
        "windows": [],
    }
    moved = rerooted(msgspec.convert(doc, RunSummary), str(folder))
    assert moved.traces == [str(folder / "own.pt.trace.json")] and moved.out_dir == str(folder)
    assert contained(str(folder / "own.pt.trace.json"), str(folder))
    assert not contained(str(folder / "escape.pt.trace.json"), str(folder)) and not contained(
        str(folder), str(folder)
    )


def test_an_empty_file_may_be_replaced_a_foreign_one_not(tmp_path: Path) -> None:
    empty = tmp_path / "made-by-mktemp"
    empty.write_bytes(b"")
    mine = tmp_path / "mine.json"
    mine.write_text('{"notes": 1}')
    assert why_not_replace(str(empty), lambda head: False) is None  # nothing in it to lose
    assert why_not_replace(str(mine), lambda head: False) is not None
    os.mkfifo(tmp_path / "fifo")
    assert why_not_replace(str(tmp_path / "fifo"), lambda head: True) is not None
