"""Statistics behind `stepcli compare`: confidence intervals for a step-time change, and warm-up
detection.

Why a bootstrap, and which one:
- Step times are not normal (long right tails, several modes) and consecutive steps are correlated
  (allocator and cache state, thermal drift, a neighbour on a shared runner), so the interval comes
  from resampling, not a formula.
- Within one run, steps are resampled in circular blocks of about n^(1/3) consecutive steps (a block
  bootstrap), so short-range correlation stays inside the resamples instead of making the interval
  too narrow.
- With several runs per side, each resample first draws runs with replacement and then blocks within
  each drawn run (a two-level bootstrap), so run-to-run variation (another machine, another moment)
  widens the interval. With one run per side that variation cannot be seen; callers say so.
- Every process of a run (ranks) is resampled with the same step positions, so ranks that move
  together in a synchronous job are not counted as independent evidence.
- Step times are positive and a slowdown is a ratio, so the interval of a step-time change is made
  on the log scale: the percentiles of log(current / baseline) over the resamples, mapped back to a
  relative change. Its lower end can never pass -100%, and a noisy side widens it multiplicatively,
  not into negative times. (Per-operator attribution keeps the plain difference of means: an
  operator's self time can be 0 on one side.)
- Too few step positions to resample (MIN_STEPS) give no interval at all: the verdict is
  inconclusive, not a huge interval.

Everything is seeded: the same inputs give the same interval and so the same verdict. numpy does the
resampling (the CLI side only, never the agent): a pure-Python median of 2,000 resamples of 3,000
steps took about 2 s per side on these machines, numpy takes a few tenths of a second for both
(scripts/bench_gate.py --speed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stepcli.stats import METRICS  # the one list of decidable statistics

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 20240613
METHOD_STEPS = "block bootstrap over steps"
METHOD_RUNS = "two-level bootstrap (runs, then blocks of steps)"
# Fewer step positions than this on a side (steps of one process; ranks that step together count
# once) decide nothing: a bootstrap of 3 values spans their range and says little about the next
# run.
MIN_STEPS = 10
MSER_BATCH = 5  # MSER-5: warm-up detection on batch means of 5 steps
_CELLS_PER_CHUNK = 4_000_000  # resample values held at once (32 MB of float64)
# From this many values a resample (steps x processes x runs), a mean is resampled from block sums
# (the same draws, equal to the rounding of a sum): below it, value by value, as always.
BLOCK_SUMS_FROM = 10_000
# A quantile (median, p90) of runs of SUBSAMPLE_FROM steps or more is resampled m out of n:
# SUBSAMPLE_STEPS positions of each run per resample, the spread scaled to all of them
# (docs/commands/compare.md says why).
SUBSAMPLE_FROM = 20_000
SUBSAMPLE_STEPS = 10_000
_QUANTILES = ("median", "p90")

FloatArray = npt.NDArray[np.float64]
# One run: per process, that process's step times (ms) in step order.
Run = Sequence[Sequence[float]]


@dataclass(frozen=True)
class Change:
    """The change of one step-time statistic from baseline to current, with its bootstrap interval
    (ms)."""

    metric: str
    baseline: float
    current: float
    low: float  # interval of current - baseline (ms), from the bootstrap of the difference
    high: float
    confidence: float
    method: str
    resamples: int
    baseline_steps: int
    current_steps: int
    baseline_runs: int
    current_runs: int
    # interval of current / baseline - 1, from the bootstrap of log ratios (it respects positivity:
    # never below -100%); None when a side has zeros (then percentages come from the ms interval)
    ratio_low: float | None = None
    ratio_high: float | None = None
    # steps of each run per resample when long runs were resampled m out of n (a quantile: see
    # subsampled), else None
    subsample: int | None = None

    @property
    def delta(self) -> float:
        return self.current - self.baseline

    def relative(self, value: float) -> float | None:
        """`value` (a delta in ms) as a fraction of the baseline, or None when the baseline is 0."""
        return value / self.baseline if self.baseline else None

    def relative_interval(self) -> tuple[float, float] | None:
        """The interval of the change as fractions of the baseline (ratio interval when there is
        one), or None when the baseline is 0."""
        if self.ratio_low is not None and self.ratio_high is not None:
            return self.ratio_low, self.ratio_high
        if not self.baseline:
            return None
        # a step time cannot fall below zero: -100% is the floor (the ms interval, over the
        # baseline's own uncertainty, can reach past the point baseline when the current side's
        # steps take no time)
        return max(-1.0, self.low / self.baseline), max(-1.0, self.high / self.baseline)


def block_length(steps: int) -> int:
    """Blocks of about n^(1/3) steps: the usual rate for a block bootstrap of a variance or
    quantile."""
    return max(1, round(math.pow(steps, 1.0 / 3.0)))


def _percentile_rows(values: FloatArray, q: float) -> FloatArray:
    """Linear-interpolated percentile of each row (numpy's and stepcli.stats' rule); NaN = no value.

    Sorting short rows, or one np.partition of long ones, is several times faster than
    np.percentile.
    """
    if not np.isnan(values).any():
        n = values.shape[1]
        position = (n - 1) * q / 100.0
        low = math.floor(position)
        if n <= 512:  # sorting short rows is many times faster than partitioning them
            ordered = np.sort(values, axis=1)
            low_values, high_values = ordered[:, low], ordered[:, min(low + 1, n - 1)]
        else:  # one partition, then the smallest value above it
            part = np.partition(values, low, axis=1)
            low_values = part[:, low]
            high_values = part[:, low + 1 :].min(axis=1) if low + 1 < n else low_values
        interpolated: FloatArray = low_values + (high_values - low_values) * (position - low)
        return interpolated
    ordered = np.sort(values, axis=1)  # NaN sorts last
    counts = (~np.isnan(values)).sum(axis=1)
    positions = (counts - 1) * q / 100.0
    lows = np.floor(positions).astype(np.int64)
    highs = np.minimum(lows + 1, counts - 1)
    low_values = np.take_along_axis(ordered, lows[:, None], axis=1)[:, 0]
    high_values = np.take_along_axis(ordered, highs[:, None], axis=1)[:, 0]
    per_row: FloatArray = low_values + (high_values - low_values) * (positions - lows)
    return per_row


def statistic(values: FloatArray, metric: str, axis: int | None = None) -> FloatArray | float:
    """`metric` of `values` (NaN = no value): of each row with axis=1, else of all of them."""
    if axis is None:
        return float(statistic(values.reshape(1, -1), metric, axis=1)[0])  # type: ignore[index]
    nan = bool(np.isnan(values).any())
    if metric == "median":
        return _percentile_rows(values, 50)
    if metric == "p90":
        return _percentile_rows(values, 90)
    reduced: FloatArray
    if metric == "mean":
        reduced = (np.nanmean if nan else np.mean)(values, axis=axis)
    elif metric == "min":
        reduced = (np.nanmin if nan else np.min)(values, axis=axis)
    elif metric == "max":
        reduced = (np.nanmax if nan else np.max)(values, axis=axis)
    else:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return reduced


def _as_matrix(run: Run) -> FloatArray:
    """A run as steps x processes, NaN where a process made fewer steps than the longest one."""
    processes = [list(p) for p in run if len(p)]
    longest = max((len(p) for p in processes), default=0)
    matrix = np.full((longest, max(len(processes), 1)), np.nan)
    for column, times in enumerate(processes):
        matrix[: len(times), column] = times
    return matrix


def pooled(runs: Sequence[Run]) -> FloatArray:
    """Every step time of every process of every run, as one flat array."""
    parts = [np.asarray(p, dtype=float) for run in runs for p in run if len(p)]
    return np.concatenate(parts) if parts else np.empty(0)


def replicates(
    runs: Sequence[Run],
    metric: str,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    rng: np.random.Generator,
    length: int | None = None,
) -> FloatArray:
    """`resamples` bootstrap values of `metric` for one side (see the module docstring for the
    scheme); `length`: step positions per resample (m out of n, in blocks of about m^(1/3)), when
    fewer than the longest run's."""
    matrices = [m for m in (_as_matrix(run) for run in runs) if m.shape[0]]
    if not matrices:
        raise ValueError("no step times to resample")
    n_runs = len(matrices)
    longest = max(m.shape[0] for m in matrices)
    width = max(m.shape[1] for m in matrices)
    data = np.full((n_runs, longest, width), np.nan)
    for index, matrix in enumerate(matrices):
        data[index, : matrix.shape[0], : matrix.shape[1]] = matrix
    lengths = np.array([m.shape[0] for m in matrices])
    span = min(longest, length) if length is not None else longest  # step positions of a resample
    blocks = np.array([block_length(min(int(n), span)) for n in lengths])
    positions = np.arange(span)
    n_blocks = -(-span // int(blocks.min()))
    ragged = bool((lengths < span).any())
    same_block = bool((blocks == blocks[0]).all())
    flat = data.reshape(n_runs * longest, width)

    out = np.empty(resamples)
    chunk = max(1, _CELLS_PER_CHUNK // (n_runs * span * width))
    sums = (
        _block_sums(data, lengths)
        if metric == "mean" and n_runs * longest * width >= BLOCK_SUMS_FROM
        else None
    )
    for first in range(0, resamples, chunk):
        size = min(chunk, resamples - first)
        if n_runs == 1:
            chosen = np.zeros((size, 1), dtype=np.int64)
        else:
            chosen = rng.integers(0, n_runs, size=(size, n_runs))
        n = lengths[chosen][..., None]  # (size, runs, 1)
        # Circular blocks: block k of a resample starts at a uniform position of the run it was
        # drawn from.
        starts = np.floor(rng.random((size, n_runs, n_blocks)) * n).astype(np.int64)
        # the same draws, each block's sum from prefix sums instead of its values
        if sums is not None:
            out[first : first + size] = _mean_of_blocks(sums, chosen, starts, n, blocks, span)
            continue
        if same_block:
            start_of_position = np.repeat(starts, int(blocks[0]), axis=2)[..., :span]
            offset = positions % int(blocks[0])
        else:
            block = blocks[chosen][..., None]
            start_of_position = np.take_along_axis(starts, positions // block, axis=2)
            offset = positions % block
        rows = (start_of_position + offset) % n
        values = flat[chosen[..., None] * longest + rows]  # (size, runs, steps, width)
        if ragged:
            # positions past a shorter run's end
            values[np.broadcast_to(positions >= n, rows.shape)] = np.nan
        out[first : first + size] = statistic(values.reshape(size, -1), metric, axis=1)
    return out


def _block_sums(data: FloatArray, lengths: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
    """Per run, the prefix sums of its step values (every process's, NaN left out) and of their
    count, over the run laid twice end to end: a circular block's sum is then one difference,
    whatever its start."""
    n_runs, longest, _ = data.shape
    values = np.nansum(data, axis=2)
    counts = (~np.isnan(data)).sum(axis=2).astype(np.float64)
    twice_values = np.zeros((n_runs, 2 * longest + 1))
    twice_counts = np.zeros((n_runs, 2 * longest + 1))
    for run, n in enumerate(lengths.tolist()):
        twice_values[run, 1 : 2 * n + 1] = np.cumsum(
            np.concatenate([values[run, :n], values[run, :n]])
        )
        twice_counts[run, 1 : 2 * n + 1] = np.cumsum(
            np.concatenate([counts[run, :n], counts[run, :n]])
        )
    return twice_values, twice_counts


def _mean_of_blocks(
    sums: tuple[FloatArray, FloatArray],
    chosen: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    n: npt.NDArray[np.int64],
    blocks: npt.NDArray[np.int64],
    longest: int,
) -> FloatArray:
    """The mean of each resample that `replicates` would gather value by value (block k of a drawn
    run covers its positions k*b to (k+1)*b, none past the run's end, from its start on,
    circularly), from block sums: resamples x blocks differences instead of resamples x steps values
    (50 times less work at 100,000 steps)."""
    twice_values, twice_counts = sums
    block = blocks[chosen][..., None]  # (size, runs, 1)
    k = np.arange(starts.shape[2])
    covered = np.clip(np.minimum((k + 1) * block, np.minimum(n, longest)) - k * block, 0, None)
    row = chosen[..., None] * twice_values.shape[1]
    low, high = (row + starts).ravel(), (row + starts + covered).ravel()
    flat_values, flat_counts = twice_values.ravel(), twice_counts.ravel()
    total = (flat_values[high] - flat_values[low]).reshape(starts.shape).sum(axis=(1, 2))
    count = (flat_counts[high] - flat_counts[low]).reshape(starts.shape).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = total / count
    return means


def estimate_change(
    baseline: Sequence[Run],
    current: Sequence[Run],
    metric: str = "median",
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    log_scale: bool = True,
) -> Change:
    """The change of `metric` from baseline to current runs, with a percentile bootstrap interval.

    The ms interval bootstraps the difference itself. With `log_scale`, the relative interval
    bootstraps the ratio current/baseline on log values, so it respects positivity; it is not turned
    into ms, because scaling a ratio drawn from resamples with a large baseline by the observed
    baseline understates a change far past the baseline's noise. False: no ratio interval (values
    that may be 0, such as an operator's self time on a side that does not run it).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1; got {confidence!r}")
    rng = np.random.default_rng(seed)
    base_all, cur_all = pooled(baseline), pooled(current)
    if not base_all.size or not cur_all.size:
        raise ValueError("both sides need step times")
    length = (
        SUBSAMPLE_STEPS if subsampled(baseline, metric) and subsampled(current, metric) else None
    )
    cur_reps = replicates(current, metric, resamples=resamples, rng=rng, length=length)
    base_reps = replicates(baseline, metric, resamples=resamples, rng=rng, length=length)
    base_value = float(statistic(base_all, metric))
    # m out of n: each side's spread scaled from m steps a run to all of them
    if length is not None:
        cur_reps = _scaled(cur_reps, float(statistic(cur_all, metric)), length, current)
        base_reps = _scaled(base_reps, base_value, length, baseline)
    tail = (1 - confidence) / 2 * 100
    ratio: tuple[float, float] | tuple[None, None] = (None, None)
    if log_scale and base_value > 0 and bool((cur_reps > 0).all()) and bool((base_reps > 0).all()):
        log_low, log_high = np.percentile(np.log(cur_reps) - np.log(base_reps), [tail, 100 - tail])
        ratio = (math.expm1(float(log_low)), math.expm1(float(log_high)))
    low, high = (float(v) for v in np.percentile(cur_reps - base_reps, [tail, 100 - tail]))
    several = len(baseline) > 1 or len(current) > 1
    return Change(
        metric=metric,
        baseline=base_value,
        current=float(statistic(cur_all, metric)),
        low=float(low),
        high=float(high),
        confidence=confidence,
        method=METHOD_RUNS if several else METHOD_STEPS,
        resamples=resamples,
        baseline_steps=int(base_all.size),
        current_steps=int(cur_all.size),
        baseline_runs=len(baseline),
        current_runs=len(current),
        ratio_low=ratio[0],
        ratio_high=ratio[1],
        subsample=length,
    )


def _run_lengths(runs: Sequence[Run]) -> list[int]:
    """Each run's step positions (its longest process's steps)."""
    return [max((len(p) for p in run), default=0) for run in runs]


def subsampled(runs: Sequence[Run], metric: str) -> bool:
    """Whether a side's quantile is resampled m out of n: every run has SUBSAMPLE_FROM step
    positions or more."""
    lengths = _run_lengths(runs)
    return metric in _QUANTILES and bool(lengths) and min(lengths) >= SUBSAMPLE_FROM


def _scaled(reps: FloatArray, value: float, length: int, runs: Sequence[Run]) -> FloatArray:
    """Replicates of resamples of `length` steps a run, their deviations from the whole side's
    `value` scaled by sqrt(m / n): a quantile's spread shrinks as 1/sqrt(steps), so the spread of
    m-step resamples, scaled, is that of n-step ones (the m-out-of-n bootstrap)."""
    lengths = [length for length in _run_lengths(runs) if length]
    n = sum(lengths) / len(lengths)
    out: FloatArray = value + (reps - value) * math.sqrt(length / n)
    return out


def step_positions(runs: Sequence[Run]) -> int:
    """Independent step positions of a side: per run, its longest process (ranks step together)."""
    return sum(max((len(p) for p in run), default=0) for run in runs)


def warmup_length(times: Sequence[float], batch: int = MSER_BATCH) -> int:
    """How many leading steps are warm-up, by MSER-5 (White 1997; Hoad & Robinson 2011).

    The series is cut into batch means of `batch` steps; the truncation d (at most half the batches)
    that minimizes the squared standard error of the remaining mean, sum((x - mean)^2) / (k - d)^2,
    removes the start-up transient and little else: on a stationary series that quantity grows with
    d. Fewer than four batches cannot tell a transient from noise, so nothing is cut then.
    """
    k = len(times) // batch
    if k < 4:
        return 0
    means = np.asarray(times[: k * batch], dtype=float).reshape(k, batch).mean(axis=1)
    best_d, best = 0, math.inf
    for d in range(k // 2 + 1):
        rest = means[d:]
        score = float(((rest - rest.mean()) ** 2).sum()) / (k - d) ** 2
        if score < best - 1e-15 * max(1.0, abs(best) if math.isfinite(best) else 1.0):
            best_d, best = d, score
    if best_d == 0:
        return 0
    # MSER alone also cuts stationary noise now and then; keep a cut only when the removed start
    # really differs.
    head, rest = means[:best_d], means[best_d:]
    spread = float(rest.std(ddof=1)) if rest.size > 1 else 0.0
    if abs(float(head.mean() - rest.mean())) <= 4 * spread * math.sqrt(1 / best_d + 1 / rest.size):
        return 0
    return best_d * batch


def more_needed(change: Change, limit: float) -> float | None:
    """By what factor the data must grow (steps, or runs when a side has several) for the interval
    to decide.

    Intervals narrow as 1/sqrt(n). With the estimate below the limit, the upper end must come down
    to it; above the limit, the lower end must rise past it. None when the estimate sits on the
    limit: no amount of data decides that.
    """
    estimate = change.delta
    if estimate < limit:
        need, have = limit - estimate, change.high - estimate
    elif estimate > limit:
        need, have = estimate - limit, estimate - change.low
    else:
        return None
    if need <= 0 or have <= 0:
        return None
    return max(1.0, (have / need) ** 2)
