"""Unit tests of compare's statistics on synthetic step times with known answers (seeded, so they
never flake).

The trial counts are the issue's: 200 seeded trials per scenario, the default 95% confidence and
tolerance 10%. Each trial goes through `decide`, so the interval, the warm-up detection and the
verdict rules are tested together.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from stepcli.compare.inference import estimate_change, more_needed, warmup_length
from stepcli.compare.measurement import MeasuredProcess, Measurement, RunSteps
from stepcli.compare.verdict import decide
from stepcli.errors import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_REGRESSION
from stepcli.stats import describe

TRIALS = 200
STEPS = 60


def series(
    rng: random.Random, mean: float, noise: float, n: int = STEPS, phi: float = 0.0
) -> list[float]:
    """n step times around `mean` with relative noise `noise`, AR(1)-correlated with coefficient
    `phi`."""
    out, state = [], 0.0
    for _ in range(n):
        state = phi * state + rng.gauss(0.0, noise * (1 - phi * phi) ** 0.5)
        out.append(max(mean * (1.0 + state), 0.0))
    return out


def side(*runs: list[float], label: str = "side") -> Measurement:
    """A run-summary side with one process per run and every step untouched (step 0 is start-up)."""
    steps = tuple(
        RunSteps(
            f"{label}{i}",
            None,
            (MeasuredProcess("p", tuple(range(len(r) + 1)), (r[0], *r), "0" * (len(r) + 1)),),
            True,
        )
        for i, r in enumerate(runs)
    )
    every = [t for r in runs for t in r]
    return Measurement(
        label=label,
        kind="run",
        steps=len(every),
        runs=steps,
        populations={"untouched": describe(every), "profiled": None},
    )


def verdicts(
    shift: float, noise: float, *, phi: float = 0.0, n: int = STEPS, seed: int = 0
) -> Counter[str]:
    counts: Counter[str] = Counter()
    for trial in range(TRIALS):
        rng = random.Random(seed * 100_003 + trial)
        base = side(series(rng, 10.0, noise, n, phi))
        cur = side(series(rng, 10.0 * (1 + shift), noise, n, phi))
        counts[decide(base, cur, tolerance=0.1, min_delta_ms=0.0).verdict] += 1
    return counts


@pytest.mark.parametrize(
    ("noise", "phi"), [(0.01, 0.0), (0.05, 0.0), (0.10, 0.0), (0.30, 0.0), (0.10, 0.6)]
)
def test_identical_distributions_are_not_regressions(noise: float, phi: float) -> None:
    counts = verdicts(0.0, noise, phi=phi)
    assert counts["regression"] <= TRIALS * 0.05, counts
    if noise <= 0.05:  # narrow intervals: these decide "no change" outright
        assert counts["no_change"] == TRIALS, counts


def test_a_20_percent_shift_with_5_percent_noise_is_a_regression_every_time() -> None:
    assert verdicts(0.20, 0.05) == Counter(regression=TRIALS)


def test_a_3_percent_shift_with_30_percent_noise_is_inconclusive_not_a_regression() -> None:
    # The change is within the 10% tolerance, but at this noise 80 steps cannot show it: mostly
    # inconclusive, sometimes (the interval happens to stay under +10%) no change. A regression
    # needs the whole interval beyond +10%: about 0.2% of trials at this distance from the limit,
    # and none of these 200.
    counts = verdicts(0.03, 0.30, n=80)
    assert counts["regression"] == 0, counts
    assert counts["inconclusive"] >= TRIALS * 0.75, counts


def test_a_clear_speed_up_is_an_improvement() -> None:
    assert verdicts(-0.25, 0.05, n=30) == Counter(improvement=TRIALS)


def test_run_to_run_variation_counts_when_there_are_several_runs() -> None:
    # GIVEN runs whose level moves by 8% from run to run (another runner, another neighbour) and
    # little step noise
    def runs(rng: random.Random) -> list[list[float]]:
        return [series(rng, 10.0 * (1 + rng.gauss(0.0, 0.08)), 0.02, 40) for _ in range(3)]

    # (a 5% tolerance, so that run-to-run noise of 8% would often look like a regression)

    alarms_runs = alarms_pooled = 0
    for trial in range(TRIALS):
        rng = random.Random(trial)
        base, cur = runs(rng), runs(rng)
        # WHEN each side is three runs, runs are resampled too
        if (
            decide(side(*base), side(*cur), tolerance=0.05, min_delta_ms=0.0).verdict
            == "regression"
        ):
            alarms_runs += 1
        # versus pretending each side is one long run, which sees only step-to-step noise
        pooled = decide(
            side([t for r in base for t in r]),
            side([t for r in cur for t in r]),
            tolerance=0.05,
            min_delta_ms=0.0,
        )
        alarms_pooled += pooled.verdict == "regression"
    # THEN the two-level interval keeps false alarms rare; the step-only one does not
    assert alarms_runs <= TRIALS * 0.05
    assert alarms_pooled >= TRIALS * 0.1


def test_same_inputs_give_the_same_interval() -> None:
    rng = random.Random(7)
    base, cur = [series(rng, 10.0, 0.1)], [series(rng, 10.5, 0.1)]
    first = estimate_change([base], [cur])
    assert estimate_change([base], [cur]) == first
    assert first.low < first.delta < first.high
    assert first.method == "block bootstrap over steps"
    wider = estimate_change([base], [cur], confidence=0.99)
    assert wider.low < first.low and wider.high > first.high


@pytest.mark.parametrize("metric", ["median", "mean", "p90", "min", "max"])
def test_every_metric_has_an_interval_around_its_estimate(metric: str) -> None:
    rng = random.Random(3)
    change = estimate_change([[series(rng, 10.0, 0.05)]], [[series(rng, 12.0, 0.05)]], metric)
    assert change.low <= change.delta <= change.high
    assert change.low > 0  # +20% is far outside the noise for every statistic


def test_ranks_of_unequal_length_are_resampled_together() -> None:
    rng = random.Random(5)
    run = [series(rng, 10.0, 0.05, 50), series(rng, 10.0, 0.05, 45)]
    change = estimate_change([run], [[series(rng, 10.0, 0.05, 50)]])
    assert change.baseline_steps == 95 and change.low < 0 < change.high


def test_warmup_is_detected_and_noise_is_not_cut() -> None:
    rng = random.Random(11)
    settled = series(rng, 10.0, 0.03, 80)
    assert warmup_length([40.0, 25.0, 18.0, 14.0, 12.0, 11.0, 11.0, *settled]) == 10
    cuts = [warmup_length(series(random.Random(seed), 10.0, 0.05, 80)) for seed in range(TRIALS)]
    assert sum(cut > 0 for cut in cuts) <= TRIALS * 0.05
    assert warmup_length([30.0, 10.0, 10.0]) == 0  # too few steps to tell


def test_warmup_steps_are_left_out_of_the_verdict_and_named() -> None:
    rng = random.Random(2)
    base = side([60.0, 40.0, 25.0, 20.0, 15.0, *series(rng, 10.0, 0.02, 60)])
    cur = side(series(rng, 10.0, 0.02, 65))
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0, metric="mean")
    assert result.verdict == "no_change", result.message
    cut = re.search(r"steps 1-(\d+) left out: warm-up detected \(MSER-5\)", result.steps_used[0])
    assert cut and 5 <= int(cut.group(1)) <= 15, result.steps_used
    # --skip-steps replaces detection: keeping the slow start makes the baseline's mean much slower
    kept = decide(base, cur, tolerance=0.1, min_delta_ms=0.0, metric="mean", skip_steps=0)
    assert kept.baseline_value is not None and result.baseline_value is not None
    assert kept.baseline_value > result.baseline_value * 1.1
    assert not any("left out" in line for line in kept.steps_used)
    later = decide(base, cur, tolerance=0.1, min_delta_ms=0.0, skip_steps=20)
    assert later.steps_used[0].startswith(
        "baseline side0: untouched steps 20-65 (46 step times); steps 1-19 left out: --skip-steps "
        "20"
    )


def test_inconclusive_exits_4_or_0_when_allowed_and_says_what_would_decide() -> None:
    rng = random.Random(4)
    base, cur = side(series(rng, 10.0, 0.3, 20)), side(series(rng, 10.3, 0.3, 20))
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0)
    assert (result.verdict, result.exit_code) == ("inconclusive", EXIT_INCONCLUSIVE)
    assert "more steps per side" in result.message and "95% CI" in result.message
    assert (
        decide(base, cur, tolerance=0.1, min_delta_ms=0.0, allow_inconclusive=True).exit_code
        == EXIT_OK
    )
    # A floor far above the noise decides it.
    assert decide(base, cur, tolerance=0.1, min_delta_ms=20.0).verdict == "no_change"


def test_regression_message_has_the_interval() -> None:
    rng = random.Random(6)
    result = decide(
        side(series(rng, 10.0, 0.02)),
        side(series(rng, 12.0, 0.02)),
        tolerance=0.1,
        min_delta_ms=0.0,
    )
    assert result.exit_code == EXIT_REGRESSION
    assert result.message.startswith("median step time (untouched steps) ")
    assert "95% CI +" in result.message and "exceeds the allowed" in result.message
    assert result.change is not None and result.change.low > result.limit_ms


def test_more_needed_scales_with_the_square_of_the_interval() -> None:
    change = estimate_change([[[10.0, 11.0] * 10]], [[[10.0, 11.0] * 10]])
    half = change.high - change.delta
    assert more_needed(change, half / 2) == pytest.approx(4.0)
    assert more_needed(change, change.delta) is None


# ---------------------------------------------------------------- intervals that respect positivity
# (issue 19.12)


def test_a_ratio_interval_never_passes_minus_100_percent() -> None:
    # GIVEN two runs per side whose levels differ a hundredfold (another machine, a neighbour's job)
    rng = random.Random(8)
    base = [series(rng, 1.0, 0.05, 12), series(rng, 100.0, 0.05, 12)]
    cur = [series(rng, 1.0, 0.05, 12), series(rng, 90.0, 0.05, 12)]
    # WHEN the change gets its interval
    change = estimate_change([[r] for r in base], [[r] for r in cur])
    # THEN a step cannot become faster than instant: the interval stays above -100% (a ratio, from
    # log times)
    relative = change.relative_interval()
    assert relative is not None and relative[0] > -1.0, change
    assert relative[0] <= change.delta / change.baseline <= relative[1]
    assert change.low <= change.delta <= change.high
    assert "log step times" in (
        decide(side(*base), side(*cur), tolerance=0.1, min_delta_ms=0.0).method or ""
    )


def test_a_complete_split_of_too_few_steps_says_what_would_decide_it() -> None:
    # GIVEN 3 steps per side, every current step twice every baseline step: a split that 1 time in
    # 20 happens by chance, more than 95% confidence allows (1 in 40)
    result = decide(
        side([10.0, 10.5, 11.0]), side([20.0, 21.0, 22.0]), tolerance=0.1, min_delta_ms=0.0
    )
    # THEN inconclusive, and the message says the split is complete, why that is not enough, and
    # what would be (it said "at least 10 per side ... unless every step of one side is beyond the
    # limit", which these are)
    assert result.verdict == "inconclusive"
    assert "every step of one side is beyond the limit (1.050 ms)" in result.message, result.message
    assert (
        "by chance 1 time in 20" in result.message
        and "4 steps per side would decide it" in result.message
    )


def test_too_few_steps_are_inconclusive_without_an_interval() -> None:
    # GIVEN 3 steps per side (the 2 runs of a few steps gave -1141.6% .. +1102.4%)
    base, cur = side([10.0, 11.0, 10.5]), side([10.2, 10.9, 10.4])
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0)
    # THEN inconclusive, no interval, and the message says how many are needed
    assert result.verdict == "inconclusive" and result.change is None and "CI" not in result.message
    assert (
        "too few steps to decide (3 baseline and 3 current step positions; at least 10 per side"
        in result.message
    )
    # ranks that step together count once: two processes of 3 steps are still 3 positions
    two = Measurement(
        label="two",
        kind="run",
        steps=6,
        runs=(
            RunSteps(
                "r",
                None,
                tuple(
                    MeasuredProcess(p, (0, 1, 2, 3), (9.0, 10.0, 10.0, 10.0), "0000") for p in "ab"
                ),
                True,
            ),
        ),
        populations={"untouched": describe([10.0] * 6), "profiled": None},
    )
    assert decide(two, two, tolerance=0.1, min_delta_ms=0.0).verdict == "inconclusive"


def test_warmup_cut_of_untouched_steps_leaves_the_profiled_rows_their_steps() -> None:
    # GIVEN runs whose untouched steps start slow (warm-up detected) after 4 profiled steps (steps
    # 1-4)
    rng = random.Random(9)
    slow_start = [40.0, 30.0, 25.0, 20.0, 18.0, 16.0, 14.0, 12.0, 11.0, 11.0]

    def run(times: list[float]) -> Measurement:
        every = [10.0, 12.0, 12.0, 12.0, 12.0, *times]  # step 0 start-up, steps 1-4 profiled
        phases = "0" + "1233" + "0" * len(times)
        steps = tuple(range(len(every)))
        return Measurement(
            label="run",
            kind="run",
            steps=len(every),
            runs=(
                RunSteps("run", None, (MeasuredProcess("p", steps, tuple(every), phases),), True),
            ),
            populations={"untouched": describe(times), "profiled": describe([12.0] * 4)},
        )

    base, cur = run([*slow_start, *series(rng, 10.0, 0.02, 60)]), run(series(rng, 10.0, 0.02, 70))
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0)
    assert "warm-up detected" in result.steps_used[0]
    # THEN the profiled rows still show the 4 profiled steps of each side, not `-`
    profiled = {row.stat: row for row in result.step_rows if row.population == "profiled"}
    assert profiled["count"].baseline == 4 and profiled["count"].current == 4
    assert profiled["median"].baseline == 12.0


def test_method_says_blocks_of_1_step_in_the_singular() -> None:
    # GIVEN four runs of 3 steps per side: 12 step positions, blocks of n^(1/3) = 1 step
    rng = random.Random(10)
    base = side(*[series(rng, 10.0, 0.02, 3) for _ in range(4)])
    cur = side(*[series(rng, 10.0, 0.02, 3) for _ in range(4)])
    method = decide(base, cur, tolerance=0.1, min_delta_ms=0.0).method or ""
    assert "circular blocks of 1 step, " in method, method


def test_a_change_far_past_a_noisy_baseline_is_judged_in_ms_on_the_difference() -> None:
    # GIVEN a baseline of ~0.8 ms steps with two slow outliers, and a current side of ~101 ms steps
    # (a 100 ms sleep added): every current step is 90 ms slower than every baseline step (CI saw
    # this, on a loaded machine)
    base = [0.82, 0.63, 0.80, 5.91, 9.5, 0.84, 11.40, 0.70, 0.90, 0.78]
    cur = [101.5, 101.7, 101.4, 102.2, 101.6, 106.3, 101.5, 101.8, 101.6, 101.9]
    change = estimate_change([[base]], [[cur]])
    # THEN the ms interval is the difference's own (a ratio scaled by the observed baseline said
    # +15.9 ms)
    assert change.low > 90.0, change
    # AND a 50 ms floor is passed by the whole interval (the old one started at +13.4 ms): a
    # regression, not "inconclusive"
    result = decide(side(base), side(cur), tolerance=0.1, min_delta_ms=50.0)
    assert result.verdict == "regression", result


# ---------------------------------------------------------------- overwhelming evidence from few
# steps


def test_complete_separation_far_beyond_the_limit_decides_with_few_steps() -> None:
    # GIVEN 4 steps per side (after start-up), every current step 13x slower than every baseline
    # step
    base = side([3.1, 3.0, 3.2, 3.1])
    cur = side([42.7, 41.9, 43.5, 42.0])
    result = decide(base, cur, tolerance=0.1, min_delta_ms=0.0)
    # THEN a regression (exit 1) without an interval, saying why
    assert (result.verdict, result.exit_code) == ("regression", EXIT_REGRESSION), result.message
    assert result.change is None and "every one of the 4 current steps is slower" in result.message
    assert "probability 1/70" in result.message
    # AND the mirror image is an improvement
    assert decide(cur, base, tolerance=0.1, min_delta_ms=0.0).verdict == "improvement"


def test_separation_needs_the_whole_gap_beyond_the_limit_and_enough_steps() -> None:
    # Separated, but the smallest current step is within 10% of the largest baseline one:
    # inconclusive.
    base, cur = side([3.0, 3.1, 3.2, 3.3]), side([3.5, 3.6, 3.7, 3.8])
    assert decide(base, cur, tolerance=0.1, min_delta_ms=0.0).verdict == "inconclusive"
    # Far apart but within --min-delta-ms: inconclusive.
    far = side([30.0, 31.0, 32.0, 33.0])
    assert decide(base, far, tolerance=0.1, min_delta_ms=40.0).verdict == "inconclusive"
    # 3 steps per side: a complete separation happens by chance 1 time in 20 > 2.5%: inconclusive.
    assert decide(
        side([3.0, 3.1, 3.2]), side([42.0, 43.0, 44.0]), tolerance=0.1, min_delta_ms=0.0
    ).verdict == ("inconclusive")
    # One overlapping step: no separation, inconclusive.
    assert (
        decide(base, side([3.2, 40.0, 41.0, 42.0]), tolerance=0.1, min_delta_ms=0.0).verdict
        == "inconclusive"
    )


def test_separation_chance_is_the_exact_mann_whitney_tail() -> None:
    from stepcli.compare.withoutinterval import separation

    assert separation([1.0, 1.0, 1.0, 1.0], [9.0, 9.0, 9.0, 9.0], 0.1, 0.0, 0.95) == (
        "regression",
        1 / 70,
    )
    assert separation([1.0, 1.0, 1.0], [9.0, 9.0, 9.0, 9.0], 0.1, 0.0, 0.95) is None  # 1/35 > 0.025
    assert separation([1.0, 1.0, 1.0], [9.0, 9.0, 9.0, 9.0], 0.1, 0.0, 0.9) == (
        "regression",
        1 / 35,
    )
    assert separation([1.0, 1.0, 1.0], [9.0, 9.0, 9.0], 0.1, 0.0, 0.9) == ("regression", 1 / 20)
    assert separation([9.0] * 4, [1.0] * 4, 0.1, 0.0, 0.95) == ("improvement", 1 / 70)


def test_short_runs_compare_their_profiled_steps_when_untouched_ones_are_too_few() -> None:
    # GIVEN run summaries of 14 steps: 11 profiled (phases 1/2), 2 untouched after them, step 0
    # start-up
    def run(level: float, seed: int) -> Measurement:
        rng = random.Random(seed)
        times = [level * 3] + [level * (1 + rng.uniform(-0.05, 0.05)) for _ in range(13)]
        phases = "0" + "1" + "2" * 10 + "00"
        process = MeasuredProcess("w", tuple(range(14)), tuple(times), phases)
        return Measurement(
            label=f"run{seed}",
            kind="run",
            steps=14,
            runs=(RunSteps(f"run{seed}", None, (process,), True),),
            populations={"untouched": describe(times[12:]), "profiled": describe(times[1:12])},
        )

    result = decide(run(3.1, 1), run(42.7, 2), tolerance=0.1, min_delta_ms=0.0)
    # THEN the profiled steps decide, the report says why, and 13x slower is a regression
    assert result.verdict == "regression", result.message
    assert result.baseline_population == "profiled"
    assert any("too few untouched steps" in note for note in result.notes), result.notes


def test_a_current_side_of_zero_time_steps_is_never_more_than_100_percent_faster() -> None:
    # GIVEN a baseline of 1.0-1.2 ms steps and a current side whose steps all took no time (no ratio
    # interval: log 0), whose ms interval reaches past the point baseline
    base = [1.0, 1.2, 1.2, 1.0, 1.0, 1.2] * 2  # median 1.1, resampled medians up to 1.2
    change = estimate_change([[base]], [[[0.0] * 12]])
    assert change.ratio_low is None and change.low < -change.baseline
    # THEN the change in percent stops at -100%: a step time cannot fall below zero
    interval = change.relative_interval()
    assert interval is not None and interval[0] == -1.0 and interval[1] <= 0.0


def test_a_long_means_resamples_from_block_sums_equal_its_values_resampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from stepcli.compare import inference

    # GIVEN long runs of several processes, one process shorter, runs of several lengths (issue 47:
    # 100,000 steps)
    rng = np.random.default_rng(3)
    runs = [
        [list(rng.gamma(2.0, 1.0, 3_000)), list(rng.gamma(2.0, 1.0, 2_900))],
        [list(rng.gamma(2.0, 1.0, 1_200))] * 2,
        [list(rng.gamma(2.0, 1.0, 4_000))],
    ]
    for sides in (runs, runs[:1], [runs[2]]):
        # WHEN a mean is resampled value by value, and from block sums
        monkeypatch.setattr(inference, "BLOCK_SUMS_FROM", 10**12)
        values = inference.replicates(sides, "mean", resamples=700, rng=np.random.default_rng(5))
        monkeypatch.setattr(inference, "BLOCK_SUMS_FROM", 1)
        sums = inference.replicates(sides, "mean", resamples=700, rng=np.random.default_rng(5))
        # THEN every resample's mean is the same, to the rounding of a sum
        assert np.allclose(values, sums, rtol=1e-12, atol=0)


def test_a_long_runs_quantile_resampled_m_out_of_n_gives_the_full_bootstraps_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from stepcli.compare import inference

    # GIVEN two long runs of correlated, skewed step times (a long window: issue 47), the current 1%
    # slower
    rng = random.Random(11)
    noise = np.random.default_rng(11)
    baseline = [
        [[t + g for t, g in zip(series(rng, 10.0, 0.1, 25_000, 0.5), noise.gamma(1, 0.2, 25_000))]]
    ]
    current = [
        [[t + g for t, g in zip(series(rng, 10.1, 0.1, 25_000, 0.5), noise.gamma(1, 0.2, 25_000))]]
    ]
    for metric in ("median", "p90"):
        # WHEN its interval is made from 10,000-step resamples (the default from 20,000 steps) and
        # from all steps
        sub = estimate_change(baseline, current, metric)
        monkeypatch.setattr(inference, "SUBSAMPLE_FROM", 10**9)
        full = estimate_change(baseline, current, metric)
        monkeypatch.undo()
        # THEN it is said, and it is the full bootstrap's interval to within a few percent of its
        # width
        assert sub.subsample == 10_000 and full.subsample is None
        width = full.high - full.low
        assert abs(sub.low - full.low) < 0.1 * width and abs(sub.high - full.high) < 0.1 * width, (
            sub,
            full,
        )
        assert None not in (sub.ratio_low, sub.ratio_high, full.ratio_low, full.ratio_high)
        ratio_width = (full.ratio_high or 0.0) - (full.ratio_low or 0.0)
        assert abs((sub.ratio_low or 0.0) - (full.ratio_low or 0.0)) < 0.1 * ratio_width
        assert abs((sub.ratio_high or 0.0) - (full.ratio_high or 0.0)) < 0.1 * ratio_width
