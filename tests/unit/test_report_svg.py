"""stepcli.report.svg: labels drawn inside chart segments fit them."""

from __future__ import annotations

import re

from stepcli.report.svg import SEGLABEL_CHAR_PX, breakdown_chart, segment_label


def test_a_segment_label_is_shortened_or_left_out_where_it_does_not_fit() -> None:
    assert segment_label("optimizer 10%", "10%", 200) == "optimizer 10%"
    # the whole label spilled into the next segment
    assert segment_label("optimizer 10%", "10%", 80) == "10%"
    assert segment_label("optimizer 10%", "10%", 20) == ""


def test_every_breakdown_label_fits_its_segment() -> None:
    # GIVEN shares like the README's screenshot (a 10-11% segment of ~75 px held "optimizer 10" and
    # lost its "%")
    parts = {
        "dataloader": 11.0,
        "forward": 30.0,
        "backward": 11.0,
        "optimizer": 10.0,
        "other": 38.0,
    }
    svg = breakdown_chart([("rank 0", parts), ("rank 1", {k: v * 1.1 for k, v in parts.items()})])
    # (each segment's rect, then its label if it has one)
    pairs = re.findall(
        r'<rect class="seg bd-\w+" x="[\d.]+" y="\d+" width="([\d.]+)".*?</rect>(?:<text '
        r'class="seglabel"[^>]*>([^<]*)</text>)?',
        svg,
    )
    labels = [text for _, text in pairs if text]
    assert len(pairs) == 10 and labels, svg
    # THEN each label fits inside its own segment, whole or as its share alone
    for width, text in pairs:
        assert not text or len(text) * SEGLABEL_CHAR_PX + 6 <= float(width), (width, text)
    assert "optimizer 10%" not in labels and "10%" in labels


def test_the_start_up_note_is_drawn_over_every_curve_with_a_halo() -> None:
    from stepcli.report.page import _CSS as CSS
    from stepcli.report.svg import Curve, timeline_chart

    # GIVEN two ranks whose start-up step (1.5 s) is far above the axis (their other steps take ~2
    # ms)
    values = [1500.0, 3.0, 1.5, 13.0, 1.4, 1.8, 9.0, 1.2]
    curves = [
        Curve(f"rank {r}", list(range(8)), [v * (1 + r / 10) for v in values], "01222000")
        for r in (0, 1)
    ]
    svg = timeline_chart(curves)
    # THEN the note comes after both lines (SVG paints in order: no line runs through it), with a
    # white halo
    assert svg.index('<text class="clip"') > svg.rindex('<path class="line'), svg
    assert "start-up step 0: 1.50 s ↑" in svg
    assert re.search(r"\.clip,[^{]*\{paint-order:stroke;stroke:#fff", CSS), "the notes' halo"
