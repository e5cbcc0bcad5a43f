"""Where the recorded steps' time goes by Python stack, from the `python_function` events torch
writes with `with_stack=True` (`stepcli run --with-stack`): `stepcli table --stacks`, the report's
flame graph, and the "other" phase broken down by stack.

Only the steps' own threads are measured (the threads their `ProfilerStep#N` annotations are on),
only inside the complete steps (each event clipped to them), so the figures speak of the same whole
as the step breakdown. Frames nest by time on their thread; a frame's **self** time is its time in
the steps less its child frames' (operators it calls stay in it: a flame graph of where the Python
code spent the step), its **total** time its stack's self time and that of every stack below it. Its
time **outside operators** is the part of its self time in no host operator (no `aten::` call, no
annotation such as `Optimizer.step#...`): the interpreter, the program's own Python, the profiler's
own work. Time the steps spent outside every operator is the breakdown's "other" phase, so these say
which code made it.

Computed only when asked (this reads every frame in Python): `table` without `--stacks` never
imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepcli.traces.analyses.shares import stable_name
from stepcli.traces.read.names import step_of

if TYPE_CHECKING:
    from stepcli.traces.read.typedcolumns import Columns

NS_PER_MS = 1_000_000.0
HOW_TO_RECORD = "record them with `stepcli run --with-stack ...` (torch.profiler: with_stack=True)"


@dataclass
class StackPart:
    """One file's Python stacks: per stack (frame names, outermost first), [self ns, ns outside
    operators]."""

    steps: int  # complete steps measured
    step_ns: int  # their time
    stacks: dict[tuple[str, ...], list[int]] = field(default_factory=dict)


def has_stacks(columns: Columns) -> bool:
    """Whether the trace holds Python frames (cheap: one comparison over the kind column)."""
    from stepcli.traces.read.typedcolumns import PYTHON_FUNCTION

    return bool(len(columns) and (columns.kind == PYTHON_FUNCTION).any())


def stacks_of(columns: Columns, incomplete_step: int | None) -> StackPart | None:
    """The file's Python stacks over its complete steps; None when it holds no Python frame."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col
    from stepcli.traces.read import typedcolumns as tc

    if not has_stacks(columns):
        return None
    try:
        ns = col.nanoseconds(columns)
    except col.TooLarge:  # times no real trace has: no stacks rather than wrong ones
        return StackPart(0, 0)
    names = columns.names
    kind = columns.kind
    step_codes = [
        c for c, n in enumerate(names) if (s := step_of(n)) is not None and s != incomplete_step
    ]
    is_step = (kind == tc.USER_ANNOTATION) & np.isin(
        columns.name, np.array(step_codes or [-1], np.int32)
    )
    n_ids = max(len(columns.ids), 1)
    thread = columns.pid.astype(np.int64) * n_ids + columns.tid
    start, end = ns.start, ns.start + ns.dur
    steps = np.nonzero(is_step)[0]
    part = StackPart(len(steps), int(ns.dur[steps].sum()))
    frame = kind == tc.PYTHON_FUNCTION
    op = ((kind == tc.OTHER_CPU) | (kind == tc.USER_ANNOTATION)) & ~is_step
    for code in sorted(set(thread[steps].tolist())):
        mine = steps[thread[steps] == code]
        spans = col.union_arrays(start[mine], end[mine])
        events = np.nonzero((thread == code) & (frame | op))[0]
        clipped = col.covered(*spans, start[events], end[events])
        events, clipped = events[clipped > 0], clipped[clipped > 0]
        _add_thread(part.stacks, events, clipped, spans, start, end, frame, columns.name, names)
    return part


def _add_thread(
    stacks: dict[tuple[str, ...], list[int]],
    events: Any,
    clipped: Any,
    spans: tuple[Any, Any],
    start: Any,
    end: Any,
    frame: Any,
    name: Any,
    names: list[str],
) -> None:
    """Add one thread's frames (and the operators among them) to `stacks`."""
    import numpy as np

    from stepcli.traces.analyses import arrays as col

    order = np.lexsort((-(end[events] - start[events]), start[events]))
    events, clipped = events[order], clipped[order]
    s, e = start[events], end[events]
    n = len(events)
    parent = col.parents(s, e, e - s, np.zeros(n, np.int64))
    is_frame = frame[events]
    # Nearest frame above each event, and whether an operator encloses it (pointer doubling would
    # also do; stacks are a few dozen deep, one pass per level).
    frame_parent = np.full(n, -1, np.int64)
    in_op = np.zeros(n, bool)
    has = parent >= 0
    frame_parent[has] = np.where(is_frame[parent[has]], parent[has], -1)
    in_op[has] = ~is_frame[parent[has]]
    up = np.where(has & (frame_parent < 0), parent, -1)
    while (up >= 0).any():
        at = np.nonzero(up >= 0)[0]
        above = up[at]
        found = is_frame[above]
        frame_parent[at[found]] = above[found]
        up[at[found]] = -1
        rest = at[~found]
        up[rest] = parent[up[rest]]
    # In an operator when any ancestor is one: follow frame parents up, the flag flows down level by
    # level.
    level = np.nonzero(has & ~in_op)[0]
    for _ in range(n):
        lifted = level[in_op[parent[level]]]
        if not lifted.size:
            break
        in_op[lifted] = True
        level = np.nonzero(has & ~in_op)[0]

    def clipped_under(children: Any, limit: Any) -> Any:
        """Time of `children` in the steps, cut at `limit` (their parent's end: nesting by time is
        not always exact)."""
        return col.covered(*spans, s[children], np.minimum(e[children], limit))

    child = np.nonzero(has)[0]
    under_parent = np.bincount(
        parent[child], weights=clipped_under(child, e[parent[child]]), minlength=n
    )
    framed = np.nonzero(is_frame & (frame_parent >= 0))[0]
    under_frame = np.bincount(
        frame_parent[framed], weights=clipped_under(framed, e[frame_parent[framed]]), minlength=n
    )
    self_ns = np.maximum(clipped - under_frame.round().astype(np.int64), 0)
    outside = np.where(in_op, 0, np.maximum(clipped - under_parent.round().astype(np.int64), 0))
    keys: list[tuple[str, ...]] = [()] * n
    frame_name = name[events]
    clean: dict[int, str] = {}
    for i, p, code, own, out in zip(
        np.nonzero(is_frame)[0].tolist(),
        frame_parent[is_frame].tolist(),
        frame_name[is_frame].tolist(),
        self_ns[is_frame].tolist(),
        outside[is_frame].tolist(),
    ):
        label = clean.get(code)
        if label is None:
            label = clean[code] = stable_name(names[code])
        key = keys[i] = (keys[p] if p >= 0 else ()) + (label,)
        sums = stacks.get(key)
        if sums is None:
            stacks[key] = [own, out]
        else:
            sums[0] += own
            sums[1] += out


def merge_stacks(parts: list[StackPart | None]) -> dict[str, Any] | None:
    """The `python_stacks` document of `table --json` (docs/commands/table.md): every stack, by self
    time, with per-step figures; None when no file holds Python frames."""
    found = [p for p in parts if p is not None]
    if not found:
        return None
    steps = sum(p.steps for p in found)
    step_ns = sum(p.step_ns for p in found)
    sums: dict[tuple[str, ...], list[int]] = {}
    for part in found:
        for key, (own, out) in part.stacks.items():
            have = sums.setdefault(key, [0, 0])
            have[0] += own
            have[1] += out
    totals = dict.fromkeys(sums, 0)
    for key, (own, _out) in sums.items():
        for depth in range(1, len(key) + 1):
            prefix = key[:depth]
            if prefix in totals:
                totals[prefix] += own
    per = max(steps, 1) * NS_PER_MS
    rows: list[dict[str, Any]] = [
        {
            "stack": list(key),
            "self_ms": own / per,
            "total_ms": totals[key] / per,
            "outside_operators_ms": out / per,
            "self_share": own / step_ns if step_ns else 0.0,
            "total_share": totals[key] / step_ns if step_ns else 0.0,
        }
        for key, (own, out) in sums.items()
    ]
    rows.sort(key=lambda r: (-r["self_ms"], -r["total_ms"], r["stack"]))
    return {"steps": steps, "step_ms": step_ns / per, "stacks": rows}


_BUILTIN = re.compile(r"<built-in (?:method|function) (\S+?)(?: of (\S+) object)?>")


def short_frame(label: str) -> str:
    """A frame as people read it: `main (train.py:11)` for torch's `/path/to/train.py(11): main`,
    `Tensor.sum` for `<built-in method sum of Tensor object>`."""
    builtin = _BUILTIN.fullmatch(label)
    if builtin:
        function, owner = builtin.groups()
        return function if owner in (None, "type") else f"{owner}.{function}"
    head, sep, function = label.partition("): ")
    path, paren, line = head.rpartition("(")
    if not (sep and paren and line.isdecimal()):
        return label
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"


def short_stack(stack: list[str], width: int, lines: int = 1) -> str:
    """A stack in at most `lines` lines of `width`, innermost frame first (the code that spent the
    time), its callers after it while they fit (`<…`: more callers left out)."""
    frames = [short_frame(f) for f in reversed(stack)] or ["(no frame)"]
    out: list[str] = []
    text = ""
    for frame in frames:
        piece = frame if not text and not out else ("< " + frame if not text else " < " + frame)
        if len(text) + len(piece) <= width:
            text += piece
            continue
        if text and len(out) + 1 < lines:  # the next line
            out.append(text)
            text = "< " + frame
            if len(text) <= width:
                continue
        if not text:  # one frame wider than the line
            text = piece[: max(1, width - 1)] + "…"
        elif len(text) + 3 <= width:
            text += " <…"
        break
    return "\n".join([*out, text[:width] if len(text) > width else text])


def top_outside(document: dict[str, Any] | None, count: int = 3) -> list[dict[str, Any]]:
    """The stacks with the most Python time outside operators (the "other" phase's code), most
    first."""
    if not document:
        return []
    rows = [r for r in document["stacks"] if r["outside_operators_ms"] > 0]
    rows.sort(key=lambda r: -r["outside_operators_ms"])
    return rows[:count]


__all__ = [
    "HOW_TO_RECORD",
    "StackPart",
    "has_stacks",
    "merge_stacks",
    "short_frame",
    "short_stack",
    "stacks_of",
]
