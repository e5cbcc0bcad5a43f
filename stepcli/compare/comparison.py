"""The result of `stepcli compare`: the verdict, its exit status, and the rows its reports show.

`decide` (stepcli.compare.verdict, and stepcli.compare.withoutinterval for the verdicts made without
an interval) builds a `Comparison`; the renderers (stepcli.compare.comparerender) print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stepcli.compare.attribution import OpChange
from stepcli.compare.inference import Change
from stepcli.compare.measurement import Measurement
from stepcli.compare.populations import PopulationRow
from stepcli.errors import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_REGRESSION

Verdict = Literal["regression", "improvement", "no_change", "inconclusive", "nothing_measured"]
HEADLINES = {
    "regression": "REGRESSION",
    "improvement": "IMPROVEMENT",
    "no_change": "NO CHANGE",
    "inconclusive": "INCONCLUSIVE",
    "nothing_measured": "NOTHING MEASURED",
}


@dataclass(frozen=True)
class ComparedOpRow:
    """One operator's self-time change; `status` says when the op is missing on one side."""

    name: str
    baseline_ms: float | None
    current_ms: float | None
    status: str


@dataclass(frozen=True)
class Comparison:
    """Everything the verdict and its report need; built by `decide`, printed by the renderers."""

    baseline: Measurement
    current: Measurement
    metric: str
    tolerance: float
    min_delta_ms: float
    verdict: Verdict
    exit_code: int
    message: str  # the verdict line without its headline
    baseline_population: str | None = None
    current_population: str | None = None
    baseline_value: float | None = None
    current_value: float | None = None
    limit_ms: float | None = None
    step_rows: tuple[PopulationRow, ...] = ()
    op_rows: tuple[ComparedOpRow, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    confidence: float = 0.95
    change: Change | None = None  # None: decided on two statistics, without an interval
    method: str | None = None  # how the interval was made, in words
    steps_used: tuple[str, ...] = ()  # which steps of each run decided, in words
    baseline_samples: tuple[float, ...] = ()  # the deciding steps, for the distributions
    current_samples: tuple[float, ...] = ()
    op_changes: tuple[OpChange, ...] = ()
    # False when too few recorded steps to judge an operator: op_rows are shown as totals only,
    # without changes
    ops_judged: bool = True

    @property
    def delta_ms(self) -> float | None:
        if self.baseline_value is None or self.current_value is None:
            return None
        return self.current_value - self.baseline_value

    def decides(self, row: PopulationRow) -> bool:
        """Whether `row` of the Step time table holds the statistic the verdict was decided on."""
        return row.decides and row.stat == self.metric and self.verdict != "nothing_measured"

    @property
    def headline(self) -> str:
        return HEADLINES[self.verdict]

    @property
    def verdict_line(self) -> str:
        return f"{self.headline}: {self.message}"


def exit_code(verdict: Verdict, allow_inconclusive: bool) -> int:
    return {
        "regression": EXIT_REGRESSION,
        "inconclusive": EXIT_OK if allow_inconclusive else EXIT_INCONCLUSIVE,
    }.get(verdict, EXIT_OK)
