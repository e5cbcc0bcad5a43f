"""Unit tests of compare's attribution: phases first, operators only with enough recorded steps (issue 19.12)."""

from __future__ import annotations

import random

from stepcli.compare.attribution import OP_MIN_STEPS, PHASE_MIN_STEPS, attribute, attribution_note
from stepcli.compare.model import OpSteps

PHASES = ("dataloader", "forward", "backward", "optimizer", "other")


def run(steps: int, other_ms: float, seed: int) -> OpSteps:
    """`steps` recorded steps: forward/backward noise from many operators, a steady `other` phase."""
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
    # THEN nothing is attributed from 3 steps (no operator is blamed), and the note says what is needed
    assert few == ()
    note = attribution_note([run(3, 1.0, 1)], [run(3, 301.0, 2)])
    assert note and f"phases need at least {PHASE_MIN_STEPS}" in note and f"operators {OP_MIN_STEPS}" in note
    # WITH enough steps for phases but not operators: the phase is named, no operator
    some = attribute([run(10, 1.0, 1)], [run(10, 301.0, 2)], confidence=0.95)
    assert some and all(change.kind == "phase" for change in some)
    assert (some[0].name, some[0].significant) == ("other", True) and some[0].delta_ms > 250
    assert "attributed by phase only" in (attribution_note([run(10, 1.0, 1)], [run(10, 301.0, 2)]) or "")
    # WITH OP_MIN_STEPS steps: phases first, then operators
    many = attribute([run(OP_MIN_STEPS, 1.0, 1)], [run(OP_MIN_STEPS, 301.0, 2)], confidence=0.95)
    kinds = [change.kind for change in many]
    assert (
        kinds[0] == "phase"
        and "cpu" in kinds
        and kinds.index("cpu") > max(i for i, k in enumerate(kinds) if k == "phase")
    )
    assert attribution_note([run(OP_MIN_STEPS, 1.0, 1)], [run(OP_MIN_STEPS, 1.0, 2)]) is None
