"""Which steps decide a comparison: the step population of each side (untouched, profiled,
recorded), the first step used after warm-up, the Step time table's rows, and both sides' deciding
steps together (`Sides`; pure: no I/O).

The pairing rules are verdict.py's contract (see its docstring): like with like, so profiler
overhead never decides when untouched steps exist on both sides. Warm-up is found per run and per
population: the untouched steps' warm-up says nothing about where the profiled steps (which come
first) settle, so each population's rows use their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepcli.compare.inference import MIN_STEPS, warmup_length
from stepcli.compare.measurement import Measurement
from stepcli.fmt import plural
from stepcli.stats import STAT_NAMES, Stats, describe

# Per run (by index), per process, the (step, ms) that decide.
UsedRuns = list[list[list[tuple[int, float]]]]


@dataclass(frozen=True)
class PopulationRow:
    """One statistic of one step population, both sides."""

    population: str  # "untouched", "profiled", "recorded" or "profiled/recorded"
    stat: str
    baseline: float | None
    current: float | None
    decides: bool


def choose_populations(
    baseline: Measurement, current: Measurement
) -> tuple[list[tuple[str, str]], list[str]]:
    """The step populations to show, deciding pair first, and notes explaining any fallback."""
    notes: list[str] = []
    if baseline.kind == "trace" and current.kind == "trace":
        return [("recorded", "recorded")], notes
    if baseline.kind == "run" and current.kind == "run":
        missing = [m.label for m in (baseline, current) if m.populations.get("untouched") is None]
        if missing and baseline.populations.get("profiled") and current.populations.get("profiled"):
            notes.append(
                f"no untouched steps in {', '.join(missing)}: compared the profiled "
                f"(warmup+recorded) steps, "
                "which include profiler overhead"
            )
            return [("profiled", "profiled"), ("untouched", "untouched")], notes
        few = [(m.label, positions(m, "untouched")) for m in (baseline, current)]
        few = [(label, n) for label, n in few if n < MIN_STEPS]
        if few and min(positions(m, "profiled") for m in (baseline, current)) > min(
            n for _, n in few
        ):
            notes.append(
                f"too few untouched steps in {', '.join(f'{label} ({n})' for label, n in few)} (at "
                f"least {MIN_STEPS} per side decide): compared the profiled (warmup+recorded) "
                f"steps, which include "
                "profiler overhead on both sides"
            )
            return [("profiled", "profiled"), ("untouched", "untouched")], notes
        return [("untouched", "untouched"), ("profiled", "profiled")], notes
    run_side = "baseline" if baseline.kind == "run" else "current"
    notes.append(
        f"the {run_side} is a run summary and the other side a trace: compared the run's profiled "
        "(warmup+recorded) steps with the trace's recorded steps, since a trace has nothing else"
    )
    if baseline.kind == "run":
        return [("profiled", "recorded")], notes
    return [("recorded", "profiled")], notes


def positions(m: Measurement, population: str) -> int:
    """Step positions of one population of a side (per run, its longest process: ranks step
    together), or the statistics' count when the side has no per-step times."""
    if m.runs:
        return sum(max((len(p) for p in run.population(population)), default=0) for run in m.runs)
    stats = m.populations.get(population)
    return 0 if stats is None else int(stats["count"])


def first_steps(m: Measurement, population: str, skip_steps: int | None) -> dict[int, int]:
    """Per run (by index), the first step used: `--skip-steps`, else the end of the warm-up MSER-5
    finds."""
    out: dict[int, int] = {}
    for index, run in enumerate(m.runs):
        if skip_steps is not None:
            out[index] = skip_steps
            continue
        series = run.population(population)
        if not series:
            out[index] = 0
            continue
        # One value per position: the mean over processes, so ranks that move together count once.
        longest = max(series, key=len)
        means = [
            sum(p[i][1] for p in series if i < len(p)) / sum(1 for p in series if i < len(p))
            for i in range(len(longest))
        ]
        cut = warmup_length(means)
        out[index] = longest[cut][0] if cut else 0
    return out


def used(m: Measurement, population: str, first: dict[int, int]) -> UsedRuns:
    """Per run, per process, the (step, ms) that decide; runs left with no step are dropped."""
    runs = [run.population(population, first.get(index, 0)) for index, run in enumerate(m.runs)]
    return [run for run in runs if run]


def steps_used(
    side: str,
    m: Measurement,
    population: str,
    first: dict[int, int],
    skip: int | None,
    role: str = "",
) -> list[str]:
    """One line per run (four at most): which steps decided (or, with `role`, what they are for),
    and which were left out and why."""
    lines = []
    for index, run in enumerate(m.runs[:4]):
        kept = [step for p in run.population(population, first.get(index, 0)) for step, _ in p]
        if not kept:
            lines.append(f"{side} {run.label}: no {population} steps left")
            continue
        text = (
            f"{side} {run.label}: {population} steps {min(kept)}-{max(kept)} ({len(kept)} step "
            f"times{role})"
        )
        all_steps = [step for p in run.population(population) for step, _ in p]
        cut = [s for s in all_steps if s < first.get(index, 0)]
        if cut:
            why = f"--skip-steps {skip}" if skip is not None else "warm-up detected (MSER-5)"
            text += f"; steps {min(cut)}-{max(cut)} left out: {why}"
        aside = run.set_aside()
        if aside and population in ("untouched", "profiled"):
            text += (
                f"; {plural(aside, 'step time')} after a window set aside (the profiler's stop and "
                f"save)"
            )
        lines.append(text)
    if len(m.runs) > 4:
        lines.append(f"{side}: +{len(m.runs) - 4} more runs")
    return lines


def _population_stats(
    m: Measurement, population: str, first: dict[int, int] | None
) -> Stats | None:
    if first is None:
        return m.populations.get(population)
    return describe(ms for run in used(m, population, first) for p in run for _, ms in p)


def step_rows(
    baseline: Measurement,
    current: Measurement,
    pairs: list[tuple[str, str]],
    deciding_first: tuple[dict[int, int], dict[int, int]] | None = None,
    skip_steps: int | None = None,
) -> tuple[PopulationRow, ...]:
    """The Step time table: the deciding pair first, over the steps actually used so it agrees with
    the verdict; the other populations over their own steps after their own warm-up (or
    `--skip-steps`)."""
    rows: list[PopulationRow] = []
    for index, (b_pop, c_pop) in enumerate(pairs):
        b_first = c_first = None
        if deciding_first is not None:
            b_first, c_first = (
                deciding_first
                if index == 0
                else (
                    first_steps(baseline, b_pop, skip_steps),
                    first_steps(current, c_pop, skip_steps),
                )
            )
        b_stats, c_stats = (
            _population_stats(baseline, b_pop, b_first),
            _population_stats(current, c_pop, c_first),
        )
        if index > 0 and b_stats is None and c_stats is None:
            continue
        population = b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"
        for stat in STAT_NAMES:
            rows.append(
                PopulationRow(
                    population=population,
                    stat=stat,
                    baseline=None if b_stats is None else float(b_stats[stat]),  # type: ignore[literal-required]
                    current=None if c_stats is None else float(c_stats[stat]),  # type: ignore[literal-required]
                    decides=index == 0,
                )
            )
    return tuple(rows)


@dataclass
class Sides:
    """Both sides' deciding populations, their first steps and the (step, ms) they keep."""

    baseline: Measurement
    current: Measurement
    pops: tuple[str, str]
    skip_steps: int | None
    with_samples: bool
    first: tuple[dict[int, int], dict[int, int]] = ({}, {})
    runs: tuple[UsedRuns, UsedRuns] = ([], [])

    def __post_init__(self) -> None:
        if self.with_samples:
            b_pop, c_pop = self.pops
            self.first = (
                first_steps(self.baseline, b_pop, self.skip_steps),
                first_steps(self.current, c_pop, self.skip_steps),
            )
            self.runs = (
                used(self.baseline, b_pop, self.first[0]),
                used(self.current, c_pop, self.first[1]),
            )

    @property
    def population(self) -> str:
        b_pop, c_pop = self.pops
        return b_pop if b_pop == c_pop else f"{b_pop}/{c_pop}"

    def nothing_measured(self) -> list[tuple[str, Measurement, str]]:
        """(side, measurement, why) for each side that gives nothing to compare."""
        sides = (("baseline", self.baseline), ("current", self.current))
        empty = [(side, m, reason) for side, m in sides if (reason := m.nothing_measured())]
        if empty:
            return empty
        stats = (
            self.baseline.populations.get(self.pops[0]),
            self.current.populations.get(self.pops[1]),
        )
        if None in stats:  # each side measured something, but not the steps this comparison needs
            return [
                (side, m, f"no {pop} steps")
                for (side, m), pop, st in zip(sides, self.pops, stats)
                if st is None
            ]
        zero = [
            (side, m, f"only {pop} steps of 0 ms (a trace without time, or a broken clock)")
            for (side, m), pop, st in zip(sides, self.pops, stats)
            if st is not None and not st["max"] > 0
        ]
        # no time to compare: a ratio of 0 ms, or a change of +0 ms "within tolerance", would be
        # invented
        if zero:
            return zero
        if self.with_samples and not all(self.runs):
            skip = self.skip_steps
            return [
                (side, m, f"no {pop} steps from step {skip} on (--skip-steps {skip})")
                for (side, m), pop, runs in zip(sides, self.pops, self.runs)
                if not runs
            ]
        return []

    def steps_used(self) -> tuple[str, ...]:
        return tuple(
            steps_used("baseline", self.baseline, self.pops[0], self.first[0], self.skip_steps)
        ) + tuple(steps_used("current", self.current, self.pops[1], self.first[1], self.skip_steps))

    def samples(self, index: int) -> tuple[float, ...]:
        """The deciding step times of one side (0 baseline, 1 current), for the distributions."""
        return tuple(ms for run in self.runs[index] for p in run for _, ms in p)


def times_ms(runs: UsedRuns) -> list[list[list[float]]]:
    """The step times alone of `UsedRuns`: per run, per process, the ms."""
    return [[[ms for _, ms in p] for p in run] for run in runs]


def table_steps_used(
    baseline: Measurement,
    current: Measurement,
    pairs: list[tuple[str, str]],
    skip_steps: int | None,
) -> tuple[str, ...]:
    """The `steps:` lines of the Step time table's other populations (those that do not decide):
    which steps its rows hold and which were left out and why (each population's own warm-up), so no
    count changes unexplained."""
    lines: list[str] = []
    for b_pop, c_pop in pairs[1:]:
        for side, m, pop in (("baseline", baseline, b_pop), ("current", current, c_pop)):
            if m.populations.get(pop) is None or not m.runs:
                continue
            first = first_steps(m, pop, skip_steps)
            lines += steps_used(side, m, pop, first, skip_steps, role=", in the table only")
    return tuple(lines)
