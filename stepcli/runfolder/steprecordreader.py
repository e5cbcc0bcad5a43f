"""The whole run's step times per process (stepcli/agent/steprecord.py), read back for the run
summary and --json.

Every process leaves a compact record at exit; this reads them (checking what it reads: a record it
cannot use is skipped, never a traceback), adds percentiles estimated from the log-bucketed
histogram (within 1/16 of a doubling, about 4.5%), and the triggered captures (--capture-on-slow)
from the summary's windows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stepcli import fmt
from stepcli.agent.signing import signature_matches
from stepcli.fmt import plural
from stepcli.runfolder.layout import (
    SIGNATURE_KEY,
    STEP_RECORD_BUCKETS_PER_DOUBLING,
    STEP_RECORD_SCHEMA,
    STEP_RECORD_SUFFIX,
)
from stepcli.runfolder.runs import read_saved_json
from stepcli.runfolder.summaryfile import RunSummary, StepRecord
from stepcli.steptimes import slowest_first

_MAX_BYTES = 4 << 20
_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SHOWN = 4  # processes given a line in the summary (the slowest at p99); all of them are in --json


def load(log_dir: str, key: str | None = None) -> list[dict[str, Any]]:
    """Each process's record with `ms` (count, p50, p90, p99, max) added, by rank then worker. With
    the run's key (after `stepcli run`), only records signed with it: written by this run's own
    processes."""
    records = []
    try:
        names = sorted(os.listdir(log_dir))
    except OSError:
        return []
    for name in names:
        if not name.endswith(STEP_RECORD_SUFFIX) or name.startswith("."):
            continue
        try:
            # Not followed if a link, never blocking on a FIFO, only a regular file of this user's:
            # the control folder may have been swapped for someone else's (stepcli.safefile).
            record = read_saved_json(Path(log_dir) / name, _MAX_BYTES)
            if record is None:
                continue
            signature = record.pop(SIGNATURE_KEY, None)
            if key is not None and not signature_matches(key, record, signature):
                continue
            if record.get("schema") == STEP_RECORD_SCHEMA:
                record["ms"] = stats(record)
                records.append(record)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return sorted(
        records,
        key=lambda r: (not isinstance(r.get("rank"), int), r.get("rank") or 0, str(r["worker"])),
    )


def stats(record: dict[str, Any]) -> dict[str, float | int]:
    """count and percentiles (ms) from the histogram; max exact, from the slowest steps."""
    buckets = sorted((int(k), int(v)) for k, v in record["histogram"].items())
    count = sum(v for _, v in buckets)
    result: dict[str, float | int] = {"count": count}
    for name, q in _QUANTILES:
        seen, target = 0, q * count
        for index, value in buckets:
            seen += value
            if seen >= target:
                result[name] = round(
                    2 ** ((index + 0.5) / STEP_RECORD_BUCKETS_PER_DOUBLING) / 1000, 3
                )
                break
    slowest = [int(us) for _, us in record.get("slowest") or []]
    if slowest:
        result["max"] = round(max(slowest) / 1000, 3)
        for name, _ in _QUANTILES:  # a bucket's middle may lie past the slowest step in it
            if name in result:
                result[name] = min(result[name], result["max"])
    return result


def attach(summary: RunSummary, log_dir: str, key: str | None = None) -> None:
    """Add `step_record` (per process) and `triggered` (each --capture-on-slow window) to the run
    summary."""
    summary.step_record = [
        StepRecord(
            worker=r["worker"],
            rank=r.get("rank"),
            steps=r["steps"],
            ms=r["ms"],
            block_steps=r["block_steps"],
            blocks=[tuple(block) for block in r["blocks"]],  # as the summary reads them back
            slowest=[tuple(pair) for pair in r["slowest"]],
            histogram=r["histogram"],
        )
        for r in load(log_dir, key)
    ]
    recorded = [
        {
            "worker": w.worker,
            "first_step": w.first_step,
            "last_step": w.last_step,
            **w.trigger,
            "recorded": True,
        }
        for w in summary.windows
        if isinstance(w.trigger, dict)
    ]
    # placed, but not recorded by a process (the job ended first, or it was past those steps): said,
    # not dropped
    missed = [t for t in summary.triggered or [] if t.get("recorded") is False]
    summary.triggered = sorted(
        recorded + missed, key=lambda t: (t["first_step"], str(t.get("worker")))
    )


def _steps(record: StepRecord, ms: Mapping[str, Any]) -> str:
    """The process's step count, as report.html and `step_record[].steps` give it; the percentiles
    leave out the first step (start-up) and hold the profiled steps, unlike the untouched steps'
    median above them: said so."""
    steps = record.steps
    if steps == ms["count"]:
        return f"{plural(ms['count'], 'step')}, profiled ones included:"
    return f"{plural(steps, 'step')}; after the first (start-up), profiled ones included:"


def lines(summary: RunSummary) -> list[str]:
    """The summary's lines for the whole run's step times and the triggered captures."""
    out = []
    records = [r for r in summary.step_record if r.ms.get("count")]
    shown = slowest_first(records, SHOWN)
    for r in shown:
        ms = r.ms
        slow = sorted(r.slowest, key=lambda s: -s[1])[:3]
        out.append(
            f"whole run {r.worker}: {_steps(r, ms)} p50 ~{fmt.ms(ms['p50'])}, "
            f"p90 ~{fmt.ms(ms['p90'])}, "
            f"p99 ~{fmt.ms(ms['p99'])}, max {fmt.ms(ms.get('max', 0))}; longest steps "
            + ", ".join(f"{step} ({fmt.ms(us / 1000)})" for step, us in slow)
        )
    if len(records) > len(shown):
        out.append(
            f"whole run: {len(records) - len(shown)} more processes in --json and report.html"
        )
    for t in summary.triggered or []:
        steps = f"steps {t['first_step']}-{t['last_step']}"
        rank = f"rank {t['rank']} " if t.get("rank") is not None else ""
        predicted = (
            f", placed on predicted slow step {t['predicted_step']}"
            if t.get("predicted_step")
            else ""
        )
        missed = f"; NOT recorded: {t.get('reason')}" if t.get("recorded") is False else ""
        out.append(
            f"triggered capture {steps} ({t['worker']}): {rank}step {t['step']} took {t['ms']:.1f} "
            f"ms, baseline {t['baseline_ms']:.1f} ms, rule {t['rule']}{predicted}{missed}"
        )
    return out
