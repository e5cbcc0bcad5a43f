"""The report's flame graph: the recorded steps' CPU time by Python stack (traces recorded with
`--with-stack`), as inline SVG (no script, no stylesheet from anywhere: hovering a frame shows its
<title>), and the lines under the breakdown that say what its "other" phase is made of.

The figures are stepcli.traces.analyses.pystacks's (the same as `table --stacks`); frame names come
from traces, which may be hostile, so every one is escaped where it is written.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from stepcli import fmt
from stepcli.safetext import html_escape as escape
from stepcli.traces.analyses.pystacks import HOW_TO_RECORD, short_frame

WIDTH = 960
ROW = 17  # px per frame row
MAX_DEPTH = 80  # deeper frames are left out (their time stays in their callers' bars)
MIN_PX = 0.4  # frames narrower than this are not drawn
CHAR_PX = 6.6  # a label character, for fitting text in a frame


class _Node:
    __slots__ = ("children", "name", "self_ms", "total_ms")

    def __init__(self, name: str) -> None:
        self.name = name
        self.self_ms = 0.0
        self.total_ms = 0.0
        self.children: dict[str, _Node] = {}


def _tree(stacks: Sequence[Mapping[str, Any]]) -> _Node:
    """The stacks as a tree of frames, each node's total its own self time plus its children's."""
    root = _Node("all")
    for row in stacks:
        node = root
        node.total_ms += row["self_ms"]
        for frame in row["stack"][:MAX_DEPTH]:
            node = node.children.setdefault(frame, _Node(frame))
            node.total_ms += row["self_ms"]
        node.self_ms += row["self_ms"]
    return root


def _color(name: str) -> str:
    """A warm colour per frame name, the same on every page (crc32, not Python's salted hash)."""
    h = zlib.crc32(name.encode("utf-8", "replace"))
    return f"hsl({10 + h % 45},{70 + (h >> 8) % 20}%,{58 + (h >> 16) % 12}%)"


def flame_graph(document: Mapping[str, Any]) -> str:
    """The flame graph of a `python_stacks` document: one row per stack depth, callers above their
    callees (an icicle: the top row is every recorded step), each frame as wide as its total
    time."""
    step_ms = float(document.get("step_ms") or 0.0)
    root = _tree(document["stacks"])
    whole = max(step_ms, root.total_ms) or 1.0
    scale = WIDTH / whole
    body: list[str] = []
    depth_seen = 0
    level: list[tuple[_Node, float]] = [(root, 0.0)]
    depth = 0
    while level and depth <= MAX_DEPTH:
        nxt: list[tuple[_Node, float]] = []
        for node, x in level:
            w = node.total_ms * scale
            if w < MIN_PX:
                continue
            depth_seen = depth
            body.append(_frame_rect(node, x, depth * ROW, w, step_ms, is_root=depth == 0))
            child_x = x
            for child in sorted(node.children.values(), key=lambda c: c.name):
                nxt.append((child, child_x))
                child_x += child.total_ms * scale
        level = nxt
        depth += 1
    height = (depth_seen + 1) * ROW + 2
    title = "Python stacks of the recorded steps (flame graph)"
    return (
        f'<svg class="chart flame" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" font-family="ui-monospace,monospace" font-size="11">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _frame_rect(node: _Node, x: float, y: int, w: float, step_ms: float, *, is_root: bool) -> str:
    label = (
        f"all recorded steps ({fmt.ms(node.total_ms)} per step)"
        if is_root
        else short_frame(node.name)
    )
    share = node.total_ms / step_ms if step_ms else 0.0
    tip = (
        label
        if is_root
        else f"{node.name}\n{fmt.ms(node.total_ms)} per step ({share:.1%}), self "
        f"{fmt.ms(node.self_ms)}"
    )
    fill = "#d0d5dd" if is_root else _color(node.name)
    out = [
        f'<g class="frame"><rect x="{x:.1f}" y="{y}" width="{max(w - 0.3, 0.1):.1f}" '
        f'height="{ROW - 1}" fill="{fill}" rx="1"/><title>{escape(tip)}</title>'
    ]
    room = int((w - 6) / CHAR_PX)
    if room >= 3:
        text = label if len(label) <= room else label[: room - 1] + "…"
        out.append(f'<text x="{x + 3:.1f}" y="{y + ROW - 5}" fill="#1d2330">{escape(text)}</text>')
    out.append("</g>")
    return "".join(out)


def stacks_section(document: Mapping[str, Any] | None, recorded: bool) -> list[str]:
    """The report's Python stacks section; without stacks, one line saying why and how to get
    them."""
    if not document or not document.get("stacks"):
        why = (
            "No Python frame inside a complete recorded step."
            if document is not None or recorded
            else f"No Python stacks in these traces: {HOW_TO_RECORD}."
        )
        return [f'<p class="muted" id="stacks-missing">Flame graph left out. {escape(why)}</p>']
    steps = document["steps"]
    return [
        '<h2 id="stacks">Python stacks (recorded steps)</h2>',
        f'<p class="muted">Where the {fmt.plural(steps, "recorded step")}\' time went by Python '
        f"stack: each "
        "frame as wide as its time (its callees included), callers above callees. Hover a frame "
        "for its full name and figures. The same figures: <code>stepcli table --stacks</code>.</p>",
        flame_graph(document),
    ]


def other_section(lines: Sequence[str]) -> list[str]:
    """The breakdown's "other" explained (stepcli.traces.render.stacksection.other_lines), as a
    short paragraph."""
    if not lines:
        return []
    head, *rest = lines
    items = "".join(
        f"<li><code>{escape(line.strip())}</code></li>" for line in rest[1:] if line.strip()
    )
    more = f"<br>{escape(rest[0].strip())}<ul>{items}</ul>" if items else ""
    if rest and not items:
        more = f" ({escape(rest[0].strip())})"
    return [f'<p id="other-phase">{escape(head)}{more}</p>']
