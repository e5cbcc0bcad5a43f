"""stepcli.compare.comparerender: two operators never read alike, whatever the width."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from stepcli.compare.comparerender import _print_rows
from stepcli.traces.render.terminal import shorten, shortened_apart

# Two kernels whose names differ only in the middle (a template argument), as on a real DLRM job
KERNEL = (
    "void split_embedding_backward_codegen_rowwise_adagrad_kernel<float, float, float, "
    "{}ul>(at::Accessor<float, long>)"
)
TWINS = [KERNEL.format(2), KERNEL.format(5)]


def test_names_that_shorten_alike_are_shown_whole() -> None:
    assert shorten(TWINS[0], 40) == shorten(TWINS[1], 40)
    apart = shortened_apart([*TWINS, "aten::mm", "x" * 50], 40)
    assert apart[0] != apart[1] and apart[0].replace("\n", "") == TWINS[0]
    assert all(len(line) <= 40 for line in apart[0].split("\n"))
    assert apart[2:] == ["aten::mm", shorten("x" * 50, 40)]  # the others as before


@pytest.mark.parametrize("width", [80, 60])
def test_compare_rows_of_twins_differ_in_the_table_and_in_stacked_lines(width: int) -> None:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    rows = [
        (TWINS[0], ["-", "60.134"], "- -> 60.134 ms, new"),
        (TWINS[1], ["36.180", "-"], "36.180 -> - ms, removed"),
    ]
    _print_rows(console, "Device kernels", [("base ms", "right"), ("current ms", "right")], rows)
    text = out.getvalue()
    # THEN the part where they differ is printed for each, and no line passes the width
    assert "2ul>" in text and "5ul>" in text, text
    assert all(len(line) <= width for line in text.splitlines()), text
