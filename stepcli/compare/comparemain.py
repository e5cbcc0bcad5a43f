"""`stepcli compare`: load both sides, decide the CI verdict, print it.

The work lives in one module per concern; this one wires them and keeps the names other code
imports:
- stepcli.compare.load: inputs -> Measurement (run summaries of schema 1 or 2, traces, folders,
  several runs per side);
- stepcli.compare.inference: bootstrap intervals and warm-up detection (pure statistics);
- stepcli.compare.attribution: per-operator changes with intervals, from the traces of both sides;
- stepcli.compare.verdict: the pure verdict and its rules (read its docstring for the contract); the
  verdicts made without an interval in stepcli.compare.withoutinterval, the result in
  stepcli.compare.comparison;
- stepcli.compare.comparerender: terminal and Markdown reports;
- stepcli.commands.compare: the command's click arguments and options (loaded with the CLI: light).
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import sys
from collections.abc import Sequence

from stepcli.compare.attribution import OpChange
from stepcli.compare.comparerender import render_console, render_markdown
from stepcli.compare.comparison import ComparedOpRow, Comparison
from stepcli.compare.load import (
    load_measurement,
    load_side,
    measurement_from_run,
    measurement_from_summary,
)
from stepcli.compare.measurement import MeasuredProcess, Measurement, OpSteps, OpTime
from stepcli.compare.populations import PopulationRow
from stepcli.compare.verdict import TOP_OPS, decide, parse_confidence, parse_tolerance
from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.runfolder.layout import SUMMARY_READABLE_VERSIONS as RUN_SCHEMA_VERSIONS
from stepcli.runfolder.layout import SUMMARY_SCHEMA as RUN_SCHEMA
from stepcli.stats import METRICS

__all__ = [
    "METRICS",
    "RUN_SCHEMA",
    "RUN_SCHEMA_VERSIONS",
    "TOP_OPS",
    "Comparison",
    "Measurement",
    "ComparedOpRow",
    "OpTime",
    "PopulationRow",
    "compare_main",
    "decide",
    "load_measurement",
    "load_side",
    "measurement_from_run",
    "measurement_from_summary",
    "parse_confidence",
    "parse_tolerance",
    "render_console",
    "render_markdown",
]


# the first line of every Markdown report (render_markdown)
MARKDOWN_HEADING = b"### stepcli compare: "


def check_markdown_output(path: str) -> None:
    """`--markdown PATH` replaces only a report compare wrote there before (a CI job's previous
    run), never the user's own file (the baseline itself, say), a link, a FIFO or a device; checked
    before anything is read."""
    from stepcli import safefile

    problem = safefile.why_not_replace(path, lambda head: head.startswith(MARKDOWN_HEADING))
    if problem == safefile.NOT_OURS:
        problem += " compare; give another --markdown FILE or remove it"
    elif problem is not None:
        problem += "; give another --markdown FILE"
    if problem is not None:
        raise StepcliError(f"{path}: {problem}", EXIT_USAGE)


def check_json_output(path: str) -> None:
    """`--json PATH` replaces only a comparison compare wrote there before, as `--markdown` does."""
    from stepcli import safefile
    from stepcli.compare.jsonout import JSON_HEAD

    problem = safefile.why_not_replace(path, lambda head: head.startswith(JSON_HEAD))
    if problem == safefile.NOT_OURS:
        problem += " compare; give another --json FILE or remove it"
    elif problem is not None:
        problem += "; give another --json FILE"
    if problem is not None:
        raise StepcliError(f"{path}: {problem}", EXIT_USAGE)


def _check_outputs(markdown_path: str | None, json_path: str | None) -> None:
    """The report files may be written (before anything is compared)."""
    if markdown_path and markdown_path != "-":
        check_markdown_output(markdown_path)
    if json_path and json_path != "-":
        check_json_output(json_path)


def compare_main(
    baseline: str | Sequence[str],
    current: str | Sequence[str],
    *,
    tolerance: str | float = "10%",
    min_delta_ms: float = 0.0,
    metric: str = "median",
    markdown_path: str | None = None,
    json_path: str | None = None,
    confidence: str | float = 0.95,
    skip_steps: int | None = None,
    allow_inconclusive: bool = False,
) -> int:
    """`stepcli compare`: load, decide, print; returns the exit code (StepcliError for bad
    input)."""
    try:
        fraction = parse_tolerance(tolerance)
    except ValueError as exc:
        raise StepcliError(f"--tolerance: {exc}", EXIT_USAGE) from None
    try:
        level = parse_confidence(confidence)
    except ValueError as exc:
        raise StepcliError(f"--confidence: {exc}", EXIT_USAGE) from None
    if not math.isfinite(min_delta_ms) or min_delta_ms < 0:
        raise StepcliError(
            f"--min-delta-ms must be a number >= 0; got {min_delta_ms!r}", EXIT_USAGE
        )
    if metric not in METRICS:
        raise StepcliError(
            f"--metric: expected one of {', '.join(METRICS)}; got {metric!r}", EXIT_USAGE
        )
    if skip_steps is not None and skip_steps < 0:
        raise StepcliError(f"--skip-steps must be >= 0; got {skip_steps}", EXIT_USAGE)
    _check_outputs(markdown_path, json_path)

    base_paths = [baseline] if isinstance(baseline, str) else list(baseline)
    cur_paths = [current] if isinstance(current, str) else list(current)
    base = load_side(base_paths)
    cur = load_side(cur_paths)
    _refuse_a_run_on_both_sides(base, cur, base_paths, cur_paths)
    op_changes, why_not = _attribution(base, cur, level, fraction, min_delta_ms)
    comparison = decide(
        base,
        cur,
        tolerance=fraction,
        min_delta_ms=min_delta_ms,
        metric=metric,
        confidence=level,
        skip_steps=skip_steps,
        allow_inconclusive=allow_inconclusive,
        op_changes=op_changes,
    )
    different = different_programs(base, cur)
    if different:
        comparison = dataclasses.replace(comparison, notes=(*comparison.notes, different))
    if why_not:
        comparison = dataclasses.replace(comparison, notes=(*comparison.notes, why_not))
        if comparison.op_rows and not any(change.kind != "phase" for change in op_changes):
            # Too few recorded steps to judge an operator: their totals' changes would read as
            # findings (+66%) and be noise. The totals are shown without changes; the note says why
            # and how to get them.
            comparison = dataclasses.replace(comparison, ops_judged=False)

    _show(comparison, markdown_path, [*base_paths, *cur_paths], json_path)
    warnings = []
    if {os.path.realpath(p) for p in base_paths} == {os.path.realpath(p) for p in cur_paths}:
        # a CI gate handed one path twice (a variable unset, an artifact not downloaded) passes
        # whatever happened
        warnings.append(
            "baseline and current are the same files: the verdict compares them with themselves "
            "and says nothing about a change (a CI variable left unset?)"
        )
    elif same_runs(base, cur):  # ... or one run twice, as its folder and its --json
        warnings.append(
            "baseline and current are the same run (its folder and its --json, say): the verdict "
            "compares it with itself and says nothing about a change"
        )
    if different:  # stdout may be a file the CI job never shows: the log sees it too
        warnings.append(different)
    if comparison.verdict == "inconclusive":
        outcome = (
            "exit 0: --allow-inconclusive"
            if allow_inconclusive
            else "exit 4: a gate that cannot decide fails; --allow-inconclusive passes it"
        )
        warnings.append(f"inconclusive: {comparison.message} ({outcome})")
    from stepcli.safetext import visible

    for warning in warnings:  # names from traces and run summaries: control characters shown
        print(f"stepcli: warning: {visible(warning)}", file=sys.stderr)
    return comparison.exit_code


def _show(
    comparison: Comparison,
    markdown_path: str | None,
    inputs: Sequence[str] = (),
    json_path: str | None = None,
) -> None:
    """The comparison on stdout (the console's, Markdown with `--markdown -`, or JSON with `--json
    -`), the Markdown and JSON files, and the GitHub step summary. A reader gone (`| head`) ends the
    output, not the verdict."""
    import json

    from stepcli.compare.jsonout import comparison_document

    # JSON escapes control characters itself
    document = json.dumps(comparison_document(comparison), indent=2)
    from stepcli.safetext import visible_all

    # names from traces and run summaries: control characters shown
    comparison = visible_all(comparison)
    markdown = render_markdown(comparison)
    from stepcli.pipeconsole import discard_stdout, pipe_console

    try:
        if markdown_path == "-":
            sys.stdout.write(markdown)
            sys.stdout.flush()
        elif json_path == "-":
            sys.stdout.write(document + "\n")
            sys.stdout.flush()
        else:
            render_console(comparison, pipe_console())
    # `compare ... | head`: the reader has seen enough; the verdict still decides the exit
    except BrokenPipeError:
        discard_stdout()
    if json_path and json_path != "-":
        try:
            from stepcli import safefile

            safefile.write_bytes(json_path, (document + "\n").encode("utf-8"))
        except OSError as exc:
            raise StepcliError(
                f"{json_path}: cannot write the JSON ({exc.strerror or exc})", EXIT_USAGE
            ) from None
    if markdown_path and markdown_path != "-":
        try:
            from stepcli import safefile

            safefile.write_bytes(markdown_path, markdown.encode("utf-8"))
        except OSError as exc:
            raise StepcliError(
                f"{markdown_path}: cannot write the Markdown report ({exc.strerror or exc})",
                EXIT_USAGE,
            ) from None
    _append_step_summary(markdown, inputs)


def _refuse_a_run_on_both_sides(
    baseline: Measurement, current: Measurement, base_paths: list[str], cur_paths: list[str]
) -> None:
    """A run given on both sides among others (a CI glob that also picked up the baseline's
    artifact) would pull the two sides together and water a regression down to INCONCLUSIVE: a usage
    error. The very same inputs on both sides pass with a warning instead (a CI variable left
    unset), as the command says after the verdict."""
    base_files = {os.path.realpath(p) for p in base_paths}
    cur_files = {os.path.realpath(p) for p in cur_paths}
    if base_files == cur_files or same_runs(baseline, current):
        return
    labels = _runs(baseline)
    for key, label in _runs(current).items():
        run_id = key[0]
        if run_id and key in labels:
            raise StepcliError(
                f"{label}: the same run (run_id {run_id[:12]}) as the baseline's {labels[key]}; "
                "a run on both sides is compared with itself: give it to one side",
                EXIT_USAGE,
            )
    for path in cur_paths:
        if os.path.realpath(path) in base_files:
            raise StepcliError(
                f"{path}: given as a baseline and as current; a run on both sides is compared with "
                f"itself: "
                "give it to one side",
                EXIT_USAGE,
            )


def _runs(side: Measurement) -> dict[tuple[str | None, tuple[MeasuredProcess, ...]], str]:
    """A side's runs by what makes a run the same run: its run_id and its steps (a hand-made summary
    may reuse an id; a run's folder and its --json hold the same steps), with the label of each."""
    return {(run.run_id, run.processes): run.label for run in side.runs}


def same_runs(baseline: Measurement, current: Measurement) -> bool:
    """Whether both sides are the same run(s), every one known by its run_id."""
    base, cur = _runs(baseline).keys(), _runs(current).keys()
    return bool(base) and base == cur and all(run_id for run_id, _ in base)


def different_programs(baseline: Measurement, current: Measurement) -> str | None:
    """Why the two sides look like different programs (a CI gate handed the wrong artifact), or
    None.

    Run summaries name their program (`python train.py` vs `python eval.py`); traces show it in
    their operators: whole operator tables with no operator in common are not one program's."""
    if baseline.programs and current.programs and not baseline.programs & current.programs:
        return (
            f"baseline and current ran different programs ({', '.join(sorted(baseline.programs))} "
            f"vs {', '.join(sorted(current.programs))}): their step times may not be comparable"
        )
    names = [{op.name for op in side.ops} for side in (baseline, current)]
    if baseline.ops_complete and current.ops_complete and all(names) and not names[0] & names[1]:
        return "baseline and current have no operator in common: they look like different programs"
    return None


def _attribution(
    baseline: Measurement,
    current: Measurement,
    confidence: float,
    tolerance: float,
    min_delta_ms: float,
) -> tuple[tuple[OpChange, ...], str | None]:
    """Per-phase and per-operator changes with intervals when both sides have traces, and a note
    when there were too few recorded steps for them; () otherwise (never fails the gate)."""
    from stepcli.compare.attribution import attribute, attribution_note, op_steps_from_traces

    sides: list[tuple[OpSteps, ...]] = []
    for side in (baseline, current):
        if side.op_steps is not None:
            sides.append(side.op_steps)
        elif side.trace_files:
            from stepcli.traces.read.tracereader import load_paths

            try:
                sides.append(
                    tuple(
                        op_steps_from_traces(load_paths(list(files)), f"{side.label} #{index}")
                        for index, files in enumerate(side.trace_files)
                    )
                )
            # a trace deleted or damaged since the run: the verdict still stands
            except StepcliError as exc:
                print(
                    f"stepcli: warning: no per-operator attribution: {exc.message}", file=sys.stderr
                )
                return (), None
        else:
            return (), None
    try:
        changes = attribute(
            sides[0],
            sides[1],
            confidence=confidence,
            tolerance=tolerance,
            min_delta_ms=min_delta_ms,
        )
        return changes, attribution_note(sides[0], sides[1])
    # attribution only explains the verdict; a failure there must not lose the verdict
    except Exception as exc:
        print(
            f"stepcli: warning: no per-operator attribution: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return (), None


def _append_step_summary(markdown: str, inputs: Sequence[str] = ()) -> None:
    """Append (never overwrite) to GitHub's job summary file when Actions provides one; never to one
    of the inputs, or into an input folder (a variable pointing at the baseline would make it
    invalid JSON)."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    real = os.path.realpath(target)
    for path in inputs:
        source = os.path.realpath(path)
        if real == source or (
            os.path.isdir(source) and real.startswith(source.rstrip(os.sep) + os.sep)
        ):
            print(
                f"stepcli: warning: GITHUB_STEP_SUMMARY {target} is one of the inputs ({path}); "
                f"not appended to",
                file=sys.stderr,
            )
            return
    try:
        # Opened without blocking and only as a regular file: a FIFO there with no reader must not
        # hang the gate.
        fd = os.open(
            target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(0, "not a regular file")
            os.set_blocking(fd, True)
            data = ("\n" + markdown).encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
    except OSError as exc:
        # The verdict is the product; a summary we cannot write only costs the pretty report.
        print(
            f"stepcli: warning: could not append to GITHUB_STEP_SUMMARY {target}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
