"""`stepcli merge`: the traces of every rank as one Chrome trace (Perfetto, chrome://tracing, HTA),
one process per rank and trace process, on one clock, with each collective's last-arriving rank
marked.

Clocks are aligned as the culprit analysis aligns them (stepcli.traces.analyses.culprit: by the
collectives' ends); without collectives, by each trace's `baseTimeNanoseconds`. Ids that must stay
unique across the ranks (flow ids, correlation and external ids) are moved into a per-rank range.
The output's first key is `stepcli_merged`, so an existing -o file is overwritten only when stepcli
wrote it.

Each file is read a piece at a time (stepcli.traces.read.piecewise), each piece rewritten and
written before the next one is decoded: memory never holds a file's events as Python objects, and
the output never holds `Infinity` or `NaN`, which no trace viewer reads.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import IO, Any, NamedTuple, cast

import msgspec

from stepcli.errors import StepcliError, TraceError
from stepcli.fmt import plural
from stepcli.traces.read.files import MERGED_MARKER as MARKER
from stepcli.traces.read.jsonvalues import as_id, as_time
from stepcli.traces.read.piecewise import CutWrong, PiecewiseTrace

# (commands/merge.py imports this module at start-up: json and the trace reader are imported when a
# merge runs)

_ID_STRIDE = 1 << 40  # per-rank range of flow, correlation and external ids
_PID_STRIDE = 1000  # new pid = rank * _PID_STRIDE + the trace process's order of appearance
_ID_ARGS = ("correlation", "External id", "external id")
_FLOW_BASE = 1 << 60  # flow ids of the culprit arrows: above every rank's moved ids


def check_output(path: str) -> None:
    """Refuse to replace a file stepcli merge did not write (or anything that is not a regular
    file)."""
    from stepcli import safefile

    # Its first key, not merely the word somewhere in it (a note that quotes it is not a merged
    # trace).
    from stepcli.traces.read.files import gzip_aware

    problem = safefile.why_not_replace(
        path, gzip_aware(re.compile(rb'\s*\{\s*"' + MARKER.encode() + rb'"\s*:').match)
    )
    if problem == safefile.NOT_OURS:
        raise StepcliError(f"{path}: {problem} merge; choose another -o or remove it")
    if problem is not None:
        raise StepcliError(f"{path}: {problem}; choose another -o")


def _base_time(document: dict[str, Any]) -> int | None:
    base = document.get("baseTimeNanoseconds")
    return (
        base if isinstance(base, int) and not isinstance(base, bool) and abs(base) < 2**63 else None
    )


def _rank_of(document: dict[str, Any], path: str) -> int | None:
    from stepcli.traces.read.files import rank_from_name

    info = document.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2**31:
        return rank
    return rank_from_name(path)


class _Rewriter:
    """One trace's events moved onto the merged clock, pids and id ranges."""

    def __init__(
        self, rank: int, slot: int, shift_us: float, path: str = "", label: str | None = None
    ) -> None:
        self.rank, self.slot, self.shift_us, self.path = rank, slot, shift_us, path
        self.label = label or f"rank {rank}"  # its processes' names start with it
        self.pids: dict[Any, int] = {}
        self.main_pid: Any = None  # the trace's process that ran the steps

    def pid(self, original: Any) -> int:
        original = as_id(original)  # a list or an object as text, as `table` reads it
        if original not in self.pids:
            if len(self.pids) >= _PID_STRIDE:  # the next one would take the next rank's first pid
                raise TraceError(
                    self.path, f"more than {_PID_STRIDE} processes in one trace: cannot merge it"
                )
            self.pids[original] = self.slot * _PID_STRIDE + len(self.pids)
        return self.pids[original]

    def moved(self, ident: int) -> int:
        """An id in this rank's range: only ids below the stride keep the ranks' ranges apart (and
        within int64)."""
        if not 0 <= ident < _ID_STRIDE:
            raise TraceError(
                self.path, f"id {ident} is outside 0..2^40: the ranks' ids could not be kept apart"
            )
        return ident + self.slot * _ID_STRIDE

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        out = event  # (decoded for this pass alone: changed in place)
        if "pid" in out:
            out["pid"] = self.pid(out["pid"])
        # a numeric string is a number, as `table` reads it: moved and written as one
        for key in ("ts", "dur"):
            value = out.get(key)
            if isinstance(value, str) and math.isfinite(as_time(value)):
                out[key] = as_time(value)
        ts = out.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            if isinstance(ts, int) and abs(ts) >= 2**63:  # (a float cannot hold it: OverflowError)
                raise TraceError(self.path, f"timestamp {str(ts)[:30]}... is not a time")
            out["ts"] = round(ts - self.shift_us, 3)
        ident = out.get("id")
        if isinstance(ident, int) and not isinstance(ident, bool):
            out["id"] = self.moved(ident)
        args = out.get("args")
        if isinstance(args, dict):
            args = dict(args)
            for key in _ID_ARGS:
                value = args.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    args[key] = self.moved(value)
            if out.get("ph") == "M" and out.get("name") == "process_name" and "name" in args:
                args["name"] = f"{self.label}: {args['name']}"
            out["args"] = args
        return out

    def names(self) -> list[dict[str, Any]]:
        """Name and order every process of this trace by rank (Perfetto shows them in this
        order)."""
        out = []
        for original, pid in self.pids.items():
            out.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": pid},
                }
            )
            out.append(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "pid": pid,
                    "tid": 0,
                    "args": {"labels": self.label},
                }
            )
            if original == self.main_pid:
                out.append(
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": pid,
                        "tid": 0,
                        "args": {"name": self.label},
                    }
                )
        return out


def _flows(
    collective: dict[str, Any], mains: dict[int, tuple[int, Any]], ids: Iterator[int]
) -> list[dict[str, Any]]:
    """A flow arrow from each waiting rank's arrival to the last rank's: who waited for whom
    (Perfetto draws it between the collectives' slices, which start at those instants)."""
    last = collective["last_rank"]
    arrivals = collective.get("arrive_us", {})
    out: list[dict[str, Any]] = []
    for rank_text in collective["waits_ms"]:
        source, target = mains.get(int(rank_text)), mains.get(last)
        if (
            source is None
            or target is None
            or rank_text not in arrivals
            or str(last) not in arrivals
        ):
            continue
        common = {
            "cat": "stepcli_culprit",
            "name": f"waits for rank {last}",
            "id": next(ids),
            "bp": "e",
        }
        out.append(
            {"ph": "s", "pid": source[0], "tid": source[1], "ts": arrivals[rank_text], **common}
        )
        out.append(
            {"ph": "f", "pid": target[0], "tid": target[1], "ts": arrivals[str(last)], **common}
        )
    return out


def _culprit_marks(
    culprit: dict[str, Any] | None, mains: dict[int, tuple[int, Any]]
) -> list[dict[str, Any]]:
    """An instant event on the last-arriving rank's step thread at each collective, and arrows to it
    from the ranks that waited."""
    if not culprit:
        return []
    marks: list[dict[str, Any]] = []
    ids = itertools.count(_FLOW_BASE)
    for collective in culprit.get("per_collective", []):
        rank = collective["last_rank"]
        where = mains.get(rank)
        at = collective.get("arrive_us", {}).get(str(rank))
        if where is None or at is None:
            continue
        waits = ", ".join(f"rank {r} {ms:.2f} ms" for r, ms in collective["waits_ms"].items())
        marks.extend(_flows(collective, mains, ids))
        marks.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "stepcli_culprit",
                "name": f"last to arrive: rank {rank} at {collective['name']} "
                f"(+{collective['lateness_ms']:.2f} ms)",
                "pid": where[0],
                "tid": where[1],
                "ts": at,
                "args": {
                    "step": collective["step"],
                    "collective": collective["name"],
                    "order": collective["order"],
                    "lateness_ms": collective["lateness_ms"],
                    "waits": waits,
                },
            }
        )
    return marks


class _Plan(NamedTuple):
    """What the first pass learns of one file, so the second can write its events as it reads
    them."""

    path: str
    rank: int
    slot: int
    base: Any  # baseTimeNanoseconds as written
    main: tuple[Any, Any] | None
    main_pid: int | None  # the merged pid of the process that ran the steps
    sliced: bool  # whether its events are read in slices (else event by event)
    dropped_events: int
    dropped_values: int


def _survey(path: str, slot: int) -> tuple[int | None, _Plan]:
    """The first pass over one file, a piece at a time: its rank as found (None: none), and its plan
    (rank 0 when it has none). The main thread is where its `ProfilerStep#N` annotations are."""
    for sliced in (True, False):
        try:
            trace = PiecewiseTrace(path, sliced)
            steps: Counter[tuple[Any, Any]] = Counter()
            rewriter = _Rewriter(0, slot, 0.0, path)
            for piece in trace.pieces():
                for event in piece:
                    if "pid" in event:
                        rewriter.pid(event["pid"])
                    if event.get("ph") == "X" and str(event.get("name", "")).startswith(
                        "ProfilerStep#"
                    ):
                        steps[(as_id(event.get("pid")), as_id(event.get("tid")))] += 1
            break
        except CutWrong:
            continue  # (never unsliced)
    found = _rank_of(trace.header, path)
    main = steps.most_common(1)[0][0] if steps else None
    main_pid = rewriter.pid(main[0]) if main is not None else None
    # A base time is nanoseconds since the epoch: anything past int64 (10**400, say) is not one.
    base = _base_time(trace.header)
    rank = found if found is not None else 0
    return found, _Plan(
        path,
        rank,
        slot,
        base,
        main,
        main_pid,
        trace.layout is not None,
        trace.dropped_events,
        trace.dropped_values,
    )


def merge_traces(paths: Sequence[str], output: str) -> dict[str, Any]:
    """Write the merged trace of `paths` to `output`; return what it holds (ranks, alignment,
    marks).

    The merged trace is written as a stream, a piece of one file at a time (module docstring): a
    first pass reads each file for its rank, base time and main thread (and the new pid of that
    thread, needed by the culprit marks in the header's count), the second reads it again to write
    its events."""
    from stepcli.traces.engine import summarize_paths
    from stepcli.traces.read.files import list_trace_files

    check_output(output)
    files = [f for f in list_trace_files(paths) if os.path.realpath(f) != os.path.realpath(output)]
    if not files:
        raise StepcliError("no trace files to merge")
    summary = summarize_paths(files)
    # (none across traces of different jobs: then only base times align them)
    culprit = summary.culprit
    offsets = (culprit or {}).get("alignment", {}).get("offsets_ms", {})
    plans: list[_Plan] = []
    mains: dict[int, tuple[int, Any]] = {}
    per_rank: Counter[int] = Counter()
    missing: str | None = None
    for slot, path in enumerate(files):
        # One pid and id range per file: two traces of one rank (two windows, or a copy) never share
        # ids or pids.
        found, plan = _survey(path, slot)
        if found is None and missing is None:
            missing = path
        per_rank[plan.rank] += 1
        if plan.main is not None and plan.main_pid is not None and plan.rank not in mains:
            mains[plan.rank] = (plan.main_pid, plan.main[1])
        plans.append(plan)
    if len(files) > 1 and missing is not None:
        raise StepcliError(
            f"{missing}: no rank (distributedInfo.rank or rank<N> in the name); cannot merge ranks"
        )
    reference_base = next((p.base for p in plans if isinstance(p.base, int)), 0)
    marks = _culprit_marks(culprit, mains)
    facts = {
        # one trace without a rank is no rank 0
        "ranks": sorted(per_rank) if missing is None else [],
        "repeated_ranks": {rank: count for rank, count in sorted(per_rank.items()) if count > 1},
        "files": list(files),
        "alignment": (culprit or {}).get("alignment"),
        "culprit": (culprit or {}).get("culprit"),
        "marks": sum(1 for mark in marks if mark["ph"] == "i"),
        "mixed_jobs": summary.mixed_jobs,
        "dropped_events": sum(p.dropped_events for p in plans),  # ts or dur not a finite number
        "dropped_values": sum(p.dropped_values for p in plans),  # other non-finite numbers
    }
    head = {MARKER: facts, "displayTimeUnit": "ms", "baseTimeNanoseconds": reference_base}
    _write(output, head, _merged_events(plans, offsets, reference_base, marks, per_rank))
    return facts


def _merged_events(
    plans: list[_Plan],
    offsets: dict[str, Any],
    reference_base: int,
    marks: list[dict[str, Any]],
    per_rank: Counter[int],
) -> Iterator[list[dict[str, Any]]]:
    """The merged events, a piece of one file at a time (then the culprit marks)."""
    seen: Counter[int] = Counter()
    for plan in plans:
        if str(plan.rank) in offsets:
            shift = offsets[str(plan.rank)] * 1000
        else:
            base = plan.base
            shift = -((base - reference_base) / 1000 if isinstance(base, int) else 0.0)
        seen[plan.rank] += 1
        # A rank in several traces is several processes, each named apart (which trace it is).
        label = (
            f"rank {plan.rank}"
            if per_rank[plan.rank] == 1
            else f"rank {plan.rank} (trace {seen[plan.rank]} of {per_rank[plan.rank]}: "
            f"{os.path.basename(plan.path)})"
        )
        rewriter = _Rewriter(plan.rank, plan.slot, shift, plan.path, label)
        rewriter.main_pid = plan.main[0] if plan.main else None
        trace = PiecewiseTrace(plan.path, plan.sliced)
        try:
            for piece in trace.pieces():
                yield [rewriter.event(e) for e in piece]
        except CutWrong:
            raise TraceError(plan.path, "changed while it was merged") from None
        if plan.main is not None:
            rewriter.pid(plan.main[0])
        del trace
        yield rewriter.names()
    yield marks


def _write(path: str, head: dict[str, Any], chunks: Iterator[list[dict[str, Any]]]) -> None:
    """`head` with a `traceEvents` list of the chunks' events, a chunk at a time, into a file
    created new beside `path` and renamed over it (stepcli.safefile). Events are encoded by msgspec,
    whose decoder read them (so no string holds a lone surrogate) and which never writes `Infinity`
    or `NaN` (none is left: PiecewiseTrace)."""
    import json

    from stepcli import safefile

    encode = json.JSONEncoder(separators=(",", ":")).encode
    try:
        with safefile.NewFile(os.path.abspath(path)) as file:
            # `-o merged.json.gz`: gzipped, as its name says
            handle = _gzipped(file) if path.lower().endswith(".gz") else file
            try:
                handle.write((encode(head)[:-1] + ',"traceEvents":[').encode("utf-8"))
                first = True
                for chunk in chunks:
                    if chunk:
                        if not first:
                            handle.write(b",")
                        # (the list's brackets left out)
                        handle.write(msgspec.json.encode(chunk)[1:-1])
                        first = False
                handle.write(b"]}")
            finally:
                if handle is not file:
                    handle.close()  # (the gzip trailer; `file` stays open for NewFile)
            check_output(path)  # again: something may have appeared there meanwhile
    except OSError as exc:
        raise StepcliError(f"{path}: cannot write there: {exc.strerror or exc}") from None


def _gzipped(file: IO[bytes]) -> IO[bytes]:
    """A gzip stream into `file` (closing it writes the trailer and leaves `file` open)."""
    import gzip

    return cast(IO[bytes], gzip.GzipFile(fileobj=file, mode="wb", compresslevel=6, mtime=0))


def merge_main(paths: Sequence[str], output: str) -> str:
    """The command: merge, then what was written (a line) and how its clocks were aligned (a second
    line)."""
    facts = merge_traces(paths, output)
    alignment = facts["alignment"]
    clock = (
        f"clocks aligned by collectives (error {alignment['error_ms']:.2f} ms)"
        if alignment
        else "clocks from the traces' base times (traces of different jobs: their world sizes "
        "differ)"
        if facts.get("mixed_jobs")
        else "clocks from the traces' base times (no collectives to align by)"
    )
    found = facts["culprit"]
    who = f"; culprit rank {found['rank']}" if found else ""
    repeated = "".join(
        f"; rank {r} in {n} traces (kept apart, as {n} processes)"
        for r, n in facts["repeated_ranks"].items()
    )
    if facts["dropped_events"]:
        repeated += (
            f"; {plural(facts['dropped_events'], 'event')} left out (ts or dur not a finite number)"
        )
    if facts["dropped_values"]:
        repeated += f"; {plural(facts['dropped_values'], 'non-finite value')} left out"
    traces = plural(len(facts["files"]), "trace")
    held = (
        f"ranks {', '.join(map(str, facts['ranks']))} from {traces}"
        if facts["ranks"]
        else f"{traces} without a rank"
    )
    # two lines: one was up to 113 columns
    return f"wrote {output}: {held}, {plural(facts['marks'], 'mark')}{who}{repeated}\n  {clock}"
