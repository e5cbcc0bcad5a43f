"""The run summary: step logs + traces of one `stepcli run` -> a versioned document, printed and/or saved.

The document (schema "stepcli.run", typed in stepcli.runfolder.summaryfile, documented field by field in docs/reference/summary-json.md) is what
`--json` writes and what `stepcli compare` and `stepcli report` read, so building it (here, advice included) is
kept apart from rendering it (stepcli.run.summary.console for the terminal, stepcli.report for the page).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import signal
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from stepcli import __version__
from stepcli.agent.config import AgentConfig
from stepcli.agent.schedule import NONE
from stepcli.agent.tracker import AFTER_WINDOW, FOREIGN
from stepcli.errors import StepcliError, TraceError
from stepcli.fmt import plural
from stepcli.inputs import read_side_json
from stepcli.run.summary.compilesteps import compile_summary, compiled_steps
from stepcli.run.summary.culpritsection import culprit_section
from stepcli.run.summary.hangreport import hang_summary
from stepcli.run.summary.threads import threads_section
from stepcli.run.summary.whatifline import what_would_help
from stepcli.runfolder.layout import HELLO_PREFIX, SUMMARY_SCHEMA, SUMMARY_VERSION
from stepcli.runfolder.summaryfile import AdviceItem, Process, RunSummary, StepTimeMs, SummaryWindow
from stepcli.stats import describe
from stepcli.steptimes import process_steps
from stepcli.traces.analyses.shares import STEP_KEY

if TYPE_CHECKING:
    from stepcli.traces.runtraces import RunTraces

TOP_N = 20
_MAX_HELLO_BYTES = 1 << 20  # a process's hello file: a few notes


# What the device's work and its collectives ran under: the hardware queues per device, and NCCL's settings.
_RECORDED_ENVIRONMENT = re.compile(r"CUDA_DEVICE_MAX_CONNECTIONS|NCCL_[A-Z0-9_]*")
_MAX_VALUE = 1000  # characters of a value kept


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`CUDA_DEVICE_MAX_CONNECTIONS` and the `NCCL_*` variables the program was started with, by name: they change
    how streams overlap and how collectives run, so a comparison of two runs must be able to see them."""
    return {name: environ[name][:_MAX_VALUE] for name in sorted(environ) if _RECORDED_ENVIRONMENT.fullmatch(name)}


def _load_json_files(folder: str, predicate: Any) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    if not os.path.isdir(folder):
        return documents
    for name in sorted(os.listdir(folder)):
        if name.startswith(".") or not predicate(name):
            continue
        try:
            document = read_side_json(os.path.join(folder, name), _MAX_HELLO_BYTES)  # (never blocking on a FIFO)
        except TraceError:
            continue
        if document is not None:
            documents.append(document)
    return documents


def _step_time_ms(
    logs: list[dict[str, Any]], untouched: list[float], profiled: list[float], first: list[float], after: list[float]
) -> StepTimeMs:
    """Each population's statistics over every process's steps together, with `per_process`: its count in each
    process (in `processes` order), so that a count can be said per rank, as `steps` and the advice say theirs."""
    counts = [_step_populations([log])[:4] for log in logs]
    out: dict[str, Any] = {}
    populations = (("untouched", untouched), ("profiled", profiled), ("first_step", first), ("after_window", after))
    for index, (key, values) in enumerate(populations):
        stats = describe(values)
        out[key] = dict(stats, per_process=[len(c[index]) for c in counts]) if stats else None
    return cast("StepTimeMs", out)


def _step_populations(
    logs: list[dict[str, Any]],
) -> tuple[list[float], list[float], list[float], list[float], int]:
    """Untouched, profiled and after-a-window step times (ms) over all processes; step 0 (start-up) is kept
    apart, and the first step after each window too: it pays for the profiler's stop and save (AFTER_WINDOW)."""
    untouched: list[float] = []
    profiled: list[float] = []
    first: list[float] = []
    after: list[float] = []
    foreign = 0
    for log in logs:
        compiled = compiled_steps(log)  # torch.compile steps: kept apart like step 0 (see compilereport)
        for index, (micros, phase) in enumerate(zip(log.get("durations_us", []), log.get("phases", ""))):
            millis = micros / 1000.0
            code = int(phase)
            if index == 0:
                first.append(millis)
            elif index in compiled:
                continue
            elif code == FOREIGN:
                foreign += 1
            elif code == AFTER_WINDOW:
                after.append(millis)
            elif code == NONE:
                untouched.append(millis)
            else:
                profiled.append(millis)
    return untouched, profiled, first, after, foreign


def _primary(logs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The process that speaks for the run: rank 0, else the one that made the most steps."""
    if not logs:
        return None
    ranked = [log for log in logs if log.get("rank") == 0]
    return ranked[0] if ranked else max(logs, key=lambda log: log.get("global_steps", 0))


# stepcli run's own options: given after the script, they reach the program instead (and often its argparse).
_RUN_OPTIONS = frozenset(
    {
        "--skip-first",
        "--wait",
        "--warmup",
        "--active",
        "--repeat",
        "--record-shapes",
        "--profile-memory",
        "--with-stack",
        "--with-flops",
        "--with-modules",
        "--activities",
        "--step-on",
        "--out",
        "--gzip",
        "--json",
        "--fail-over",
        "--quiet",
    }
)


def _window_loss_explained(logs: list[dict[str, Any]]) -> bool:
    """Whether a process's own notes say why its window was not saved (the main thread blocked at a SIGTERM, the
    program exiting from another thread): then the launcher's guess at a cause would contradict them."""
    return any(
        "window" in note and "saved" in note for log in logs for note in log.get("notes", []) if isinstance(note, str)
    )


def _hook_notes(config: AgentConfig) -> list[str]:
    """What the launcher's own child said of `--step-on` targets it could not hook (its hello file: a process that
    never steps writes no step log)."""
    hellos = _load_json_files(config.log_dir, lambda n: n.startswith(HELLO_PREFIX)) if config.step_on else []
    found: list[str] = []
    for hello in hellos:
        for note in hello.get("hook_notes") or []:
            if isinstance(note, str) and note not in found:
                found.append(note)
    return found


def _why_no_steps(config: AgentConfig, exit_status: int, command: list[str] | None = None) -> str:
    hellos = _load_json_files(config.log_dir, lambda n: n.startswith(HELLO_PREFIX))
    if not hellos:
        return (
            "no steps observed: stepcli's hook never loaded in the program. Python flags -I, -E or -S skip "
            "PYTHONPATH/sitecustomize; a command that is not Python, or that resets PYTHONPATH, also hides it."
        )
    if 0 < exit_status <= 128:
        note = f"no steps observed: the program exited with status {exit_status} before its first step"
        misplaced = [a.split("=", 1)[0] for a in (command or [])[2:] if a.split("=", 1)[0] in _RUN_OPTIONS]
        if misplaced:
            note += (
                f"; {misplaced[0]} came after the script, so it went to the program: stepcli's options go before "
                "the script (stepcli run --active 2 train.py)"
            )
        return note + "."
    if not any(h.get("torch_imported") for h in hellos):
        return "no steps observed: the program never imported torch."
    if exit_status > 128:
        import signal

        try:
            name = signal.Signals(exit_status - 128).name
        except ValueError:
            name = f"signal {exit_status - 128}"
        if name in ("SIGINT", "SIGTERM", "SIGHUP"):  # the agent saves on these: no step log means no step yet
            return f"no steps recorded: the program was interrupted ({name}) before its first step."
        return (
            f"no steps recorded: the program ended with status {exit_status} ({name}?) before stepcli could write "
            "its step log; a SIGKILL or an out-of-memory kill leaves no time to save."
        )
    failed = _hook_notes(config)
    if failed:  # the --step-on target the user named is not there: say that, not "name one with --step-on"
        return f"no steps observed: {failed[0]}"
    return (
        "no steps observed: torch was imported but no optimizer.step(), torch.profiler step() or --step-on "
        "function was called. For inference or custom loops, name the step with --step-on MODULE:QUALNAME."
    )


def _trace_analysis(trace_paths: list[str], notes: list[str], traces: RunTraces | None = None) -> dict[str, Any] | None:
    """The merged summary of the run's traces; read through `traces` when given, so report.html reuses the read."""
    if not trace_paths:
        return None
    try:
        if traces is not None:
            return traces.summary(trace_paths).to_dict()
        from stepcli.traces.engine import summarize_paths

        return summarize_paths(trace_paths).to_dict()
    except StepcliError as exc:
        notes.append(f"could not summarize the traces: {exc.message}")
    except Exception as exc:  # a bug in the analysis must not hide what the run measured
        notes.append(f"could not summarize the traces: {type(exc).__name__}: {exc}")
    return None


def build_run_summary(
    config: AgentConfig,
    *,
    command: list[str],
    exit_status: int,
    started_at: float,
    duration_s: float,
    traces: RunTraces | None = None,
    on_hang: str | None = None,
    hang_ended: bool = False,
    hang_folders: Sequence[str] = (),
) -> RunSummary:
    """Everything the run measured, as a JSON-able document (schema `stepcli.run`, version 2), its advice
    included. With `traces`, the trace files are read through it (and kept there for report.html). `on_hang` and
    `hang_ended` (the launcher ended the job after a hang dump) go into the `hang` section, read from
    `hang_folders` only: the OUT/hang-<n>/ folders this run's hang watch wrote."""
    from stepcli.runfolder.steplogreader import load_step_logs

    logs, refused = load_step_logs(config, since=started_at)  # signed, schema-checked, traces inside out_dir
    logs.sort(key=lambda log: (log.get("rank") is None, log.get("rank") or 0, log.get("pid", 0)))
    primary = _primary(logs)
    untouched, profiled, first, after, foreign = _step_populations(logs)
    notes: list[str] = list(refused)
    windows = [dict(window, worker=log["worker"]) for log in logs for window in log.get("windows", [])]
    windows.sort(key=lambda w: (w["first_step"], w["worker"]))
    trace_paths = [w["trace"] for w in windows if os.path.exists(w["trace"])]

    if primary is None:
        notes.append(_why_no_steps(config, exit_status, command))
    else:
        requesters = [r for r in primary.get("requesters", []) if r["calls"]]
        together = [r for r in requesters if r["first_step"] == min((q["first_step"] for q in requesters), default=0)]
        if len({r["calls"] for r in together}) > 1:  # requesters alive together that stepped at different rates
            busiest = max(together, key=lambda r: r["calls"])
            notes.append(
                f"requesters stepped unequally; the global step follows the busiest ({busiest['name']}, "
                f"{plural(busiest['calls'], 'step')}), as KinetoStepTracker does"
            )
        if not windows and config.on_demand:
            notes.append("no trace: no `stepcli capture` asked for a window while the run stepped (--on-demand)")
        elif not windows:
            steps = primary.get("global_steps", 0)
            first_window = next(config.schedule.windows(1), None)
            # a log not written at the process's end (it was killed) holds the count of its last periodic save
            final = primary.get("exit", "running") != "running" or primary.get("progress") == "stalled"
            if first_window and steps <= first_window[1] and hang_folders:  # it hung: the hang said why
                ended = ", and --on-hang kill ended it" if hang_ended else ""
                notes.append(
                    f"no trace: the job hung at step {steps}, before the first window (steps "
                    f"{first_window[1]}-{first_window[2]}){ended}; what each process was doing is in "
                    f"{', '.join(os.path.basename(f.rstrip(os.sep)) + '/' for f in hang_folders)}"
                )
            elif first_window and steps <= first_window[1] and final:  # step N is the N+1st: none ended
                notes.append(
                    f"no trace: the program made {plural(steps, 'step')}, and the first window records steps "
                    f"{first_window[1]}-{first_window[2]}; lower --wait/--skip-first/--warmup"
                )
            elif first_window and steps <= first_window[2] and not _window_loss_explained(logs):
                # it ended inside the window with no time to save it, and said nothing of it
                cause = (
                    "SIGKILL leaves no time"
                    if exit_status == 128 + signal.SIGKILL
                    else "a SIGKILL or a hard crash leaves no time; SIGTERM, Ctrl-C and an ordinary exit save what "
                    "was recorded"
                )
                where = (
                    f"at step {steps}, inside the window of steps"
                    if final
                    else f"at step {steps} or later (its last saved count), in or before the window of steps"
                )
                notes.append(
                    f"no trace: the program ended (exit {exit_status}) {where} "
                    f"{first_window[1]}-{first_window[2]}, before its trace could be saved ({cause}); a shorter "
                    "--active is saved sooner"
                )
    stepped = {r["name"] for log in logs for r in log.get("requesters", []) if r["calls"]}
    unhooked = " ".join(note for log in logs for note in log.get("notes", []) if isinstance(note, str))
    hooks_failed = _hook_notes(config)
    said = " ".join(notes)
    notes.extend(note for note in hooks_failed if note not in unhooked and note not in said)  # (no step log says it)
    unhooked += " " + " ".join(hooks_failed)
    for spec in config.step_on:
        if spec not in stepped and f"could not hook {spec.partition(':')[0]} " not in unhooked:
            notes.append(
                f"--step-on {spec} never completed a call: its module was never imported, the function never "
                "called, or it runs as __main__ (with -m, or as the script itself)"
            )
    for log in logs:
        if log.get("skipped_windows"):
            notes.append(
                f"{log['worker']}: {log['skipped_windows']} window(s) skipped while the program ran its own profiler"
            )
        notes.extend(f"{log['worker']}: {note}" for note in log.get("notes", []))
    if foreign:
        notes.append(f"{foreign} step(s) ran under the program's own profiler and are left out of the statistics")

    analysis = _trace_analysis(trace_paths, notes, traces)
    flops, device = _at_program_pace(analysis, untouched)
    rss = [log["peak_rss_bytes"] for log in logs if log.get("peak_rss_bytes")]
    cuda = [log["cuda_peak_bytes"] for log in logs if log.get("cuda_peak_bytes")]
    torch_version = next((log.get("torch") for log in logs if log.get("torch")), None)
    summary: RunSummary = {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_VERSION,
        "stepcli_version": __version__,
        "run_id": uuid.uuid4().hex,  # tells runs apart when several are compared per side
        "command": list(command),
        "exit_status": exit_status,
        "started_at": datetime.fromtimestamp(started_at, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": (primary or {}).get("python") or platform.python_version(),
        "torch": torch_version,
        "environment": recorded_environment(os.environ),
        "out_dir": config.out_dir,
        "schedule": config.schedule.to_dict(),
        "on_demand": config.on_demand,
        "steps": {
            "global": (primary or {}).get("global_steps", 0),
            "requesters": {r["name"]: r["calls"] for r in (primary or {}).get("requesters", [])},
        },
        "step_time_ms": _step_time_ms(logs, untouched, profiled, first, after),
        "timeline_ms": [round(us / 1000.0, 3) for us in (primary or {}).get("durations_us", [])][:100_000],
        "timeline_phases": (primary or {}).get("phases", "")[:100_000],
        # Every step of every process, for compare's confidence intervals (one digit per step, as timeline_phases).
        "step_times": [
            {
                "worker": log.get("worker"),
                "rank": log.get("rank"),
                "pid": log.get("pid"),
                "durations_ms": [round(us / 1000.0, 3) for us in log.get("durations_us", [])][:100_000],
                "phases": log.get("phases", "")[:100_000],
            }
            for log in logs
        ],
        "processes": [process_entry(log) for log in logs],
        "windows": cast("list[SummaryWindow]", windows),
        # --capture-on-slow windows a process did not record (stepcli.runfolder.steprecordreader.attach adds the recorded ones)
        "triggered": [
            dict(t, worker=log["worker"])
            for log in logs
            for t in log.get("triggers_not_recorded") or []
            if isinstance(t, dict) and isinstance(t.get("first_step"), int) and isinstance(t.get("last_step"), int)
        ],
        "traces": trace_paths,
        # ProfilerStep* is the step annotation itself, not work: it would always top the list.
        "top_operators": [op for op in (analysis or {}).get("cpu_ops", []) if op["name"] != STEP_KEY][:TOP_N],
        "top_kernels": (analysis or {}).get("device_kernels", [])[:TOP_N],
        "ranks": (analysis or {}).get("ranks", []),
        "slowest_rank": (analysis or {}).get("slowest_rank"),
        "straggler": (analysis or {}).get("straggler"),
        "culprit": culprit_section((analysis or {}).get("culprit"), logs),
        "share_of": (analysis or {}).get("share_of"),
        "outside_steps": (analysis or {}).get("outside_steps"),
        "breakdown_ms": (analysis or {}).get("breakdown_ms"),
        "other_ms": (analysis or {}).get("other_ms"),
        "recorded_with": (analysis or {}).get("recorded_with"),
        "device": device,
        "flops": flops,
        "peak_memory": {"rss_bytes": max(rss) if rss else None, "cuda_bytes": max(cuda) if cuda else None},
        "threads": threads_section(logs),
        "compile": compile_summary(logs),
        "memory_snapshots": run_snapshots(logs, config.out_dir),
        "hang": hang_summary(  # --hang-timeout reports (stepcli/run/summary/hangreport.py)
            hang_folders,
            started_at,
            timeout_s=config.hang_timeout or None,
            on_hang=on_hang if config.hang_timeout else None,
            ended_job=hang_ended,
        ),
        "notes": notes,
    }
    untouched_stats = describe(untouched)
    median = untouched_stats["median"] if untouched_stats else None
    summary["what_would_help"] = what_would_help(trace_paths, median, notes, traces)
    summary["advice"] = _advice(summary, analysis)
    return summary


def _at_program_pace(
    analysis: dict[str, Any] | None, untouched: list[float]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The `flops` and `device` sections with achieved FLOP/s and MFU at the untouched steps' pace (their median
    time: the program's own, without the profiler's cost) when there are untouched steps; the recorded steps'
    figures stay under `achieved_flops_per_s_recorded` and `mfu_recorded` (stepcli.traces.analyses.flops.at_untouched_pace)."""
    from stepcli.traces.analyses.flops import at_untouched_pace

    flops, device = (analysis or {}).get("flops"), (analysis or {}).get("device")
    stats = describe(untouched)
    paced = at_untouched_pace(flops, stats["median"] if stats else None)
    if paced is not flops and paced is not None and device is not None:
        device = device | {key: paced[key] for key in flops or {} if key in device}
    return paced, device


def _advice(summary: RunSummary, analysis: dict[str, Any] | None) -> list[AdviceItem]:
    """The run's advice; a bug in a rule must not hide what the run measured (it becomes a note)."""
    from stepcli.advice.gather import advise_run

    try:
        return [item.to_dict() for item in advise_run(summary, analysis, process_steps(summary))]
    except Exception as exc:
        summary["notes"].append(f"could not compute the advice: {type(exc).__name__}: {exc}")
        return []


def run_snapshots(logs: list[dict[str, Any]], out_dir: str) -> list[str]:
    """The CUDA memory snapshots this run's processes say they wrote (their signed step logs), each still a
    regular file of this user's in the output folder (not a link): a snapshot planted there is never read."""
    import stat

    names: list[str] = []
    for log in logs:
        listed = log.get("memory_snapshots")
        for name in listed if isinstance(listed, list) else []:
            if not isinstance(name, str) or "/" in name or name.startswith(".") or not name.endswith(".pickle"):
                continue
            try:
                info = os.lstat(os.path.join(out_dir, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and (not hasattr(os, "getuid") or info.st_uid == os.getuid()):
                names.append(name)
    return sorted(set(names))


def process_entry(log: dict[str, Any]) -> Process:
    """One entry of `processes` from a process's step log."""
    return {
        "worker": log.get("worker"),
        "rank": log.get("rank"),
        "pid": log.get("pid"),
        "argv": log.get("argv"),
        "global_steps": log.get("global_steps"),
        "exit": log.get("exit"),
        "peak_rss_bytes": log.get("peak_rss_bytes"),
        "cuda_peak_bytes": log.get("cuda_peak_bytes"),
        "intra_op_threads": log.get("intra_op_threads"),
        "requesters": {r["name"]: r["calls"] for r in log.get("requesters", [])},
    }


def analysis_progress(enabled: bool = True, out_dir: str | None = None) -> AbstractContextManager[Any]:
    """A spinner on stderr while the traces are read after the program exits (seconds for large traces), so
    stepcli is not silent; on a terminal. Pipes and CI logs get no control characters: for large traces in
    `out_dir`, progress lines instead (stepcli.slowwork)."""
    try:
        interactive = enabled and sys.stderr.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        from stepcli.slowwork import reading

        return reading([out_dir], enabled) if out_dir else contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status("stepcli: reading the traces ...", spinner="dots")


def write_run_summary(summary: RunSummary, path: str, *, private_folder: bool = False) -> None:
    """`--json PATH`, written atomically through a new file (stepcli.safefile). `private_folder`: `path` is in the
    run's control folder, which must still be this user's private folder (not one put in its place)."""
    import orjson

    from stepcli import safefile
    from stepcli.agent.controlfiles import open_folder

    data = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    target = Path(path)
    try:
        if private_folder:
            fd = open_folder(str(target.parent))
            try:
                safefile.write_bytes(target.name, data, safefile.PRIVATE, dir_fd=fd)
            finally:
                os.close(fd)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            safefile.write_bytes(str(target), data)
    except OSError as exc:
        raise StepcliError(f"--json {path}: {exc.strerror or exc}") from None
