"""stepcli/snapshots/unpickle.py and fastentries.py: the streaming reader gives what the C
unpickler's reading gives, on every layout torch (and pickle) writes, without keeping the history's
dicts; what it does not handle falls back, still safe."""

from __future__ import annotations

import gzip
import io
import pickle
from pathlib import Path
from typing import Any

import memory_snapshots as fx
import pytest

from stepcli.agent.cudamemory import STEP_TAG
from stepcli.errors import TraceError
from stepcli.snapshots import snapshotreader as reader
from stepcli.snapshots.history import HistoryBuilder, Truncated, Unsupported
from stepcli.snapshots.snapshotfigures import analyze
from stepcli.snapshots.snapshotreader import load_snapshot
from stepcli.snapshots.unpickle import StreamDecoder

MiB = fx.MiB


def _decode(content: bytes) -> tuple[Any, StreamDecoder]:
    decoder = StreamDecoder(io.BytesIO(content).read, HistoryBuilder(STEP_TAG))
    return decoder.load(), decoder


def _same(path: Path) -> dict[str, Any]:
    """Both readings of the file agree, entry by entry and in the report."""
    streamed, whole = load_snapshot(str(path)), load_snapshot(str(path), streamed=False)
    # stacks numbered in another order: compared as stacks
    assert _resolved(streamed) == _resolved(whole)
    assert streamed.info == whole.info
    report = analyze(streamed)
    assert report == analyze(whole)
    return report


def _resolved(snapshot: reader.Snapshot) -> tuple[Any, ...]:
    stacks = snapshot.stacks
    traces = [
        [(e.action, e.addr, e.size, stacks[e.stack], e.step) for e in t] for t in snapshot.traces
    ]
    segments = [(s[:5], [(*b[:4], stacks[b.stack]) for b in s.blocks]) for s in snapshot.segments]
    return traces, segments, sorted(stacks)


def _torch_like(entries: int, distinct_frames: int = 600) -> dict[str, Any]:
    """What torch's `_snapshot()` shares: one frames list per allocation among its alloc and free
    events and its block, one dict per distinct frame (keys name, filename, line), one metadata
    string per event."""
    frames = [
        {"name": f"f{i}", "filename": f"/work/m{i % 7}.py", "line": i}
        for i in range(distinct_frames)
    ]
    trace: list[dict[str, Any]] = []
    blocks = []
    live: list[tuple[int, list[dict[str, Any]]]] = []
    for i in range(entries):
        step = f"{STEP_TAG}{i // 500}"
        if live and i % 3 == 2:
            addr, stack = live.pop(0)
            for action in ("free_requested", "free_completed"):
                entry = {"action": action, "addr": addr, "size": 512, "stream": 0, "time_us": i}
                trace.append(
                    {**entry, "compile_context": "", "user_metadata": step, "frames": stack}
                )
            continue
        stack = [frames[(i * 7 + k) % distinct_frames] for k in range(1 + i % 23)]
        addr = 0x7F0000000000 + 512 * i
        live.append((addr, stack))
        entry = {
            "action": "alloc",
            "addr": addr,
            "size": 512 + (i % 5) * (1 << 33),
            "stream": 0,
            "time_us": i,
        }
        trace.append(
            {**entry, "compile_context": f"ctx{i}" if i % 11 == 0 else "", "user_metadata": step}
        )
        trace[-1]["frames"] = stack
    # still allocated: the blocks name the same lists, before the history
    for addr, stack in live[:50]:
        blocks.append(
            {
                "address": addr,
                "size": 512,
                "requested_size": 500,
                "state": "active_allocated",
                "frames": stack,
            }
        )
    trace.append(
        {"action": "oom", "device_free": 1 << 20, "size": 1 << 30, "stream": 0, "time_us": entries}
    )
    trace[-1]["frames"] = [frames[0], {"name": "late", "filename": "/work/late.py", "line": 1}]
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": entries + 1})
    segment = {
        "device": 0,
        "address": 0x7F0000000000,
        "total_size": 1 << 30,
        "stream": 0,
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace, []], "allocator_settings": {}}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("scenario", ["training", "oom", "fragmented"])
def test_streamed_equals_the_c_unpickler_on_the_fixtures(
    tmp_path: Path, scenario: str, protocol: int
) -> None:
    builder, info = {
        "training": (fx.training(steps=6, leak=2 * MiB), None),
        "oom": fx.oom_in_forward(),
        "fragmented": fx.fragmented(),
    }[scenario]
    content = pickle.dumps(builder.snapshot(info), protocol=protocol)
    _data, decoder = _decode(content)  # streamed, no fallback
    assert sum(len(t) for t in decoder.histories.values()) == len(builder.trace)
    path = tmp_path / "s.pickle"
    path.write_bytes(content)
    _same(path)


def test_torch_like_sharing_streams_and_keeps_no_entry(tmp_path: Path) -> None:
    """Shared frames lists and metadata strings named again, LONG_BINGET references (600 frames),
    stacks of new frames inline, 5-byte sizes, an oom entry, an empty second device: all streamed,
    and the memo holds the frames and strings, not the 8,000 entries."""
    snapshot = _torch_like(6000)
    entries = len(snapshot["device_traces"][0])
    content = pickle.dumps(snapshot)
    data, decoder = _decode(content)
    assert sum(len(t) for t in decoder.histories.values()) == entries
    assert data["device_traces"][0] == []  # each entry went to the columns as it was read
    # The memo: frame dicts, keys, actions, and the strings of the few entries read the slow way
    # (those that bring new frames): the same for 3x the history, where the C unpickler's holds 2-4
    # objects per entry.
    _data, longer = _decode(pickle.dumps(_torch_like(18000)))
    assert len(longer._memo) < 1.1 * len(decoder._memo) < entries
    path = tmp_path / "t.pickle"
    path.write_bytes(content)
    report = _same(path)
    assert report["history_entries"] == entries and report["moment"]["kind"] == "oom"
    gz = tmp_path / "t.pickle.gz"
    gz.write_bytes(gzip.compress(content))
    assert analyze(load_snapshot(str(gz))) == {**report, "file": str(gz)}


def test_python_pickler_and_long_stacks(tmp_path: Path) -> None:
    """pickle's Python implementation frames differently; a 1,500-frame stack is appended in two
    batches."""
    snapshot = _torch_like(800)
    snapshot["device_traces"][0][5]["frames"] = [
        {"name": f"d{i}", "filename": "/x.py", "line": i} for i in range(1500)
    ]
    buffer = io.BytesIO()
    pickle._Pickler(buffer, protocol=4).dump(snapshot)  # type: ignore[attr-defined]
    path = tmp_path / "p.pickle"
    path.write_bytes(buffer.getvalue())
    _decode(buffer.getvalue())
    _same(path)


def test_a_reference_back_to_an_entry_falls_back_to_the_c_unpickler(tmp_path: Path) -> None:
    snapshot = _torch_like(3000)
    trace = snapshot["device_traces"][0]
    # the same dict twice: pickle names it again, batches after the reader let it go
    trace.append(trace[1500])
    content = pickle.dumps(snapshot)
    with pytest.raises(Unsupported):
        _decode(content)
    path = tmp_path / "r.pickle"
    path.write_bytes(content)
    assert len(load_snapshot(str(path)).traces[0]) == len(trace)
    _same(path)


def test_a_truncated_history_is_one_error_without_a_second_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = pickle.dumps(_torch_like(3000))
    with pytest.raises(Truncated):
        _decode(content[: len(content) // 2])
    path = tmp_path / "cut.pickle"
    path.write_bytes(content[: len(content) // 2])
    monkeypatch.setattr(reader, "_PlainDataUnpickler", None)  # a fallback would fail with TypeError
    with pytest.raises(TraceError, match="truncated"):
        load_snapshot(str(path))


def test_a_class_after_the_history_is_still_refused(tmp_path: Path) -> None:
    """The streaming reader builds no class: it hands the file to the restricted unpickler, which
    refuses."""
    planted = tmp_path / "planted"
    snapshot = _torch_like(2000)
    snapshot["later"] = _Plant(planted)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(TraceError, match=r"refused: the pickle asks to build pathlib"):
        load_snapshot(str(path))
    assert not planted.exists()


class _Plant:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))
