"""The advice of one run (or of traces): the evidence its rules read, gathered from the run summary
and the traces' analysis, and every rule applied (stepcli.advice.rules, then the device rules of
stepcli.advice.deviceadvice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from stepcli.advice.deviceadvice import advise_device
from stepcli.advice.rules import Advice, Evidence, advise
from stepcli.runfolder.summaryfile import RunSummary
from stepcli.steptimes import ProcessSteps, rank_steps
from stepcli.traces.analyses.shares import STEP_KEY


def advise_run(
    summary: RunSummary | None,
    analysis: Mapping[str, Any] | None,
    processes: Sequence[ProcessSteps],
) -> list[Advice]:
    """The advice for a run (or traces): operator tables, breakdown and device time from the traces'
    analysis (every operator, not only the summary's top 20) or, without traces, from what the run
    summary kept of them; step times from every process.

    `stepcli run` calls this when it builds the run summary (so the terminal's `advice:` lines do
    not depend on report.html), `stepcli report` when its inputs carry no advice (plain traces,
    older summaries)."""
    kept: Mapping[str, Any] = msgspec.to_builtins(summary) if summary is not None else {}
    if analysis is not None:
        ops = [op for op in analysis["cpu_ops"] if op["name"] != STEP_KEY]
        kernels, breakdown, device = (
            analysis["device_kernels"],
            analysis["breakdown_ms"],
            analysis["device"],
        )
        recorded = len(analysis["steps"])
    else:
        ops, kernels = list(kept.get("top_operators") or []), list(kept.get("top_kernels") or [])
        breakdown, device = kept.get("breakdown_ms"), kept.get("device")
        recorded = sum(
            (rank.get("step_ms") or {}).get("count", 0) for rank in kept.get("ranks") or []
        )
    lead = processes[0] if processes else None
    untouched = (
        [(s, v) for s, v, c in zip(lead.steps, lead.values_ms, lead.phases) if c == "0" and s != 0]
        if lead
        else []
    )
    evidence = Evidence(
        breakdown_ms=breakdown,
        device_busy_share=(device or {}).get("busy_share"),
        cpu_ops=ops,
        kernels=kernels,
        recorded_steps=recorded,
        rank_steps=rank_steps(processes),
        untouched_ms=untouched,
        device=device,
        straggler=(analysis if analysis is not None else kept).get("straggler"),
        ranks_analysed=len((analysis if analysis is not None else kept).get("ranks") or []) > 1,
        culprit=kept.get("culprit") or (analysis or {}).get("culprit"),
        threads=summary.threads if summary is not None else None,
    )
    return advise(evidence) + advise_device(evidence)
