"""What triggered a --capture-on-slow window, as a request carries it and as it is saved beside the
trace.

Runs inside the target: standard library only. A leaf: on-demand capture (ondemand.py) reads it from
requests and saves it, the slow-step trigger (slowtrigger.py) writes it; neither imports the other
for it.
"""

from __future__ import annotations

import os

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TRIGGER_FILE = "trigger.json"
TRIGGER_KEY = "stepcli_trigger"  # the same, in the trace's own top-level metadata
TRIGGER_KEYS = (
    "rank",
    "step",
    "ms",
    "baseline_ms",
    "threshold_ms",
    "rule",
    "predicted_step",
    "period",
)


def clean_trigger(value: Any) -> dict[str, Any] | None:
    """The trigger of a request read from requests.json, keeping only known keys with plain
    values."""
    if not isinstance(value, dict):
        return None
    kept: dict[str, Any] = {}
    for key in TRIGGER_KEYS:
        item = value.get(key)
        if isinstance(item, (int, float)) or item is None and key in value:
            kept[key] = item
        elif isinstance(item, str):
            kept[key] = item[:32]
    return kept


def save_trigger(trace: str, trigger: dict[str, Any]) -> None:
    """trigger.json next to the trace (a triggered window has a folder of its own)."""
    from .config import atomic_write_json

    try:
        atomic_write_json(
            os.path.join(os.path.dirname(os.path.abspath(trace)), TRIGGER_FILE), trigger
        )
    except OSError:
        pass  # the step log and the summary still say it
