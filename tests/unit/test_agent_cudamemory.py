"""The --memory agent's pure parts: the phase read from the stack (real torch on the CPU), the per-step callback,
and the snapshot file it writes."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch

from stepcli.agent.cudamemory import SNAPSHOT_KEY, _write_snapshot, current_phase
from stepcli.agent.tracker import StepTracker
from stepcli.snapshots.reader import load_snapshot


def test_phase_from_the_stack_in_forward_backward_and_outside() -> None:
    seen: dict[str, str] = {}

    def note(name: str) -> None:  # hooks return None: their result would replace the output or gradient
        seen[name] = current_phase(set(), sys._getframe())

    model = torch.nn.Linear(4, 2)
    model.register_forward_hook(lambda *_: note("forward"))
    out = model(torch.randn(3, 4))
    out.register_hook(lambda _grad: note("backward"))
    out.sum().backward()
    assert seen == {"forward": "forward", "backward": "backward"}
    assert current_phase(set(), sys._getframe()) == "other"
    assert current_phase({123}, sys._getframe()) == "optimizer"  # the tracker's wrappers say an optimizer steps


def test_phase_inside_the_optimizer_from_its_frames() -> None:
    seen: list[str] = []
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    opt.register_step_pre_hook(lambda *_: seen.append(current_phase(set(), sys._getframe())))
    param.grad = torch.ones(2)
    opt.step()
    assert seen == ["optimizer"]


def test_step_callback_sees_every_new_step_and_costs_nothing_unasked() -> None:
    plain = StepTracker()
    assert "_advance" not in vars(plain)  # no callback: the class's method, untouched
    tracker = StepTracker()
    steps: list[int] = []
    tracker.add_step_callback(steps.append)
    tracker.register("a", "SGD#0")
    tracker.register("b", "SGD#1")
    for _ in range(3):
        tracker.step("a")
        tracker.step("b")  # the same iteration: no new global step
    assert steps == [1, 2, 3]
    assert len(tracker.durations_ns) == 3


def test_snapshot_file_never_overwrites(tmp_path: Path, monkeypatch: object) -> None:
    snapshot = {"segments": [], "device_traces": [[]], SNAPSHOT_KEY: {"step": 7, "phase": "backward"}}
    first = _write_snapshot(str(tmp_path), dict(snapshot, **{SNAPSHOT_KEY: dict(snapshot[SNAPSHOT_KEY])}))
    second = _write_snapshot(str(tmp_path), dict(snapshot, **{SNAPSHOT_KEY: dict(snapshot[SNAPSHOT_KEY])}))
    assert Path(first).name.startswith("oom-") and first.endswith(".pickle")
    assert first != second and Path(first).exists() and Path(second).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(first).name, Path(second).name])  # no temp
    with open(first, "rb") as handle:
        assert pickle.load(handle)[SNAPSHOT_KEY]["step"] == 7
    info = load_snapshot(first).info
    assert info is not None and info["phase"] == "backward" and info["worker"]
