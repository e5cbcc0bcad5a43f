"""The per-rank table on narrow terminals: labels wrap at their spaces, figures are never cut."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from stepcli.traces.render.terminal import ranks_table


def _ranks() -> list[dict[str, Any]]:
    window = {"count": 3, "mean": 120.0, "p90": 121.0, "max": 122.0}
    return [
        {
            "rank": rank,
            "worker": f"rank{rank}",
            "step_ms": {"count": 12, "mean": 123.45, "p90": 150.2, "max": 1203.4},
            "compute_ms": 100.1,
            "comm_ms": 23.3,
            "windows": [{"steps": "2-4", "step_ms": window}, {"steps": "10-12", "step_ms": window}],
        }
        for rank in range(2)
    ]


def _render(width: int) -> list[str]:
    console = Console(width=width, record=True, no_color=True, force_terminal=False)
    console.print(ranks_table(_ranks(), 1, title="Recorded step time per rank", width=width))
    return [line.rstrip() for line in console.export_text().splitlines()]


@pytest.mark.parametrize("width", [56, 60, 70])
def test_under_80_columns_every_label_and_figure_stays_whole(width: int) -> None:
    lines = _render(width)
    assert all(len(line) <= width for line in lines), lines
    rows = [line.split() for line in lines if line.startswith(("rank", "  "))]
    # each rank's label on its own row beside its figures (at 60 columns "(slowest)" may go to the
    # next line)
    for rank in (0, 1):
        row = next(r for r in rows if r[:2] == ["rank", str(rank)])
        assert row[-6:] == ["12", "123.5", "150.2", "1,203.4", "100.1", "23.30"], lines
    windows = [r for r in rows if r and r[0] in ("2-4", "10-12")]
    assert len(windows) == 4 and all(r[1:] == ["3", "120.0", "121.0", "122.0"] for r in windows), (
        lines
    )
    assert "ms per step;" in " ".join(lines)  # the units the shorter headings leave out


def test_80_columns_keep_the_box_and_the_units_in_the_headings() -> None:
    lines = _render(80)
    assert all(len(line) <= 80 for line in lines), lines
    assert any("┃ Process" in line and "Mean ms" in line for line in lines), lines
    assert any(line.startswith("│ rank 1 (slowest)") for line in lines), lines
