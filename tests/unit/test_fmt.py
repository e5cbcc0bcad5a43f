"""stepcli.fmt: one way to write durations and sizes everywhere (terminal, tables, report.html), and
control characters from names shown, never sent to the reader's terminal."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stepcli import fmt, safetext
from stepcli.agent.output import human_size
from stepcli.safetext import html_escape, visible, visible_all


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
    assert (
        fmt.size_or_dash(None) == "-"
        and fmt.size_or_dash(0) == "-"
        and fmt.size_or_dash(2048) == "2.0 KiB"
    )


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
    assert [fmt.ms_cell(v) for v in (None, 0.4123, 12.345, 1234.5)] == [
        "-",
        "0.412",
        "12.35",
        "1,234.5",
    ]
    assert [fmt.ms_exact(v) for v in (25.0, 31.25, 0.0001)] == ["25", "31.25", "0.0001"]
    assert fmt.percent(0.254) == "25%" and fmt.percent(0.254, 1) == "25.4%"


def test_control_characters_become_escapes_and_the_rest_is_unchanged() -> None:
    assert visible("\x1b[2J\x1b[H") == "\\x1b[2J\\x1b[H"
    assert visible("a\x07b\x00c\x7f\x9b\td\n") == "a\\x07b\\x00c\\x7f\\x9b\\x09d\\x0a"
    assert visible("evil\u202eop\u2066") == "evil\\u202eop\\u2066"
    plain = "aten::conv2d ∑ ünïcödé 🙂 <b>"
    assert visible(plain) == plain


def test_html_escape_also_escapes_markup() -> None:
    assert html_escape("<\x1b>") == "&lt;\\x1b&gt;"


@dataclass(frozen=True)
class _Row:
    name: str
    calls: int


def test_visible_all_reaches_every_string_at_any_depth() -> None:
    value = {"k\x07": [("a\x1b", 1), _Row("b\x07", 2)], "n": 3.5, "none": None}
    assert visible_all(value) == {
        "k\\x07": [("a\\x1b", 1), _Row("b\\x07", 2)],
        "n": 3.5,
        "none": None,
    }


@pytest.mark.parametrize("value", [1e17, 1e308, -1e12, float("inf")])
def test_an_absurd_duration_stays_short_in_every_format(value: float) -> None:
    # A hostile trace's `dur` of 1e17 broke the table's columns; `--min-delta-ms 1e308` printed 309
    # digits.
    for text in (fmt.ms(value), fmt.ms_cell(value), fmt.ms_fixed(value), fmt.ms_exact(value)):
        assert len(text) <= 10, text
    # ordinary ones unchanged
    assert fmt.ms_cell(123_456.789) == "123,456.8" and fmt.ms_fixed(2.5) == "2.500"


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 steps"), (1, "1 step"), (2, "2 steps"), (1024, "1,024 steps")]
)
def test_a_count_agrees_with_its_noun(count: int, text: str) -> None:
    assert fmt.plural(count, "step") == text


def test_the_agent_shows_control_characters_as_stepcli_does() -> None:
    # The agent's `saved trace of steps ...: PATH` lines name the output folder, which may hold ESC
    # sequences
    from stepcli.agent.output import visible

    every = "".join(chr(code) for code in range(0x3000)) + "\u2066\u2069"
    assert visible(every) == safetext.visible(every)
    assert visible("out\x1b[2J") == "out\\x1b[2J"


@pytest.mark.parametrize(
    ("us", "shown"),
    [
        (878.0, "878 µs"),
        (999.4, "999 µs"),
        (999.6, "1.00 ms"),
        (11091.5, "11.09 ms"),
        (-1500.0, "-1.50 ms"),
    ],
)
def test_short_durations_read_alike_everywhere(us: float, shown: str) -> None:
    # (999.6 µs read "1000 µs": a four-digit microsecond figure where every other reads in ms)
    assert fmt.us(us) == shown


def test_visible_all_reaches_into_a_typed_run_summary() -> None:
    # The run summary is a msgspec Struct: a program named with ESC sequences must not reach the
    # terminal raw.
    from stepcli.runfolder.summaryfile import RunSummary

    summary = RunSummary(command=["python", "x\x1b[2J.py"])
    shown = visible_all(summary)
    assert shown.command == ["python", "x\\x1b[2J.py"]
    assert summary.command == ["python", "x\x1b[2J.py"]  # the summary itself is left as it is
