"""The --memory agent's pure parts: the phase read from the stack (real torch on the CPU), the
per-step callback, and the snapshot file it writes."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import memory_snapshots as fx
import pytest
import torch

from stepcli.agent.config import AgentConfig
from stepcli.agent.cudamemory import STEP_TAG, _write_snapshot, current_phase, dump_now, install
from stepcli.agent.tracker import StepTracker
from stepcli.runfolder.layout import SNAPSHOT_KEY
from stepcli.snapshots.snapshotreader import find_snapshots, load_snapshot


def test_phase_from_the_stack_in_forward_backward_and_outside() -> None:
    seen: dict[str, str] = {}

    # hooks return None: their result would replace the output or gradient
    def note(name: str) -> None:
        seen[name] = current_phase(set(), sys._getframe())

    model = torch.nn.Linear(4, 2)
    model.register_forward_hook(lambda *_: note("forward"))
    out = model(torch.randn(3, 4))
    out.register_hook(lambda _grad: note("backward"))
    out.sum().backward()
    assert seen == {"forward": "forward", "backward": "backward"}
    assert current_phase(set(), sys._getframe()) == "other"
    # the tracker's wrappers say an optimizer steps
    assert current_phase({123}, sys._getframe()) == "optimizer"


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
    snapshot = {
        "segments": [],
        "device_traces": [[]],
        SNAPSHOT_KEY: {"step": 7, "phase": "backward"},
    }
    first = _write_snapshot(
        str(tmp_path), dict(snapshot, **{SNAPSHOT_KEY: dict(snapshot[SNAPSHOT_KEY])})
    )
    second = _write_snapshot(
        str(tmp_path), dict(snapshot, **{SNAPSHOT_KEY: dict(snapshot[SNAPSHOT_KEY])})
    )
    assert Path(first).name.startswith("oom-") and first.endswith(".pickle")
    assert first != second and Path(first).exists() and Path(second).exists()
    # no temp
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [Path(first).name, Path(second).name]
    )
    with open(first, "rb") as handle:
        assert pickle.load(handle)[SNAPSHOT_KEY]["step"] == 7
    info = load_snapshot(first).info
    assert info is not None and info["phase"] == "backward" and info["worker"]


class _Recorder:
    """Stands in for the few CUDA calls of torch that a CPU-only build lacks, and records their
    order.

    The real calls run in tests/e2e/test_memory_cuda.py on a machine with a GPU; here the agent's
    own logic is checked: the order torch requires, the step tags, the file written once, and never
    an exception."""

    def __init__(self, snapshot: dict[str, object]) -> None:
        self.calls: list[tuple[str, object]] = []
        self.snapshot = snapshot
        self.observer: object = None
        self.fail_snapshot = False
        memory = SimpleNamespace(
            _record_memory_history=lambda **kw: self.calls.append(("record_memory_history", kw)),
            _set_memory_metadata=lambda text: self.calls.append(("metadata", text)),
            _snapshot=self._snapshot,
        )
        self.torch = SimpleNamespace(
            __version__="test",
            _C=SimpleNamespace(
                _cuda_record_memory_history=object(),
                _cuda_attach_out_of_memory_observer=self._attach,
            ),
            cuda=SimpleNamespace(_lazy_call=self._lazy_call, memory=memory),
        )
        self.queued: list[object] = []

    def _lazy_call(self, callable: object) -> None:
        self.queued.append(callable)  # torch runs these when the program first initializes CUDA

    def _attach(self, observer: object) -> None:
        self.calls.append(("attach_observer", None))
        self.observer = observer

    def _snapshot(self) -> dict[str, object]:
        if self.fail_snapshot:
            raise RuntimeError("CUDA error: out of memory")
        return dict(self.snapshot)


def _agent(tmp_path: Path) -> SimpleNamespace:
    config = AgentConfig(run_id="r1", out_dir=str(tmp_path), launcher_pid=0, memory_entries=5000)
    os.makedirs(config.log_dir)
    return SimpleNamespace(
        config=config, pid=os.getpid(), enabled=True, tracker=StepTracker(), in_step=set()
    )


def test_history_starts_at_first_cuda_use_before_the_observer_and_tags_steps(
    tmp_path: Path,
) -> None:
    builder, _info = fx.oom_in_forward()
    fake = _Recorder(builder.snapshot())
    agent = _agent(tmp_path)
    history = install(agent, fake.torch, 5000)  # type: ignore[arg-type]
    # nothing touches CUDA before the program does
    assert fake.calls == [] and len(fake.queued) == 1
    fake.queued[0]()  # the program's first CUDA use
    assert fake.calls[:2] == [
        ("record_memory_history", {"max_entries": 5000, "context": "alloc", "stacks": "python"}),
        ("attach_observer", None),
    ]
    agent.tracker.register("opt", "SGD#0")
    agent.tracker.step("opt")
    agent.tracker.step("opt")
    assert [text for name, text in fake.calls if name == "metadata"] == [
        f"{STEP_TAG}0",
        f"{STEP_TAG}1",
        f"{STEP_TAG}2",
    ]
    assert history.started


def test_out_of_memory_writes_one_snapshot_with_step_and_phase(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    builder, _info = fx.oom_in_forward()
    fake = _Recorder(builder.snapshot())
    agent = _agent(tmp_path)
    install(agent, fake.torch, 5000)  # type: ignore[arg-type]
    fake.queued[0]()
    agent.tracker.register("opt", "SGD#0")
    for _ in range(3):
        agent.tracker.step("opt")
    observer = fake.observer
    assert callable(observer)
    observer(0, 512 * fx.MiB, 8 << 30, 3 * fx.MiB)
    # a program that catches the error and tries again
    observer(0, 512 * fx.MiB, 8 << 30, 3 * fx.MiB)
    files = list(tmp_path.glob("oom-*.pickle"))
    assert len(files) == 1
    info = load_snapshot(str(files[0])).info
    assert info is not None
    assert (info["step"], info["phase"], info["requested_bytes"]) == (3, "other", 512 * fx.MiB)
    assert (info["device_free_bytes"], info["device_total_bytes"], info["max_entries"]) == (
        3 * fx.MiB,
        8 << 30,
        5000,
    )
    err = capfd.readouterr().err
    assert err.count("out of CUDA memory at step 3 (other): memory snapshot saved to") == 1


def test_a_failing_snapshot_is_one_line_and_never_raises(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    fake = _Recorder({})
    fake.fail_snapshot = True
    agent = _agent(tmp_path)
    install(agent, fake.torch, 5000)  # type: ignore[arg-type]
    fake.queued[0]()
    fake.observer(0, 1, 2, 3)  # type: ignore[operator]
    assert (
        "--memory: could not save the CUDA memory snapshot: RuntimeError" in capfd.readouterr().err
    )
    assert not list(tmp_path.glob("oom-*"))


def _cuda_torch(snapshot: dict[str, object], initialized: bool = True) -> SimpleNamespace:
    """The CUDA calls `capture --memory-snapshot` makes, stubbed: a CPU-only build has none of
    them."""
    return SimpleNamespace(
        _C=SimpleNamespace(_cuda_record_memory_history=object()),
        cuda=SimpleNamespace(
            is_initialized=lambda: initialized,
            memory=SimpleNamespace(_snapshot=lambda: dict(snapshot)),
        ),
    )


def test_memory_snapshot_on_demand_is_written_with_step_and_never_overwritten(
    tmp_path: Path,
) -> None:
    builder, _info = fx.oom_in_forward()
    agent = _agent(tmp_path)
    agent.tracker.register("opt", "SGD#0")
    for _ in range(4):
        agent.tracker.step("opt")
    torch_ = _cuda_torch(builder.snapshot())
    first = dump_now(agent, torch_)  # type: ignore[arg-type]
    second = dump_now(agent, torch_)  # type: ignore[arg-type]
    worker = load_snapshot(first["snapshot"]).info["worker"]  # type: ignore[index]
    assert Path(first["snapshot"]).name == f"memory-{worker}-1.pickle"
    assert Path(second["snapshot"]).name == f"memory-{worker}-2.pickle"
    assert sorted(p.name for p in tmp_path.glob("*.pickle")) == [
        f"memory-{worker}-1.pickle",
        f"memory-{worker}-2.pickle",
    ]
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left
    info = load_snapshot(first["snapshot"]).info
    assert info is not None and (info["step"], info["phase"], info["on_demand"]) == (
        4,
        "other",
        True,
    )
    assert first["history"] is True and first["reason"] is None
    # `stepcli memory RUN` reads them
    assert find_snapshots(str(tmp_path)) == [first["snapshot"], second["snapshot"]]


def test_memory_snapshot_on_demand_without_history_or_cuda(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    plain = dump_now(agent, _cuda_torch({"segments": [], "device_traces": [[]]}))  # type: ignore[arg-type]
    # started without --memory: segments, no history
    assert plain["snapshot"] and plain["history"] is False
    unused = dump_now(agent, _cuda_torch({}, initialized=False))  # type: ignore[arg-type]
    assert (
        unused["snapshot"] is None and unused["reason"] == "no CUDA memory (it has not used CUDA)"
    )
    cpu = dump_now(agent, torch)  # the real CPU-only torch: never initializes CUDA
    assert cpu["snapshot"] is None and cpu["reason"].startswith("no CUDA memory")
    assert len(list(tmp_path.glob("memory-*.pickle"))) == 1
