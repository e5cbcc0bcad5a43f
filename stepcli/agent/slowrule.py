"""The `--capture-on-slow` rule: when one step is slow enough, against its own process's recent
steps, to trace.

Runs inside the target (and in the launcher, which checks the rule before the program starts):
standard library only. Pure: a rule's text in, a threshold from a baseline out.

  Nx      slower than N times the rolling median (N > 1), e.g. `3x`
  +Tms    slower than the rolling median plus T milliseconds (or `+Ts` seconds), e.g. `+50ms`
  zK      more than K robust standard deviations above the rolling median (K > 0), e.g. `z4`: the
          spread is 1.4826 times the median absolute deviation, and at least 5% of the median, so
          that a run whose steps barely vary does not trigger on every hiccup

The baseline is the last BASELINE_STEPS steps that no window recorded (the first step, start-up,
never counts).
"""

from __future__ import annotations

BASELINE_STEPS = 64  # the rolling baseline: this many recent steps outside any window
# the baseline is recomputed this often at first, then every BASELINE_STEPS steps
REFRESH_STEPS = 16
MIN_STEPS = 8  # steps in the baseline before any step can trigger
MIN_SPREAD = 0.05  # zK: the spread is at least this share of the median
# --max-captures: windows wait in requests.json while the run lasts (a bounded file)
MAX_CAPTURES = 8
MAX_CAPTURE_STEPS = 100  # --capture-steps
SYNTAX = (
    "3x (times the rolling median), +50ms (over it) or z4 (robust standard deviations above it)"
)


def parse(text: str) -> tuple[str, float]:
    """(kind, value) of a rule: ("x", 3.0), ("plus", 0.05 seconds) or ("z", 4.0); ValueError saying
    the syntax."""
    spec = text.strip().lower()
    try:
        if spec.endswith("x"):
            kind, value = "x", float(spec[:-1])
            ok = value > 1
        elif spec.startswith("+") and spec.endswith("ms"):
            kind, value = "plus", float(spec[1:-2]) / 1000
            ok = value > 0
        elif spec.startswith("+") and spec.endswith("s"):
            kind, value = "plus", float(spec[1:-1])
            ok = value > 0
        elif spec.startswith("z"):
            kind, value = "z", float(spec[1:])
            ok = value > 0
        else:
            ok = False
    except ValueError:
        ok = False
    if not ok or value != value or value in (float("inf"),):
        raise ValueError(f"--capture-on-slow {text!r}: expected {SYNTAX}")
    return kind, value


def baseline(sample: list[int], with_spread: bool = True) -> tuple[int, float]:
    """(median, robust spread) of step durations in ns (the spread only when asked); `sample` is
    sorted in place."""
    sample.sort()
    median = sample[len(sample) // 2]
    if not with_spread:
        return median, 0.0
    deviations = sorted(abs(d - median) for d in sample)
    spread = max(1.4826 * deviations[len(deviations) // 2], MIN_SPREAD * median)
    return median, spread


def threshold_ns(kind: str, value: float, median: int, spread: float) -> int:
    """A step longer than this (ns) is slow."""
    if kind == "x":
        return int(median * value)
    if kind == "plus":
        return int(median + value * 1e9)
    return int(median + value * spread)
