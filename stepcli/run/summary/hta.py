"""The Holistic Trace Analysis one-liner the run summary suggests for one recorded window.

HTA reads one folder and keeps one trace per rank, so the command names a folder that holds exactly one window:
the output folder when each process recorded one window, else that window's `window-step<N>/` folder.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from stepcli.runsummary import RunSummary


def hta_command(summary: RunSummary, relative: Any = os.path.relpath) -> str | None:
    """`python -c "...TraceAnalysis(trace_dir=...)..."` for the run's first window, or None without traces."""
    windows = [w for w in summary.get("windows", []) if w.get("trace") in summary.get("traces", [])]
    if not windows:
        return None
    folder = relative(os.path.dirname(windows[0]["trace"]))
    # HTA's breakdowns need device kernels; on CPU-only traces they fail, and the steps per rank still help.
    analysis = "get_temporal_breakdown()" if summary.get("top_kernels") else "get_profiler_steps()"
    code = (
        f"from hta.trace_analysis import TraceAnalysis; print(TraceAnalysis(trace_dir={json.dumps(folder)}).{analysis})"
    )
    return f"python -c {shlex.quote(code)}"
