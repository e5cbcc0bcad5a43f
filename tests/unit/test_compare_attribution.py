"""Unit tests of compare's attribution: phases first, operators only with enough recorded steps
(issue 19.12)."""

from __future__ import annotations

import random

import pytest

from stepcli.compare.attribution import (
    OP_MIN_STEPS,
    PHASE_MIN_STEPS,
    OpChange,
    attribute,
    attribution_note,
    row_level,
)
from stepcli.compare.measurement import OpSteps

PHASES = ("dataloader", "forward", "backward", "optimizer", "other")


def run(steps: int, other_ms: float, seed: int) -> OpSteps:
    """`steps` recorded steps: forward/backward noise from many operators, a steady `other`
    phase."""
    rng = random.Random(seed)
    ops: dict[tuple[str, str], tuple[float, ...]] = {}
    for name in PHASES:
        base = other_ms if name == "other" else 5.0
        ops[("phase", name)] = tuple(base * (1 + rng.uniform(-0.02, 0.02)) for _ in range(steps))
    for index in range(40):  # noisy operators: the largest of 40 changes from a few steps is noise
        ops[("cpu", f"aten::op{index}")] = tuple(rng.uniform(0.0, 3.0) for _ in range(steps))
    return OpSteps(label=f"run{seed}", steps=tuple((None, 2 + s) for s in range(steps)), ops=ops)


def test_a_sleep_outside_any_operator_is_attributed_to_the_other_phase_not_an_operator() -> None:
    # GIVEN 3 recorded steps per side and a change that is only a sleep (the `other` phase +300 ms)
    few = attribute([run(3, 1.0, 1)], [run(3, 301.0, 2)], confidence=0.95)
    # THEN nothing is attributed from 3 steps (no operator is blamed), and the note says what is
    # needed
    assert few == ()
    note = attribution_note([run(3, 1.0, 1)], [run(3, 301.0, 2)])
    assert (
        note
        and f"phases need at least {PHASE_MIN_STEPS}" in note
        and f"operators {OP_MIN_STEPS}" in note
    )
    # WITH enough steps for phases but not operators: the phase is named, no operator
    some = attribute([run(10, 1.0, 1)], [run(10, 301.0, 2)], confidence=0.95)
    assert some and all(change.kind == "phase" for change in some)
    assert (some[0].name, some[0].significant) == ("other", True) and some[0].delta_ms > 250
    assert "attributed by phase only" in (
        attribution_note([run(10, 1.0, 1)], [run(10, 301.0, 2)]) or ""
    )
    # WITH OP_MIN_STEPS steps: phases first, then operators
    many = attribute([run(OP_MIN_STEPS, 1.0, 1)], [run(OP_MIN_STEPS, 301.0, 2)], confidence=0.95)
    kinds = [change.kind for change in many]
    assert (
        kinds[0] == "phase"
        and "cpu" in kinds
        and kinds.index("cpu") > max(i for i, k in enumerate(kinds) if k == "phase")
    )
    assert attribution_note([run(OP_MIN_STEPS, 1.0, 1)], [run(OP_MIN_STEPS, 1.0, 2)]) is None


def test_a_row_is_significant_only_beyond_the_tolerance_of_the_recorded_step() -> None:
    # GIVEN 30 recorded steps per side of a ~21 ms step, and the `other` phase 1.0 ms vs 2.5 ms: a
    # real change, but of 7% of the step, and 16 ms (76%) on the other side of the threshold
    base, small, large = run(30, 1.0, 1), run(30, 2.5, 2), run(30, 17.0, 3)
    step_ms = 4 * 5.0 + 1.0

    def other(changes: tuple[OpChange, ...]) -> OpChange:
        return next(change for change in changes if change.name == "other")

    # WITHOUT a tolerance the 1.5 ms change is significant (its interval excludes 0) ...
    assert other(attribute([base], [small], confidence=0.95)).significant
    # ... WITH the default 10% its interval lies within ±2.1 ms: not a cause of any verdict
    within = other(attribute([base], [small], confidence=0.95, tolerance=0.1))
    assert within.limit_ms == pytest.approx(0.1 * step_ms, rel=0.02) and not within.significant
    # ... and 16 ms is, beyond it
    assert other(attribute([base], [large], confidence=0.95, tolerance=0.1)).significant
    # AND --min-delta-ms raises the limit when it is the larger
    assert other(attribute([base], [small], confidence=0.95, min_delta_ms=5.0)).limit_ms == 5.0


def test_each_family_is_judged_at_a_bonferroni_level() -> None:
    assert row_level(0.95, 5) == pytest.approx(0.99)
    assert row_level(0.95, 1) == pytest.approx(0.95) and row_level(0.95, 0) == pytest.approx(0.95)
    changes = attribute([run(OP_MIN_STEPS, 1.0, 1)], [run(OP_MIN_STEPS, 1.0, 2)], confidence=0.95)
    phases = [change for change in changes if change.kind == "phase"]
    operators = [change for change in changes if change.kind == "cpu"]
    assert {(c.family_size, round(c.row_confidence, 6)) for c in phases} == {(5, 0.99)}
    # every one of the 40 operators was a candidate for the top rows: each is judged at 1 - 0.05/40
    assert {(c.family_size, round(c.row_confidence, 6)) for c in operators} == {(40, 0.99875)}
    # AND no operator of this A/A pair (noise only, 40 candidates) is called significant
    assert not [change for change in operators if change.significant]
