"""The run summary on the terminal after `stepcli run`: an overview grid, the traces, the tables of
`stepcli table`, notes, advice and the commands to run next. It renders a RunSummary; nothing here
computes a figure.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

import msgspec

from stepcli.fmt import ms, plural, print_wrapped, size_or_dash
from stepcli.run.summary.compilesteps import compile_lines
from stepcli.run.summary.culpritsection import print_culprit
from stepcli.runfolder.summaryfile import (
    PeakMemory,
    PopulationStats,
    RecordedWith,
    RunSummary,
    Steps,
    StepTimeMs,
    SummaryOpRow,
)
from stepcli.safetext import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], phases: str, width: int = 60) -> str:
    """A compact step-time chart; profiled steps are drawn in a second colour by the caller's
    markup."""
    if not values:
        return ""
    buckets = max(1, -(-len(values) // width))
    points = [max(values[i : i + buckets]) for i in range(0, len(values), buckets)]
    marks = [
        any(p not in "0" for p in phases[i : i + buckets]) for i in range(0, len(values), buckets)
    ]
    low, high = min(points), max(points)
    span = (high - low) or 1.0
    chars = []
    for point, profiled in zip(points, marks):
        block = _BLOCKS[min(len(_BLOCKS) - 1, int((point - low) / span * (len(_BLOCKS) - 1)))]
        chars.append(f"[magenta]{block}[/]" if profiled else block)
    return "".join(chars)


def print_run_summary(summary: RunSummary, report_path: str | None = None) -> None:
    """The summary on stderr after the program exits (stdout belongs to the program)."""
    from rich.markup import escape

    from stepcli.pipeconsole import pipe_console
    from stepcli.runfolder.summaryfile import advice_line
    from stepcli.safetext import visible_all

    summary = visible_all(summary)  # names from traces: control characters shown
    report_path = visible_all(report_path)

    console = pipe_console(stderr=True, highlight=False)  # no trailing spaces in CI logs
    # The command on a line of its own (never cut or wrapped inside the grid), its outcome in the
    # grid.
    console.print("[bold]stepcli summary[/]")
    console.print(f"[bold]command[/] {escape(shlex.join(summary.command))}", soft_wrap=True)
    console.print(_overview(summary, console))
    _print_hang(summary, console)
    _print_windows(summary, console)
    _print_tables(summary, console)
    out_dir = summary.out_dir
    print_culprit(console, summary.culprit, _relative(out_dir) if out_dir else None)
    from stepcli.runfolder.steprecordreader import lines as whole_run_lines

    # before the notes, the advice and `next:`, wrapped to the width
    for line in whole_run_lines(summary):
        print_wrapped(console, line)
    for note in summary.notes:
        console.print(f"[yellow]note:[/] {note}")
    for item in summary.advice or ():
        console.print(f"[bold cyan]advice:[/] {escape(advice_line(item))}")
    helps = summary.what_would_help
    if helps:
        from stepcli.whatif.whatifrender import top_line

        best = top_line(helps)
        if best:
            print_wrapped(console, best)
    _print_next(summary, report_path, console)


def _killed_by(status: int | None) -> str:
    """` (SIGTERM)` for 143: the name of the signal an exit status of 128+N says the program died
    of."""
    import signal

    if status is not None and 128 < status < 128 + 65:
        try:
            return f" ({signal.Signals(status - 128).name})"
        except ValueError:
            return ""
    return ""


def _overview(summary: RunSummary, console: Console) -> Table:
    """The grid of the run's outcome: status, steps, step times, compile, timeline, peak memory."""
    from rich.table import Table

    overview = Table.grid(padding=(0, 2))
    overview.add_column(style="bold")
    overview.add_column()
    status = summary.exit_status
    overview.add_row(
        "status",
        f"[{'green' if status == 0 else 'red'}]exit {status}{_killed_by(status)}[/], "
        f"{summary.duration_s:.1f} s",
    )
    steps = summary.steps or Steps(global_=0)
    named = list(steps.requesters.items())
    requesters = ", ".join(f"{name} {count}" for name, count in named[:6])
    if len(named) > 6:  # e.g. a new optimizer per epoch
        requesters += f", +{len(named) - 6} more"
    overview.add_row("steps", f"{steps.global_}" + (f"  ({requesters})" if requesters else ""))
    processes = summary.processes
    each = "rank" if processes and all(p.rank is not None for p in processes) else "process"
    if len(processes) > 1:
        # The one convention, said once: a count is per rank (as `steps` and the advice give
        # theirs); the statistics beside it pool every rank's steps.
        overview.add_row(
            "processes",
            ", ".join(f"{p.worker} {plural(p.global_steps or 0, 'step')}" for p in processes)
            + f" (counts are per {each}; the statistics pool every {each}'s steps)",
        )
    times = summary.step_time_ms or StepTimeMs()
    for label, stats in (("untouched steps", times.untouched), ("profiled steps", times.profiled)):
        if stats:
            overview.add_row(
                label,
                f"{_count(stats, len(processes), each)}  median {ms(stats.median)}  p90 "
                f"{ms(stats.p90)}  min {ms(stats.min)}  max {ms(stats.max)}",
            )
    after = times.after_window
    if after:  # in neither population: say how many, so the counts add up
        overview.add_row(
            "after a window",
            f"n={after.count}  median {ms(after.median)}  max {ms(after.max)}  (set aside: the "
            f"first step "
            "after each window pays for the profiler's stop and save)",
        )
    if times.first_step:
        overview.add_row(
            "first step", f"{ms(times.first_step.max)} (start-up, not in the statistics)"
        )
    for index, text in enumerate(compile_lines(summary.compile, len(summary.processes))):
        overview.add_row("compile" if index == 0 else "", text)
    _add_timeline(overview, summary, console)
    threads = summary.threads
    for host in threads.hosts if threads else []:  # only when they outnumber the cores
        if host.oversubscribed:
            overview.add_row(
                "threads",
                f"{host.intra_op_threads} intra-op threads in "
                f"{plural(host.processes, 'process', 'processes')} on {plural(host.cores, 'core')} "
                f"({host.host}): oversubscribed, see the advice",
            )
    memory = summary.peak_memory or PeakMemory()
    if memory.rss_bytes or memory.cuda_bytes:
        overview.add_row(
            "peak memory",
            f"RSS {size_or_dash(memory.rss_bytes)}"
            + (f"  CUDA {size_or_dash(memory.cuda_bytes)}" if memory.cuda_bytes else ""),
        )
    return overview


def _count(stats: PopulationStats, processes: int, each: str) -> str:
    """A population's count: `n=27` for one process; per rank for several (`n=27 per rank`, `n=26-27
    per rank`), from `per_process` (a summary without it: the count over every rank, said so)."""
    if processes <= 1:
        return f"n={stats.count}"
    counts = stats.per_process
    if not isinstance(counts, list) or not counts:
        return f"n={stats.count} over {processes} {each}s"
    low, high = min(counts), max(counts)
    return f"n={low if low == high else f'{low}-{high}'} per {each}"


def _add_timeline(overview: Table, summary: RunSummary, console: Console) -> None:
    timeline = summary.timeline_ms[1:]
    scale = f"  {ms(min(timeline))} .. {ms(max(timeline))}" if timeline else ""
    line = sparkline(
        timeline, (summary.timeline_phases or "")[1:], width=max(10, min(60, console.width - 40))
    )
    if line:
        if not console.no_color and console.color_system and "[magenta]" in line:
            scale += "  [dim](magenta: profiled)[/]"
        overview.add_row("timeline", line + scale)


def _print_hang(summary: RunSummary, console: Console) -> None:
    """The hang block (stepcli/run/summary/hangreport.py) under the outcome it explains: as it is
    (names from the program are no markup), never re-wrapped (its lines fit 80 columns; a long
    folder path stays whole)."""
    from stepcli.run.summary.hangwords import summary_lines

    for line in summary_lines(summary.hang, _relative):
        console.print(visible(line), markup=False, highlight=False, soft_wrap=True)


def _print_windows(summary: RunSummary, console: Console) -> None:
    """Each trace with its size; paths on lines of their own, never cut or wrapped, so they can be
    copied."""
    for window in summary.windows:
        steps = (
            f"steps {window.first_step}-{window.last_step}"
            if window.first_step != window.last_step
            else f"step {window.first_step}"
        )
        note = window.note if isinstance(window.note, str) else "incomplete"
        extra = "" if window.complete else f" [yellow]({note})[/]"
        console.print(
            f"[bold]trace[/] {steps} {window.worker} ({size_or_dash(window.bytes)}){extra}:"
        )
        console.print(f"  {window.trace}", markup=False, soft_wrap=True)


def _print_tables(summary: RunSummary, console: Console) -> None:
    """Top operators and kernels, the step breakdown and the ranks, as `stepcli table` shows
    them."""
    if not (summary.top_operators or summary.top_kernels):
        return
    from stepcli.traces.render import terminal as render
    from stepcli.traces.render.gpusection import print_device_section

    width = console.width
    share_of = summary.share_of or "recorded step time"
    if summary.top_operators:
        title = "Top CPU operators by self time (recorded steps)"
        render.print_table(
            console,
            render.ops_table(
                _rows(summary.top_operators), title, 10, width=width, share_of=share_of
            ),
        )
        outside = render.outside_note(msgspec.to_builtins(summary.outside_steps))
        if outside:
            console.print(outside, markup=False, highlight=False, soft_wrap=True)
    if summary.top_kernels:
        title = "Top device kernels by self time"
        render.print_table(
            console,
            render.ops_table(_rows(summary.top_kernels), title, 10, width=width, share_of=share_of),
        )
    breakdown = summary.breakdown_ms
    if breakdown:
        render.print_table(console, render.breakdown_table(breakdown, summary.device))
        from stepcli.traces.render.stacksection import other_lines

        other = {"other_ms": msgspec.to_builtins(summary.other_ms), "breakdown_ms": breakdown}
        for line in other_lines(other, console.width):
            print_wrapped(console, line, indent="    ")
    print_device_section(
        {"flops": summary.flops, "device": summary.device, "ranks": summary.ranks}, console
    )
    if len(summary.ranks) > 1:
        title = "Recorded step time per rank"
        ranks = render.ranks_table(summary.ranks, _slowest(summary), title=title, width=width)
        render.print_table(console, ranks)
        straggler = summary.straggler
        if straggler:
            console.print(f"slowest rank: {straggler['evidence']}", markup=False, highlight=False)


# (what the traces hold, `table`'s option that shows it, what it shows) for the `next:` lines
_RECORDED_OPTIONS = (
    ("stacks", "--stacks", "the Python stacks"),
    ("shapes", "--group-by-shape", "one row per shape"),
)


def _print_next(summary: RunSummary, report_path: str | None, console: Console) -> None:
    """The commands to run next, one per line, never wrapped in the middle: each can be copied as it
    is."""
    lines = []
    if summary.traces:
        out = summary.out_dir or "."
        lines.append(f"  stepcli table {shlex.quote(_relative(out))}")
        recorded = summary.recorded_with or RecordedWith()
        for flag, option, why in _RECORDED_OPTIONS:
            if getattr(recorded, flag):  # what the traces hold, and the option that shows it
                line = f"  stepcli table {shlex.quote(_relative(out))} {option}"
                lines.append(f"{line}    ({why})" if len(line) + len(why) + 6 <= 80 else line)
    if report_path:
        lines.append(f"  open {shlex.quote(_relative(report_path))} in a browser")
    if summary.traces and summary.what_would_help and summary.what_would_help.verdict == "ok":
        lines.append(f"  stepcli whatif {shlex.quote(_relative(summary.out_dir or '.'))}")
    if summary.traces:
        # Not TensorBoard: it shows nothing of a trace without the deprecated torch-tb-profiler
        # plugin.
        lines.append("  open a trace in https://ui.perfetto.dev or chrome://tracing")
        from stepcli.run.summary.hta import hta_command

        hta = hta_command(summary, _relative)
        if hta:  # one window's folder: HTA keeps one trace per rank from a folder
            from importlib.util import find_spec

            first = "" if find_spec("hta") else " (pip install HolisticTraceAnalysis)"  # 75 columns
            lines += [f"  Holistic Trace Analysis of one window{first}:", f"  {hta}"]
    if lines:
        console.print("next:")
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)


def _relative(path: str) -> str:
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    except ValueError:
        return path


def _rows(rows: list[SummaryOpRow]) -> list[dict[str, Any]]:
    """Operator rows as the table renderer (shared with `stepcli table`) takes them."""
    return [msgspec.to_builtins(row) for row in rows]


def _slowest(summary: RunSummary) -> int | None:
    return summary.slowest_rank if isinstance(summary.slowest_rank, int) else None
