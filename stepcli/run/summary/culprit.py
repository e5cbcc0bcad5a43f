"""The run summary's `culprit` section: the traces' culprit analysis (stepcli.traces.analyses.culprit) plus each process's
Python garbage collections over the whole run (from its step log, stepcli.agent.gcpauses), its terminal lines and
its advice rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stepcli.traces.analyses.culpritwords import cause_words, group_words, summary_line

# Advice: a culprit (already a finding, stepcli.traces.analyses.culprit) making the others wait at least this much per step.
CULPRIT_MIN_WAIT_MS = 1.0
_SUGGESTIONS = {
    "gc": "Schedule garbage collection: gc.freeze() after set-up, gc.disable() and gc.collect(1) every N steps "
    "on every rank at the same step (as torchtitan does)",
    "dataloader": "Give that rank's DataLoader more workers (num_workers, prefetch_factor) or check its data shard",
    "host_to_device": "Pin memory and copy with non_blocking=True; check that rank's device and its PCIe link",
    "compile": "Compile before timing (warm-up steps), or mark dynamic shapes so that rank stops recompiling",
    "cpu_operators": "Give the ranks the same work: uneven shards or sequence lengths, or extra work on that rank",
    "no_operator": "Look at the Python code that runs only on that rank (logging, checkpoints, I/O, sleeps)",
    "cpu_wait": "Give each rank its own cores: fewer threads per rank (OMP_NUM_THREADS, torch.set_num_threads, "
    "DataLoader workers), pin ranks to cores (numactl, taskset), or move other jobs off the machine",
}


def _gc_counts(log: Mapping[str, Any]) -> dict[str, Any] | None:
    """A step log's `gc` entry, checked: per generation collections, pause ms, longest pause ms, objects collected."""
    entry = log.get("gc")
    keys = ("collections", "pause_ms", "max_pause_ms", "collected")
    if not isinstance(entry, dict):
        return None
    out: dict[str, Any] = {}
    for key in keys:
        values = entry.get(key)
        if not (isinstance(values, list) and len(values) == 3):
            return None
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e18 for v in values):
            return None
        out[key] = values
    return out


def culprit_section(analysis: Mapping[str, Any] | None, logs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The traces' culprit analysis with `gc`: one row per process that recorded its collections."""
    gc_rows = []
    for log in logs:
        counts = _gc_counts(log)
        if counts is not None:
            gc_rows.append({"worker": log.get("worker"), "rank": log.get("rank"), **counts})
    if analysis is None and not gc_rows:
        return None
    section: dict[str, Any] = dict(analysis) if analysis else {"collectives": 0, "culprit": None}
    section["gc"] = gc_rows
    return section


def culprit_lines(section: Mapping[str, Any] | None) -> list[str]:
    """The run summary's lines: the culprit (or why none) and the garbage collections of each rank."""
    if not section:
        return []
    lines = []
    if section.get("collectives"):
        line = summary_line(dict(section))
        if line:
            lines.append(line)
    ranked = [row for row in section.get("gc", []) if row.get("rank") is not None]
    if len(ranked) > 1 or (ranked and section.get("collectives")):
        parts = []
        for row in ranked:
            pause = sum(row["pause_ms"])
            parts.append(
                f"rank {row['rank']} {sum(row['collections'])} ({pause:.1f} ms, gen 2: {row['collections'][2]})"
            )
        # Counted by a gc callback from the interpreter's start: torch's import and the set-up are in it too.
        lines.append("python gc over each whole process (start-up and imports included): " + ", ".join(parts))
    return lines


def print_culprit(console: Any, section: Mapping[str, Any] | None, out_dir: str | None = None) -> None:
    """The culprit lines on the run summary's console (rich), as they are: no markup in names from traces; and,
    with collectives, the command that shows every rank on one timeline."""
    from stepcli.fmt import print_wrapped

    for line in culprit_lines(section):
        print_wrapped(console, line)
    if section and section.get("collectives") and out_dir:
        import shlex

        # The command on a line of its own, whole: it can be copied as it is.
        console.print("every rank on one timeline, culprits marked:", markup=False, highlight=False)
        console.print(f"  stepcli merge {shlex.quote(out_dir)} -o all-ranks.json", markup=False, soft_wrap=True)


def culprit_advice(section: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The fields of the `culprit` advice (stepcli.advice.rules.Advice): a rank that arrives last at the collectives,
    with the cause of its lateness; None below the threshold."""
    found = (section or {}).get("culprit")
    if not found or found["wait_caused_ms_per_step"] < CULPRIT_MIN_WAIT_MS:
        return None
    limits = (section or {}).get("thresholds", {})
    group = found.get("group")  # judged on one of its process groups: that group's figures
    figures = group or found
    where = f"the collectives on {group_words(group)}" if group else "the collectives"
    judged_on = "the collectives of one of its process groups" if group else "the collectives"
    return {
        "rule": "culprit",
        "title": f"Rank {found['rank']} holds the others back at collectives",
        "evidence": f"rank {found['rank']} arrives last at {figures['last_share']:.0%} of {where}, "
        f"{figures['lateness_ms_per_step']:.1f} ms/step late; its extra time is {cause_words(found)}, "
        f"{found['cause_ms_per_step']:.1f} ms/step",
        "threshold": f"last at ≥ {limits.get('min_last_share', 0):.0%} of {judged_on} and beyond chance "
        f"(p ≤ {limits.get('max_chance', 0):g}; or last at every one by a lead far beyond the others' noise), a lead over the clock alignment error and its own jitter, "
        f"≥ {limits.get('min_lateness_ms_per_step', 0):g} ms/step late, others waiting ≥ {CULPRIT_MIN_WAIT_MS:g} "
        "ms/step",
        "suggestion": _SUGGESTIONS[found["cause"]] + ".",
    }
