"""stepcli.inputs: the one reader of files stepcli did not write, side files and gzip trailers included (issue 47)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from stepcli.errors import TraceError
from stepcli.inputs import gzip_trailer, read_side_json


def test_a_side_file_is_read_only_when_it_is_a_small_regular_file_of_finite_json(tmp_path: Path) -> None:
    side = tmp_path / "t.flops"
    assert read_side_json(str(side)) is None  # nothing there: nothing to say
    side.write_text('{"flops": 12, "device": null}')
    assert read_side_json(str(side)) == {"flops": 12, "device": None}
    cases = {
        "fifo": "not a regular file",
        "dev_zero": "not a regular file",
        "dangling": "which does not exist",
        "big": "larger than the 64.0 KiB stepcli reads in such a file",
        "1e400": "out of range",
        "-Infinity": "not a number JSON allows",
        "[" * 10_000: "nested too deeply",
    }
    for case, words in cases.items():
        path = tmp_path / f"{len(os.listdir(tmp_path))}.flops"
        if case == "fifo":
            os.mkfifo(path)  # (opened without blocking: no writer ever comes)
        elif case == "dev_zero":
            path.symlink_to("/dev/zero")
        elif case == "dangling":
            path.symlink_to(tmp_path / "gone")
        elif case == "big":
            path.write_bytes(b" " * (1 << 17))
        else:
            path.write_text(f'{{"flops": {case}}}' if len(case) < 20 else case)
        with pytest.raises(TraceError, match=words):
            read_side_json(str(path), 1 << 16)


def test_a_gzip_trailer_is_read_only_from_a_regular_gzip_file(tmp_path: Path) -> None:
    packed = tmp_path / "a.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(b"x" * 1000))
    assert gzip_trailer(str(packed)) == (packed.stat().st_size, 1000)
    fifo = tmp_path / "b.pt.trace.json.gz"
    os.mkfifo(fifo)
    plain = tmp_path / "c.pt.trace.json.gz"
    plain.write_bytes(b"not gzip at all")
    for path in (fifo, plain, tmp_path / "missing.gz", Path("/dev/zero")):
        assert gzip_trailer(str(path)) is None
