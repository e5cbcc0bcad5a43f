"""`stepcli report` and the report.html of `stepcli run`, end to end: real runs, real traces, a real
browser."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir
from conftest import (
    DATA,
    REPO,
    TRAIN_LOOP,
    ddp_script,
    profiler_steps,
    run_stepcli,
    trace_files,
    write_script,
)

FIXTURE_TRACE = REPO / "tests" / "data" / "train_cpu.pt.trace.json"
# Real CUDA traces (scripts/make_cuda_fixture_traces.py says how they were recorded and what they
# hold).
CUDA_SMALL = REPO / "tests" / "data" / "cuda_small.pt.trace.json.gz"
CUDA_COMPILE = REPO / "tests" / "data" / "cuda_compile.pt.trace.json.gz"

SLOW_LOADER = """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class SlowDataset(Dataset):
        def __len__(self):
            return 48

        def __getitem__(self, index):
            time.sleep(0.005)  # a slow decode in the main process: num_workers=0
            return torch.randn(16), torch.randn(1)

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(SlowDataset(), batch_size=4):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

DDP = ddp_script(6)


def _advice_rules(html: str) -> list[str]:
    return re.findall(r'data-rule="([a-z-]+)"', html)


def _assert_self_contained(html: str) -> None:
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html), (
        "nothing may be loaded from elsewhere"
    )


def _check_in_browser(driver: Any, page: Path, top_op: str, shot_dir: Path, name: str) -> Path:
    """Load the page from disk and check what a person would see; returns the screenshot's path."""
    from selenium.webdriver.common.by import By

    driver.get_log("browser")  # drop entries from an earlier page
    driver.get_log("performance")
    driver.get(page.resolve().as_uri())
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    # No network: no resource loaded, and the only request Chromium saw is the page itself.
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            requests.append(message["params"]["request"]["url"])
    # (Chromium's own chrome:// pages may load in the background; anything over a network is a
    # failure.)
    external = [
        url
        for url in requests
        if not url.startswith(("file:", "chrome:", "chrome-untrusted:", "data:", "about:"))
    ]
    assert external == [], external
    assert page.resolve().as_uri() in requests

    # Charts are drawn: SVGs with non-empty paths and shapes of non-zero size.
    charts = driver.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) >= 3
    lines = driver.find_elements(By.CSS_SELECTOR, "svg.chart path.line")
    assert lines and all(len(p.get_attribute("d") or "") > 3 for p in lines)
    boxes = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart rect, svg.chart path')).map("
        "e => {const b = e.getBBox(); return b.width * b.height > 0 || b.width > 0;});"
    )
    assert boxes and sum(boxes) >= 5
    assert (
        driver.execute_script(
            "return document.querySelector('svg.chart').getBoundingClientRect().height"
        )
        > 100
    )

    # The trace's top operator is in the table, first by self time.
    first = driver.find_element(By.CSS_SELECTOR, "#cpu-ops tbody tr td").text
    assert first == top_op

    # The table sorts on click: Calls ascending, then descending.
    header = driver.find_element(By.XPATH, "//table[@id='cpu-ops']//th[normalize-space()='Calls']")
    header.click()
    calls = [
        int(c.get_attribute("data-v"))
        for c in driver.find_elements(By.CSS_SELECTOR, "#cpu-ops tbody tr td:nth-child(2)")
    ]
    assert calls == sorted(calls) and calls[0] < calls[-1]
    header.click()
    calls = [
        int(c.get_attribute("data-v"))
        for c in driver.find_elements(By.CSS_SELECTOR, "#cpu-ops tbody tr td:nth-child(2)")
    ]
    assert calls == sorted(calls, reverse=True)
    driver.refresh()  # the screenshot shows the page as it opens
    driver.execute_script("window.scrollTo(0, 0)")

    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1100, min(height + 40, 8000))
    shot = shot_dir / f"{name}.png"
    driver.save_screenshot(str(shot))
    driver.set_window_size(1100, 900)
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    return shot


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("demo")
    out = base / "out"
    result = run_stepcli("demo", "--record-shapes", "-o", out, "--json", base / "run.json")
    assert result.returncode == 0, result.stderr
    return {"out": out, "result": result, "summary": json.loads((base / "run.json").read_text())}


@pytest.fixture(scope="module")
def slow_loader_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("slowloader")
    script = write_script(base, "slow_loader.py", SLOW_LOADER)
    out = base / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "2",
        "--warmup",
        "1",
        "--active",
        "3",
        "--profile-memory",
        "-o",
        out,
        "--json",
        base / "run.json",
        script,
    )
    assert result.returncode == 0, result.stderr
    return {"out": out, "result": result, "summary": json.loads((base / "run.json").read_text())}


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("torchrun")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(base, "ddp.py", DDP)
    out = base / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        "-o",
        out,
        "--json",
        base / "run.json",
        "--",
        torchrun,
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()  # as the run wrote it (a test below rewrites it)
    return {
        "out": out,
        "result": result,
        "summary": json.loads((base / "run.json").read_text()),
        "page": page,
    }


def test_run_writes_report_and_points_to_it(
    demo_run: dict[str, Any], browser: Any, tmp_path: Path
) -> None:  # noqa: F811
    # GIVEN the demo run WHEN it ends THEN report.html sits in its folder and the "next:" line names
    # it
    out, result = demo_run["out"], demo_run["result"]
    page = out / "report.html"
    assert page.is_file()
    lines = result.stderr.splitlines()
    after_next = lines[lines.index("next:") + 1 :]  # one command per line after "next:"
    # (the demo records shapes: `stepcli table OUT --group-by-shape` comes between table and the
    # page)
    assert after_next[1].strip().startswith(f"stepcli table {out} --group-by-shape"), after_next
    assert after_next[2].strip() == f"open {out / 'report.html'} in a browser", after_next
    html = page.read_text()
    _assert_self_contained(html)
    # AND no advice fires on the demo (nothing in its numbers crosses a threshold), unless a loaded
    # machine pushed its data loading (~0.7 ms of ~3 ms steps) past the rule's own thresholds, as a
    # loaded CI machine once did
    from stepcli.advice.rules import DATALOADER_MIN_MS, DATALOADER_SHARE

    breakdown = demo_run["summary"]["breakdown_ms"]
    loading = breakdown["dataloader"]
    slowed = loading / sum(breakdown.values()) > DATALOADER_SHARE and loading >= DATALOADER_MIN_MS
    assert _advice_rules(html) == (["data-loading"] if slowed else []), result.stderr
    assert ("advice:" in result.stderr) == slowed and ("No rule fired" in html) == (not slowed)
    # AND the page shows the run's facts, its trace as a relative link, and the shapes table
    # (--record-shapes)
    assert "exit status" in html and 'id="shape-ops"' in html
    trace = trace_files(out)[0]
    assert f'href="{trace.name}"' in html
    top_op = demo_run["summary"]["top_operators"][0]["name"]
    _check_in_browser(browser, page, top_op, artifacts_dir(tmp_path), "report-demo")


def test_slow_dataloader_gets_advice_in_terminal_and_page(
    slow_loader_run: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    out, result = slow_loader_run["out"], slow_loader_run["result"]
    # GIVEN a single-process DataLoader whose __getitem__ sleeps THEN the data-loading rule fires,
    # with its evidence
    advice_lines = [line for line in result.stderr.splitlines() if line.startswith("advice:")]
    assert advice_lines and "Data loading slows the step" in advice_lines[0], result.stderr
    assert "threshold > 20%" in result.stderr.replace("\n", " ")
    html = (out / "report.html").read_text()
    assert "data-loading" in _advice_rules(html) and "num_workers" in html
    # AND --profile-memory gives the allocated-memory curve
    assert "Allocated memory over the recorded window" in html
    top_op = slow_loader_run["summary"]["top_operators"][0]["name"]
    _check_in_browser(
        browser, out / "report.html", top_op, artifacts_dir(tmp_path), "report-slow-loader"
    )


def test_torchrun_writes_one_trace_per_rank(torchrun_run: dict[str, Any]) -> None:
    # GIVEN `stepcli run --wait 1 --warmup 1 --active 2 -- torchrun --standalone --nproc-per-node 2
    # ddp.py` THEN each rank wrote one trace of exactly steps 2 and 3, and the processes are the
    # ranks (not torchrun's agent)
    traces = trace_files(torchrun_run["out"])
    assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
    assert all(profiler_steps(t) == [2, 3] for t in traces)
    assert sorted(p["worker"] for p in torchrun_run["summary"]["processes"]) == ["rank0", "rank1"]


def test_torchrun_report_has_every_rank(
    torchrun_run: dict[str, Any], browser: Any, tmp_path: Path
) -> None:  # noqa: F811
    out = torchrun_run["out"]
    html = (out / "report.html").read_text()
    # One curve per rank over the whole run, and one breakdown bar per rank.
    assert html.count('<path class="line s') >= 2
    assert "<title>rank 0</title>" in html and "<title>rank 1</title>" in html
    assert re.search(r">rank 0( \(slowest\))?</text>", html) and re.search(
        r">rank 1( \(slowest\))?</text>", html
    )
    top_op = torchrun_run["summary"]["top_operators"][0]["name"]
    _check_in_browser(
        browser, out / "report.html", top_op, artifacts_dir(tmp_path), "report-torchrun"
    )
    # "What would help": the run summary's what-if answer, its ranked changes and the critical path
    # over the ranks
    helps = torchrun_run["summary"]["what_would_help"]
    assert '<h2 id="whatif">What would help</h2>' in html
    if helps["verdict"] == "ok":
        rows = re.findall(
            r"<tr><td><code>([^<]+)</code>", html.split('id="whatif-table"')[1].split("</table>")[0]
        )
        assert rows == [o["change"] for o in helps["opportunities"]]
        chart = html.split('id="whatif-path"')[1].split("</svg>")[0]
        # one row per rank the path crosses
        on_path = {s["rank"] for s in helps["critical_path"]["segments"]}
        assert all(f">rank {rank}</text>" in chart for rank in on_path) and chart.count(
            "<rect"
        ) >= len(on_path)
    else:
        assert f"Inconclusive: {helps['reason']}" in html


def test_run_end_page_equals_stepcli_report_of_the_folder(torchrun_run: dict[str, Any]) -> None:
    # GIVEN a torchrun job's page, built at the end of the run from what the run summary read of the
    # rank traces
    out = torchrun_run["out"]
    assert len(torchrun_run["summary"]["traces"]) == 2
    # WHEN `stepcli report` reads the folder afterwards (into the same folder, so links are alike)
    result = run_stepcli("report", out, "-o", out / "again.html")
    assert result.returncode == 0, result.stderr
    # THEN it is the same page, byte for byte: every figure, table, chart and advice line
    again = (out / "again.html").read_text()
    assert "rank 1" in again and 'id="cpu-ops"' in again
    assert again == torchrun_run["page"]


def test_report_command_rebuilds_the_page_from_a_run_folder_or_summary(
    demo_run: dict[str, Any], tmp_path: Path
) -> None:
    out = demo_run["out"]
    # GIVEN the run folder WHEN `stepcli report OUT` THEN it rewrites the page stepcli wrote, and
    # prints its path
    result = run_stepcli("report", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out / "report.html")
    rebuilt = (out / "report.html").read_text()
    # the summary saved with the run was found
    assert "exit status" in rebuilt and "stepcli.demo.train" in rebuilt
    # AND from the --json summary alone, to a chosen file
    target = tmp_path / "from-summary.html"
    summary_path = tmp_path / "run.json"
    summary_path.write_text(json.dumps(demo_run["summary"]))
    result = run_stepcli("report", summary_path, "-o", target)
    assert result.returncode == 0, result.stderr
    html = target.read_text()
    assert demo_run["summary"]["top_operators"][0]["name"] in html and "exit status" in html
    # AND from that summary saved as NAME.json.gz: gzipped (a CI artifact), or plain (as
    # `stepcli run --json NAME.json.gz` writes it); it was refused as "not a profiler trace"
    gzipped, plain = tmp_path / "gzipped.json.gz", tmp_path / "plain.json.gz"
    gzipped.write_bytes(gzip.compress(summary_path.read_bytes()))
    plain.write_bytes(summary_path.read_bytes())
    for saved in (gzipped, plain):
        result = run_stepcli("report", saved, "-o", tmp_path / f"{saved.name}.html")
        assert result.returncode == 0, result.stderr
        html = (tmp_path / f"{saved.name}.html").read_text()
        assert demo_run["summary"]["top_operators"][0]["name"] in html and "exit status" in html


def test_a_run_folder_is_read_where_it_lies_and_only_what_this_user_wrote_there(
    demo_run: dict[str, Any], tmp_path: Path
) -> None:
    # GIVEN the run folder moved elsewhere (a CI artifact downloaded), its summary naming the old
    # out_dir
    moved = tmp_path / "artifact"
    shutil.copytree(demo_run["out"], moved, symlinks=True)
    (saved,) = moved.glob(".stepcli/*/summary.json")
    assert json.loads(saved.read_text())["out_dir"] == str(demo_run["out"])
    top = demo_run["summary"]["top_operators"][0]["name"]
    # WHEN report and compare read it THEN the run's own traces and summary are found inside it
    result = run_stepcli("report", moved, "-o", moved / "page.html")
    assert result.returncode == 0, result.stderr
    page = (moved / "page.html").read_text()
    assert "exit status" in page and top in page
    assert run_stepcli("compare", moved, moved).returncode in (0, 4)

    # GIVEN a hostile summary naming out_dir "/" and a trace outside the folder, with an operator of
    # its own
    outside = tmp_path / "elsewhere" / "secret.pt.trace.json"
    outside.parent.mkdir()
    doc = json.loads((DATA / "train_cpu.pt.trace.json").read_text())
    for event in doc["traceEvents"]:
        if event.get("cat") == "cpu_op":
            event["name"] = "aten::secret_of_another_folder"
    outside.write_text(json.dumps(doc))
    hostile = json.loads(saved.read_text()) | {"out_dir": "/", "traces": [str(outside)]}
    hostile["windows"] = [w | {"trace": str(outside)} for w in hostile["windows"]]
    saved.write_text(json.dumps(hostile))
    # WHEN the folder is read THEN nothing outside it is: the named trace is looked for inside the
    # folder
    result = run_stepcli("report", moved, "-o", moved / "page.html")
    assert result.returncode == 0, result.stderr
    assert "secret_of_another_folder" not in (moved / "page.html").read_text()
    compared = run_stepcli("compare", moved, moved)
    assert "secret_of_another_folder" not in compared.stdout + compared.stderr

    # GIVEN the summary replaced by a link to a summary elsewhere, then `.stepcli` itself a link
    elsewhere = tmp_path / "elsewhere" / "summary.json"
    elsewhere.write_text(json.dumps(demo_run["summary"]))
    saved.unlink()
    saved.symlink_to(elsewhere)
    # WHEN read THEN the link is not followed: report has no run summary, compare says so in one
    # line
    assert run_stepcli("report", moved, "-o", moved / "page.html").returncode == 0
    assert "exit status" not in (moved / "page.html").read_text()
    refused = run_stepcli("compare", moved, moved)
    assert refused.returncode == 2 and "is not a regular file of yours" in refused.stderr, (
        refused.stderr
    )
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".stepcli").symlink_to(demo_run["out"] / ".stepcli")
    for trace in demo_run["out"].glob("*.pt.trace.json*"):
        shutil.copy(trace, linked)
    assert run_stepcli("report", linked, "-o", linked / "page.html").returncode == 0
    assert "exit status" not in (linked / "page.html").read_text()  # read as a folder of traces
    if os.getuid() == 0:  # (only root can give a folder to another user)
        # GIVEN a run's folder in `.stepcli` that belongs to another user THEN it is left out too
        foreign = tmp_path / "foreign"
        shutil.copytree(demo_run["out"], foreign, symlinks=True)
        for path in foreign.glob(".stepcli/*"):
            os.chown(path, 65534, 65534)
        assert run_stepcli("report", foreign, "-o", foreign / "page.html").returncode == 0
        assert "exit status" not in (foreign / "page.html").read_text()


def test_report_from_plain_torch_profiler_traces(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    # GIVEN a trace from plain torch.profiler (no stepcli) and a folder of two rank traces
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.tracereader import load_paths

    top_op = next(
        op.name
        for op in summarize(load_paths([str(FIXTURE_TRACE)])).cpu_ops
        if op.name != "ProfilerStep*"
    )
    single = tmp_path / "single.html"
    result = run_stepcli("report", FIXTURE_TRACE, "-o", single)
    assert result.returncode == 0, result.stderr
    _assert_self_contained(single.read_text())
    _check_in_browser(browser, single, top_op, artifacts_dir(tmp_path), "report-plain-trace")

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        shutil.copy(FIXTURE_TRACE, ranks / f"host_rank{rank}.1.pt.trace.json")
    result = run_stepcli("report", ranks)
    assert result.returncode == 0, result.stderr
    html = (ranks / "report.html").read_text()
    assert "<title>rank 0</title>" in html and "<title>rank 1</title>" in html


def test_cuda_trace_shows_kernels_device_time_and_device_advice(
    browser: Any, tmp_path: Path
) -> None:  # noqa: F811
    # GIVEN a CUDA trace of many tiny kernels, an .item() per step and a per-tensor Adam
    page = tmp_path / "cuda.html"
    result = run_stepcli("report", CUDA_SMALL, "-o", page)
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    # THEN the three rules with that evidence fire, and only those
    assert sorted(_advice_rules(html)) == ["host-sync", "launch-bound", "optimizer"]
    assert "cudaStreamSynchronize ×" in html
    # AND the page has the kernel table and the device busy/idle bar
    assert (
        'id="kernels"' in html and 'class="seg dev-busy"' in html and 'class="seg dev-idle"' in html
    )
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.tracereader import load_paths

    top_op = next(
        op.name
        for op in summarize(load_paths([str(CUDA_SMALL)])).cpu_ops
        if op.name != "ProfilerStep*"
    )
    _check_in_browser(browser, page, top_op, artifacts_dir(tmp_path), "report-cuda")


def test_recompilation_advice_from_a_compiled_trace(tmp_path: Path) -> None:
    page = tmp_path / "compile.html"
    result = run_stepcli("report", CUDA_COMPILE, "-o", page)
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert _advice_rules(html) == ["recompile"] and "frame 0: 2 compilations" in html


def test_report_bad_input_is_one_line(tmp_path: Path) -> None:
    result = run_stepcli("report", tmp_path / "missing")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "missing" in result.stderr

    not_trace = tmp_path / "notes.json"
    not_trace.write_text('{"hello": 1}')
    result = run_stepcli("report", not_trace)
    assert (
        result.returncode != 0
        and "Traceback" not in result.stderr
        and "notes.json" in result.stderr
    )

    # Nothing the user had is overwritten: an existing page that stepcli did not write stays.
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my page</p>")
    result = run_stepcli("report", FIXTURE_TRACE, "-o", mine)
    assert (
        result.returncode != 0
        and mine.read_text() == "<p>my page</p>"
        and "mine.html" in result.stderr
    )

    # Nor is a link replaced by the page, dangling or pointing at a page stepcli wrote (merge and
    # compare refuse links too): it was silently swapped for a regular file.
    page = tmp_path / "page.html"
    assert run_stepcli("report", FIXTURE_TRACE, "-o", page).returncode == 0
    for name, target in (("dangling.html", tmp_path / "nowhere"), ("linked.html", page)):
        link = tmp_path / name
        link.symlink_to(target)
        result = run_stepcli("report", FIXTURE_TRACE, "-o", link)
        assert result.returncode == 2 and link.is_symlink(), result.stderr
        assert (
            result.stderr
            == f"stepcli: error: {link}: exists and is not a regular file; give another -o "
            f"FILE.html\n"
        )

    # A part of the -o path that is a file is named as such (mkdir's own word was "File exists")
    result = run_stepcli("report", FIXTURE_TRACE, "-o", tmp_path / "notes.json" / "x.html")
    assert result.returncode == 2 and result.stderr.endswith(
        f"cannot write the report: {not_trace} is not a folder\n"
    )

    # A trace that is a link in a loop, or to nothing, is said to be one
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    assert (
        run_stepcli("table", loop).stderr
        == f"stepcli: error: {loop}: a symbolic link in a loop of links\n"
    )


@pytest.fixture(scope="module")
def no_report_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The slow DataLoader above run with --no-report; whether a page existed is noted before any
    test rebuilds it."""
    base = tmp_path_factory.mktemp("noreport")
    script = write_script(base, "slow_loader.py", SLOW_LOADER)
    out = base / "out"
    args = (
        "--wait",
        "2",
        "--warmup",
        "1",
        "--active",
        "3",
        "--no-report",
        "-o",
        out,
        "--json",
        base / "run.json",
    )
    result = run_stepcli("run", *args, script)
    assert result.returncode == 0, result.stderr
    return {
        "out": out,
        "result": result,
        "summary": json.loads((base / "run.json").read_text()),
        "page_written": (out / "report.html").exists(),
    }


def test_no_report_flag_writes_the_traces_and_no_page(no_report_run: dict[str, Any]) -> None:
    # GIVEN a run with --no-report THEN its traces are there, no page is written and none is named
    result = no_report_run["result"]
    assert trace_files(no_report_run["out"]) and not no_report_run["page_written"]
    assert "report.html" not in result.stderr


def test_no_report_keeps_the_advice_in_the_terminal_and_the_json(
    no_report_run: dict[str, Any],
) -> None:
    # GIVEN the slow DataLoader of the test above WHEN run with --no-report
    out, result = no_report_run["out"], no_report_run["result"]
    # THEN no page is written, yet the terminal still gives the data-loading advice with its
    # evidence
    assert not no_report_run["page_written"]
    advice_lines = [line for line in result.stderr.splitlines() if line.startswith("advice:")]
    assert advice_lines and "Data loading slows the step" in advice_lines[0], result.stderr
    # AND the run summary carries it, for the page `stepcli report` builds later and for CI
    summary = no_report_run["summary"]
    assert [item["rule"] for item in summary["advice"]] == ["data-loading"]
    assert set(summary["advice"][0]) == {"rule", "title", "evidence", "threshold", "suggestion"}
    # AND `stepcli report OUT` later gives the run's page: its command, its facts and the same
    # advice
    again = run_stepcli("report", out)
    assert again.returncode == 0, again.stderr
    html = (out / "report.html").read_text()
    assert (
        "slow_loader.py" in html
        and "exit status" in html
        and _advice_rules(html) == ["data-loading"]
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", [1, 2]),
        ("processes", "abc"),
        ("schedule", [1]),
        ("notes", {"a": 1}),
        # step times no run has (they overflowed the statistics and the charts: internal errors)
        ("timeline_ms", [5e-324, 5e-324, 5e-324]),
        ("timeline_ms", [1e308, 1e308, 1e308]),
        ("step_times", [{"durations_ms": [5e-324] * 3, "phases": "000"}]),
        # a critical path's segment without its ms: the page's chart raised KeyError (an internal
        # error)
        (
            "what_would_help",
            {
                "verdict": "ok",
                "critical_path": {"ms": 1.0, "segments": [{"kind": "cpu", "name": "f"}]},
            },
        ),
        ("hang", {"reports": [{"folder": "hang-1", "processes": [{"rank": 0, "frame": "main"}]}]}),
    ],
)
def test_run_summary_with_wrong_types_is_bad_input(tmp_path: Path, field: str, value: Any) -> None:
    # GIVEN a run summary whose field has the wrong type (hand-edited, or from a hostile source)
    document: dict[str, Any] = {
        "schema": "stepcli.run",
        "schema_version": 2,
        "command": ["python", "train.py"],
        "exit_status": 0,
        "out_dir": str(tmp_path),
        "steps": {"global": 3, "requesters": {"SGD#0": 3}},
        "step_time_ms": {"untouched": None, "profiled": None, "first_step": None},
        "timeline_ms": [5.0, 1.0, 1.0],
        "timeline_phases": "000",
        "processes": [],
        "traces": [],
        field: value,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    # WHEN `stepcli report` (and `stepcli compare`) read it THEN exit 2 with one line naming the
    # file and the field
    for result in (run_stepcli("report", path), run_stepcli("compare", path, path)):
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, (
            result.stderr
        )
        assert str(path) in result.stderr and field in result.stderr
    assert not (tmp_path / "run.report.html").exists()


HUGE_REGION = """
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        with torch.profiler.record_function("Torch-Compiled Region: 0/" + "9" * 4400):
            model(torch.randn(2, 4)).sum().backward()
        opt.step()
"""


@pytest.fixture(scope="module")
def reused_folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs into the same -o folder: HUGE_REGION (4 steps, its page rebuilt before the next
    run), then the training loop (7 steps)."""
    base = tmp_path_factory.mktemp("reused")
    out = base / "out"
    huge = write_script(base, "huge.py", HUGE_REGION)
    first = run_stepcli(
        "run", "--wait", "1", "--active", "2", "-o", out, "--json", base / "run.json", huge
    )
    first_page = (out / "report.html").is_file()
    first_rebuilt = run_stepcli("report", out, "-o", base / "again.html")
    train = write_script(base, "train.py", TRAIN_LOOP)
    second = run_stepcli("run", "--active", "1", "-o", out, train, "7")
    return {
        "out": out,
        "first": first,
        "first_page": first_page,
        "first_rebuilt": first_rebuilt,
        "first_summary": json.loads((base / "run.json").read_text())
        if first.returncode == 0
        else None,
        "second": second,
    }


def test_operator_named_like_a_compiled_region_with_a_huge_id(
    reused_folder: dict[str, Any],
) -> None:
    # GIVEN a program whose record_function looks like torch.compile's region with a 4,400-digit
    # compile id WHEN it runs and its page is rebuilt THEN both succeed: the name is an operator,
    # not a recompilation
    result = reused_folder["first"]
    assert result.returncode == 0 and "internal error" not in result.stderr, result.stderr
    assert reused_folder["first_page"] and "could not" not in result.stderr, result.stderr
    again = reused_folder["first_rebuilt"]
    assert again.returncode == 0, again.stderr
    assert reused_folder["first_summary"]["advice"] == []


def test_reused_output_folder_reports_only_the_latest_run(reused_folder: dict[str, Any]) -> None:
    # GIVEN two runs into the same -o folder (the 4-step program above, then 7 steps of training)
    out = reused_folder["out"]
    for result in (reused_folder["first"], reused_folder["second"]):
        assert result.returncode == 0, result.stderr
    first_trace, second_trace = sorted(trace_files(out), key=lambda p: p.stat().st_mtime)
    # THEN the page stepcli wrote is replaced by the second run's, not renamed
    assert [p.name for p in out.glob("report*.html")] == ["report.html"]
    # WHEN the page is written by the second run, or rebuilt from the folder THEN it shows the
    # second run only
    written = (out / "report.html").read_text()
    result = run_stepcli("report", out)
    assert result.returncode == 0, result.stderr
    for html in (written, (out / "report.html").read_text()):
        assert "<b>7</b>" in html  # steps measured
        assert second_trace.name in html and first_trace.name not in html
