"""Every recorded step's figures in one array pass (stepcli.traces.analyses.stepops) equal each step
summarized alone, bit for bit: what `stepcli compare` attributes a change to must not move (issue
47, defect 17)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from stepcli.compare import attribution
from stepcli.compare.attribution import op_steps_from_traces
from stepcli.compare.measurement import OpSteps
from stepcli.traces.read.tracereader import Trace, load_paths

DATA = Path(__file__).resolve().parent.parent / "data"


def _alone(traces: list[Trace], monkeypatch: pytest.MonkeyPatch) -> OpSteps:
    """The figures with every step summarized alone (the way before the array pass)."""
    with monkeypatch.context() as patched:
        patched.setattr("stepcli.traces.analyses.stepops.step_times", lambda *_: None)
        return op_steps_from_traces(traces, "x")


def _bits(steps: OpSteps) -> tuple[object, dict[tuple[str, str], list[bytes]]]:
    return steps.steps, {
        key: [struct.pack("<d", v) for v in values] for key, values in steps.ops.items()
    }


def _tricky(steps: int, seed: int, overlap: bool = False) -> list[dict[str, object]]:
    """Steps with phases, nested and folded operators, a second thread, kernels that run past their
    step, events between steps, odd microsecond fractions, and (`overlap`: step 7) two overlapping
    windows of one process."""
    rng = random.Random(seed)
    events: list[dict[str, object]] = []
    t = 1_700_000_000_123.4567
    for step in range(steps):
        dur = 400 + rng.random() * 50

        def add(
            cat: str, name: str, ts: float, d: float, pid: int = 1, tid: int = 1, **args: object
        ) -> None:
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": ts,
                    "dur": d,
                    **args,
                }
            )

        add("user_annotation", f"ProfilerStep#{step}", t, dur)
        if step == 7 and overlap:
            add("user_annotation", f"ProfilerStep#{step + 1000}", t + 10.3, 30.1)
        add("user_annotation", "enumerate(DataLoader)#_Iter.__next__", t + 1.1, 20.37)
        add("cpu_op", "aten::linear", t + 30.01, 100.33)
        add("cpu_op", "aten::linear", t + 30.02, 90.5)  # folded into its namesake parent
        add("cpu_op", "aten::mm", t + 31.7, 60.125)
        add("cuda_runtime", "cudaLaunchKernel", t + 95.2, 4.0, args={"correlation": step + 1})
        add(
            "kernel",
            "gemm",
            t + dur - 5,
            40.0 + rng.random(),
            pid=0,
            tid=7,
            args={"correlation": step + 1},
        )
        add("user_annotation", "## backward ##", t + 140.0, 150.0)
        add("cpu_op", "autograd::engine::evaluate_function: MmBackward0", t + 141.0, 120.0)
        add("user_annotation", "Optimizer.step#SGD.step", t + 300.0, 60.0 + rng.random())
        # optimizer.step(closure): the agent's closure mark, backward inside the optimizer
        if step % 3 == 1:
            add("user_annotation", "stepcli: optimizer closure", t + 305.0, 40.0)
            add("cpu_op", "aten::relu", t + 306.0, 10.0)
            add("cpu_op", "autograd::engine::evaluate_function: ReluBackward0", t + 320.0, 20.0)
        add("cpu_op", "aten::add_", t + 301.0, 10.0, tid=2)  # another thread of the process
        add("cpu_op", "aten::copy_", t + dur + 3.0, 2.0)  # between steps: outside every step
        t += dur + 10 + rng.random()
    return events


def test_the_array_pass_equals_each_step_summarized_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    # GIVEN real traces (CPU, CUDA, an H200 GPT step) and a synthetic one with every awkward case
    # above
    from stepcli.traces.read.columns import load_columns
    from stepcli.traces.read.splitread import read_blocked

    synthetic = tmp_path / "tricky.pt.trace.json"
    synthetic.write_text(json.dumps({"traceEvents": _tricky(30, 1)}))
    overlapping = tmp_path / "overlap.pt.trace.json"  # a step left to the lone summary
    overlapping.write_text(json.dumps({"traceEvents": _tricky(12, 2, overlap=True)}))
    paths = [DATA / "train_cpu.pt.trace.json", DATA / "cuda_small.pt.trace.json.gz"]
    paths += [DATA / "h200_gpt_bf16.pt.trace.json.gz", synthetic, overlapping]
    for path in paths:
        traces = load_paths([str(path)])
        # WHEN each step's figures come from the array pass THEN they equal each step summarized
        # alone, bit for bit
        fast = op_steps_from_traces(traces, "x")
        assert fast.steps and any(key[0] == "phase" for key in fast.ops), path
        assert _bits(fast) == _bits(_alone(traces, monkeypatch)), path
        # and so do they when the steps are cut from the trace read into columns (as compare reads
        # it), whole or a block at a time
        assert _bits(op_steps_from_traces([load_columns(str(path))], "x")) == _bits(fast), path
        # (the real traces are small)
        monkeypatch.setattr("stepcli.traces.read.splitread.MIN_BLOCKED_BYTES", 1)
        blocked = read_blocked(str(path), False)
        assert (blocked is None) == str(path).endswith(".gz"), path
        if blocked is not None:
            assert _bits(op_steps_from_traces([blocked], "x")) == _bits(fast), path


def test_overlapping_windows_of_one_process_are_left_to_the_lone_summary(tmp_path: Path) -> None:
    import bisect
    import json

    from stepcli.traces.analyses.stepops import step_times
    from stepcli.traces.read.names import step_of

    synthetic = tmp_path / "tricky.pt.trace.json"
    synthetic.write_text(json.dumps({"traceEvents": _tricky(12, 2, overlap=True)}))
    (trace,) = load_paths([str(synthetic)])
    events = sorted(trace.events, key=lambda e: e.ts)
    starts = [e.ts for e in events]
    windows = sorted(
        (e.ts, e.ts + e.dur) for e in events if e.cat == "user_annotation" and step_of(e.name) == 7
    )
    (start, end) = windows[0]
    lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
    found = step_times(events, [(lo, hi)])
    assert found is not None and found.fallback == {0}  # step 7 holds two windows of one process
    assert attribution.op_steps_from_traces([trace], "x").steps  # and the whole trace still reads
