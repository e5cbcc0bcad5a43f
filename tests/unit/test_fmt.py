"""stepcli.fmt.visible: control characters from names are shown, never sent to the reader's terminal."""

from __future__ import annotations

from dataclasses import dataclass

from stepcli.fmt import html_escape, visible, visible_all


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
    assert visible_all(value) == {"k\\x07": [("a\\x1b", 1), _Row("b\\x07", 2)], "n": 3.5, "none": None}
