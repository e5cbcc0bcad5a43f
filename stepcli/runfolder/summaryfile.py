"""The run summary document (schema "stepcli.run"): declared once, as msgspec Structs.

`stepcli run` writes it (`--json`, and `summary.json` beside the step logs); `stepcli report`,
`compare`, `top`, `table` and `whatif` read it through stepcli.runfolder.summaryread, which
decodes a file (untrusted input: hand-edited, from another version, or hostile) into these types
once, at the edge. Their constraints hold the numbers finite and the counts non-negative; each
field's wording ("is not a non-negative integer") is the `description` of its type below, so a
wrong field's one-line message comes from the declaration too. docs/reference/summary-json.md
documents every field; tests/unit/test_summary_doc.py holds the two together.

`hang`, `what_would_help`, `compile` and `step_record` are declared here and built as these
Structs by their modules. Sections of another document's shape (`ranks`, `straggler`, `culprit`,
`device`, `flops`, `triggered`) are plain objects here, checked by summaryread.

This module imports no stepcli package (only the shared top-level modules), so run/, report/ and
compare/ can all depend on it without depending on each other. stepcli.steptimes reads its step
times per process.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

# The schema's name and versions, and the file's name, are the run folder's layout's (one home for
# them).
from stepcli.runfolder.layout import SUMMARY_FILE as SUMMARY_FILE
from stepcli.runfolder.layout import SUMMARY_SCHEMA
from stepcli.stats import Stats

# --------------------------------------------------------------------------------------------------
# The value types. A description is the wording of the one-line error for a value that is not one.

_FINITE = sys.float_info.max  # a JSON number past it reads as infinity: no run measures that
Int = Annotated[int, Meta(description="an integer")]
Count = Annotated[int, Meta(ge=0, description="a non-negative integer")]
Number = Annotated[
    int | Annotated[float, Meta(ge=-_FINITE, le=_FINITE)], Meta(description="a number")
]
Amount = Annotated[
    Annotated[int, Meta(ge=0)] | Annotated[float, Meta(ge=0, le=_FINITE)],
    Meta(description="a non-negative number"),
]
# A step's time: none is under a nanosecond or over the trace reader's cap (10^18 us); such values
# (5e-324, 1e308) are a hostile file's, and would overflow the statistics and the charts built on
# them (checked after decoding).
StepMs = Annotated[
    Annotated[int, Meta(ge=0)] | Annotated[float, Meta(ge=0, le=_FINITE)],
    Meta(description="a step time in ms (0, or 0.000001 to 10^15)"),
]
MIN_STEP_MS, MAX_STEP_MS = 1e-6, 1e15
Phases = Annotated[str, Meta(pattern="^[\x00-\x7f]*$", description="a string of phase digits")]
Text = Annotated[str, Meta(description="a string")]
Flag = Annotated[bool, Meta(description="true or false")]
SnapshotName = Annotated[
    str, Meta(pattern=r"^[^./\\][^/\\]*\.pickle$", description="a snapshot file name")
]
# an object shaped by another document, checked against its `_Sections` declaration
Section = dict[str, Any]


# --------------------------------------------------------------------------------------------------
# The document.


_STAT = Annotated[Amount, Meta(extra={"missing": "is not a non-negative number"})]


class PopulationStats(Struct, kw_only=True):
    """A population's statistics over every process's steps together (stepcli.stats.describe), and
    its count in each process (`processes` order; absent from summaries written before it): the
    terminal says counts per rank."""

    count: _STAT
    mean: _STAT
    median: _STAT
    p90: _STAT
    min: _STAT
    max: _STAT
    per_process: list[Count] | UnsetType = UNSET

    def stats(self) -> Stats:
        """The statistics alone, as stepcli.stats and the budgets of `--fail-over` and `compare`
        take them."""
        return Stats(
            count=int(self.count),
            mean=self.mean,
            median=self.median,
            p90=self.p90,
            min=self.min,
            max=self.max,
        )


_NULL_OR_STATS = Meta(description="is neither null nor an object")


class StepTimeMs(Struct, kw_only=True):
    """`step_time_ms`: statistics of untouched, profiled and start-up steps (None when there are
    none), and of the steps set aside after a window (the profiler's stop and save; absent in older
    summaries)."""

    untouched: Annotated[PopulationStats | None, _NULL_OR_STATS] = None
    profiled: Annotated[PopulationStats | None, _NULL_OR_STATS] = None
    first_step: Annotated[PopulationStats | None, _NULL_OR_STATS] = None
    after_window: Annotated[PopulationStats | None | UnsetType, _NULL_OR_STATS] = UNSET


class Steps(Struct, kw_only=True):
    """`steps`: the primary process's global steps and its step calls per requester."""

    global_: Count = msgspec.field(name="global")
    requesters: dict[str, Count] = {}


class SummaryStepTimes(Struct, kw_only=True):
    """One entry of `step_times`: every step of one process, with one phase digit per step."""

    worker: Text | None = None
    rank: Int | None = None
    pid: Int | None = None
    durations_ms: list[StepMs]
    phases: Phases


class Process(Struct, kw_only=True):
    """One entry of `processes`."""

    worker: Text | None = None
    rank: Int | None = None
    pid: Int | None = None
    argv: list[Text] | None = None
    global_steps: Count | None = None
    exit: Text | None = None
    peak_rss_bytes: Count | None = None
    cuda_peak_bytes: Count | None = None
    intra_op_threads: Count | None = None
    requesters: dict[str, Count] = {}
    # Read (never written) for hand-made summaries that keep each process's step times with the
    # process:
    step_times_ms: list[Amount] | UnsetType = UNSET
    durations_ms: list[StepMs] | UnsetType = UNSET
    timeline_ms: list[StepMs] | UnsetType = UNSET
    phases: Phases | None | UnsetType = UNSET


class SummaryWindow(Struct, kw_only=True):
    """One entry of `windows`: a saved trace (keys in the order the step log writes them, `worker`
    last)."""

    first_step: Int
    last_step: Int
    trace: Text
    bytes: Count | None = None
    complete: Flag = True
    note: Text | None | UnsetType = UNSET  # why it was cut short
    flops: Count | None | UnsetType = UNSET  # with --with-flops: the FLOPs counted over its steps
    # the pause its save put into the program (stop, write the file)
    save_s: Amount | None | UnsetType = UNSET
    capture: Text | UnsetType = UNSET  # the `stepcli capture` request that opened it
    trigger: Section | UnsetType = UNSET  # --capture-on-slow: what placed this window
    worker: Text = ""


class SummaryOpRow(Struct, kw_only=True):
    """One row of `top_operators` / `top_kernels` (stepcli.traces.analyses.results.OpRow)."""

    name: Annotated[Text, Meta(extra={"missing": "has an entry without a name"})]
    calls: Amount = 0
    self_ms: Number = 0.0
    total_ms: Number = 0.0
    avg_ms: Number = 0.0
    self_share: Number | None = None
    shape: Text | UnsetType = UNSET  # with --record-shapes


class OutsideSteps(Struct, kw_only=True):
    """`outside_steps`: host events outside every recorded step, left out of `top_operators`."""

    events: Count
    self_ms: Number


class OtherMs(Struct, kw_only=True):
    """`other_ms`: the breakdown's `other` per step, outside every operator and inside operators of
    no phase."""

    outside_operators: Number
    inside_operators: Number


class RecordedWith(Struct, kw_only=True):
    """`recorded_with`: what the traces hold (`table`'s recorded_with), so `next:` names the option
    that shows it."""

    stacks: Flag = False  # Python frames (--with-stack)
    shapes: Flag = False  # input shapes (--record-shapes)


class PeakMemory(Struct, kw_only=True):
    rss_bytes: Count | None = None
    cuda_bytes: Count | None = None


class ThreadsHost(Struct, kw_only=True):
    """One host of `threads`: its processes' intra-op threads against the cores they may run on."""

    host: Text
    processes: Count = 0
    intra_op_threads: Count  # summed over its processes
    per_process: list[Count] = []  # the distinct counts of its processes
    cores: Count  # the union of its processes' affinity masks
    oversubscribed: Flag = False  # intra_op_threads > cores


class Threads(Struct, kw_only=True):
    """`threads`: per host (stepcli.run.summary.threads)."""

    hosts: list[ThreadsHost]
    oversubscribed: Flag = False


class AdviceItem(Struct, kw_only=True):
    """One entry of `advice` (stepcli.advice.rules)."""

    rule: Text
    title: Text
    evidence: Text
    threshold: Text
    suggestion: Text


# The sections other modules build (stepcli.run.summary.*) as these Structs.


class HangFrame(Struct, kw_only=True):
    """A hang process's `frame`: the innermost frame of the program's own code."""

    function: Text | None = None
    file: Text | None = None
    line: Int | None = None


class HangProcess(Struct, kw_only=True):
    """One process of a hang report (stepcli.run.summary.hangreport), fields in its order."""

    worker: Text | None = None
    rank: Int | None = None
    pid: Int | None = None
    host: Text | None = None
    step: Int | None = None
    collective: Section | None = None  # as the stacks file has it (stepcli/agent/stacks.py)
    waiting: Flag | None = None  # in a collective that has not returned
    collectives_known: Flag | None = None  # the flight recorder answered: C++ collectives are seen
    in_backward: Flag | None = None
    where: Text | None = None
    frame: HangFrame | None = None
    source: Text | None = None  # "python", "faulthandler" (its Python could not run) or "stopped"
    file: Text | None = None


class HangReport(Struct, kw_only=True):
    """One `hang-<n>` folder this run's hang watch wrote."""

    folder: Text | None = None
    idle_s: Number | None = None
    processes: list[HangProcess] = []
    verdict: Text | None = None


class HangSection(Struct, kw_only=True):
    """`hang`: the reports of `--hang-timeout`, and what `--on-hang` did."""

    reports: list[HangReport] = []
    timeout_s: Amount | None = None
    on_hang: Text | None = None
    ended_job: Flag | None = None


class HelpOpportunity(Struct, kw_only=True):
    """One of `what_would_help`'s opportunities (as in the what-if answer)."""

    change: Text
    predicted_ms: Number
    predicted_untouched_ms: Number | None = None
    saved_ms: Number
    saved_share: Number


class PathSegment(Struct, kw_only=True):
    """One segment of the critical path: per step, on one rank, of one kind and name."""

    rank: Int | None = None
    kind: Text
    name: Text
    ms: Number
    share: Number


class CriticalPath(Struct, kw_only=True):
    """`what_would_help.critical_path`: its ms per step and its first segments, in order."""

    ms: Amount = 0
    segments: list[PathSegment] = []


class WhatWouldHelp(Struct, kw_only=True):
    """`what_would_help`: `stepcli whatif` with no change, kept short (summary/whatifline.py)."""

    verdict: Text
    reason: Text | None = None
    steps: list[Int] = []
    measured_ms: Number | None = None
    replay_error: Number | None = None
    untouched_ms: Amount | None = None
    opportunities: list[HelpOpportunity] = []
    critical_path: CriticalPath | None = None


class CompileStep(Struct, kw_only=True):
    """One entry of `compile.by_step`: what torch compiled during one step of one process."""

    worker: Text | None = None
    step: Int
    seconds: Amount = 0
    frames: Count = 0
    recompiles: Count = 0
    graph_breaks: Count = 0
    reasons: list[Text] = []
    step_ms: Amount | None = None
    text: Text = ""


class CompileSection(Struct, kw_only=True):
    """`compile`: the steps torch compiled in (stepcli.run.summary.compilesteps)."""

    steps: Count = 0
    seconds: Amount = 0
    frames: Count = 0
    recompiles: Count = 0
    graph_breaks: Count = 0
    dropped_events: Count = 0
    step_time_ms: PopulationStats | None = None  # of the steps that compiled, step 0 excluded
    by_step: list[CompileStep] = []


Block = Annotated[tuple[Any, Any, Any], Meta(description="a [step, max, mean] block")]


class StepRecord(Struct, kw_only=True):
    """One entry of `step_record`: a process's whole-run step times (steprecordreader.py)."""

    worker: Text | None = None
    rank: Int | None = None
    steps: Count = 0
    ms: dict[str, Amount] = {}  # count, p50, p90, p99 and max
    block_steps: Count | None = None
    blocks: list[Block] = []
    slowest: list[tuple[Count, Amount]] = []  # (step, us)
    histogram: dict[str, Count] = {}


class RunSummary(Struct, kw_only=True):
    """The whole document, fields in the order `stepcli run` writes them. Every field may be missing
    from a file (schema 1, a hand-made summary): it then reads as its default; `stepcli run` writes
    them all."""

    schema: Text = SUMMARY_SCHEMA
    schema_version: Int | None = None
    stepcli_version: Text | None = None
    run_id: Text | None = None
    command: list[Text] = []
    exit_status: Int | None = None
    started_at: Text | None = None
    duration_s: Amount | None = None
    host: Text | None = None
    platform: Text | None = None
    python: Text | None = None
    torch: Text | None = None
    # CUDA_DEVICE_MAX_CONNECTIONS and NCCL_* the program started with
    environment: dict[str, Text] = {}
    out_dir: Text | None = None
    schedule: dict[str, Number | None] = {}
    on_demand: Flag | None = None
    steps: Steps | None = None
    step_time_ms: StepTimeMs | None = None
    timeline_ms: list[StepMs] = []
    timeline_phases: Phases | None = None
    step_times: list[SummaryStepTimes] | None = None
    processes: list[Process] = []
    windows: list[SummaryWindow] = []
    triggered: list[Section] = []  # the windows --capture-on-slow placed, with their trigger
    traces: list[Text] = []
    top_operators: list[SummaryOpRow] = []
    top_kernels: list[SummaryOpRow] = []
    ranks: list[Section] = []
    # absent: a summary that did not say (the traces then do)
    slowest_rank: Int | None | UnsetType = UNSET
    straggler: Section | None = None
    # stepcli.traces.analyses.culprit via stepcli.run.summary.culpritsection
    culprit: Section | None = None
    share_of: Text | None = None
    outside_steps: OutsideSteps | None = None
    breakdown_ms: dict[str, Number] | None = None
    # of breakdown_ms["other"]: outside every operator, inside one of no phase
    other_ms: OtherMs | None = None
    recorded_with: RecordedWith | None = None  # the traces hold Python stacks, input shapes
    device: Section | None = None
    flops: Section | None = None
    peak_memory: PeakMemory | None = None
    # per host, intra-op threads against cores (stepcli/run/summary/threads.py)
    threads: Threads | None = None
    compile: CompileSection | None = None
    # The CUDA memory snapshots this run's processes wrote (file names in out_dir, from their signed
    # step logs): the page reads these and no other file of the folder.
    memory_snapshots: list[SnapshotName] = []
    hang: HangSection | None = None  # --hang-timeout's reports (stepcli/run/summary/hangreport.py)
    notes: list[Text] = []
    what_would_help: WhatWouldHelp | None = None  # `stepcli whatif` with no change
    # absent: written before advice was (report computes it)
    advice: list[AdviceItem] | UnsetType = UNSET
    step_record: list[StepRecord] = []  # the whole run's step times per process


# --------------------------------------------------------------------------------------------------
# The advice entries, as the terminal and the page show them.


@dataclass(frozen=True)
class Advice:
    """One recommendation: what was seen (with numbers), the threshold it crossed, and what to try
    (computed by stepcli.advice.rules; an entry of `advice`)."""

    rule: str
    title: str
    evidence: str
    threshold: str
    suggestion: str

    def to_item(self) -> AdviceItem:
        return AdviceItem(
            rule=self.rule,
            title=self.title,
            evidence=self.evidence,
            threshold=self.threshold,
            suggestion=self.suggestion,
        )

    @classmethod
    def from_item(cls, item: AdviceItem) -> Advice:
        return cls(item.rule, item.title, item.evidence, item.threshold, item.suggestion)

    def line(self) -> str:
        """One line for the terminal."""
        return advice_line(self.to_item())


def advice_line(item: AdviceItem) -> str:
    """One advice entry as one line for the terminal."""
    return f"{item.title}: {item.evidence} (threshold {item.threshold}). {item.suggestion}"
