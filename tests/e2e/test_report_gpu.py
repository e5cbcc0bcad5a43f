"""The report's GPU section (stepcli.report.gpu) on real NCCL traces, in a real browser, with a screenshot."""

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
    # THEN one stacked bar per rank and one for the job, each filling the bar's width (the parts add up to a step)
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.gpu-bars")
    assert len(bars) == 1
    widths = browser.execute_script(
        "const rows = {}; document.querySelectorAll('svg.gpu-bars rect.seg').forEach(r => {"
        "const y = r.getAttribute('y'); rows[y] = (rows[y] || 0) + r.getBBox().width; }); return Object.values(rows);"
    )
    assert len(widths) == 3 and all(w == pytest.approx(760, abs=0.5) for w in widths)
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.gpu-bars text.axis")]
    assert labels == ["job", "rank 0", "rank 1"]
    # AND a segment's hover text is the summary's figure: the job's exposed communication per step
    exposed = browser.find_element(By.CSS_SELECTOR, "svg.gpu-bars rect.gpu-exposed title").get_attribute("textContent")
    assert exposed.startswith(f"exposed comm: {data['device']['exposed_comm_ms']:.3f} ms/step")
    # AND the launch table has the job and both ranks with their kernels per step
    cells = [
        [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#gpu-launches tbody tr")
    ]
    expected = [("job", data["device"])] + [(r["process"], r["device"]) for r in data["ranks"]]
    assert [(c[0], c[1]) for c in cells] == [(n, f"{d['launch']['kernels_per_step']:,.1f}") for n, d in expected]
    # AND the collectives and copies tables list the job's rows
    collectives = browser.find_elements(By.CSS_SELECTOR, "#gpu-collective-table tbody tr td:first-child")
    assert [c.text for c in collectives] == [c["collective"] for c in data["device"]["collectives"]]
    copies = browser.find_elements(By.CSS_SELECTOR, "#gpu-copy-table tbody tr")
    assert len(copies) == len(data["device"]["copies"]) > 0
    # AND the advice names exposed communication and a device waiting for its host, with their numbers
    html = page.read_text()
    for rule in ("exposed-comm", "host-bound"):
        assert f'data-rule="{rule}"' in html
    assert f"{data['device']['exposed_comm_ms']:.2f} ms per step" in html
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
