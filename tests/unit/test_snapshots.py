"""stepcli/snapshots: reading snapshots safely, the split, fragmentation, leaks and advice, on built
snapshots."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import memory_snapshots as fx
import pytest
import torch.cuda._memory_viz as memory_viz

from stepcli.advice.memoryadvice import advise
from stepcli.errors import TraceError
from stepcli.snapshots import categories
from stepcli.snapshots.snapshotfigures import analyze
from stepcli.snapshots.snapshotreader import load_snapshot

MiB = fx.MiB


def _report(
    tmp_path: Path, builder: fx.SnapshotBuilder, info: dict[str, Any] | None = None
) -> dict[str, Any]:
    path = builder.write(tmp_path / "snap.pickle", info)
    report = analyze(load_snapshot(str(path)))
    report["advice"] = advise(report)
    return report


def _rules(report: dict[str, Any]) -> list[str]:
    return [item["rule"] for item in report["advice"]]


def test_fixtures_follow_torchs_format() -> None:
    """torch's own readers accept the built snapshots: segsum checks every segment's accounting."""
    for builder, info in (fx.oom_in_forward(), fx.fragmented(), (fx.training(leak=MiB), None)):
        snapshot = builder.snapshot(info)
        assert "total_allocated" in memory_viz.segsum(snapshot)
        assert "raise OutOfMemoryError" in memory_viz.trace(snapshot) or info is None


def test_oom_in_forward_names_step_phase_request_and_activations(tmp_path: Path) -> None:
    builder, info = fx.oom_in_forward(steps=4)
    report = _report(tmp_path, builder, info)
    moment = report["moment"]
    assert (moment["kind"], moment["step"], moment["phase"]) == ("oom", 4, "forward")
    assert report["oom"]["requested_bytes"] == 512 * MiB
    split = report["split"]
    assert split["parameters"] == 8 * MiB and split["gradients"] == 8 * MiB
    assert split["optimizer_state"] == 16 * MiB  # Adam: two buffers per parameter
    assert split["activations"] == 240 * MiB and split["other"] == 0
    assert sum(split.values()) == moment["allocated_bytes"]
    top = report["top_sites"][0]
    assert top["site"] == {"file": fx.SCRIPT, "line": 20, "function": "main"}
    assert (
        top["via"]["file"].endswith("torch/nn/modules/linear.py")
        and top["category"] == "activations"
    )
    assert _rules(report) == ["activations"]
    assert report["fragmentation"]["request_fits_largest_block"] is False


def test_oom_without_stepcli_info_reads_the_history(tmp_path: Path) -> None:
    """A snapshot dumped by hand (no `stepcli` key): the request and phase come from the `oom`
    event."""
    builder, _info = fx.oom_in_forward(steps=3)
    report = _report(tmp_path, builder, None)
    assert report["moment"]["kind"] == "oom" and report["moment"]["phase"] == "forward"
    assert report["moment"]["step"] == 3  # the step tag on the oom event
    assert report["oom"] == {
        "requested_bytes": 512 * MiB,
        "device_free_bytes": 3 * MiB,
        "device_total_bytes": None,
    }


def test_optimizer_state_dominates(tmp_path: Path) -> None:
    report = _report(tmp_path, fx.training(params=400 * MiB, activation=20 * MiB))
    assert report["moment"]["kind"] == "peak"
    assert report["split"]["optimizer_state"] == 800 * MiB
    assert _rules(report) == ["optimizer_state"]


def test_without_adam_no_optimizer_advice(tmp_path: Path) -> None:
    report = _report(tmp_path, fx.training(params=400 * MiB, activation=20 * MiB, adam=False))
    assert report["split"]["optimizer_state"] == 0
    assert "optimizer_state" not in _rules(report)


def test_fragmentation_when_the_request_fits_the_free_total_but_no_block(tmp_path: Path) -> None:
    builder, info = fx.fragmented()
    report = _report(tmp_path, builder, info)
    frag = report["fragmentation"]
    assert frag["free_in_reserved_bytes"] == 320 * MiB
    assert frag["largest_free_block_bytes"] == 10 * MiB
    assert frag["request_fits_largest_block"] is False
    assert _rules(report) == ["fragmentation"]
    assert "expandable_segments:True" in report["advice"][0]["text"]


def test_fragmentation_evidence_never_claims_a_request_larger_than_all_free_memory(
    tmp_path: Path,
) -> None:
    builder, info = fx.fragmented()
    # more than all free memory: it would not fit anyway
    info = {**info, "requested_bytes": 1024 * MiB}
    builder.trace[-1]["size"] = 1024 * MiB
    report = _report(tmp_path, builder, info)
    (item,) = report["advice"]
    assert item["rule"] == "fragmentation"
    assert "would fit" not in item["evidence"]
    assert item["evidence"].startswith(
        "320.00 MiB (50%) of the 640.00 MiB reserved is not allocated"
    )


def test_leak_names_the_site_that_grows(tmp_path: Path) -> None:
    report = _report(tmp_path, fx.training(steps=6, leak=2 * MiB))
    leak = report["leak"]
    assert leak is not None
    assert (leak["first_step"], leak["last_step"]) == (1, 5)
    assert leak["per_step_bytes"] == 2 * MiB
    assert leak["site"] == {"file": fx.SCRIPT, "line": 31, "function": "main"}
    assert leak["site_bytes_per_step"] == 2 * MiB
    assert "leak" in _rules(report)


@pytest.mark.parametrize(("steps", "leak"), [(6, 0), (4, 2 * MiB), (6, 64 * 1024)])
def test_no_leak_in_a_steady_loop_too_few_steps_or_too_little(
    tmp_path: Path, steps: int, leak: int
) -> None:
    """Steady: flat after the optimizer's first step. 4 steps: only 2 increases. 64 KiB x 4: under 1
    MiB."""
    report = _report(tmp_path, fx.training(steps=steps, leak=leak))
    assert report["leak"] is None
    assert "leak" not in _rules(report)


def test_a_batch_that_doubles_until_oom_is_no_leak(tmp_path: Path) -> None:
    # GIVEN a batch that doubles every step until forward runs out of memory: memory at each step's
    # start grows with the batch (the previous step's input and output are alive until rebound),
    # nothing piles up
    builder, info = fx.batch_doubling(steps=5)
    report = _report(tmp_path, builder, info)
    starts = [s["start_allocated_bytes"] for s in report["steps"] if s["step"] >= 1]
    # the start-of-step figure grows
    assert len(starts) >= 5 and all(a < b for a, b in zip(starts, starts[1:]))
    # THEN no leak is reported, and no advice says memory grows step over step
    assert report["leak"] is None
    assert "leak" not in _rules(report)
    assert not any(
        "step over step" in item["text"] or "no single site" in item["text"]
        for item in report["advice"]
    )
    assert _rules(report)[0] == "activations"


def test_a_leak_that_holds_most_memory_comes_first_and_says_so(tmp_path: Path) -> None:
    # GIVEN a list that keeps each step's forward output (train.py:24) until forward runs out of
    # memory
    builder, info = fx.leak_until_oom(steps=8, kept=48 * MiB)
    report = _report(tmp_path, builder, info)
    leak = report["leak"]
    # THEN the leak and its site are found, with the bytes its earlier steps' tensors hold at the
    # error
    assert leak is not None and leak["site"] == {"file": fx.SCRIPT, "line": 24, "function": "main"}
    assert leak["held_bytes"] == 8 * 48 * MiB and leak["held_activation_bytes"] == 8 * 48 * MiB
    allocated = report["moment"]["allocated_bytes"]
    assert leak["held_bytes"] / allocated > 0.5
    # AND the leak's advice comes first, saying it holds most of the memory, before activation
    # checkpointing
    assert _rules(report) == ["leak", "activations"]
    first = report["advice"][0]
    assert first["text"].startswith("a leak holds most of the memory (")
    assert "train.py:24 (main)" in first["text"]
    assert "384.00 MiB of the" in first["evidence"]
    assert "384.00 MiB of them kept alive by the leak" in report["advice"][1]["evidence"]


def test_a_small_leak_comes_after_the_other_advice(tmp_path: Path) -> None:
    # GIVEN the fixture's small leak (2 MiB a step) beside activations that dominate at the peak
    report = _report(tmp_path, fx.training(steps=6, leak=2 * MiB, activation=400 * MiB, adam=False))
    # THEN the leak is found, last
    assert report["leak"] is not None and _rules(report)[-1] == "leak"
    assert not report["advice"][-1]["text"].startswith("a leak holds most")


def test_history_that_lost_its_start_still_adds_up(tmp_path: Path) -> None:
    """The ring dropped the first events: what was allocated then is known from the segments and the
    frees (its stack only for memory still allocated at the end; the rest counts as other)."""
    builder = fx.training(steps=6)
    full = _report(tmp_path, builder)
    builder.trace = builder.trace[40:]
    cut = _report(tmp_path, builder)
    assert cut["moment"]["allocated_bytes"] == full["moment"]["allocated_bytes"]
    assert sum(cut["split"].values()) == sum(full["split"].values())
    # still allocated at the end: their stacks are in the segments
    for kept in ("parameters", "optimizer_state"):
        assert cut["split"][kept] == full["split"][kept]
    assert cut["steps"][0]["complete"] is False


def test_untagged_snapshot_has_no_steps(tmp_path: Path) -> None:
    builder = fx.training(steps=3)
    for entry in builder.trace:
        entry["user_metadata"] = ""
    report = _report(tmp_path, builder)
    assert report["steps"] == [] and report["leak"] is None
    assert report["moment"]["step"] is None
    assert report["split"]["gradients"] == 0  # no stack and no step: other, not gradients
    assert report["split"]["other"] > 0


def test_text_of_a_hand_dumped_snapshot_says_what_it_cannot_know(tmp_path: Path) -> None:
    from stepcli.snapshots.memoryrender import to_text

    builder = fx.training(steps=3, params=400 * MiB, activation=20 * MiB)
    for entry in builder.trace:
        entry["user_metadata"] = ""
    text = to_text(_report(tmp_path, builder))
    # the peak: an activation allocated in forward
    assert "peak memory at an unknown step, in forward" in text
    assert (
        "steps: unknown (allocations carry no step: not written by `stepcli run --memory`)" in text
    )
    assert "advice: optimizer state dominates" in text


def test_categories_order() -> None:
    """Optimizer over backward over parameters over activations; checkpoint recompute inside
    backward counts as backward."""
    backward = fx.frame(f"{fx.TORCH}/autograd/__init__.py", 347, "backward")
    assert categories.category(tuple(_frames(fx.forward(3) + [backward])), True) == "gradients"
    assert categories.category(tuple(_frames(fx.optimizer_state(3))), True) == "optimizer_state"
    assert categories.category(tuple(_frames(fx.to_device(3))), False) == "parameters"
    assert (
        categories.category((), False) == "other" and categories.category((), True) == "gradients"
    )
    assert categories.phase(tuple(_frames(fx.forward(3)))) == "forward"


def _frames(raw: list[dict[str, Any]]) -> list[Any]:
    from stepcli.snapshots.snapshotreader import HistoryFrame

    return [HistoryFrame(f["filename"], f["line"], f["name"]) for f in raw]


class _Plant:
    """Unpickling this would create a file: a stand-in for any code a hostile pickle could run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))


def test_hostile_pickle_is_refused_before_it_runs(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": _Plant(planted)}))
    with pytest.raises(TraceError, match=r"refused: the pickle asks to build pathlib.*Path"):
        load_snapshot(str(path))
    assert not planted.exists()


@pytest.mark.parametrize(
    ("content", "name"),
    [
        (b"cbuiltins\neval\n(S'1+1'\ntR.", "builtins.eval"),  # runs code
        # a terabyte from 40 bytes
        (b"c__builtin__\nbytearray\n(I1000000000000\ntR.", "__builtin__.bytearray"),
    ],
)
def test_builtins_that_run_code_or_allocate_are_refused(
    tmp_path: Path, content: bytes, name: str
) -> None:
    path = tmp_path / "builtin.pickle"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=f"refused: the pickle asks to build {name}"):
        load_snapshot(str(path))


def test_old_protocol_sets_are_plain_data(tmp_path: Path) -> None:
    builder, info = fx.oom_in_forward()
    path = tmp_path / "p2.pickle"
    path.write_bytes(pickle.dumps({**builder.snapshot(info), "tags": {"a", "b"}}, protocol=2))
    assert load_snapshot(str(path)).info is not None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not a pickle at all", "not a pickle"),
        (pickle.dumps({"segments": []})[:-5], "not a pickle .pickle data was truncated"),
        (pickle.dumps([1, 2, 3]), "not a CUDA memory snapshot"),
        (pickle.dumps({"segments": [1]}), "not a CUDA memory snapshot torch writes"),
        (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc"}]]}), "torch writes"),
    ],
)
def test_bad_files_are_one_clear_error(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=problem):
        load_snapshot(str(path))


def test_the_agents_record_keeps_only_plain_fields(tmp_path: Path) -> None:
    """Whoever wrote the file, the report stays JSON: odd fields of the `stepcli` record are
    dropped."""
    builder, info = fx.oom_in_forward()
    odd = {
        **info,
        "extra": {1, 2},
        "nested": [[[]]],
        "argv": ["train.py", "--lr", "0.1"],
        "phase": ["x"],
    }
    snapshot = load_snapshot(str(builder.write(tmp_path / "odd.pickle", odd)))
    assert snapshot.info is not None
    assert (
        "extra" not in snapshot.info
        and "nested" not in snapshot.info
        and "phase" not in snapshot.info
    )
    assert snapshot.info["argv"] == ["train.py", "--lr", "0.1"] and snapshot.info["step"] == 4
    report = analyze(snapshot)
    # from the oom event's stack, as for a hand-made snapshot
    assert report["moment"]["phase"] == "forward"
    json.dumps(report)


def test_gzip_snapshot_and_its_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builder, info = fx.oom_in_forward()
    path = tmp_path / "oom.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(builder.snapshot(info))))
    assert load_snapshot(str(path)).info is not None
    monkeypatch.setenv("STEPCLI_MAX_INPUT_BYTES", "1000")
    with pytest.raises(TraceError, match="larger than the 1000 bytes"):
        load_snapshot(str(path))


def test_stacks_are_interned(tmp_path: Path) -> None:
    snapshot = load_snapshot(str(fx.training(steps=6).write(tmp_path / "s.pickle")))
    assert len(snapshot.stacks) < 20  # a handful of distinct stacks, however many events
    assert sum(len(t) for t in snapshot.traces) > 100
