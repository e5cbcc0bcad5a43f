"""stepcli/snapshots/shape.py and the decoder's checks: snapshots of torch's shape read, at any
size, in memory of the order of what they describe; a pickle made to take memory is refused at its
first object that is not of a snapshot's shape, in a few MiB (issue 47)."""

from __future__ import annotations

import io
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import memory_snapshots as fx
import pytest

from stepcli.agent.cudamemory import STEP_TAG
from stepcli.errors import TraceError
from stepcli.snapshots.history import HistoryBuilder, HistoryFrame
from stepcli.snapshots.snapshotfigures import analyze
from stepcli.snapshots.snapshotreader import load_snapshot
from stepcli.snapshots.unpickle import StreamDecoder


def _resolved(snapshot: Any) -> tuple[Any, ...]:
    stacks = snapshot.stacks
    traces = [
        [(e.action, e.addr, e.size, stacks[e.stack], e.step) for e in t] for t in snapshot.traces
    ]
    segments = [(s[:5], [(*b[:4], stacks[b.stack]) for b in s.blocks]) for s in snapshot.segments]
    return traces, segments


def test_torch_shaped_snapshot_streams_like_the_c_unpickler_and_keeps_no_frame_dict(
    tmp_path: Path,
) -> None:
    """torch's layout (every event its own frames list of its own frame dicts, strings shared): read
    on the fast path, the same as Python's unpickler reads it, and the memo keeps no frame dict (the
    H200 snapshot of issue 47 built 180 MiB of them and was refused)."""
    content = pickle.dumps(fx.torch_shaped(4000))
    path = tmp_path / "t.pickle"
    path.write_bytes(content)
    streamed, whole = load_snapshot(str(path)), load_snapshot(str(path), streamed=False)
    assert _resolved(streamed) == _resolved(whole)
    assert analyze(streamed) == analyze(whole)
    decoder = StreamDecoder(io.BytesIO(content).read, HistoryBuilder(STEP_TAG))
    decoder.run()
    assert not [v for v in decoder._memo.values() if type(v) is dict and "filename" in v]
    assert len(decoder._memo) < 1000  # keys, strings, blocks: not 4,000 events' nor 20,000 frames'


def test_frames_named_again_after_they_were_let_go(tmp_path: Path) -> None:
    """A pickle that names a frame dict again (Python's pickler does when one dict is in two lists):
    the Frame stands in for it, whether the slow loop or the fast path let it go."""
    snapshot = fx.torch_shaped(600)
    trace = snapshot["device_traces"][0]
    # dicts of earlier lists, named again
    trace[400]["frames"] = trace[10]["frames"][:1] + trace[300]["frames"]
    path = tmp_path / "again.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert _resolved(load_snapshot(str(path))) == _resolved(
        load_snapshot(str(path), streamed=False)
    )


def test_a_large_torch_shaped_snapshot_reads_in_a_small_budget(tmp_path: Path) -> None:
    """62,000 events, 12 MB of pickle (what issue 47's H200 job wrote), read within 64 MiB."""
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(fx.torch_shaped(62_000)))
    assert path.stat().st_size > 10 << 20
    snapshot = load_snapshot(str(path), max_memory=64 << 20)
    assert len(snapshot.traces[0]) == 62_000
    assert all(type(frame) is HistoryFrame for stack in snapshot.stacks for frame in stack)


def _in_snapshot(body: bytes) -> bytes:
    """A snapshot's pickle whose device_traces value is `body` (raw opcodes)."""
    head = pickle.dumps({"segments": [], "device_traces": "PLACEHOLDER"}, protocol=4)
    return head.replace(b"\x8c\x0bPLACEHOLDER", body)


# 5 million empty lists, appended 1,000 at a time
_LISTS_IN_BATCHES = b"]" + (b"(" + b"]" * 1000 + b"e") * 5000
_TOWER = b"K\x01" + b"\x85" * (5 << 20)  # (((((1,),),),)...): a tuple of a tuple ... 5 million deep
# 100 dicts of 1,000 keys (references to 1,000 strings) each an empty dict: 100,000 dicts in 300 KB
_KEYS = b"".join(
    b"X" + len(k).to_bytes(4, "little") + k + b"\x94" for k in (b"k%d" % i for i in range(1000))
)
_DICTS_OF_DICTS = (
    b"}(\x8c\x01x]"
    + _KEYS
    + b"0" * 1000
    + b"u"
    + b"".join(
        b"\x8c\x03d%02d}(" % n
        + b"".join(b"j" + (i + 3).to_bytes(4, "little") + b"}" for i in range(1000))
        + b"u"
        for n in range(100)
    )
)
_ENTRY = b"}(\x8c\x06action\x8c\x05alloc\x8c\x04size\x4b\x01\x8c\x06frames](" + b"]" * 1000 + b"eu"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (_LISTS_IN_BATCHES, "more than 4096 lists held in lists"),
        # 5 million on the stack at once
        (b"(" + b"]" * (5 << 20), "nested too deeply or piled up"),
        (b"(" * (1 << 20), "nested too deeply or piled up"),
        (_TOWER, "a tuple holds a tuple"),
        (b"\x8d" + (1 << 40).to_bytes(8, "little") + b"x" * 64, "a string of 1099511627776 bytes"),
        # 1,000 dicts of another shape
        (b"](" + b"}\x8c\x01aK\x01s" * 1000 + b"e", "a dict of keys {'a'}"),
        (b"](](" + _ENTRY + b"ee", "a frame is a list, not a dict"),
        (b"](" + b"K\x01" * 70_000 + b"e", "nested too deeply or piled up"),
        (
            b"]" + (b"(" + b"\x8c\x01a" * 1000 + b"e") * 100,
            "more than 65536 strings or numbers in one list",
        ),
        (b"\x8c\x05posix\x8c\x06system\x93", "the pickle asks to build posix.system"),
        (b"]\x8c\x01a\x8c\x01b\x86a", "a list item is a tuple"),
        (b"](K\x01]e", "a list of both scalars and lists"),
        (_DICTS_OF_DICTS, "more than 65536 dicts, lists or sets held in dicts"),
    ],
    ids=[
        "5M-empty-lists",
        "5M-on-the-stack",
        "1M-marks",
        "tuple-tower",
        "1TiB-string",
        "dicts-of-another-shape",
        "frames-of-lists",
        "70k-ints-on-the-stack",
        "100k-strings-in-a-list",
        "global",
        "tuples-in-a-list",
        "mixed-lists",
        "100k-dicts-in-dicts",
    ],
)
def test_crafted_pickles_are_refused_at_their_first_odd_object(
    tmp_path: Path, body: bytes, problem: str
) -> None:
    path = tmp_path / "crafted.pickle"
    path.write_bytes(_in_snapshot(body) if body[:1] != b"\x80" else body)
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="refused: .*" + problem.replace("(", r"\(")) as caught:
            load_snapshot(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(caught.value)
    # a few MiB of pickle read, not the millions of objects it describes
    assert peak < 8 << 20, peak


def test_a_dict_of_the_wrong_shape_at_the_top_is_not_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "wrong.pickle"
    path.write_bytes(
        pickle.dumps({"segments": [{"address": 1, "blocks": []}], "device_traces": []})
    )
    with pytest.raises(
        TraceError, match="refused: a list item is a dict of keys {'address', 'blocks'}"
    ):
        load_snapshot(str(path))
    path.write_bytes(pickle.dumps(["segments"]))
    with pytest.raises(TraceError, match="a pickle, but not a CUDA memory snapshot"):
        load_snapshot(str(path))
