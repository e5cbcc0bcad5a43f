"""The run summary document (schema "stepcli.run"): its typed model and the one loader that validates it.

`stepcli run` writes it (`--json`, and `summary.json` beside the step logs); `stepcli report` and `stepcli compare`
read it. A file is untrusted input (hand-edited, from another version, or hostile), so `load_run_summary` checks
every field it holds once, at the edge, and every reader then trusts the types below: a wrong type is one line and
exit 2, never a crash deep in a renderer. The document's fields are documented one by one in docs/reference/summary-json.md.

This module imports no stepcli package (only the shared top-level modules), so run/, report/ and compare/ can
all depend on it without depending on each other. stepcli.steptimes reads its step times per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.jsonchecks import (
    AMOUNT,
    BOOL,
    COUNT,
    INT,
    NUMBER,
    STR,
    Check,
    at,
    is_number,
    list_of,
    map_of,
    object_of,
    optional,
    pair,
    simple,
)
from stepcli.runfolder.layout import SUMMARY_READABLE_VERSIONS, SUMMARY_SCHEMA
from stepcli.stats import STAT_NAMES, Stats

if TYPE_CHECKING:
    # typing has NotRequired from 3.11, above stepcli's floor (3.10). Annotations here are strings, never evaluated
    # (`from __future__ import annotations`), so only the type checker needs the name: no runtime dependency.
    from typing_extensions import NotRequired


# `steps`: the primary process's global steps and its step calls per requester ("global" is a Python keyword).
Steps = TypedDict("Steps", {"global": int, "requesters": dict[str, int]})


class PopulationStats(Stats, total=False):
    """A population's statistics over every process's steps together, and its count in each process (`processes`
    order; absent from summaries written before it): the terminal says counts per rank."""

    per_process: list[int]


class StepTimeMs(TypedDict):
    """`step_time_ms`: statistics of untouched, profiled and start-up steps (None when there are none), and of the
    steps set aside after a window (the profiler's stop and save; absent in older summaries)."""

    untouched: PopulationStats | None
    profiled: PopulationStats | None
    first_step: PopulationStats | None
    after_window: NotRequired[PopulationStats | None]


class SummaryStepTimes(TypedDict):
    """One entry of `step_times`: every step of one process, with one phase digit per step."""

    worker: str | None
    rank: int | None
    pid: int | None
    durations_ms: list[float]
    phases: str


class ThreadsHost(TypedDict):
    """One host of `threads`: its processes' intra-op threads against the cores they may run on."""

    host: str
    processes: int
    intra_op_threads: int  # summed over its processes
    per_process: list[int]  # the distinct counts of its processes
    cores: int  # the union of its processes' affinity masks
    oversubscribed: bool  # intra_op_threads > cores


class Threads(TypedDict):
    """`threads`: per host (stepcli.run.summary.threads)."""

    hosts: list[ThreadsHost]
    oversubscribed: bool


class Process(TypedDict, total=False):
    """One entry of `processes`."""

    worker: str | None
    rank: int | None
    pid: int | None
    argv: list[str] | None
    global_steps: int | None
    exit: str | None
    peak_rss_bytes: int | None
    cuda_peak_bytes: int | None
    intra_op_threads: int | None
    requesters: dict[str, int]
    # Read (never written) for hand-made summaries that keep each process's step times with the process:
    step_times_ms: list[float]
    durations_ms: list[float]
    timeline_ms: list[float]
    phases: str | None


class SummaryWindow(TypedDict):
    """One entry of `windows`: a saved trace."""

    worker: str
    first_step: int
    last_step: int
    trace: str
    bytes: int
    complete: bool
    note: NotRequired[str]
    capture: NotRequired[str]
    trigger: NotRequired[dict[str, Any]]  # --capture-on-slow: what placed this window
    save_s: NotRequired[float]  # the pause its save put into the program (stopping the profiler, writing the file)


class SummaryOpRow(TypedDict):
    """One row of `top_operators` / `top_kernels`."""

    name: str
    calls: int
    self_ms: float
    total_ms: float
    avg_ms: float
    self_share: float


class PeakMemory(TypedDict):
    rss_bytes: int | None
    cuda_bytes: int | None


class AdviceItem(TypedDict):
    """One entry of `advice` (stepcli.advice.rules.Advice.to_dict)."""

    rule: str
    title: str
    evidence: str
    threshold: str
    suggestion: str


class RunSummary(TypedDict, total=False):
    """The whole document. Every field may be missing from a file (schema 1, a hand-made summary); `stepcli run`
    writes them all."""

    schema: str
    schema_version: int
    stepcli_version: str
    run_id: str
    command: list[str]
    exit_status: int | None
    started_at: str
    duration_s: float
    host: str
    platform: str
    python: str | None
    torch: str | None
    environment: dict[str, str]
    out_dir: str
    schedule: dict[str, int]
    on_demand: bool
    steps: Steps
    step_time_ms: StepTimeMs
    timeline_ms: list[float]
    timeline_phases: str
    step_times: list[SummaryStepTimes]
    processes: list[Process]
    windows: list[SummaryWindow]
    traces: list[str]
    top_operators: list[SummaryOpRow]
    top_kernels: list[SummaryOpRow]
    ranks: list[dict[str, Any]]
    slowest_rank: int | None
    straggler: dict[str, Any] | None
    culprit: (
        dict[str, Any] | None
    )  # stepcli.traces.analyses.culprit via stepcli.run.summary.culpritsection (None without 2+ ranks)
    what_would_help: dict[str, Any] | None  # `stepcli whatif` with no change (stepcli.run.summary.whatifline)
    share_of: str | None
    outside_steps: dict[str, Any] | None
    breakdown_ms: dict[str, float] | None
    # of breakdown_ms["other"]: ms per step outside every operator and inside one of no phase (table's other_ms)
    other_ms: dict[str, float] | None
    recorded_with: dict[str, bool] | None  # the traces hold Python stacks, input shapes (table's recorded_with)
    device: dict[str, Any] | None
    flops: dict[str, Any] | None
    peak_memory: PeakMemory
    threads: Threads | None  # per host, intra-op threads against cores (stepcli/run/summary/threads.py)
    compile: dict[str, Any] | None
    hang: dict[str, Any] | None
    # The CUDA memory snapshots this run's processes wrote (file names in out_dir, from their signed step logs):
    # the page reads these and no other file of the folder.
    memory_snapshots: list[str]
    step_record: list[dict[str, Any]]  # the whole run's step times per process (stepcli/runfolder/steprecordreader.py)
    triggered: list[dict[str, Any]]  # the windows --capture-on-slow placed, with their trigger
    notes: list[str]
    advice: list[AdviceItem]


# ---------------------------------------------------------------------------------------------------------------
# Validation: one check per field, each returning why the value is wrong (or None).

# A step's time: none is under a nanosecond or over the trace reader's cap (10^18 us); such values (5e-324, 1e308)
# are a hostile file's, and would overflow the statistics and the charts built on them.
_MIN_STEP_MS, _MAX_STEP_MS = 1e-6, 1e15


def _is_step_ms(value: Any) -> bool:
    return is_number(value) and (value == 0 or _MIN_STEP_MS <= value <= _MAX_STEP_MS)


_STEP_MS = simple(_is_step_ms, "a step time in ms (0, or 0.000001 to 10^15)")
_PHASES = simple(lambda v: isinstance(v, str) and v.isascii(), "a string of phase digits")


def _stats(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return "is neither null nor an object"
    for key in STAT_NAMES:
        if not is_number(value.get(key)) or value[key] < 0:
            return f".{key} is not a non-negative number"
    problem = list_of(COUNT)(value["per_process"]) if "per_process" in value else None
    return at(".per_process", problem) if problem else None


def _step_times(value: Any) -> str | None:
    problem = object_of(
        {"worker": optional(STR), "rank": optional(INT), "pid": optional(INT)}, ("durations_ms", "phases")
    )(value)
    if problem:
        return problem
    times, phases = value["durations_ms"], value["phases"]
    if not isinstance(times, list) or not isinstance(phases, str) or len(phases) != len(times):
        return "needs durations_ms and one phase digit per step"
    if not all(_is_step_ms(t) for t in times):
        return ".durations_ms has a value that is not a step time in ms (0, or 0.000001 to 10^15)"
    return None


_OP_FIELDS = object_of(
    {
        "calls": AMOUNT,
        "self_ms": NUMBER,
        "total_ms": NUMBER,
        "avg_ms": NUMBER,
        "self_share": optional(NUMBER),
    }
)


def _op_row(value: Any) -> str | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return "has an entry without a name"
    problem = _OP_FIELDS(value)
    return at(f"[{value['name'][:80]!r}]", problem) if problem else None  # repr: one printable line


def _op_rows(value: Any) -> str | None:
    if not isinstance(value, list):
        return "is not a list"
    return next((problem for row in value if (problem := _op_row(row))), None)


# `step_record` and `triggered` (stepcli/runfolder/steprecordreader.py), and the `hang` section's reports
# (stepcli/run/summary/hangreport.py): the parts report.html reads item by item.
_STEP_RECORD = object_of(
    {
        "worker": optional(STR),
        "rank": optional(INT),
        "steps": COUNT,
        "ms": map_of(AMOUNT),
        "block_steps": optional(COUNT),
        "blocks": list_of(simple(lambda v: isinstance(v, list) and len(v) == 3, "a [step, max, mean] block")),
        "slowest": list_of(pair(COUNT, AMOUNT)),
        "histogram": map_of(COUNT),
    }
)
_TRIGGERED = object_of(
    {
        "worker": optional(STR),
        "rank": optional(INT),
        "first_step": INT,
        "last_step": INT,
        "step": optional(INT),
        "ms": optional(AMOUNT),
        "baseline_ms": optional(AMOUNT),
        "rule": optional(STR),
        "recorded": optional(BOOL),
        "reason": optional(STR),
    }
)
_HANG_PROCESS = object_of(
    {
        "rank": optional(INT),
        "pid": optional(INT),
        "step": optional(INT),
        "collective": optional(object_of({})),
        "waiting": optional(BOOL),
    }
)
_HANG = object_of(
    {
        "reports": list_of(
            object_of(
                {
                    "folder": optional(STR),
                    "idle_s": optional(NUMBER),
                    "verdict": optional(STR),
                    "processes": list_of(_HANG_PROCESS),
                }
            )
        ),
        "timeout_s": optional(AMOUNT),
        "on_hang": optional(STR),
        "ended_job": optional(BOOL),
    }
)
_REQUESTERS = map_of(COUNT)
_HOST_COUNTS = {"processes": COUNT, "intra_op_threads": COUNT, "per_process": list_of(COUNT), "cores": COUNT}
_THREADS_HOST = object_of({"host": STR, **_HOST_COUNTS, "oversubscribed": BOOL}, ("host", "intra_op_threads", "cores"))
_FIELDS: dict[str, Check] = {
    "schema_version": INT,
    "stepcli_version": optional(STR),
    "run_id": optional(STR),
    "command": list_of(STR),
    "exit_status": optional(INT),
    "started_at": optional(STR),
    "duration_s": optional(AMOUNT),
    "host": optional(STR),
    "platform": optional(STR),
    "python": optional(STR),
    "torch": optional(STR),
    "environment": map_of(STR),
    "out_dir": optional(STR),
    "schedule": map_of(optional(NUMBER)),
    "on_demand": optional(BOOL),
    "steps": object_of({"global": COUNT, "requesters": _REQUESTERS}, ("global",)),
    "step_time_ms": object_of({"untouched": _stats, "profiled": _stats, "first_step": _stats, "after_window": _stats}),
    "timeline_ms": list_of(_STEP_MS),
    "timeline_phases": optional(_PHASES),
    "step_times": optional(list_of(_step_times)),
    "processes": list_of(
        object_of(
            {
                "worker": optional(STR),
                "rank": optional(INT),
                "pid": optional(INT),
                "argv": optional(list_of(STR)),
                "global_steps": optional(COUNT),
                "exit": optional(STR),
                "peak_rss_bytes": optional(COUNT),
                "cuda_peak_bytes": optional(COUNT),
                "intra_op_threads": optional(COUNT),
                "requesters": _REQUESTERS,
                "step_times_ms": list_of(AMOUNT),
                "durations_ms": list_of(_STEP_MS),
                "timeline_ms": list_of(_STEP_MS),
                "phases": optional(_PHASES),
            }
        )
    ),
    "windows": list_of(
        object_of(
            {
                "worker": STR,
                "first_step": INT,
                "last_step": INT,
                "trace": STR,
                "bytes": optional(COUNT),
                "complete": BOOL,
                "note": optional(STR),
                "save_s": optional(AMOUNT),
            }
        )
    ),
    "traces": list_of(STR),
    "top_operators": _op_rows,
    "top_kernels": _op_rows,
    "ranks": list_of(object_of({"rank": optional(INT), "step_ms": _stats})),
    "slowest_rank": optional(INT),
    "straggler": optional(object_of({"evidence": optional(STR)})),
    "culprit": optional(object_of({})),
    "what_would_help": optional(
        object_of(
            {
                "verdict": STR,
                "reason": optional(STR),
                "steps": list_of(INT),
                "measured_ms": optional(NUMBER),
                "replay_error": optional(NUMBER),
                "untouched_ms": optional(AMOUNT),
                "opportunities": list_of(
                    object_of(
                        {
                            "change": STR,
                            "predicted_ms": NUMBER,
                            "predicted_untouched_ms": optional(NUMBER),
                            "saved_ms": NUMBER,
                            "saved_share": NUMBER,
                        },
                        ("change", "predicted_ms", "saved_ms", "saved_share"),
                    )
                ),
                "critical_path": optional(object_of({"ms": AMOUNT, "segments": list_of(object_of({}))})),
            },
            ("verdict",),
        )
    ),
    "share_of": optional(STR),
    "outside_steps": optional(object_of({"events": COUNT, "self_ms": NUMBER})),
    "breakdown_ms": optional(map_of(NUMBER)),
    "other_ms": optional(object_of({"outside_operators": NUMBER, "inside_operators": NUMBER})),
    "recorded_with": optional(object_of({"stacks": BOOL, "shapes": BOOL})),
    "device": optional(object_of({"busy_ms": NUMBER, "busy_share": NUMBER})),
    "flops": optional(object_of({})),
    "peak_memory": object_of({"rss_bytes": optional(COUNT), "cuda_bytes": optional(COUNT)}),
    "threads": optional(object_of({"hosts": list_of(_THREADS_HOST), "oversubscribed": BOOL}, ("hosts",))),
    "compile": optional(object_of({"by_step": list_of(object_of({"worker": optional(STR), "step": INT}))})),
    "hang": optional(_HANG),
    "step_record": list_of(_STEP_RECORD),
    "triggered": list_of(_TRIGGERED),
    "memory_snapshots": list_of(
        simple(
            lambda v: isinstance(v, str) and "/" not in v and "\\" not in v and v.endswith(".pickle") and v[:1] != ".",
            "a snapshot file name",
        )
    ),
    "notes": list_of(STR),
    "advice": list_of(object_of({key: STR for key in AdviceItem.__annotations__}, tuple(AdviceItem.__annotations__))),
}


def invalid(label: str, problem: str) -> StepcliError:
    """The one-line error for a document that is not a valid run summary (exit 2)."""
    return StepcliError(f"{label}: not a valid stepcli run summary: {problem}", EXIT_USAGE)


def load_run_summary(document: Any, label: str, *, required: Sequence[str] = ()) -> RunSummary:
    """`document` (decoded JSON) as a RunSummary, or StepcliError (exit 2) naming the first wrong field.

    Every field present must have its documented type; `required` names fields a reader cannot do without
    (`compare` needs `schema_version`, `steps` and `step_time_ms`). Trace paths must lie inside `out_dir`.
    """
    if not isinstance(document, dict):
        raise invalid(label, "not a JSON object")
    if document.get("schema") != SUMMARY_SCHEMA:
        raise StepcliError(
            f"{label}: unknown document schema {str(document.get('schema'))[:80]!r}; expected a {SUMMARY_SCHEMA!r} run summary",
            EXIT_USAGE,
        )
    version = document.get("schema_version")
    if (version is not None or "schema_version" in required) and (
        isinstance(version, bool) or version not in SUMMARY_READABLE_VERSIONS
    ):
        supported = ", ".join(map(str, SUMMARY_READABLE_VERSIONS))
        raise StepcliError(
            f"{label}: unsupported run summary schema_version {version!r} (this stepcli reads {supported}); "
            "re-create it with this stepcli's `run --json`",
            EXIT_USAGE,
        )
    for key in required:
        if document.get(key) is None:
            raise invalid(label, f"{key} is missing")
    for key, check in _FIELDS.items():
        if key in document:
            problem = check(document[key])
            if problem:
                raise invalid(label, at(key, problem))
    from stepcli.inputs import run_paths_problem

    problem = run_paths_problem(document)
    if problem:
        raise invalid(label, problem)
    return cast(RunSummary, document)


def read_run_summary(data: bytes | bytearray, label: str, *, required: Sequence[str] = ()) -> RunSummary:
    """Decode and validate the bytes of a run summary file (read with stepcli.inputs.read_input)."""
    import orjson

    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StepcliError(f"{label}: not valid JSON ({exc})", EXIT_USAGE) from None
    return load_run_summary(document, label, required=required)


# ---------------------------------------------------------------------------------------------------------------
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

    def to_dict(self) -> AdviceItem:
        return {
            "rule": self.rule,
            "title": self.title,
            "evidence": self.evidence,
            "threshold": self.threshold,
            "suggestion": self.suggestion,
        }

    @classmethod
    def from_dict(cls, item: AdviceItem) -> Advice:
        return cls(item["rule"], item["title"], item["evidence"], item["threshold"], item["suggestion"])

    def line(self) -> str:
        """One line for the terminal."""
        return advice_line(self.to_dict())


def advice_line(item: AdviceItem) -> str:
    """One advice entry as one line for the terminal."""
    return f"{item['title']}: {item['evidence']} (threshold {item['threshold']}). {item['suggestion']}"
