"""The what-if answer: the replay checked against the measured step, the critical path, each
change's prediction and the ranked opportunities, as one JSON-ready document (schema
`stepcli.whatif/1`, docs/reference/whatif-json.md). Pure: the lanes come in, the document goes out
(stepcli.whatif.whatifmain reads, stepcli.whatif.whatifrender prints).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.traces.analyses.lanes import PHASE_NAMES, RankLane
from stepcli.traces.analyses.ranks import steps_label
from stepcli.whatif.criticalpath import (
    PathPiece,
    critical_path,
    nearly_critical,
    slack,
    walk_critical_path,
)
from stepcli.whatif.lanegraph import Graph, Scale, WhatifChange, build_graph
from stepcli.whatif.lanereplay import (
    LaneReplay,
    PackedRecords,
    ReplayError,
    replay,
)
from stepcli.whatif.lanetime import step_ms

SCHEMA = "stepcli.whatif/1"
MAX_REPLAY_ERROR = 0.05  # a replay further than this from the measured step answers nothing
TOP_OPERATORS = 5  # operator classes offered as opportunities (halved)
TOP_KERNELS = 3  # device work names offered as opportunities (halved)


@dataclass
class WhatifRequest:
    """The changes as typed, in order: ("scale", "SEL=F"), ("comm", "F"), ("idealize", "R")."""

    changes: list[tuple[str, str]]
    step: int | None = None


def usage(message: str) -> StepcliError:
    return StepcliError(message, EXIT_USAGE)


# a value typed on the command line is quoted in an error up to this many characters
SHOWN_VALUE = 60


def shown(value: str) -> str:
    """A typed value as an error quotes it: whole when short, else its start (a selector of 100k
    characters would make the one line a screenful)."""
    return value if len(value) <= SHOWN_VALUE else value[: SHOWN_VALUE - 3] + "..."


def parse_change(flag: str, value: str, lanes: Sequence[RankLane]) -> WhatifChange:
    """One flag's change, checked against the lanes (a selector matching nothing is a usage error
    with near names)."""
    ranks = sorted({lane.rank for lane in lanes if lane.rank is not None})
    if flag == "comm":
        if len(lanes) < 2:
            raise usage(f"--comm: {_alone(lanes)}; collectives between ranks need two or more")
        return WhatifChange(f"--comm {value}", comm=_factor(value, "--comm"))
    if flag == "idealize":
        if len(lanes) < 2:
            raise usage(f"--idealize-rank: {_alone(lanes)}; idealizing a rank needs two or more")
        try:
            rank = int(value)
        except ValueError:
            raise usage(f"--idealize-rank {shown(value)}: not a rank number") from None
        if rank not in ranks:
            raise usage(
                f"--idealize-rank {rank}: no such rank in these traces (ranks {_ranks(ranks)})"
            )
        return WhatifChange(f"--idealize-rank {rank}", idealize=[rank])
    selector, equals, factor_text = value.rpartition("=")
    if not equals or not selector:
        raise usage(
            f"--scale {shown(value)}: expected SELECTOR=FACTOR, e.g. phase:dataloader=0 or "
            "aten::mm=0.5"
        )
    factor = _factor(factor_text, f"--scale {shown(value)}")
    return WhatifChange(f"--scale {value}", scales=[_scale(selector, factor, lanes, ranks, value)])


def _alone(lanes: Sequence[RankLane]) -> str:
    """What a lone trace is: one process, or one rank of a job (whose other ranks were not read)."""
    lane = lanes[0] if lanes else None
    if lane is None or lane.rank is None:
        return "these traces are one process"
    if lane.world_size and lane.world_size > 1:
        return f"only rank {lane.rank} of a {lane.world_size}-rank job was read"
    return f"these traces are one process (rank {lane.rank})"


def _factor(text: str, where: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise usage(
            f"{where}: {shown(text)!r} is not a number (0 removes it, 0.5 halves it)"
        ) from None
    if not math.isfinite(factor) or factor < 0 or factor > 1000:
        raise usage(f"{where}: the factor must be a number from 0 to 1000")
    return factor


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"


def _scale(
    selector: str, factor: float, lanes: Sequence[RankLane], ranks: Sequence[int], typed: str
) -> Scale:
    rank = None
    typed = shown(typed)
    if selector.startswith("rank:"):
        head, slash, selector = selector[len("rank:") :].partition("/")
        if not slash or not head.isdecimal() or not selector:
            raise usage(
                f"--scale {typed}: expected rank:R/SELECTOR=FACTOR, e.g. rank:1/phase:forward=0.5"
            )
        rank = int(head)
        if rank not in ranks:
            raise usage(f"--scale {typed}: no rank {rank} in these traces (ranks {_ranks(ranks)})")
    if selector.startswith("phase:"):
        name = selector[len("phase:") :]
        if name not in PHASE_NAMES:
            raise usage(
                f"--scale {typed}: no phase {shown(name)!r}; phases: {', '.join(_phase_order())}"
            )
        return Scale(rank, PHASE_NAMES.index(name), frozenset(), factor)
    known = operator_names(lanes, rank)
    if selector.startswith("re:"):
        try:
            pattern = re.compile(selector[3:])
        except re.error as exc:
            raise usage(f"--scale {typed}: not a regular expression ({exc})") from None
        except (RecursionError, OverflowError, MemoryError):
            # groups nested thousands deep: Python's regex compiler recurses per level
            raise usage(f"--scale {typed}: a regular expression too deeply nested") from None
        names = frozenset(n for n in known if pattern.search(n))
    else:
        names = frozenset([selector]) & frozenset(known)
    if not names:
        near = difflib.get_close_matches(selector.removeprefix("re:"), list(known), n=3, cutoff=0.4)
        hint = f"; near names: {', '.join(near)}" if near else ""
        raise usage(
            f"--scale {typed}: matches no operator on the steps' thread of these traces{hint}"
        )
    return Scale(rank, None, names, factor)


def _phase_order() -> list[str]:
    return ["dataloader", "forward", "backward", "optimizer", "other"]


def operator_names(lanes: Sequence[RankLane], rank: int | None = None) -> dict[str, float]:
    """Operator name -> total µs of its spans on the steps' threads (every depth), and device work
    name -> its total µs in the steps, most first."""
    totals: dict[str, float] = {}
    for lane in lanes:
        if rank is not None and lane.rank != rank:
            continue
        work = lane.device
        if work is not None and len(work):
            sums = np.bincount(work.name, weights=work.dur, minlength=len(lane.names))
            for code in np.nonzero(sums)[0].tolist():
                totals[lane.names[code]] = totals.get(lane.names[code], 0.0) + float(sums[code])
        if not len(lane.op_name):
            continue
        sums = np.bincount(
            lane.op_name, weights=lane.op_end - lane.op_start, minlength=len(lane.names)
        )
        for code in np.nonzero(sums)[0].tolist():
            totals[lane.names[code]] = totals.get(lane.names[code], 0.0) + float(sums[code])
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def top_operators(lanes: Sequence[RankLane], count: int) -> list[str]:
    """The outermost operators with the most time (the step's own children), by name."""
    totals: dict[str, float] = {}
    for lane in lanes:
        top = lane.op_top
        if not top.any():
            continue
        sums = np.bincount(
            lane.op_name[top], weights=(lane.op_end - lane.op_start)[top], minlength=len(lane.names)
        )
        for code in np.nonzero(sums)[0].tolist():
            totals[lane.names[code]] = totals.get(lane.names[code], 0.0) + float(sums[code])
    return [name for name, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:count]]


def choose_steps(lanes: Sequence[RankLane], step: int | None) -> list[int]:
    """The steps every lane recorded, the longest run of consecutive ones (or just `step`)."""
    common = sorted(set.intersection(*(set(lane.steps) for lane in lanes))) if lanes else []
    if not common:
        if not any(lane.steps for lane in lanes):
            raise usage("no complete ProfilerStep in these traces: whatif replays recorded steps")
        # name the traces that disagree: among many files, which one to leave out or rerun
        empty = [lane for lane in lanes if not lane.steps]
        if empty:
            others = "another trace has" if len(lanes) - len(empty) == 1 else "other traces have"
            raise usage(
                f"{empty[0].path}: no complete ProfilerStep, where {others} steps: give "
                "traces of one run, each with its steps"
            )
        first = lanes[0]
        apart = next((lane for lane in lanes if not set(lane.steps) & set(first.steps)), lanes[-1])
        raise usage(
            f"the traces share no recorded step ({first.path}: {_steps_shown(first.steps)}; "
            f"{apart.path}: {_steps_shown(apart.steps)}): give traces of one run"
        )
    if step is not None:
        if step not in common:
            raise usage(
                f"--step {step}: not a step every trace recorded (steps "
                f"{steps_label(common)[len('steps ') :] if len(common) > 1 else str(common[0])})"
            )
        return [step]
    best: list[int] = [common[0]]
    run = [common[0]]
    for number in common[1:]:
        run = run + [number] if number == run[-1] + 1 else [number]
        if len(run) > len(best):
            best = list(run)
    return best


def _steps_shown(steps: Sequence[int]) -> str:
    """A trace's steps for an error line: `steps 2-4`, or the first and last of many scattered."""
    label = steps_label(sorted(steps))
    return label if len(label) <= 40 else f"{len(steps)} steps, {min(steps)} to {max(steps)}"


@dataclass
class Answer:
    """The answer document, and the graph and unchanged replay it came from (None when inconclusive
    early), and the critical path walked on that replay (empty unless the verdict is ok): the
    replay's stretches are dropped once walked."""

    doc: dict[str, Any]
    graph: Graph | None = None
    base: LaneReplay | None = None
    path: list[PathPiece] = field(default_factory=list)


def answer(
    lanes: Sequence[RankLane], request: WhatifRequest, untouched_ms: float | None
) -> dict[str, Any]:
    """The whole answer document; `verdict` is "inconclusive" (with `reason`) when the replay cannot
    be trusted."""
    return solve(lanes, request, untouched_ms).doc


def solve(
    lanes: Sequence[RankLane],
    request: WhatifRequest,
    untouched_ms: float | None,
    release: bool = False,
) -> Answer:
    """answer(), with the graph and its replay kept for the trace (stepcli.whatif.tracefile).
    `release`: the lanes are the caller's to give up: once the graph joins them, their collectives
    (RankLane.arrivals, a quarter of a lane) are dropped for the replays."""
    lanes = list(lanes)
    steps = choose_steps(lanes, request.step)
    changes = [parse_change(flag, value, lanes) for flag, value in request.changes]
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "ranks": sorted(lane.rank for lane in lanes if lane.rank is not None),
        "steps": steps,
        "measured_ms": None,
        "replayed_ms": None,
        "replay_error": None,
        "untouched_ms": untouched_ms,
        "verdict": "inconclusive",
        "reason": None,
        "critical_path": None,
        "nearly_critical_ranks": [],
        "slack": [],
        "changes": [],
        "opportunities": [],
    }
    reason = _unmodelled(lanes)
    graph = None
    if reason is None:
        graph = build_graph(lanes, steps)
        if release:
            for lane in lanes:
                lane.arrivals = None
        if len(lanes) > 1 and not graph.members:
            reason = (
                f"no collective could be matched across the ranks in {steps_label(steps)}: "
                "without one, the ranks' timelines cannot be joined"
            )
        elif (
            len(lanes) > 1
            and any(lane.device is not None for lane in lanes)
            and not any(graph.device_rows)
        ):
            reason = (
                f"no NCCL kernel could be tied to the ranks' collectives in {steps_label(steps)}: "
                "without one, the ranks' device streams cannot be joined"
            )
    if graph is None or reason is not None:
        doc["reason"] = reason
        return Answer(doc)
    measured = step_ms(graph)
    try:
        base = replay(graph)
    except ReplayError as exc:
        doc["reason"] = f"the replay could not finish: {exc}"
        return Answer(doc, graph)
    replayed = step_ms(graph, base)
    error = (replayed - measured) / measured if measured > 0 else 0.0
    doc.update(measured_ms=measured, replayed_ms=replayed, replay_error=error)
    if measured <= 0:
        doc["reason"] = "the recorded steps take no time"
        return Answer(doc, graph, base)
    if abs(error) > MAX_REPLAY_ERROR:
        doc["reason"] = (
            f"the replay is {error:+.1%} off the measured step (more than {MAX_REPLAY_ERROR:.0%}): "
            f"the graph does not explain the waits ({_why_off(graph)})"
        )
        return Answer(doc, graph, base)
    doc["verdict"] = "ok"
    path = walk_critical_path(graph, base)
    doc["critical_path"] = critical_path(graph, path)
    doc["nearly_critical_ranks"] = nearly_critical(graph, base, measured)
    doc["slack"] = slack(graph, base, top_operators(graph.lanes, TOP_OPERATORS))
    # The path and the slack were what the unchanged replay's stretches and device times were kept
    # for; the predictions need only its waits per lane. At 1,024 ranks they held ~20 KB a rank
    # through every prediction.
    base.records, base.device = [PackedRecords() for _ in base.records], []

    def predicted(change: WhatifChange) -> dict[str, Any]:
        ms = step_ms(graph, replay(graph, change, records=False), change)
        saved = measured - ms
        return {
            "change": change.text,
            "predicted_ms": ms,
            "predicted_untouched_ms": ms * untouched_ms / measured
            if untouched_ms is not None
            else None,
            "saved_ms": saved,
            "saved_share": saved / measured,
        }

    doc["changes"] = [predicted(c) for c in changes]
    if len(changes) > 1:
        together = changes[0]
        for other in changes[1:]:
            together = together.merged(other, "")
        together.text = " ".join(c.text for c in changes)
        doc["changes"].append(predicted(together))
    if not changes:
        ranked = [predicted(c) for c in opportunities(graph, base, lanes)]
        ranked.sort(key=lambda entry: -entry["saved_ms"])
        doc["opportunities"] = ranked
    return Answer(doc, graph, base, path)


# the steps' thread's call into a DataLoader with worker processes
_LOADER_WORKERS = "_MultiProcessingDataLoaderIter"


def loader_workers_note(lanes: Sequence[RankLane], doc: dict[str, Any]) -> str | None:
    """A note when an answer changes data loading done by worker processes: only the steps'
    thread is in the traces, so such a change is predicted as that thread waiting less, and the
    workers' own CPU (which competes with the steps where cores are short) is not in it."""
    entries = doc["changes"] or doc["opportunities"]
    if doc["verdict"] != "ok" or not any("dataloader" in e["change"].lower() for e in entries):
        return None
    for lane in lanes:
        codes = {i for i, name in enumerate(lane.names) if _LOADER_WORKERS in name}
        if codes and np.isin(lane.op_name, np.array(sorted(codes), np.int32)).any():
            return (
                "the data loader runs in worker processes the traces do not hold: a change to "
                "data loading is predicted as the steps' thread waiting less for it, without the "
                "workers' own CPU (on a machine short of cores it competes with the steps)"
            )
    return None


def _unmodelled(lanes: Sequence[RankLane]) -> str | None:
    """Why these traces cannot be replayed honestly yet, or None."""
    ranks = sorted(lane.rank for lane in lanes if lane.rank is not None)
    sizes = {lane.world_size for lane in lanes if lane.world_size}
    if sizes and max(sizes) > len(lanes):
        return (
            f"only rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} of a {max(sizes)}-rank job "
            f"{'were' if len(ranks) > 1 else 'was'} read: the other ranks' traces are needed to "
            f"replay the waits"
        )
    return None


def _why_off(graph: Graph) -> str:
    """The likeliest reason a replay missed: device work that waited for nothing the graph knows, or
    the host."""
    waited = sum(lane.device.unexplained_us for lane in graph.lanes if lane.device is not None)
    if waited > 0:
        per_step = waited / len(graph.steps) / 1000.0
        unknown = [
            lane
            for lane in graph.lanes
            if lane.device is not None and not lane.device.cross_stream_known
        ]
        why = (
            "the trace has no CUDA sync events (enable_cuda_sync_events), so waits between streams "
            "are unknown"
            if unknown
            else "a wait the trace does not record"
        )
        return f"device work waited {per_step:.2f} ms per step for nothing in the graph: {why}"
    return "host gaps not explained, or clocks not aligned"


def top_kernels(lanes: Sequence[RankLane], count: int) -> list[str]:
    """The device work names with the most time in the steps (kernels, copies, sets)."""
    totals: dict[str, float] = {}
    for lane in lanes:
        work = lane.device
        if work is None or not len(work):
            continue
        sums = np.bincount(work.name, weights=work.dur, minlength=len(lane.names))
        for code in np.nonzero(sums)[0].tolist():
            totals[lane.names[code]] = totals.get(lane.names[code], 0.0) + float(sums[code])
    return [name for name, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:count]]


def opportunities(graph: Graph, base: LaneReplay, lanes: Sequence[RankLane]) -> list[WhatifChange]:
    """Each phase removed and halved, the top operator classes halved, communication halved, the
    ranks the others wait for idealized."""
    out: list[WhatifChange] = []
    for name in _phase_order():
        code = PHASE_NAMES.index(name)
        if any(np.any((lane.phase == code) & (np.diff(lane.grid) > 0)) for lane in lanes):
            for factor, shown in ((0.0, "0"), (0.5, "0.5")):
                out.append(
                    WhatifChange(
                        f"--scale phase:{name}={shown}", [Scale(None, code, frozenset(), factor)]
                    )
                )
    for name in top_operators(lanes, TOP_OPERATORS):
        out.append(WhatifChange(f"--scale {name}=0.5", [Scale(None, None, frozenset([name]), 0.5)]))
    for name in top_kernels(lanes, TOP_KERNELS):
        out.append(WhatifChange(f"--scale {name}=0.5", [Scale(None, None, frozenset([name]), 0.5)]))
    if graph.members:
        out.append(WhatifChange("--comm 0.5", comm=0.5))
        order = np.argsort(base.blocked)
        for i in order[:4].tolist():
            rank = lanes[i].rank
            if rank is not None:
                out.append(WhatifChange(f"--idealize-rank {rank}", idealize=[rank]))
    return out
