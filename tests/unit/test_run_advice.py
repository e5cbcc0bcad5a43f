"""Advice rules: each fires just above its threshold and stays silent just below it, or without its
evidence."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.advice import rules as advice
from stepcli.advice.rules import Evidence, advise


def _breakdown(**shares: float) -> dict[str, float]:
    """A 100 ms step split by the given shares; the rest is forward."""
    parts = {"dataloader": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0, "other": 0.0}
    for key, share in shares.items():
        parts[key] = share * 100.0
    parts["forward"] = 100.0 - sum(v for k, v in parts.items() if k != "forward")
    return parts


def _rules(evidence: Evidence) -> list[str]:
    return [a.rule for a in advise(evidence)]


def test_no_evidence_no_advice() -> None:
    assert advise(Evidence()) == []


@pytest.mark.parametrize(
    ("share", "fires"), [(0.19, False), (0.20, False), (0.21, True), (0.9, True)]
)
def test_data_loading_share(share: float, fires: bool) -> None:
    found = advise(Evidence(breakdown_ms=_breakdown(dataloader=share)))
    assert ("data-loading" in [a.rule for a in found]) is fires
    if fires:
        item = found[0]
        assert f"{share * 100:.0f}%" in item.evidence and "> 20%" in item.threshold
        assert "num_workers" in item.suggestion and "pin_memory" in item.suggestion


@pytest.mark.parametrize(
    ("step_ms", "fires"), [(20.0, False), (24.0, False), (25.0, True), (60.0, True)]
)
def test_data_loading_needs_five_ms_per_step(step_ms: float, fires: bool) -> None:
    # 20.5% of the step is data loading; it only matters once that is at least 5 ms per step (a tiny
    # model's in-process batching, like the demo's, is not worth worker processes)
    breakdown = {k: v * step_ms / 100.0 for k, v in _breakdown(dataloader=0.205).items()}
    assert ("data-loading" in _rules(Evidence(breakdown_ms=breakdown))) is fires


def _kernels(count: int, mean_us: float) -> list[dict[str, Any]]:
    return [
        {"name": "void gemm_kernel<float>()", "calls": count, "self_ms": count * mean_us / 1000.0}
    ]


@pytest.mark.parametrize(
    ("busy", "kernels_per_step", "mean_us", "fires"),
    [
        (0.50, 100, 8.0, True),
        (0.61, 100, 8.0, False),  # idle 39% < 40%
        (0.50, 100, 21.0, False),  # kernels long enough
        (0.50, 49, 8.0, False),  # too few kernels to be launch-bound
        (0.59, 50, 20.0, True),  # every bound met exactly
    ],
)
def test_launch_bound(busy: float, kernels_per_step: int, mean_us: float, fires: bool) -> None:
    steps = 4
    evidence = Evidence(
        device_busy_share=busy,
        kernels=_kernels(kernels_per_step * steps, mean_us),
        recorded_steps=steps,
    )
    assert ("launch-bound" in _rules(evidence)) is fires


def test_launch_bound_needs_kernels() -> None:
    assert _rules(Evidence(device_busy_share=0.1, recorded_steps=3)) == []


@pytest.mark.parametrize(("calls", "fires"), [(2, False), (3, True), (12, True)])
def test_host_sync_per_step(calls: int, fires: bool) -> None:
    ops = [
        {"name": "cudaStreamSynchronize", "calls": calls, "self_ms": 1.0},
        {"name": "aten::mm", "calls": 90, "self_ms": 5.0},
        {"name": "aten::_local_scalar_dense", "calls": 900, "self_ms": 1.0},
    ]  # on CPU tensors: no evidence
    evidence = Evidence(cpu_ops=ops, kernels=_kernels(30, 50.0), recorded_steps=3)
    found = [a for a in advise(evidence) if a.rule == "host-sync"]
    assert bool(found) is fires
    if fires:
        assert (
            f"cudaStreamSynchronize ×{calls}" in found[0].evidence
            and "_local_scalar_dense" not in found[0].evidence
        )


def test_host_sync_is_silent_without_a_device() -> None:
    ops = [{"name": "cudaDeviceSynchronize", "calls": 300, "self_ms": 1.0}]
    # no kernel ran: nothing to wait for
    assert "host-sync" not in _rules(Evidence(cpu_ops=ops, recorded_steps=3))


def _optimizer_ops(
    per_step: float, steps: int = 3, extra: str | None = None
) -> list[dict[str, Any]]:
    ops = [{"name": "aten::addcdiv_", "calls": int(per_step * steps), "self_ms": 1.0}]
    if extra:
        ops.append({"name": extra, "calls": steps, "self_ms": 1.0})
    return ops


@pytest.mark.parametrize(
    ("share", "per_step", "extra", "fires"),
    [
        (0.30, 40, None, True),
        (0.15, 40, None, False),  # share at the threshold
        (0.16, 40, None, True),
        (0.30, 19, None, False),  # few parameter tensors: the loop is cheap
        (0.30, 20, None, True),
        (0.30, 40, "aten::_foreach_addcdiv_", False),  # already foreach
        (0.30, 40, "aten::_fused_adamw_", False),  # already fused
    ],
)
def test_slow_optimizer(share: float, per_step: float, extra: str | None, fires: bool) -> None:
    evidence = Evidence(
        breakdown_ms=_breakdown(optimizer=share),
        cpu_ops=_optimizer_ops(per_step, extra=extra),
        recorded_steps=3,
    )
    assert ("optimizer" in _rules(evidence)) is fires


@pytest.mark.parametrize(
    ("names", "fires"),
    [
        (["Torch-Compiled Region: 0/0"], False),
        # two frames, each compiled once
        (["Torch-Compiled Region: 0/0", "Torch-Compiled Region: 1/0"], False),
        (["Torch-Compiled Region: 0/0", "Torch-Compiled Region: 0/1"], True),
        (["Torch-Compiled Region: 2/3"], True),
    ],
)
def test_recompilations(names: list[str], fires: bool) -> None:
    ops = [{"name": n, "calls": 3, "self_ms": 1.0} for n in names]
    assert ("recompile" in _rules(Evidence(cpu_ops=ops, recorded_steps=3))) is fires


def _ranks(means: dict[int, float], steps: int = 12, jitter: float = 0.0) -> dict[int, list[float]]:
    """Step times per rank around the given means; with jitter, every other step swings by +/-
    jitter."""
    return {
        r: [m + (jitter if i % 2 else -jitter) * (1 if r % 2 else -1) for i in range(steps)]
        for r, m in means.items()
    }


@pytest.mark.parametrize(
    ("rank_steps", "fires"),
    [
        (_ranks({0: 100.0, 1: 109.0}), False),  # 1.09x
        (_ranks({0: 100.0, 1: 111.0}), True),
        (_ranks({0: 100.0, 1: 101.0, 2: 99.0, 3: 125.0}), True),
        (_ranks({0: 100.0}), False),  # one rank: nothing to compare with
        (_ranks({0: 100.0, 1: 120.0}, steps=9), False),  # too few steps to call it consistent
        (_ranks({0: 100.0, 1: 120.0}, steps=10), True),
        # slower on average, but only in half of the steps
        (_ranks({0: 100.0, 1: 120.0}, jitter=30.0), False),
    ],
)
def test_straggler(rank_steps: dict[int, list[float]], fires: bool) -> None:
    found = [a for a in advise(Evidence(rank_steps=rank_steps)) if a.rule == "straggler"]
    assert bool(found) is fires
    if fires:
        means = {r: sum(v) / len(v) for r, v in rank_steps.items()}
        slowest = max(means, key=lambda r: means[r])
        assert found[0].title == f"Rank {slowest} is slower than the others"


def test_stalls() -> None:
    steady = [(step, 10.0) for step in range(1, 30)]
    # exactly 3x: not over
    assert "stalls" not in _rules(Evidence(untouched_ms=steady + [(30, 30.0)]))
    found = [a for a in advise(Evidence(untouched_ms=steady + [(30, 31.0)])) if a.rule == "stalls"]
    assert found and "about step 30" in found[0].evidence
    few = [(step, 10.0) for step in range(1, advice.STALL_MIN_STEPS - 1)] + [(99, 500.0)]
    # too few steps to call anything typical
    assert "stalls" not in _rules(Evidence(untouched_ms=few))


def test_every_rule_names_its_threshold_and_line_is_one_line() -> None:
    evidence = Evidence(
        breakdown_ms=_breakdown(dataloader=0.5, optimizer=0.3),
        cpu_ops=_optimizer_ops(40)
        + [{"name": "Torch-Compiled Region: 0/2", "calls": 3, "self_ms": 1.0}],
        rank_steps=_ranks({0: 10.0, 1: 20.0}),
        recorded_steps=3,
    )
    found = advise(evidence)
    assert {a.rule for a in found} == {"data-loading", "optimizer", "recompile", "straggler"}
    for item in found:
        assert item.threshold and item.evidence and item.suggestion
        assert "\n" not in item.line() and item.threshold in item.line()


def _threads_logs(
    threads: list[int], cpus: list[list[int]], host: str = "h"
) -> list[dict[str, Any]]:
    return [{"host": host, "intra_op_threads": t, "cpus": c} for t, c in zip(threads, cpus)]


@pytest.mark.parametrize(
    ("threads", "cpus", "fires"),
    [
        ([1, 1], [[0, 1], [0, 1]], False),  # 2 ranks x 1 thread on 2 cores: at the threshold
        ([2, 2], [[0, 1], [0, 1]], True),  # 2 ranks x 2 threads on 2 cores (issue 46.8)
        ([1, 2], [[0, 1], [0, 1]], True),  # 3 threads on 2 cores
        ([2, 2], [[0, 1], [2, 3]], False),  # each rank pinned to its own 2 cores: 4 on 4
        ([2], [[0]], True),  # one process, 2 threads, pinned to 1 core
        ([4], [[0, 1, 2, 3]], False),
    ],
)
def test_threads_beyond_the_cores(threads: list[int], cpus: list[list[int]], fires: bool) -> None:
    from stepcli.run.summary.threads import threads_section

    section = threads_section(_threads_logs(threads, cpus))
    assert section is not None and section.oversubscribed is fires
    assert ("threads" in _rules(Evidence(threads=section))) is fires


def test_threads_advice_names_the_setting_that_fixes_it() -> None:
    from stepcli.run.summary.threads import threads_section

    section = threads_section(_threads_logs([2, 2], [[0, 1], [0, 1]]))
    (item,) = [a for a in advise(Evidence(threads=section)) if a.rule == "threads"]
    assert item.evidence.startswith("2 processes x 2 intra-op threads = 4 on 2 cores stepcli sees")
    assert "OMP_NUM_THREADS=1" in item.suggestion and "torch.set_num_threads(1)" in item.suggestion
    # AND per host: two hosts, each within its own cores, are fine; the one beyond them is named
    logs = _threads_logs([1, 1], [[0, 1], [0, 1]], "a") + _threads_logs(
        [4, 4], [[0, 1], [0, 1]], "b"
    )
    (item,) = [a for a in advise(Evidence(threads=threads_section(logs))) if a.rule == "threads"]
    assert (
        "= 8 on 2 cores stepcli sees on host b:" in item.evidence
        and "OMP_NUM_THREADS=1" in item.suggestion
    )
    # AND nothing without the evidence (older step logs)
    assert threads_section([{"host": "h", "intra_op_threads": None, "cpus": None}]) is None
