"""The culprit in words: its cause, its process group, the evidence sentence the JSON and the report
carry, and the terminal line of `table` and the run summary (stepcli.traces.analyses.culprit
computes what they say).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

CAUSE_WORDS = {
    "gc": "Python garbage collection",
    "dataloader": "data loading",
    "host_to_device": "host-to-device copies",
    "compile": "compilation",
    "cpu_operators": "CPU operators",
    "no_operator": "time with no operator (Python code, I/O, sleeps)",
    "cpu_wait": "time waiting for a CPU (more busy threads than cores)",
}
_GENERATION = re.compile(r"gen (\d)")


def cause_words(found: dict[str, Any]) -> str:
    """The cause in words, with the generation of a gc pause or the top operators, e.g. `Python
    garbage collection (gen 2)` or `CPU operators (aten::matmul 15.1 ms, aten::tanh 10.7 ms)`."""
    cause = found["cause"]
    top = found.get("top") or []
    if cause == "gc" and top:
        generation = _GENERATION.search(top[0]["name"])
        return f"Python garbage collection (gen {generation.group(1) if generation else '?'})"
    if top:
        return (
            f"{CAUSE_WORDS[cause]} ("
            + ", ".join(f"{t['name']} {t['ms_per_step']:.1f} ms" for t in top)
            + ")"
        )
    return CAUSE_WORDS[cause]


def group_words(group: dict[str, Any]) -> str:
    """A process group in words, e.g. `process group 2 [ranks 2, 3]`."""
    return f"process group {group['name']} [ranks {', '.join(str(r) for r in group['ranks'])}]"


def evidence(found: dict[str, Any]) -> str:
    """One sentence: who arrives last, how often (on which process group, when judged on one), how
    late, and why."""
    group = found.get("group")
    figures = group or found
    where = f"the collectives on {group_words(group)}" if group else "the collectives"
    others = "the other members" if group else "the other ranks"
    return (
        f"rank {found['rank']} arrives last at {figures['last_share']:.0%} of {where}, "
        f"{figures['lateness_ms_per_step']:.1f} ms/step late, making the others wait "
        f"{figures['wait_caused_ms_per_step']:.1f} ms/step; its extra time before arriving is "
        f"{cause_words(found)}, {found['cause_ms_per_step']:.1f} ms/step more than {others}"
    )


def summary_line(section: dict[str, Any] | None) -> str | None:
    """The terminal line of `table` and the run summary."""
    if not section:
        return None
    found = section.get("culprit")
    if found:
        return f"culprit: {found['evidence']} ({_clocks(section)})"
    return f"culprit: none: {no_culprit_reason(section)}"


def no_culprit_reason(section: Mapping[str, Any]) -> str:
    """Why no culprit is named, as the terminal and the page both say it: the test that decided, as
    the analysis wrote it (`no_culprit.words`)."""
    decided = section.get("no_culprit")
    if isinstance(decided, Mapping) and isinstance(decided.get("words"), str):
        return f"{decided['words']} ({_clocks(section)})"
    return (
        f"no rank arrives last consistently enough at {section['collectives']} collectives "
        f"({_clocks(section)})"
    )


def no_culprit_words(why: Mapping[str, Any]) -> str:
    """The sentence of the test that decided no culprit (stepcli.traces.analyses.culprit._why_not),
    with the latest rank's figures: it must never contradict the table of ranks beside it."""
    rank, reason = why["rank"], why["reason"]
    last = f"rank {rank} arrives last at {why['times_last']} of {why['collectives']} collectives"
    if reason == "not_last_often":
        return (
            f"no rank arrives last at {why['min_last_share']:.0%} of its collectives or more: "
            f"the latest, {last} ({why['last_share']:.0%})"
        )
    if reason == "chance":
        return (
            f"{last}, which ranks doing the same work do {why['chance']:.0%} of the time by chance"
        )
    if reason == "lead_in_noise":
        return (
            f"{last}, but by a median lead of only {why['lead_median_ms']:.2f} ms, no more than "
            f"the noise ({why['min_lead_ms']:.2f} ms: its arrivals' jitter, the clocks' alignment "
            f"error)"
        )
    if reason == "little_lateness":
        return (
            f"{last}, but only {why['lateness_ms_per_step']:.2f} ms/step late, under the "
            f"{why['min_lateness_ms_per_step']:.2f} ms/step that would matter"
        )
    return (
        f"{last}, {why['lateness_ms_per_step']:.2f} ms/step late, but does no extra work before "
        f"arriving ({why['cause_ms_per_step']:.2f} ms/step more than the others): it only leaves "
        f"each collective later, the order in which the collective completes on the ranks (gloo's "
        f"ring), not work of its own"
    )


def _clocks(section: Mapping[str, Any]) -> str:
    alignment = section["alignment"]
    if alignment.get("one_clock"):
        return "one clock: all ranks on one machine"
    return f"clock alignment error {alignment['error_ms']:.2f} ms"


def culprit_lines(section: dict[str, Any] | None) -> list[str]:
    """The terminal line of `table`, as a list (none without collectives on two or more ranks)."""
    line = summary_line(section)
    return [line] if line else []
