"""Collectives matched across ranks, and the ranks' clocks aligned by them: the first half of the
culprit analysis (stepcli.traces.analyses.culprit). A collective ends at nearly the same instant on
every rank, so the departures give each rank's clock offset; the matching is by process group and
sequence number where the trace names groups (NCCL), else by step, name and order (gloo).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepcli.stats import percentile
from stepcli.traces.analyses.arrivals import RankArrivals

MIN_ERROR_US = 1.0
# (process group name or "", the rank's key: step, name, seq, order)
Key = tuple[str, tuple[int, str, int, int]]


@dataclass
class Matched:
    """The collectives every member of their process group issued, as rows of the members'
    values."""

    ranks: list[int]
    keys: list[Key]
    # [collective] -> the rank indices (into ranks, ascending) of its group's members
    members: list[list[int]]
    arrive: list[list[float]]  # [collective][member], µs, each rank's own clock
    depart: list[list[float]]
    gaps: list[list[dict[str, float]]]
    details: list[list[dict[str, float]]]
    groups: dict[str, list[int]]  # process group name -> its member ranks, for the groups matched
    # [rank index] -> the clock of its times, when the trace says (stepcli recorded it)
    clocks: list[str | None]
    # [rank index] -> step -> (ms on a CPU, ms waiting for one)
    cpu_time: list[dict[int, tuple[float, float]]]


def match_collectives(parts: list[RankArrivals]) -> Matched | None:
    by_rank: dict[int, dict[Key, tuple[RankArrivals, int]]] = {}
    listed: dict[str, tuple[int, ...]] = {}  # group -> its members as a trace lists them
    clock_of: dict[int, str | None] = {}
    time_of: dict[int, dict[int, tuple[float, float]]] = {}
    for part in parts:
        if part.rank is None:
            continue
        clock = getattr(part, "clock", None)  # (arrivals pickled by an older stepcli have none)
        clock_of[part.rank] = clock if clock_of.get(part.rank, clock) == clock else None
        time_of.setdefault(part.rank, {}).update(getattr(part, "cpu_time", None) or {})
        index = by_rank.setdefault(part.rank, {})
        for i, key in enumerate(part.keys):
            at = part.groups[i] if i < len(part.groups) else -1
            group, listed_ranks = part.group_table[at] if at >= 0 else ("", ())
            if listed_ranks:
                listed.setdefault(group, listed_ranks)
            # a key seen twice (two windows of one step): the first
            index.setdefault((group, key), (part, i))
    if len(by_rank) < 2:
        return None
    # A group's members: the ranks it lists (those present), else the ranks whose traces have it;
    # without a group (gloo, older torch), every rank.
    present: dict[str, set[int]] = {}
    for rank, index in by_rank.items():
        for group, _ in index:
            present.setdefault(group, set()).add(rank)
    everyone = set(by_rank)
    member_sets = {
        group: everyone
        if not group
        else (set(listed[group]) & everyone if group in listed else ranks)
        for group, ranks in present.items()
    }
    candidates = {key for index in by_rank.values() for key in index}
    keys = sorted(
        (
            k
            for k in candidates
            if len(member_sets[k[0]]) >= 2 and all(k in by_rank[r] for r in member_sets[k[0]])
        ),
        key=lambda k: (k[1][0], k[0], k[1][1:]),
    )
    if not keys:
        return None
    ranks = sorted(set().union(*(member_sets[k[0]] for k in keys)))
    column = {rank: j for j, rank in enumerate(ranks)}
    members = [sorted(column[r] for r in member_sets[k[0]]) for k in keys]
    rows = [[by_rank[ranks[j]][key] for j in cols] for key, cols in zip(keys, members)]
    return Matched(
        ranks,
        keys,
        members,
        [[p.arrive_us[i] for p, i in row] for row in rows],
        [[p.depart_us[i] for p, i in row] for row in rows],
        [[p.gaps[i] for p, i in row] for row in rows],
        [[p.details[i] for p, i in row] for row in rows],
        {group: sorted(member_sets[group]) for group in sorted({k[0] for k in keys}) if group},
        [clock_of.get(rank) for rank in ranks],
        [time_of.get(rank, {}) for rank in ranks],
    )


def _pair_offset(
    arrive: list[tuple[float, float]], depart: list[tuple[float, float]]
) -> tuple[float, float]:
    """The offset of rank b's clock to rank a's, and its error, from the (a, b) arrivals and
    departures of the collectives they share (see `align`)."""
    diffs = sorted(b - a for a, b in depart)
    low = max(arr[1] - dep[0] for arr, dep in zip(arrive, depart))
    high = min(dep[1] - arr[0] for arr, dep in zip(arrive, depart))
    estimate = percentile(diffs, 50)
    spread = (percentile(diffs, 90) - percentile(diffs, 10)) / 2
    if low <= high:
        estimate = min(max(estimate, low), high)
        spread = min(spread, max(estimate - low, high - estimate))
    return estimate, max(MIN_ERROR_US, spread)


def align(
    arrive: list[list[float]],
    depart: list[list[float]],
    members: list[list[int]] | None = None,
    clocks: list[str | None] | None = None,
) -> tuple[list[float], list[float]]:
    """Per rank (column): its clock's offset to rank column 0 and the error of that estimate, µs.

    The estimate is the median difference of departures. Causality bounds it: no rank leaves a
    collective before the last rank arrived, so offset >= arrive_j - depart_0 and offset <= depart_j
    - arrive_0 for every collective; the estimate is kept inside those bounds, and its error is the
    smaller of half the departures' spread (10th to 90th percentile) and its distance to the farther
    bound.

    With process groups (`members`: each row's rank columns; every column by default) two ranks may
    share no collective (tensor-parallel ranks 0 and 3 of groups {0, 1}, {2, 3} with data-parallel
    groups {0, 2}, {1, 3}): a rank is aligned through the fewest ranks that do (0 -> 1 -> 3), the
    errors on the way summed. A rank sharing no collective with column 0 even so is aligned to the
    lowest rank of its own set (it never meets the others at a collective, so only offsets within
    the set matter).

    Ranks whose traces name the same clock (`clocks`: host and boot, which stepcli records) share it
    exactly: offset 0 between them, no error added; only ranks of different machines are aligned by
    collectives."""
    if members is None:
        members = [list(range(len(row))) for row in arrive]
    n = max((max(cols) + 1 for cols in members if cols), default=0)
    same_clock: dict[str, list[int]] = {}
    for j, clock in enumerate((clocks or [])[:n]):
        if clock:
            same_clock.setdefault(clock, []).append(j)

    def settle(b: int, offset: float, error: float) -> list[int]:
        """Give b, and every rank on b's clock, this offset and error; the ranks settled."""
        clock = clocks[b] if clocks and b < len(clocks) else None
        settled = same_clock.get(clock, [b]) if clock else [b]
        for j in settled:
            if not done[j]:
                offsets[j], errors[j], done[j] = offset, error, True
        return settled

    where: list[dict[int, int]] = [{} for _ in range(n)]  # column -> {row: position in the row}
    for r, cols in enumerate(members):
        for k, j in enumerate(cols):
            where[j][r] = k
    offsets, errors = [0.0] * n, [0.0] * n
    done = [False] * n
    for root in range(n):
        if done[root]:
            continue
        queue = settle(root, 0.0, 0.0)
        while queue:
            a = queue.pop(0)
            for b in range(n):
                shared = [] if done[b] else [r for r in where[a] if r in where[b]]
                if not shared:
                    continue
                pairs = [(where[a][r], where[b][r]) for r in shared]
                offset, error = _pair_offset(
                    [(arrive[r][i], arrive[r][k]) for r, (i, k) in zip(shared, pairs)],
                    [(depart[r][i], depart[r][k]) for r, (i, k) in zip(shared, pairs)],
                )
                queue.extend(settle(b, offsets[a] + offset, errors[a] + error))
    return offsets, errors
