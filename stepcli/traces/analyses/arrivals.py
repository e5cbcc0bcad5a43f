"""Each rank's collectives from its own trace: when it arrived, when it left, and what it did before
arriving.

Read from the columns the summary already decoded (stepcli.traces.read.columns), so no trace is read
twice. Pure.

- **Arrival**: the host-side start of a collective in the process that runs the steps: the outermost
  `c10d::*`, `record_param_comms` or `nccl:*` event of any of its threads (DDP on CUDA calls
  collectives from the autograd engine's thread), or `gloo:*` on the steps' thread (on other
  threads, `gloo:*` is gloo's worker doing the work).
- **Departure**: when the collective finished: the end of its NCCL kernel on the device, the one
  whose launch (same `correlation`) sits inside the collective; without correlations, of its
  matching `gloo:*` event on a gloo worker thread or NCCL kernel (the k-th collective of the window
  pairs with the k-th of those when the counts agree); else the end of the host-side call (a
  synchronous collective).
- **Process group**: on NCCL traces torch nests a `record_param_comms` event in each host-side
  collective whose args name its process group (`Process Group Name`), the group's member ranks
  (`Process Group Ranks`) and the collective's sequence number on that group (`Seq`, the same on
  every member). The first one inside the collective gives it its group. gloo traces (and older
  torch) have none.
- **Key**: (step, collective name, sequence number or -1, order among the step's collectives with
  the same name, group and sequence number), with the group beside it (`groups`, into
  `group_table`). With a group, collectives are matched across the group's members by its sequence
  number (exact, even when a rank's trace lost an event); without one, by the order in which every
  rank issues the step's collectives of that name.
- **Gap before arrival**: from the later of the previous collective's host-side end and its
  departure (time spent waiting for the others is not the rank's own work) to this arrival, split
  into causes (`CAUSES`) over the process's threads (gloo's workers left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepcli.traces.analyses import arrays as col
from stepcli.traces.read import typedcolumns
from stepcli.traces.read.names import STEP_PREFIX, step_of

_HOST_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:")
# The agent's annotation of a Python garbage collection (stepcli.agent.gcpauses).
GC_PREFIX = "python gc (gen "
_DATALOADER_PREFIX = "enumerate(DataLoader)"
_COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy", "hipMemcpy", "Memcpy HtoD")
_COMPILE_MARKERS = ("compile_inner", "call_user_compiler", "compile_fx", "TorchDynamo Cache Lookup")
# Why a rank arrived late, most specific first (the order breaks ties).
CAUSES = ("gc", "dataloader", "host_to_device", "compile", "cpu_operators", "no_operator")
_TOP_DETAIL = 8  # operator names kept per gap


@dataclass
class RankArrivals:
    """One rank's collectives in one trace, in the order it issued them; small and picklable (a
    FilePart field)."""

    rank: int | None
    # (step, name, seq or -1, order)
    keys: list[tuple[int, str, int, int]] = field(default_factory=list)
    arrive_us: list[float] = field(default_factory=list)  # the trace's own clock
    depart_us: list[float] = field(default_factory=list)
    # cause -> µs in the gap before arrival
    gaps: list[dict[str, float]] = field(default_factory=list)
    # operator or gc annotation name -> µs
    details: list[dict[str, float]] = field(default_factory=list)
    # per collective: its process group in group_table; -1: none
    groups: list[int] = field(default_factory=list)
    # (process group name, its member ranks; () when the trace does not list them all) of the groups
    # used
    group_table: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    # the clock of its times (host and boot) when stepcli recorded it: ranks sharing one
    clock: str | None = None
    # need no alignment step -> (ms on a CPU, ms waiting for one) of its steps' thread, when stepcli
    # recorded the trace (Linux)
    cpu_time: dict[int, tuple[float, float]] = field(default_factory=dict)


def _category(names: list[str]) -> np.ndarray:
    """Per name code: 0 operator, 1 gc, 2 dataloader, 3 host-to-device copy, 4 compilation, 5 step,
    6 collective."""

    def one(name: str) -> int:
        if name.startswith(STEP_PREFIX):
            return 5
        if name.startswith(_HOST_PREFIXES):
            return 6
        if name.startswith(GC_PREFIX):
            return 1
        if name.startswith(_DATALOADER_PREFIX):
            return 2
        if name.startswith(_COPY_PREFIXES):
            return 3
        if any(marker in name for marker in _COMPILE_MARKERS):
            return 4
        return 0

    return np.array([one(n) for n in names] or [0], np.int8)


def _outermost(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions (of spans sorted by start, longer first) not inside an earlier one."""
    if not len(start):
        return np.zeros(0, np.int64)
    reach = np.maximum.accumulate(end)
    keep = np.ones(len(start), bool)
    keep[1:] = start[1:] >= reach[:-1]
    return np.nonzero(keep)[0]


def _outermost_per_thread(
    columns: typedcolumns.Columns, events: np.ndarray, thread: np.ndarray
) -> np.ndarray:
    """The events (sorted by start, longer first) inside no other event of their thread, sorted by
    start."""
    kept = []
    for code in col.unique(thread[events]).tolist():
        mine = events[thread[events] == code]
        kept.append(mine[_outermost(columns.ts[mine], columns.ts[mine] + columns.dur[mine])])
    out = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    return out[np.argsort(columns.ts[out], kind="stable")]


def _departures(
    columns: typedcolumns.Columns,
    gloo_work: np.ndarray,
    host: np.ndarray,
    thread: np.ndarray,
    host_end: np.ndarray,
) -> np.ndarray:
    """The end of each host collective's completion event (gloo worker thread, NCCL kernel), else
    its own end.

    An NCCL kernel belongs to the host collective its launch sits in: the kernel's `correlation`
    names the launch call, on the collective's thread. With several process groups on different
    streams, kernels need not start in the order the collectives were issued, so pairing by order
    would mismatch them. Without correlations (and for gloo's workers), the k-th collective pairs
    with the k-th completion event when the counts agree."""
    name_is_nccl = np.array(["nccl" in n[:16].lower() for n in columns.names] or [False], bool)
    gloo = np.nonzero(gloo_work)[0]
    kernels = np.nonzero((columns.kind == typedcolumns.DEVICE) & name_is_nccl[columns.name])[0]
    launched = _launched_in(columns, kernels, host, thread)
    if launched is not None:
        by_launch: np.ndarray = np.maximum(launched, host_end)
        return by_launch
    for done in (gloo, kernels):
        if len(done) == len(host_end) and len(done):
            done = done[np.argsort(columns.ts[done], kind="stable")]
            paired: np.ndarray = np.maximum(columns.ts[done] + columns.dur[done], host_end)
            return paired
    return host_end


def _launched_in(
    columns: typedcolumns.Columns, kernels: np.ndarray, host: np.ndarray, thread: np.ndarray
) -> np.ndarray | None:
    """Per host collective, the latest end of the NCCL kernels launched inside it (-inf: none), or
    None when no kernel's launch is found inside one."""
    kernels = kernels[columns.corr[kernels] >= 0]
    if not len(kernels) or not len(host):
        return None
    wanted = columns.corr[kernels]
    launches = np.nonzero(
        (columns.kind != typedcolumns.DEVICE)
        & (columns.kind != typedcolumns.MEMORY)
        & (columns.corr >= 0)
    )[0]
    launches = launches[np.isin(columns.corr[launches], wanted)]
    if not len(launches):
        return None
    # the first per id
    launch_of = dict(zip(columns.corr[launches].tolist()[::-1], launches.tolist()[::-1]))
    # host collectives by thread, then start
    by_thread = np.lexsort((columns.ts[host], thread[host]))
    host_thread, host_start = thread[host][by_thread], columns.ts[host][by_thread]
    host_stop = host_start + columns.dur[host][by_thread]
    out = np.full(len(host), -np.inf)
    found = False
    for kernel, corr in zip(kernels.tolist(), wanted.tolist()):
        launch = launch_of.get(corr)
        if launch is None:
            continue
        lo = np.searchsorted(host_thread, thread[launch], side="left")
        hi = np.searchsorted(host_thread, thread[launch], side="right")
        at = lo + np.searchsorted(host_start[lo:hi], columns.ts[launch], side="right") - 1
        if at < lo or columns.ts[launch] > host_stop[at]:
            continue
        i = by_thread[at]
        out[i] = max(out[i], columns.ts[kernel] + columns.dur[kernel])
        found = True
    return out if found else None


def rank_arrivals(
    columns: typedcolumns.Columns,
    rank: int | None,
    incomplete_step: int | None = None,
    clock: str | None = None,
    cpu_time: dict[int, tuple[float, float]] | None = None,
    with_gaps: bool = True,
) -> RankArrivals | None:
    """The rank's collectives inside its complete steps, or None when the trace has none.
    `with_gaps=False`: without the culprit's figures (each gap by cause and its operators, empty),
    for a reader that only matches and replays the collectives (two thirds of a what-if lane)."""
    if not len(columns) or rank is None:
        return None
    by_name = _category(columns.names)
    if not np.any(by_name == 6):  # no collective's name: nothing to look at per event
        return None
    category = by_name[columns.name]
    cpu = (columns.kind == typedcolumns.OTHER_CPU) | (columns.kind == typedcolumns.USER_ANNOTATION)
    steps = np.nonzero(cpu & (category == 5))[0]
    if not steps.size or not np.any(category == 6):
        return None
    thread = columns.pid.astype(np.int64) * max(len(columns.ids), 1) + columns.tid
    main_thread = np.bincount(thread[steps]).argmax()
    main_pid = columns.pid[steps[thread[steps] == main_thread][0]]
    # Every CPU event of the process that runs the steps, by start (longer first): DDP on CUDA calls
    # its collectives from the autograd engine's thread, so they are looked for on every thread of
    # the process.
    events = np.nonzero(cpu & (columns.pid == main_pid))[0]
    events = events[
        col.thread_order(np.zeros(len(events), np.int64), columns.ts[events], columns.dur[events])
    ]
    is_gloo = np.array([n.startswith("gloo:") for n in columns.names] or [False], bool)[
        columns.name
    ]
    # gloo's worker threads: the collectives' completion
    gloo_work = cpu & is_gloo & (thread != main_thread)
    host = events[(category[events] == 6) & ~gloo_work[events]]
    host = _outermost_per_thread(columns, host, thread)
    if not host.size:
        return None
    arrive = columns.ts[host]
    host_end = arrive + columns.dur[host]
    depart = _departures(columns, gloo_work, host, thread, host_end)
    step_numbers, step_start, step_end = _step_table(columns, steps, incomplete_step)
    where = np.searchsorted(step_start, arrive, side="right") - 1
    inside = (where >= 0) & (arrive < step_end[np.maximum(where, 0)])
    out = RankArrivals(rank, clock=clock, cpu_time=cpu_time or {})
    previous_done = np.concatenate(
        ([step_start[0] if len(step_start) else arrive[0]], np.maximum(host_end, depart))
    )
    gap_from = np.minimum(previous_done[:-1], arrive)
    if with_gaps:
        causes, details = _gaps(
            columns, events[~gloo_work[events]], category, thread, gap_from, arrive
        )
    else:
        nothing: dict[str, float] = {}
        causes = details = [nothing] * len(host)
    group_at = _host_groups(columns, host, thread)
    table: dict[tuple[str, tuple[int, ...]], int] = {}
    seen: dict[tuple[int, int, str, int], int] = {}
    # (a group's member list, parsed once: 128 ranks are 128 items)
    ranks_of: dict[str, tuple[int, ...]] = {}
    for i in np.nonzero(inside)[0].tolist():
        step = step_numbers[where[i]]
        if step < 0:
            continue
        name = columns.names[columns.name[host[i]]]
        group, seq = -1, -1
        found = group_at.get(i)
        if found is not None:
            ranks = ranks_of.get(found[2])
            if ranks is None:
                ranks = ranks_of[found[2]] = members(found[2])
            entry = (found[0], ranks)
            group = table.setdefault(entry, len(table))
            seq = found[1]
        order = seen.get((step, group, name, seq), 0)
        seen[(step, group, name, seq)] = order + 1
        out.keys.append((step, name, seq, order))
        out.groups.append(group)
        out.arrive_us.append(float(arrive[i]))
        out.depart_us.append(float(depart[i]))
        out.gaps.append(causes[i])
        out.details.append(details[i])
    out.group_table = list(table)
    return out if out.keys else None


def members(text: str) -> tuple[int, ...]:
    """The ranks of torch's `Process Group Ranks` ("[0, 1, 2, 3]"); () when it is cut short ("[0, 1,
    ..., 63]", torch lists at most 30) or unreadable."""
    inner = text.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        return ()
    items = [item.strip() for item in inner[1:-1].split(",")]
    if not all(item.isascii() and item.isdecimal() and len(item) <= 10 for item in items):
        return ()
    return tuple(sorted({int(item) for item in items}))


def _host_groups(
    columns: typedcolumns.Columns, host: np.ndarray, thread: np.ndarray
) -> dict[int, tuple[str, int, str]]:
    """Per host collective (position in `host`): the process group of the first `record_param_comms`
    with one inside it on its thread (or of itself)."""
    if not columns.groups or not len(host):
        return {}
    carriers = np.array(sorted(columns.groups), np.int64)
    carriers = carriers[np.lexsort((columns.ts[carriers], thread[carriers]))]
    carrier_thread, carrier_ts = thread[carriers], columns.ts[carriers]
    out: dict[int, tuple[str, int, str]] = {}
    for i, index in enumerate(host.tolist()):
        lo = np.searchsorted(carrier_thread, thread[index], side="left")
        hi = np.searchsorted(carrier_thread, thread[index], side="right")
        start, end = columns.ts[index], columns.ts[index] + columns.dur[index]
        at = lo + np.searchsorted(carrier_ts[lo:hi], start, side="left")
        if at < hi and carrier_ts[at] <= end:
            out[i] = columns.groups[int(carriers[at])]
    return out


def _step_table(
    columns: typedcolumns.Columns, steps: np.ndarray, incomplete_step: int | None
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Step numbers (-1: unusable or incomplete), starts and ends of the step annotations, by
    start."""
    steps = steps[np.argsort(columns.ts[steps], kind="stable")]
    numbers = []
    for index in steps.tolist():
        found = step_of(columns.names[columns.name[index]])
        number = -1 if found is None else found
        numbers.append(-1 if number == incomplete_step else number)
    return numbers, columns.ts[steps], columns.ts[steps] + columns.dur[steps]


def _union(columns: typedcolumns.Columns, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    start = columns.ts[events]
    return col.union_arrays(start, start + columns.dur[events])


def _covered(union: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    starts, ends = union
    if not len(starts):
        return np.zeros(len(lo))
    before = np.concatenate(([0.0], np.cumsum(ends - starts)))

    def length_before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right")
        prev = np.maximum(k - 1, 0)
        return np.where(k > 0, before[prev] + np.minimum(t, ends[prev]) - starts[prev], 0.0)

    return np.asarray(length_before(hi) - length_before(lo))


def _gaps(
    columns: typedcolumns.Columns,
    events: np.ndarray,
    category: np.ndarray,
    thread: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per gap [lo, hi) in the process: µs per cause and the top-level operator (or gc) names by
    their time."""
    # steps and collectives are no work
    work = events[(category[events] != 5) & (category[events] != 6)]
    cause_of = {1: "gc", 2: "dataloader", 3: "host_to_device", 4: "compile"}
    per_cause = {
        label: _covered(_union(columns, work[category[work] == c]), lo, hi)
        for c, label in cause_of.items()
    }
    special = work[(category[work] >= 1) & (category[work] <= 4)]
    special_union = _union(columns, special)
    # Operators, and gc pauses; an annotation's own time is Python code between operators: no
    # operator.
    ops = work[
        ((category[work] == 0) & (columns.kind[work] == typedcolumns.OTHER_CPU))
        | (category[work] == 1)
    ]
    busy = _covered(_union(columns, np.concatenate([ops, special])), lo, hi)
    # Top-level operators (and gc pauses) only, by their time in the gap: the calls the rank's
    # Python code made, and without nesting to resolve. The gaps are sorted and disjoint: each falls
    # in at most one (binary search).
    ops = _outermost_per_thread(columns, ops, thread)
    start = columns.ts[ops]
    gap_of = np.searchsorted(lo, start, side="right") - 1
    in_gap = (gap_of >= 0) & (start < hi[np.maximum(gap_of, 0)])
    ops, gap_of, start = ops[in_gap], gap_of[in_gap], start[in_gap]
    end = start + columns.dur[ops]
    inside_special = _covered(special_union, start, np.maximum(end, start + 1e-3)) > 0
    is_gc = category[ops] == 1
    inside = ~inside_special | is_gc
    value = np.minimum(end, hi[gap_of]) - start
    gap_of, name_of, value_of = gap_of[inside], columns.name[ops][inside], value[inside]
    is_gc = is_gc[inside]
    operators = np.bincount(gap_of, weights=value_of * ~is_gc, minlength=len(lo))
    n_names = max(len(columns.names), 1)
    pairs, where = np.unique(gap_of.astype(np.int64) * n_names + name_of, return_inverse=True)
    pair_sums = np.bincount(where.reshape(-1), weights=value_of, minlength=len(pairs))
    by_gap: list[list[tuple[float, int]]] = [[] for _ in range(len(lo))]
    for pair, value in zip(pairs.tolist(), pair_sums.tolist()):
        by_gap[pair // n_names].append((value, pair % n_names))
    causes: list[dict[str, float]] = []
    details: list[dict[str, float]] = []
    for i in range(len(lo)):
        gap = {label: float(values[i]) for label, values in per_cause.items()}
        gap["cpu_operators"] = float(operators[i])
        gap["no_operator"] = float(max(0.0, (hi[i] - lo[i]) - busy[i]))
        causes.append(gap)
        top = sorted(by_gap[i], key=lambda item: -item[0])[:_TOP_DETAIL]
        details.append({columns.names[name]: round(value, 3) for value, name in top if value > 0})
    return causes, details
