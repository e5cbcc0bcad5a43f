"""Which rank holds the job back at its collectives, by how much, and why
(docs/concepts/culprit.md).

Under synchronous collectives every rank's step takes the same time: the rank that makes the others
wait looks no different from its victims. But it arrives last. From each rank's arrivals and
departures (stepcli.traces.analyses.arrivals), matched across ranks: by (process group, step,
collective name, the group's sequence number) among the group's members when the trace names process
groups (NCCL), else by (step, collective name, order in the step) across all ranks (gloo):

- **Clocks** are aligned by the collectives themselves: a collective ends at nearly the same instant
  on every rank, so a rank's offset to the reference (lowest) rank is the median difference of their
  departures, and the alignment error is half the spread (10th to 90th percentile) of those
  differences (at least 1 µs); two ranks that share no process group are aligned through ranks that
  do, their errors summed.
- Per collective, on aligned clocks, among the members of its process group only: the **culprit** is
  the last rank to arrive; its **lateness** is its arrival minus the arrival of the rank before it;
  every other member **waits** the culprit's arrival minus its own (a rank outside the group is not
  charged).
- Per rank, over the collectives it is a member of: times last, lateness ms/step, wait caused to
  others ms/step, own wait ms/step, and its median **lead** (its arrival minus the latest other
  member's).
- A culprit is named only when it is a finding, not noise: last in at least `MIN_LAST_SHARE` of its
  collectives and more often than chance would make it (at most `MAX_CHANCE`; last at random: 1 in
  its groups' size), or, since a sign alone cannot decide from few collectives (last at 3 of 3 on
  two ranks happens 1 time in 8), last at most of them (`MIN_LAST_SHARE`) by a mean lead (signed:
  early where it was not last) so far beyond the noise (its leads' own spread, or the spread of the
  other members' own gaps before arriving, which a lead is the difference of when all do the same
  work: whichever is smaller, the chance doubled) that a rank doing what the others do would show it
  at most `MAX_CHANCE` / (the ranks that could be the candidate) of the time: a one-sided Student
  t-test (`lead_t_chance`), lateness of at least `MIN_LATENESS_MS` and `MIN_STEP_SHARE` of the
  median step time per step, and its median lead above both the alignment error and `JITTER_FACTOR`
  standard errors of that median (from the lead's jitter, a robust standard deviation over the
  collectives): late by a consistent margin, not by scheduling noise. With process groups the same
  rule is also judged on each of its groups alone (but a group of every rank), over that group's
  collectives: a rank late only before its tensor-parallel all-reduce is last at half its
  collectives, and at all of its group's. The finding then names the group (of those that pass, the
  one with the largest cause). And its own extra time before arriving (its cause, below) must be at
  least `MIN_LATENESS_MS` per step: a rank that only leaves each collective later (gloo's ring
  completes on the ranks in turn) arrives later without doing anything longer.
- Its **cause**: over the collectives it arrived last at, its gap before arriving minus the median
  of the other members' same gap, per cause (stepcli.traces.analyses.arrivals.CAUSES), on the named
  group's collectives only when one is named; the largest extra is the cause, with the operator (or
  garbage collection) names that account for it. But when its steps' thread waited for a CPU
  (runnable, not running: stepcli.agent.cpuwait writes that and its time on a CPU per step into the
  traces it records) longer than its own work explains (the others' wait per ms on a CPU, times its
  own) by at least `CPU_WAIT_SHARE` of its lateness, and it did no more work than the others (its
  time on a CPU at most `SAME_WORK_SHARE` of it, or 1 ms, longer than theirs), the cause is
  `cpu_wait`: the wait stretched whatever the trace shows the time in.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcli.stats import median, percentile
from stepcli.traces.analyses.alignment import Matched, align, match_collectives
from stepcli.traces.analyses.arrivals import CAUSES, GC_PREFIX, RankArrivals

# (for the summary's one import)
from stepcli.traces.analyses.arrivals import rank_arrivals as rank_arrivals
from stepcli.traces.analyses.culpritwords import evidence, no_culprit_words
from stepcli.traces.analyses.significance import chance_of_last, jitter, lead_t_chance

MIN_LAST_SHARE = 0.6
# ... and a share chance would give at most this often (last at random: 1 / ranks)
MAX_CHANCE = 0.05
MIN_LATENESS_MS = 1.0
MIN_STEP_SHARE = 0.05
# waiting for a CPU is the cause when it explains at least this share of the lateness
CPU_WAIT_SHARE = 0.5
# ... and the rank ran on a CPU no more than this share (or 1 ms) longer than the others
SAME_WORK_SHARE = 0.25
# the median lead must also exceed this many standard errors of itself (from its jitter)
JITTER_FACTOR = 2.0
# the culprit's, per group or not
_OWN_FIGURES = ("last_share", "lateness_ms_per_step", "wait_caused_ms_per_step")
_MAX_LISTED = 1000  # collectives listed one by one in the JSON


@dataclass
class _GroupFigures:
    """One rank's figures over the collectives of one of its process groups."""

    size: int  # the group's members
    taken: int = 0
    times_last: int = 0
    late_us: float = 0.0
    caused_us: float = 0.0
    leads: list[float] = field(default_factory=list)
    others_gaps: list[float] = field(default_factory=list)

    def row(self, n_steps: int) -> dict[str, Any]:
        """The figures `_is_finding` and `_cause` read, as the rank's row has them."""
        return {
            "times_last": self.times_last,
            "last_share": self.times_last / self.taken,
            "lateness_ms_per_step": self.late_us / 1000 / n_steps,
            "wait_caused_ms_per_step": self.caused_us / 1000 / n_steps,
            "lead_median_ms": median(self.leads) / 1000,
            "lead_jitter_ms": jitter(self.leads) / 1000,
        }


def from_parts(parts: Sequence[Any], steps: Sequence[Any]) -> dict[str, Any] | None:
    """`analyze` over the file parts' arrivals (stepcli.traces.analyses.results.FilePart) and their
    steps' median time."""
    durations = [step.dur_ms for step in steps]
    return analyze(
        [p.arrivals for p in parts if p.arrivals], median(durations) if durations else None
    )


def analyze(
    parts: list[RankArrivals], median_step_ms: float | None = None
) -> dict[str, Any] | None:
    """The `culprit` section of `table --json` and the run summary, or None without collectives on
    2+ ranks."""
    matched = match_collectives(parts)
    if matched is None:
        return None
    offsets, errors = align(matched.arrive, matched.depart, matched.members, matched.clocks)
    error_us = sum(sorted(errors)[-2:])  # two ranks' arrivals carry both their errors
    tally = _tally(matched, offsets)
    n_steps = len(tally.per_step)
    rows = tally.rows(matched.ranks, n_steps)
    candidate = max(range(len(matched.ranks)), key=lambda j: (tally.late_us[j], -j))
    min_lead_us = _lead_floor(error_us, rows[candidate]["lead_jitter_ms"], tally.taken[candidate])
    culprit, no_culprit = _judge(
        matched, tally, rows, candidate, error_us, min_lead_us, median_step_ms
    )
    return {
        "collectives": len(matched.keys),
        "steps": n_steps,
        "process_groups": matched.groups,
        "alignment": _alignment(matched, offsets, errors, error_us),
        "thresholds": {
            "min_last_share": MIN_LAST_SHARE,
            "max_chance": MAX_CHANCE,
            "min_lateness_ms_per_step": MIN_LATENESS_MS,
            "min_step_share": MIN_STEP_SHARE,
            "min_lead_ms": round(min_lead_us / 1000, 4),
            # the size test (or the sign test above): one-sided t-test chance of the candidate's
            # mean lead against the others' noise, a finding at most max_chance / ranks
            "lead_t_chance": round(
                lead_t_chance(tally.leads[candidate], tally.others_gaps[candidate]), 6
            ),
            "min_cause_ms_per_step": MIN_LATENESS_MS,
        },
        "ranks": rows,
        "culprit": culprit,
        "no_culprit": no_culprit,
        "per_step": [
            {
                "step": step,
                # the latest, summed
                "last_rank": matched.ranks[max(range(len(values)), key=lambda j: values[j])],
                "lateness_ms": {str(r): round(v / 1000, 3) for r, v in zip(matched.ranks, values)},
            }
            for step, values in tally.per_step.items()
        ],
        "per_collective": tally.listed,
    }


@dataclass
class _Tally:
    """Per rank, over the collectives it is a member of: what one pass over the matched collectives
    counts."""

    late_us: list[float]
    caused_us: list[float]
    waited_us: list[float]
    times_last: list[int]
    taken: list[int]  # collectives the rank is a member of
    # ... and the sum of 1 / members over them (how often it would be last at random)
    chance: list[float]
    leads: list[list[float]]
    others_gaps: list[list[float]]  # the other members' median gap, per collective
    last_at: list[int] = field(default_factory=list)  # per collective: the rank last to arrive
    per_step: dict[int, list[float]] = field(default_factory=dict)  # lateness per step and rank
    # the first _MAX_LISTED collectives, for the JSON
    listed: list[dict[str, Any]] = field(default_factory=list)
    # per (rank, process group): collectives, times last, lateness and waits caused there, and the
    # leads
    in_group: dict[tuple[int, str], _GroupFigures] = field(default_factory=dict)

    def rows(self, ranks: Sequence[int], n_steps: int) -> list[dict[str, Any]]:
        """The `ranks` rows of the section."""
        return [
            {
                "rank": ranks[j],
                "times_last": self.times_last[j],
                "last_share": self.times_last[j] / self.taken[j],
                "lateness_ms_per_step": self.late_us[j] / 1000 / n_steps,
                "wait_caused_ms_per_step": self.caused_us[j] / 1000 / n_steps,
                "waited_ms_per_step": self.waited_us[j] / 1000 / n_steps,
                "lead_median_ms": median(self.leads[j]) / 1000,
                "lead_jitter_ms": jitter(self.leads[j]) / 1000,
            }
            for j in range(len(ranks))
        ]


def _tally(matched: Matched, offsets: Sequence[float]) -> _Tally:
    """One pass over the matched collectives on aligned clocks: who was last, by how much, who
    waited."""
    ranks, n = matched.ranks, len(matched.ranks)
    tally = _Tally(
        late_us=[0.0] * n,
        caused_us=[0.0] * n,
        waited_us=[0.0] * n,
        times_last=[0] * n,
        taken=[0] * n,
        chance=[0.0] * n,
        leads=[[] for _ in range(n)],
        others_gaps=[[] for _ in range(n)],
        per_step={step: [0.0] * n for step in sorted({key[1][0] for key in matched.keys})},
    )
    for (group, key), cols, arrive, gaps in zip(
        matched.keys, matched.members, matched.arrive, matched.gaps
    ):
        aligned = [a - offsets[j] for j, a in zip(cols, arrive)]
        order = sorted(range(len(cols)), key=lambda k: aligned[k])
        last = cols[order[-1]]
        lateness = aligned[order[-1]] - aligned[order[-2]]
        waits = [aligned[order[-1]] - a for a in aligned]
        tally.times_last[last] += 1
        tally.late_us[last] += lateness
        tally.caused_us[last] += sum(waits)
        # the latest arrival of the others: the last's for everyone but the last, the second last's
        # for it
        first_out, second_out = aligned[order[-1]], aligned[order[-2]]
        others_gap = _OthersGap(gaps)
        for k, j in enumerate(cols):
            tally.waited_us[j] += waits[k]
            tally.taken[j] += 1
            tally.chance[j] += 1 / len(cols)
            tally.leads[j].append(aligned[k] - (second_out if k == order[-1] else first_out))
            figures = tally.in_group.setdefault((j, group), _GroupFigures(len(cols)))
            figures.taken += 1
            figures.leads.append(tally.leads[j][-1])
            tally.others_gaps[j].append(others_gap(k))
            figures.others_gaps.append(tally.others_gaps[j][-1])
        mine = tally.in_group[(last, group)]
        mine.times_last += 1
        mine.late_us += lateness
        mine.caused_us += sum(waits)
        tally.per_step[key[0]][last] += lateness
        tally.last_at.append(last)
        if len(tally.listed) < _MAX_LISTED:
            tally.listed.append(
                {
                    "step": key[0],
                    "name": key[1],
                    "order": key[3],
                    "group": group or None,
                    "seq": key[2] if key[2] >= 0 else None,
                    "last_rank": ranks[last],
                    "lateness_ms": round(lateness / 1000, 3),
                    "waits_ms": {
                        str(ranks[j]): round(waits[k] / 1000, 3)
                        for k, j in enumerate(cols)
                        if j != last
                    },
                    # arrivals on the reference rank's clock (the trace's µs), for `stepcli merge`
                    "arrive_us": {str(ranks[j]): round(aligned[k], 3) for k, j in enumerate(cols)},
                }
            )
    return tally


def _judge(
    matched: Matched,
    tally: _Tally,
    rows: list[dict[str, Any]],
    candidate: int,
    error_us: float,
    min_lead_us: float,
    median_step_ms: float | None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the culprit, or why the latest rank is none): judged on its process groups alone first, then
    on all."""
    n, n_steps = len(matched.ranks), len(tally.per_step)
    # a rank last at random: 1 in (the size of its groups), on average over its collectives
    group_size = tally.taken[candidate] / tally.chance[candidate]
    why_not = _why_not(
        rows[candidate],
        min_lead_us,
        median_step_ms,
        tally.taken[candidate],
        group_size,
        (tally.leads[candidate], tally.others_gaps[candidate]),
        n,
    )
    culprit = _group_culprit(matched, tally, rows, candidate, error_us, median_step_ms)
    if culprit is None and why_not is None:
        culprit = _cause(matched, candidate, tally.last_at, rows[candidate], n_steps)
        # Late, but doing nothing longer than the others before arriving: it left the previous
        # collective later (gloo's ring completes on the ranks in turn), which is the collective's
        # doing, not the rank's.
        if culprit["cause_ms_per_step"] < MIN_LATENESS_MS:
            why_not = {"reason": "no_extra_work", "cause_ms_per_step": culprit["cause_ms_per_step"]}
            culprit = None
    if culprit is not None or why_not is None:
        return culprit, None
    # The test that decided (the first the latest rank failed), with the figures it judged, in words
    # once here: the terminal, --json and the page all show this sentence.
    row = rows[candidate]
    no_culprit = {
        "rank": matched.ranks[candidate],
        "times_last": row["times_last"],
        "collectives": tally.taken[candidate],
        "last_share": row["last_share"],
        "lateness_ms_per_step": row["lateness_ms_per_step"],
        "lead_median_ms": row["lead_median_ms"],
        **why_not,
    }
    no_culprit["words"] = no_culprit_words(no_culprit)
    return None, no_culprit


def _group_culprit(
    matched: Matched,
    tally: _Tally,
    rows: list[dict[str, Any]],
    candidate: int,
    error_us: float,
    median_step_ms: float | None,
) -> dict[str, Any] | None:
    """The candidate judged on each of its process groups alone (a rank late only before its
    tensor-parallel all-reduce is last at half its collectives); a group of every rank is the whole
    again. Of the groups where it is a finding, the one with the largest cause; None when none."""
    n, n_steps = len(matched.ranks), len(tally.per_step)
    found: tuple[str, dict[str, Any]] | None = None
    for (j, group), figures in sorted(tally.in_group.items()):
        if j != candidate or not group or len(matched.groups[group]) == n:
            continue
        row = figures.row(n_steps)
        group_min_lead_us = _lead_floor(error_us, row["lead_jitter_ms"], figures.taken)
        if _is_finding(
            row,
            group_min_lead_us,
            median_step_ms,
            figures.taken,
            figures.size,
            (figures.leads, figures.others_gaps),
            figures.size,
        ):
            cause = _cause(matched, candidate, tally.last_at, row, n_steps, group)
            if cause["cause_ms_per_step"] < MIN_LATENESS_MS:
                continue  # late, but not by any work of its own (see below)
            if found is None or cause["cause_ms_per_step"] > found[1]["cause_ms_per_step"]:
                found = (group, cause)
    if found is None:
        return None
    group, culprit = found
    figures = tally.in_group[(candidate, group)]
    culprit["group"] = {
        "name": group,
        "ranks": matched.groups[group],
        "collectives": figures.taken,
        "times_last": figures.times_last,
        **{k: culprit[k] for k in _OWN_FIGURES},
    }
    culprit |= {k: rows[candidate][k] for k in _OWN_FIGURES}  # the rank's own, as its row
    culprit["evidence"] = evidence(culprit)
    return culprit


def _alignment(
    matched: Matched, offsets: Sequence[float], errors: Sequence[float], error_us: float
) -> dict[str, Any]:
    ranks = matched.ranks
    return {
        "reference_rank": ranks[0],
        "offsets_ms": {str(r): round(o / 1000, 4) for r, o in zip(ranks, offsets)},
        "errors_ms": {str(r): round(e / 1000, 4) for r, e in zip(ranks, errors)},
        "error_ms": round(error_us / 1000, 4),
        # every rank's trace names the same clock (one machine): nothing was estimated
        "one_clock": bool(matched.clocks[0]) and len(set(matched.clocks)) == 1,
    }


def _lead_floor(error_us: float, jitter_ms: float, count: int) -> float:
    """The median lead a finding needs, µs: above the alignment error and `JITTER_FACTOR` standard
    errors of the median (1.2533 x jitter / sqrt(collectives)). A rank last every time by 80 +- 40
    ms (a loaded machine) is late by a consistent margin; 2 +- 5 ms over a few collectives is
    not."""
    return max(error_us, JITTER_FACTOR * 1.2533 * jitter_ms * 1000 / math.sqrt(max(count, 1)))


def _is_finding(
    row: dict[str, Any],
    min_lead_us: float,
    median_step_ms: float | None,
    count: int,
    ranks: float,
    leads: tuple[Sequence[float], Sequence[float]] = ((), ()),
    candidates: int = 2,
) -> bool:
    return _why_not(row, min_lead_us, median_step_ms, count, ranks, leads, candidates) is None


def _why_not(
    row: dict[str, Any],
    min_lead_us: float,
    median_step_ms: float | None,
    count: int,
    ranks: float,
    leads: tuple[Sequence[float], Sequence[float]] = ((), ()),
    candidates: int = 2,
) -> dict[str, Any] | None:
    """None when the row is a finding, else the first test it fails (`reason`) with the bar it
    missed: what the no-culprit sentence says (culpritwords.no_culprit_words)."""
    if row["last_share"] < MIN_LAST_SHARE:
        return {"reason": "not_last_often", "min_last_share": MIN_LAST_SHARE}
    chance = chance_of_last(row["times_last"], count, ranks)
    # last most of the time (MIN_LAST_SHARE, above) by a mean lead far beyond the others' noise: its
    # leads are signed (early at the collectives it was not last at), so a lead of 13 ms at 6 of 8
    # collectives and -0.5 ms at the other 2 decides where the sign alone (6 of 8: 1 in 7 by chance)
    # cannot; the candidate is the latest of the ranks: a chance that small for any of them
    if chance > MAX_CHANCE and lead_t_chance(*leads) > MAX_CHANCE / max(candidates, 1):
        return {"reason": "chance", "chance": chance, "max_chance": MAX_CHANCE}
    if row["lead_median_ms"] * 1000 <= min_lead_us:
        return {"reason": "lead_in_noise", "min_lead_ms": min_lead_us / 1000}
    floor = max(MIN_LATENESS_MS, MIN_STEP_SHARE * (median_step_ms or 0.0))
    if row["lateness_ms_per_step"] < floor:
        return {"reason": "little_lateness", "min_lateness_ms_per_step": floor}
    return None


class _OthersGap:
    """The other members' median gap before arriving (µs), at one collective, for each member in
    turn: the members' gaps are summed and sorted once, and each member's answer is the percentile
    of that list without it (a slice, not a sum per member: a group of 128 ranks took 128 x 128 sums
    per collective, 1.1 s of a 1,024-rank job's merge)."""

    def __init__(self, gaps: list[dict[str, float]]) -> None:
        self.totals = [sum(gap.values()) for gap in gaps]
        self.ordered = sorted(self.totals)
        # a NaN has no place in a sorted list: then the long way
        self.exact = all(t == t for t in self.totals)

    def __call__(self, k: int) -> float:
        if not self.exact:
            return median([t for i, t in enumerate(self.totals) if i != k])
        gone = bisect_left(self.ordered, self.totals[k])
        return percentile(self.ordered[:gone] + self.ordered[gone + 1 :], 50)


def _cause(
    matched: Matched,
    culprit: int,
    last_at: list[int],
    row: dict[str, Any],
    n_steps: int,
    group: str | None = None,
) -> dict[str, Any]:
    """What the culprit did longer than the others before the collectives it arrived last at (on
    `group` only, when given)."""
    extra = dict.fromkeys(CAUSES, 0.0)
    names: dict[str, float] = {}
    for c, last in enumerate(last_at):
        if last != culprit or (group is not None and matched.keys[c][0] != group):
            continue
        gaps, details = matched.gaps[c], matched.details[c]
        mine = matched.members[c].index(culprit)
        others = [k for k in range(len(gaps)) if k != mine]  # the other members of its group
        for cause in CAUSES:
            extra[cause] += gaps[mine].get(cause, 0.0) - median(
                [gaps[k].get(cause, 0.0) for k in others]
            )
        for name in set(details[mine]):
            names[name] = (
                names.get(name, 0.0)
                + details[mine][name]
                - median([details[k].get(name, 0.0) for k in others])
            )
    per_step = {cause: value / 1000 / n_steps for cause, value in extra.items()}
    cause = max(CAUSES, key=lambda c: (per_step[c], -CAUSES.index(c)))
    excess = _cpu_excess(matched, culprit, group)
    cpu_wait = excess[1] if excess is not None else None
    # Time waiting for a CPU stretches whatever the thread was doing (an operator, Python code):
    # when the rank did no more work than the others and the wait explains most of its lateness, the
    # wait is the cause, whatever the trace shows the time spent in. (A rank with more work waits
    # more too, and far more per ms of work than ranks that sleep in collectives, which the
    # scheduler favours when they wake: then its work is the cause.)
    lateness = row["lateness_ms_per_step"]
    if (
        excess is not None
        and excess[0] <= max(MIN_LATENESS_MS, SAME_WORK_SHARE * excess[2])
        and excess[1] >= max(MIN_LATENESS_MS, CPU_WAIT_SHARE * lateness)
    ):
        cause = "cpu_wait"
    cause_ms = excess[1] if cause == "cpu_wait" and excess is not None else per_step.get(cause, 0.0)
    wanted = (
        (lambda name: name.startswith(GC_PREFIX))
        if cause == "gc"
        else (lambda name: not name.startswith(GC_PREFIX))
    )
    # (names that account for at least 0.05 ms per step)
    top = sorted(
        ((v / 1000 / n_steps, k) for k, v in names.items() if wanted(k) and v >= 50 * n_steps),
        reverse=True,
    )
    top = top[:3]
    rank = matched.ranks[culprit]
    result = {
        "rank": rank,
        "last_share": row["last_share"],
        "lateness_ms_per_step": row["lateness_ms_per_step"],
        "wait_caused_ms_per_step": row["wait_caused_ms_per_step"],
        "cause": cause,
        "cause_ms_per_step": cause_ms,
        "causes_ms_per_step": {c: round(v, 3) for c, v in per_step.items()}
        | {"cpu_wait": None if cpu_wait is None else round(cpu_wait, 3)},
        "top": [{"name": name, "ms_per_step": round(ms, 3)} for ms, name in top]
        if cause in ("gc", "cpu_operators")
        else [],
    }
    result["evidence"] = evidence(result)
    return result


def _cpu_excess(
    matched: Matched, culprit: int, group: str | None
) -> tuple[float, float, float] | None:
    """Per step: how much longer the culprit's steps' thread ran on a CPU than the other members'
    (their median), how much longer it waited for one than its own work explains (its wait minus its
    time on a CPU times the other members' median wait per ms on a CPU: on a machine evenly short of
    cores every rank waits in proportion to its work), and its own time on a CPU. Over the analyzed
    steps every member measured; None when not all of them did (a trace not recorded by stepcli, or
    not on Linux)."""
    members = matched.groups[group] if group else matched.ranks
    columns = [matched.ranks.index(rank) for rank in members if rank in matched.ranks]
    steps = sorted({key[1][0] for key in matched.keys})
    times = matched.cpu_time
    measured = [s for s in steps if all(s in times[j] for j in columns)]
    if not measured or culprit not in columns or len(columns) < 2:
        return None
    others = [j for j in columns if j != culprit]

    def totals(j: int) -> tuple[float, float]:
        return sum(times[j][s][0] for s in measured), sum(times[j][s][1] for s in measured)

    ran, waited = totals(culprit)
    rate = median([w / r if r > 0 else 0.0 for r, w in map(totals, others)])
    ran_more = ran - median([totals(j)[0] for j in others])
    return ran_more / len(measured), (waited - ran * rate) / len(measured), ran / len(measured)
