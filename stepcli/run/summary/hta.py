"""The Holistic Trace Analysis one-liner the run summary suggests for one recorded window.

HTA reads one folder and keeps one trace per rank, so the command names a folder that holds exactly
one window: the output folder when each process recorded one window, else that window's
`window-step<N>/` folder. A folder that also holds other runs' traces (`-o` given twice) is named
with this window's files (`trace_files=`), so HTA reads this run, not whichever run's trace it
happens to keep.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from stepcli.runfolder.summaryfile import RunSummary


def hta_command(summary: RunSummary, relative: Any = os.path.relpath) -> str | None:
    """`python -c "...TraceAnalysis(trace_dir=...)..."` for the run's first window, or None without
    traces."""
    windows = [w for w in summary.windows if w.trace in summary.traces]
    if not windows:
        return None
    where = os.path.dirname(windows[0].trace)
    folder = relative(where)
    ours = sorted({os.path.basename(w.trace) for w in windows if os.path.dirname(w.trace) == where})
    args = f"trace_dir={json.dumps(folder)}"
    if set(_traces_in(where)) - set(ours):
        from stepcli.traces.read.files import rank_from_name

        ranks = [rank_from_name(name) for name in ours]
        if len({r for r in ranks if r is not None}) != len(ours):
            ranks = list(range(len(ours)))  # HTA needs one key per file
        files = ", ".join(
            f"{rank}: {json.dumps(name)}" for rank, name in zip(ranks, ours, strict=True)
        )
        args = f"trace_files={{{files}}}, {args}"
    # HTA's breakdowns need device kernels; on CPU-only traces they fail, and the steps per rank
    # still help.
    analysis = "get_temporal_breakdown()" if summary.top_kernels else "get_profiler_steps()"
    code = f"from hta.trace_analysis import TraceAnalysis; print(TraceAnalysis({args}).{analysis})"
    return f"python -c {shlex.quote(code)}"


def _traces_in(folder: str) -> list[str]:
    """The trace files HTA would read in `folder` (its own listing: `.json` and `.gz` names, not
    recursive)."""
    try:
        return [
            n
            for n in os.listdir(folder)
            if n.endswith((".json", ".json.gz")) and not n.startswith(".")
        ]
    except OSError:
        return []
