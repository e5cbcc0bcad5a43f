"""stepcli.fmt: one way to write durations and sizes everywhere (terminal, tables, report.html)."""

from __future__ import annotations

import pytest

from stepcli import fmt
from stepcli.agent.output import human_size


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (366_186_496, "349.2 MiB"),  # issue 19 item 13: this RSS was shown as "349.2 MB"
        (5 * 1024**3, "5.0 GiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_sizes_are_binary_and_labelled_so(count: int, text: str) -> None:
    assert fmt.size(count) == text
    # The agent, which may import nothing of stepcli outside itself, writes sizes the same way.
    if count < 1024**4:
        assert human_size(count) == text


def test_size_or_dash_for_nothing_measured() -> None:
    assert fmt.size_or_dash(None) == "-" and fmt.size_or_dash(0) == "-" and fmt.size_or_dash(2048) == "2.0 KiB"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0 ms"),
        (0.4123, "0.412 ms"),
        (1.234, "1.23 ms"),
        (12.34, "12.3 ms"),
        (123.4, "123 ms"),
        (1234.0, "1.23 s"),
    ],
)
def test_milliseconds_with_unit(value: float | None, text: str) -> None:
    assert fmt.ms(value) == text


def test_milliseconds_in_cells_and_as_typed() -> None:
    assert [fmt.ms_cell(v) for v in (None, 0.4123, 12.345, 1234.5)] == ["-", "0.412", "12.35", "1,234.5"]
    assert [fmt.ms_exact(v) for v in (25.0, 31.25, 0.0001)] == ["25", "31.25", "0.0001"]
    assert fmt.percent(0.254) == "25%" and fmt.percent(0.254, 1) == "25.4%"
