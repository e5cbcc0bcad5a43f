"""The culprit advice: a rank that arrives last at the collectives (a finding of
stepcli.traces.analyses.culprit) and makes the others wait at least CULPRIT_MIN_WAIT_MS per step,
with the cause of its lateness and what to do about that cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepcli.traces.analyses.culpritwords import cause_words, group_words

# Advice: a culprit (already a finding, stepcli.traces.analyses.culprit) making the others wait at
# least this much per step.
CULPRIT_MIN_WAIT_MS = 1.0
_SUGGESTIONS = {
    "gc": "Schedule garbage collection: gc.freeze() after set-up, gc.disable() and gc.collect(1) "
    "every N steps on every rank at the same step (as torchtitan does)",
    "dataloader": "Give that rank's DataLoader more workers (num_workers, prefetch_factor) or "
    "check its data shard",
    "host_to_device": "Pin memory and copy with non_blocking=True; check that rank's device and "
    "its PCIe link",
    "compile": "Compile before timing (warm-up steps), or mark dynamic shapes so that rank stops "
    "recompiling",
    "cpu_operators": "Give the ranks the same work: uneven shards or sequence lengths, or extra "
    "work on that rank",
    "no_operator": "Look at the Python code that runs only on that rank (logging, checkpoints, "
    "I/O, sleeps)",
    "cpu_wait": "Give each rank its own cores: fewer threads per rank (OMP_NUM_THREADS, "
    "torch.set_num_threads, DataLoader workers), pin ranks to cores (numactl, taskset), or move "
    "other jobs off the machine",
}


def culprit_advice(section: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The fields of the `culprit` advice (stepcli.advice.rules.Advice): a rank that arrives last at
    the collectives, with the cause of its lateness; None below the threshold."""
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
        f"{figures['lateness_ms_per_step']:.1f} ms/step late; its extra time is "
        f"{cause_words(found)}, {found['cause_ms_per_step']:.1f} ms/step",
        "threshold": f"last at ≥ {limits.get('min_last_share', 0):.0%} of {judged_on} and beyond "
        f"chance (p ≤ {limits.get('max_chance', 0):g}; or last at every one by a lead far beyond "
        f"the others' noise), a lead over the clock alignment error and its own jitter, ≥ "
        f"{limits.get('min_lateness_ms_per_step', 0):g} ms/step late, others waiting ≥ "
        f"{CULPRIT_MIN_WAIT_MS:g} "
        "ms/step",
        "suggestion": _SUGGESTIONS[found["cause"]] + ".",
    }
