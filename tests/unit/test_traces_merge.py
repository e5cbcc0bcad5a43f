"""`stepcli merge`'s pure parts (stepcli.traces.merge): the output guard and the per-rank rewrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepcli.errors import StepcliError
from stepcli.traces.merge import _Rewriter, check_output


def test_merge_never_replaces_a_foreign_file(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.json"
    foreign.write_text("{}")
    with pytest.raises(StepcliError, match="not written by stepcli merge"):
        check_output(str(foreign))
    (tmp_path / "ours.json").write_text('{"stepcli_merged": {}, "traceEvents": []}')
    check_output(str(tmp_path / "ours.json"))
    check_output(str(tmp_path / "absent.json"))
    with pytest.raises(StepcliError, match="not a regular file"):
        check_output(str(tmp_path))


def test_merge_moves_ids_pids_and_clock_per_rank() -> None:
    rewriter = _Rewriter(rank=3, slot=1, shift_us=250.0)
    flow = rewriter.event({"ph": "s", "id": 7, "pid": 4242, "tid": 1, "ts": 1000.0, "args": {"correlation": 9}})
    name = rewriter.event({"ph": "M", "name": "process_name", "pid": 4242, "args": {"name": "python"}})
    device = rewriter.event({"ph": "X", "pid": 0, "tid": 7, "ts": 2000.0, "dur": 5.0, "args": {"External id": 9}})
    assert flow["ts"] == 750.0 and flow["pid"] == 1000 and device["pid"] == 1001
    assert flow["id"] == 7 + (1 << 40) and flow["args"]["correlation"] == 9 + (1 << 40)
    assert device["args"]["External id"] == flow["args"]["correlation"]  # still linked within the rank
    assert name["args"]["name"] == "rank 3: python"
