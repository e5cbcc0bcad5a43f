"""Reading a run summary file: decode it into its declaration (stepcli.runfolder.summaryfile) once,
at the edge, then check what a type cannot say (step-time ranges, one phase digit per step, trace
paths inside `out_dir`). Every problem is one line naming the field, exit 2, never a crash deep in
a renderer.

Sections of another document's shape (`ranks`, `straggler`, `culprit`, `device`, `flops`,
`triggered`) stay plain objects in the summary; what report.html and the advice read of them is
declared here, for checking only (`_Sections`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import Struct

from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.jsonchecks import wording
from stepcli.runfolder.layout import SUMMARY_READABLE_VERSIONS, SUMMARY_SCHEMA
from stepcli.runfolder.summaryfile import (
    MAX_STEP_MS,
    MIN_STEP_MS,
    Amount,
    Flag,
    Int,
    Number,
    RunSummary,
    Section,
    Text,
)

# The sections other modules shape, declared for checking only: the fields report.html and the
# advice read.


class _StatsCheck(Struct, kw_only=True):
    count: Amount
    mean: Amount
    median: Amount
    p90: Amount
    min: Amount
    max: Amount


class _Triggered(Struct, kw_only=True):
    worker: Text | None = None
    rank: Int | None = None
    first_step: Int = 0
    last_step: Int = 0
    step: Int | None = None
    ms: Amount | None = None
    baseline_ms: Amount | None = None
    rule: Text | None = None
    recorded: Flag | None = None
    reason: Text | None = None


class _Rank(Struct, kw_only=True):
    rank: Int | None = None
    step_ms: _StatsCheck | None = None


class _Straggler(Struct, kw_only=True):
    evidence: Text | None = None


class _Device(Struct, kw_only=True):
    busy_ms: Number = 0
    busy_share: Number = 0


class _Sections(Struct, kw_only=True):
    """The sections kept as plain objects, as the checks see them (names as in RunSummary)."""

    triggered: list[_Triggered] = []
    ranks: list[_Rank] = []
    straggler: _Straggler | None = None
    culprit: Section | None = None
    device: _Device | None = None
    flops: Section | None = None
    trigger: Section | None = None


# --------------------------------------------------------------------------------------------------
# Loading: decode into the types above, then the checks a type cannot say; every problem is one
# line.


def invalid(label: str, problem: str) -> StepcliError:
    """The one-line error for a document that is not a valid run summary (exit 2)."""
    return StepcliError(f"{label}: not a valid stepcli run summary: {problem}", EXIT_USAGE)


def _header_problem(document: Any, label: str, required: Sequence[str]) -> None:
    """The checks before decoding: an object of this schema, of a version this stepcli reads."""
    if not isinstance(document, dict):
        raise invalid(label, "not a JSON object")
    if document.get("schema") != SUMMARY_SCHEMA:
        raise StepcliError(
            f"{label}: unknown document schema {str(document.get('schema'))[:80]!r}; expected a "
            f"{SUMMARY_SCHEMA!r} run summary",
            EXIT_USAGE,
        )
    version = document.get("schema_version")
    if (version is not None or "schema_version" in required) and (
        isinstance(version, bool) or version not in SUMMARY_READABLE_VERSIONS
    ):
        supported = ", ".join(map(str, SUMMARY_READABLE_VERSIONS))
        raise StepcliError(
            f"{label}: unsupported run summary schema_version {version!r} (this stepcli reads "
            f"{supported}); "
            "re-create it with this stepcli's `run --json`",
            EXIT_USAGE,
        )
    for key in required:
        if document.get(key) is None:
            raise invalid(label, f"{key} is missing")


def load_run_summary(document: Any, label: str, *, required: Sequence[str] = ()) -> RunSummary:
    """`document` (decoded JSON) as a RunSummary, or StepcliError (exit 2) naming the first wrong
    field.

    Every field present must have its declared type; `required` names fields a reader cannot do
    without (`compare` needs `schema_version`, `steps` and `step_time_ms`). Trace paths must lie
    inside `out_dir`.
    """
    _header_problem(document, label, required)
    try:
        summary = msgspec.convert(document, RunSummary)
        msgspec.convert(document, _Sections)
    except msgspec.ValidationError as exc:
        raise invalid(label, _wording(exc, document)) from None
    problem = _value_problem(summary)
    if problem:
        raise invalid(label, problem)
    return summary


def read_run_summary(
    data: bytes | bytearray, label: str, *, required: Sequence[str] = ()
) -> RunSummary:
    """Decode and check the bytes of a run summary file (read with stepcli.inputs.read_input)."""
    try:
        head = msgspec.json.decode(data, type=_Header)
    except msgspec.ValidationError:
        head = None  # not an object, or a header of the wrong types: the header checks say which
    except msgspec.DecodeError as exc:
        raise StepcliError(f"{label}: not valid JSON ({exc})", EXIT_USAGE) from None
    if (
        head is None
        or head.schema != SUMMARY_SCHEMA
        or not _readable(head.schema_version, required)
    ):
        _header_problem(_RAW.decode(data), label, required)
    try:
        summary = msgspec.json.decode(data, type=RunSummary)
        msgspec.json.decode(data, type=_Sections)
    except msgspec.ValidationError as exc:
        raise invalid(label, _wording(exc, _RAW.decode(data))) from None
    for key in required:
        if getattr(summary, key.replace("global", "global_"), None) is None:
            raise invalid(label, f"{key} is missing")
    problem = _value_problem(summary)
    if problem:
        raise invalid(label, problem)
    return summary


# The document as plain objects, to say where a problem is: a number past the float range reads as
# inf here.
_RAW = msgspec.json.Decoder(float_hook=float)


class _Header(Struct):
    schema: Any = None
    schema_version: Any = None


def _readable(version: Any, required: Sequence[str]) -> bool:
    if version is None:
        return "schema_version" not in required
    return not isinstance(version, bool) and version in SUMMARY_READABLE_VERSIONS


def _value_problem(summary: RunSummary) -> str | None:
    """What the types cannot say: step times in range, one phase digit per step, traces inside
    `out_dir`."""
    for index, entry in enumerate(summary.step_times or []):
        if len(entry.phases) != len(entry.durations_ms):
            return f"step_times[{index}] needs durations_ms and one phase digit per step"
    series: list[tuple[str, list[float]]] = [("timeline_ms", summary.timeline_ms)]
    series += [
        (f"step_times[{i}].durations_ms", e.durations_ms)
        for i, e in enumerate(summary.step_times or [])
    ]
    for i, process in enumerate(summary.processes):
        series += [(f"processes[{i}].durations_ms", process.durations_ms or [])]
        series += [(f"processes[{i}].timeline_ms", process.timeline_ms or [])]
    for where, values in series:
        wrong = next(
            (j for j, v in enumerate(values) if v != 0 and not MIN_STEP_MS <= v <= MAX_STEP_MS),
            None,
        )
        if wrong is not None:
            return f"{where}[{wrong}] is not a step time in ms (0, or 0.000001 to 10^15)"
    from stepcli.inputs import run_paths_problem

    return run_paths_problem(
        {
            "out_dir": summary.out_dir,
            "traces": summary.traces,
            "windows": [{"trace": window.trace} for window in summary.windows],
        }
    )


def _wording(error: msgspec.ValidationError, document: Any) -> str:
    """msgspec's `Expected `int`, got `str` - at `$.processes[0].rank`` as stepcli says it:
    `processes[0].rank is not an integer` (the declared type's description)."""
    problem = wording(error, document, _Sections if _in_sections(error) else RunSummary)
    return problem[1:] if problem.startswith(".") else problem


def _in_sections(error: msgspec.ValidationError) -> bool:
    where = str(error).partition(" - at `$")[2]
    return where.startswith(".") and where[1:].split(".")[0].split("[")[0] in _SECTION_NAMES


_SECTION_NAMES = frozenset(field.encode_name for field in msgspec.structs.fields(_Sections))
