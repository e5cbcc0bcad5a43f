"""The report's GPU section (stepcli.report.gpu) on real NCCL traces, in a real browser, with a
screenshot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir
from conftest import REPO, run_stepcli

TRACES = REPO.parent / "shared" / "traces"


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"no real GPU traces at {TRACES}")
def test_gpu_section_shows_each_ranks_step_and_launches(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    # GIVEN the real two-rank NCCL traces WHEN `stepcli report` writes the page
    source = TRACES / "two_ranks_of_128"
    page = tmp_path / "gpu.html"
    result = run_stepcli("report", source, "-o", page)
    assert result.returncode == 0, result.stderr
    data = json.loads(run_stepcli("table", "--json", source).stdout)
    browser.get(page.resolve().as_uri())
    # THEN one stacked bar per rank and one for the job, each filling the bar's width (the parts add
    # up to a step)
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.gpu-bars")
    assert len(bars) == 1
    widths = browser.execute_script(
        "const rows = {}; document.querySelectorAll('svg.gpu-bars rect.seg').forEach(r => {const y "
        "= r.getAttribute('y'); rows[y] = (rows[y] || 0) + r.getBBox().width; }); return "
        "Object.values(rows);"
    )
    assert len(widths) == 3 and all(w == pytest.approx(760, abs=0.5) for w in widths)
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.gpu-bars text.axis")]
    assert labels == ["job", "rank 0", "rank 1"]
    # AND a segment's hover text is the summary's figure: the job's exposed communication per step
    exposed = browser.find_element(
        By.CSS_SELECTOR, "svg.gpu-bars rect.gpu-exposed title"
    ).get_attribute("textContent")
    assert exposed.startswith(f"exposed comm: {data['device']['exposed_comm_ms']:.3f} ms/step")
    # AND the launch table has the job and both ranks with their kernels per step
    cells = [
        [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#gpu-launches tbody tr")
    ]
    expected = [("job", data["device"])] + [(r["process"], r["device"]) for r in data["ranks"]]
    assert [(c[0], c[1]) for c in cells] == [
        (n, f"{d['launch']['kernels_per_step']:,.1f}") for n, d in expected
    ]
    # AND the collectives and copies tables list the job's rows
    collectives = browser.find_elements(
        By.CSS_SELECTOR, "#gpu-collective-table tbody tr td:first-child"
    )
    assert [c.text for c in collectives] == [c["collective"] for c in data["device"]["collectives"]]
    copies = browser.find_elements(By.CSS_SELECTOR, "#gpu-copy-table tbody tr")
    assert len(copies) == len(data["device"]["copies"]) > 0
    # AND the advice names exposed communication and a device waiting for its host, with their
    # numbers
    html = page.read_text()
    for rule in ("exposed-comm", "host-bound"):
        assert f'data-rule="{rule}"' in html
    assert f"{data['device']['exposed_comm_ms']:.2f} ms per step" in html
    # AND step by step: the job's chart (mean over ranks) is shown, one column per recorded step
    # whose parts add up to the step's time; picking a rank shows its own steps instead
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.gpu-steps")
    assert [c.get_attribute("data-choice") for c in charts] == ["job", "rank 0", "rank 1"]
    assert [c.is_displayed() for c in charts] == [True, False, False]
    tips = [
        t.get_attribute("textContent")
        for t in charts[0].find_elements(By.CSS_SELECTOR, "g.gpu-step title")
    ]
    assert [t.splitlines()[0] for t in tips] == [
        f"step {s['step']}: {s['step_ms']:.3f} ms" for s in data["device"]["steps"]
    ]
    parts = [
        sum(float(line.rsplit(": ", 1)[1].split()[0]) for line in t.splitlines()[1:]) for t in tips
    ]
    assert parts == pytest.approx([s["step_ms"] for s in data["device"]["steps"]], abs=0.01)
    browser.execute_script(
        "var s = document.getElementById('gpu-step-choice'); s.value = 'rank 1'; "
        "s.dispatchEvent(new Event('change'));"
    )
    assert [c.is_displayed() for c in charts] == [False, False, True]
    rank1 = next(r["device"]["steps"] for r in data["ranks"] if r["process"] == "rank 1")
    tip = charts[2].find_element(By.CSS_SELECTOR, "g.gpu-step title").get_attribute("textContent")
    assert tip.startswith(f"step {rank1[0]['step']}: {rank1[0]['step_ms']:.3f} ms")
    # AND a screenshot of the section, for a person to look at
    browser.execute_script("document.getElementById('gpu').scrollIntoView()")
    shot = artifacts_dir(tmp_path) / "report-gpu.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000


def test_cpu_report_has_no_gpu_section(tmp_path: Path) -> None:
    page = tmp_path / "cpu.html"
    result = run_stepcli("report", REPO / "tests" / "data" / "train_cpu.pt.trace.json", "-o", page)
    assert result.returncode == 0, result.stderr
    assert 'id="gpu"' not in page.read_text()


def _synthetic_ranks(folder: Path, ranks: int, steps: int) -> None:
    """`ranks` traces of `steps` steps each: launched compute kernels, a collective and a copy per
    step; rank 5 is 3 ms slower every step."""
    folder.mkdir()
    for rank in range(ranks):
        events: list[dict[str, Any]] = []
        t, corr = 1_700_000_000_000.0, 0
        for n in range(steps):
            dur = (
                10_000.0
                + (3_000 if rank == 5 else 0)
                + (4_000 if n % 17 == 0 else 0)
                + 37 * (n % 7)
            )
            events.append(
                dict(
                    name=f"ProfilerStep#{n + 10}",
                    cat="user_annotation",
                    ph="X",
                    pid=1,
                    tid=1,
                    ts=t,
                    dur=dur,
                )
            )
            k = t + 300
            for i in range(20):
                corr += 1
                events.append(
                    dict(
                        name="cudaLaunchKernel",
                        cat="cuda_runtime",
                        ph="X",
                        pid=1,
                        tid=1,
                        ts=k - 50,
                        dur=5,
                        args={"correlation": corr},
                    )
                )
                events.append(
                    dict(
                        name="gemm",
                        cat="kernel",
                        ph="X",
                        pid=0,
                        tid=7,
                        ts=k,
                        dur=200 + i,
                        args={"correlation": corr},
                    )
                )
                k += 200 + i + 30
            events.append(
                dict(
                    name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                    cat="kernel",
                    ph="X",
                    pid=0,
                    tid=20,
                    ts=t + 2_000,
                    dur=3_000 + rank * 200,
                )
            )
            events.append(
                dict(
                    name="Memcpy HtoD (Pinned -> Device)",
                    cat="gpu_memcpy",
                    ph="X",
                    pid=0,
                    tid=8,
                    ts=k + 100,
                    dur=300,
                )
            )
            t += dur
        document = {"traceEvents": events, "distributedInfo": {"rank": rank}}
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(document))


def test_step_charts_stay_readable_with_8_ranks_of_60_steps(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # GIVEN 8 ranks of 60 recorded steps WHEN `stepcli report` writes the page
    source = tmp_path / "ranks"
    _synthetic_ranks(source, ranks=8, steps=60)
    page = tmp_path / "steps.html"
    result = run_stepcli("report", source, "-o", page)
    assert result.returncode == 0, result.stderr
    assert page.stat().st_size < 2_000_000
    browser.get(page.resolve().as_uri())
    # THEN one picker (the job, then every rank) and one chart shown at a time
    picker = Select(browser.find_element(By.ID, "gpu-step-choice"))
    assert [o.text for o in picker.options] == ["job (mean over ranks)"] + [
        f"rank {r}" for r in range(8)
    ]
    picker.select_by_visible_text("rank 5")
    shown = [c for c in browser.find_elements(By.CSS_SELECTOR, "svg.gpu-steps") if c.is_displayed()]
    assert [c.get_attribute("data-choice") for c in shown] == ["rank 5"]
    # AND all 60 columns are there, inside the chart and apart from each other, with step labels
    # that do not overlap
    boxes = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('g.gpu-step')).map(g => {const b = "
        "g.getBBox(); return [b.x, b.width, b.height];});",
        shown[0],
    )
    assert len(boxes) == 60
    assert all(b[1] >= 5 for b in boxes) and all(
        b2[0] > b1[0] + b1[1] for b1, b2 in zip(boxes, boxes[1:])
    )
    labels = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('text.axis[text-anchor=middle]')).map(t "
        "=> {const b = t.getBBox(); return [b.x, b.x + b.width];});",
        shown[0],
    )
    assert 5 <= len(labels) <= 30 and all(b[0] > a[1] for a, b in zip(labels, labels[1:]))
    # AND rank 5's 3 ms slower steps stand taller than rank 0's on the same scale (hidden charts
    # have no boxes: their columns' heights are read from the rects)
    heights = {
        c.get_attribute("data-choice"): browser.execute_script(
            "return Array.from(arguments[0].querySelectorAll('g.gpu-step')).map(g => "
            "Array.from(g.querySelectorAll('rect')).reduce((s, r) => s + "
            "parseFloat(r.getAttribute('height')), 0));",
            c,
        )
        for c in browser.find_elements(By.CSS_SELECTOR, "svg.gpu-steps")
    }
    assert boxes[1][2] == pytest.approx(heights["rank 5"][1], abs=0.5)
    assert min(heights["rank 5"]) > max(h for n, h in enumerate(heights["rank 0"]) if n % 17) > 0
    browser.execute_script("document.getElementById('gpu-steps').scrollIntoView()")
    shot = artifacts_dir(tmp_path) / "report-gpu-steps.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000
