"""`stepcli compare --json`: the comparison as one machine-readable document, schema
`stepcli.compare/1` (docs/reference/compare-json.md): the verdict, the interval, the populations and
steps that decided, the Step time table and every attribution row with its estimate, interval and
whether it is significant. Built from the same `Comparison` the terminal and Markdown reports
render, so the three agree."""

from __future__ import annotations

from typing import Any

from stepcli.compare.attribution import PHASE_LABELS
from stepcli.compare.comparison import Comparison
from stepcli.compare.measurement import Measurement

SCHEMA = "stepcli.compare/1"
JSON_HEAD = (
    # how a file this command wrote begins (--json FILE replaces only those)
    b'{\n  "schema": "stepcli.compare/'
)


def _side(m: Measurement, population: str | None, value: float | None) -> dict[str, Any]:
    return {
        "label": m.label,
        "kind": m.kind,
        "description": m.description,
        "steps": m.steps,
        "runs": [run.label for run in m.runs],
        "population": population,
        "value_ms": value,
    }


def _rounded(value: Any) -> Any:
    """Floats to 6 decimals (0.1445, not 0.14450000000000002), everywhere in the document."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


def comparison_document(c: Comparison) -> dict[str, Any]:
    """The JSON document of one comparison (see the module docstring), floats rounded to 6
    decimals."""
    return dict(_rounded(_document(c)))


def _document(c: Comparison) -> dict[str, Any]:
    change = c.change
    relative = change.relative_interval() if change is not None else None
    return {
        "schema": SCHEMA,
        "verdict": c.verdict,
        "headline": c.headline,
        "message": c.message,
        "exit_code": c.exit_code,
        "metric": c.metric,
        "tolerance": c.tolerance,
        "min_delta_ms": c.min_delta_ms,
        "confidence": c.confidence,
        "limit_ms": c.limit_ms,
        "baseline": _side(c.baseline, c.baseline_population, c.baseline_value),
        "current": _side(c.current, c.current_population, c.current_value),
        "interval": None
        if change is None
        else {
            "delta_ms": change.delta,
            "low_ms": change.low,
            "high_ms": change.high,
            "relative": change.relative(change.delta),
            "relative_low": None if relative is None else relative[0],
            "relative_high": None if relative is None else relative[1],
            "confidence": change.confidence,
            "method": c.method,
            "resamples": change.resamples,
            "baseline_steps": change.baseline_steps,
            "current_steps": change.current_steps,
            "baseline_runs": change.baseline_runs,
            "current_runs": change.current_runs,
        },
        "steps_used": list(c.steps_used),
        "step_rows": [
            {
                "population": row.population,
                "stat": row.stat,
                "baseline": row.baseline,
                "current": row.current,
                "decides": c.decides(row),
            }
            for row in c.step_rows
        ],
        "attribution": [
            {
                "kind": ch.kind,
                "name": ch.name,
                "label": PHASE_LABELS.get(ch.name, ch.name) if ch.kind == "phase" else ch.name,
                "baseline_ms": ch.baseline_ms,
                "current_ms": ch.current_ms,
                "delta_ms": ch.delta_ms,
                "low_ms": ch.low,
                "high_ms": ch.high,
                "confidence": ch.row_confidence,
                "family_size": ch.family_size,
                "limit_ms": ch.limit_ms,
                "significant": ch.significant,
            }
            for ch in c.op_changes
        ],
        "operators": [
            {
                "name": op.name,
                "baseline_ms": op.baseline_ms,
                "current_ms": op.current_ms,
                "status": op.status,
            }
            for op in c.op_rows
        ],
        "operators_judged": c.ops_judged,
        "notes": list(c.notes),
    }
