"""Pure parts of the report: chart helpers, data accessors, and the page size of a long many-rank
run."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import REPO

from stepcli.report import default_output, svg
from stepcli.run.summary.htmlreport import build, report_main
from stepcli.runfolder.summaryfile import RunSummary


def _bench_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "bench_report", REPO / "scripts" / "bench_report.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_envelope_keeps_every_spike_and_bounds_points() -> None:
    xs = list(range(100_000))
    ys = [1.0] * 100_000
    ys[54_321] = 99.0
    ys[77_777] = -5.0
    points = svg.envelope(xs, ys, max_points=1000)
    assert len(points) <= 1000
    assert (54_321, 99.0) in points and (77_777, -5.0) in points
    assert [x for x, _ in points] == sorted(x for x, _ in points)
    assert svg.envelope([1, 2], [3.0, 4.0]) == [(1, 3.0), (2, 4.0)]  # short curves untouched


def test_nice_max_and_phase_runs() -> None:
    assert [svg.nice_max(v) for v in (0.7, 1.0, 1.3, 2.2, 4.9, 730.0)] == [
        1.0,
        1.0,
        2.0,
        2.5,
        5.0,
        1000.0,
    ]
    # warmup step 2, recorded 3-4 (code 2 then 3 = one window), untouched, recorded 7, and a gap in
    # step numbers
    assert svg.phase_runs([0, 1, 2, 3, 4, 5, 6, 7], "00123002") == [
        (2, 2, "1"),
        (3, 4, "2"),
        (7, 7, "2"),
    ]
    assert svg.phase_runs([3, 4, 8, 9], "2222") == [(3, 4, "2"), (8, 9, "2")]


def test_charts_escape_labels_and_hold_no_url() -> None:
    chart = svg.timeline_chart([svg.Curve("<rank & 0>", [0, 1, 2], [5.0, 1.0, 2.0], "002")])
    assert "<rank" not in chart and "&lt;rank &amp; 0&gt;" in chart
    assert "http" not in chart and chart.startswith("<svg") and chart.endswith("</svg>")


def test_default_output_names() -> None:
    assert default_output("runs/x/t.pt.trace.json.gz") == "runs/x/t.report.html"
    assert default_output("run.json") == "run.report.html"


def test_summary_without_step_logs_or_traces_still_reports(tmp_path: Path) -> None:
    # A --json summary copied away from its run (a CI artifact): the timeline and tables it kept are
    # enough.
    summary = {
        "schema": "stepcli.run",
        "command": ["python", "t.py"],
        "exit_status": 0,
        "out_dir": str(tmp_path / "gone"),
        "timeline_ms": [900.0] + [10.0] * 30,
        "timeline_phases": "0" * 3 + "1233" + "0" * 24,
        "processes": [
            {"worker": "h_1", "rank": None, "global_steps": 31, "peak_rss_bytes": 123456789}
        ],
        "top_operators": [
            {
                "name": "aten::mm",
                "calls": 9,
                "self_ms": 5.0,
                "total_ms": 5.0,
                "avg_ms": 0.5,
                "self_share": 0.6,
            }
        ],
        "breakdown_ms": {
            "dataloader": 8.0,
            "forward": 1.0,
            "backward": 1.0,
            "optimizer": 0.0,
            "other": 0.0,
        },
        "traces": [],
        "notes": ["a note"],
    }
    data = build(msgspec.convert(summary, RunSummary), [], [])
    assert [p.label for p in data.processes] == ["h_1"] and len(data.processes[0].values_ms) == 31
    assert [a.rule for a in data.advice] == ["data-loading"]
    assert data.memory_peaks == [("h_1", 123456789, None)] and data.notes == ["a note"]


def test_per_process_step_times_in_the_summary_are_used(tmp_path: Path) -> None:
    # Summaries that carry every process's step times draw one curve per process.
    summary = {
        "schema": "stepcli.run",
        "command": ["x"],
        "out_dir": str(tmp_path),
        "processes": [
            {
                "worker": "rank0",
                "rank": 0,
                "step_times_ms": [100.0] + [10.0] * 12,
                "phases": "0" * 13,
            },
            {
                "worker": "rank1",
                "rank": 1,
                "step_times_ms": [100.0] + [13.0] * 12,
                "phases": "0" * 13,
            },
        ],
    }
    data = build(msgspec.convert(summary, RunSummary), [], [])
    assert [p.label for p in data.processes] == ["rank 0", "rank 1"]
    assert data.slowest == "rank 1" and [a.rule for a in data.advice] == ["straggler"]


def test_long_many_rank_run_gives_a_small_page(tmp_path: Path) -> None:
    # GIVEN 10,000 steps on each of 8 ranks (scripts/bench_report.py's synthetic run) THEN the page
    # stays small, every rank is drawn, the curves are reduced (and the page says so), and the
    # planted stalls and straggler show.
    folder = _bench_module().make_synthetic_run(tmp_path / "run", steps=10_000, ranks=8)
    page = Path(report_main([str(folder)], None))
    html = page.read_text()
    assert page.stat().st_size < 3_000_000
    assert all(f"<title>rank {r}</title>" in html for r in range(8))
    assert "drawn as a min/max envelope" in html
    assert set(re.findall(r'data-rule="([a-z-]+)"', html)) == {"straggler", "stalls"}
    summary = json.loads(next((folder / ".stepcli").glob("*/summary.json")).read_text())
    assert summary["command"] == ["torchrun", "train.py"] and "torchrun train.py" in html


def test_unreadable_trace_leaves_a_note_not_a_failure(tmp_path: Path) -> None:
    # A run whose trace is damaged still gets its page, from the summary, with a note saying why
    # tables are thin.
    broken = tmp_path / "rank0.1.pt.trace.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm"')
    summary = {
        "schema": "stepcli.run",
        "command": ["x"],
        "out_dir": str(tmp_path),
        "timeline_ms": [5.0, 1.0, 1.0],
        "timeline_phases": "000",
        "processes": [{"worker": "w", "rank": None}],
        "traces": [str(broken)],
    }
    data = build(msgspec.convert(summary, RunSummary), [], [str(broken)])
    assert any(
        "could not read the traces" in note and "rank0.1.pt.trace.json" in note
        for note in data.notes
    )
    assert len(data.processes[0].values_ms) == 3


def test_memory_curves_read_in_worker_processes_equal_the_serial_read(tmp_path: Path) -> None:
    from stepcli.traces.memorycurve import memory_curves

    # GIVEN rank traces with torch's [memory] events (two devices), one without any, one cut short
    def memory_trace(rank: int, count: int) -> Path:
        events = [
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": 100.0 + i,
                "args": {"Total Allocated": 1000 * rank + i, "Device Type": i % 2, "Device Id": 0},
            }
            for i in range(count)
        ]
        path = tmp_path / f"host_{rank}.{rank}.pt.trace.json"
        path.write_text(json.dumps({"traceEvents": events}))
        return path

    paths = [str(memory_trace(r, 50 + r)) for r in range(3)]
    plain = tmp_path / "plain.json"
    plain.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "a",
                        "pid": 1,
                        "tid": 1,
                        "ts": 1.0,
                        "dur": 1.0,
                    }
                ]
            }
        )
    )
    cut = tmp_path / "cut.json"
    cut.write_text(Path(paths[0]).read_text()[:300])
    paths += [str(plain), str(cut)]
    # WHEN read by three worker processes and in this one THEN the curves are the same, in file
    # order
    serial = memory_curves(paths, jobs=1)
    assert memory_curves(paths, jobs=3) == serial
    assert [label for label, _ in serial] == [
        f"host_{r} {d}" for r in range(3) for d in ("CPU", "CUDA:0")
    ]
    assert serial[2][1][0] == (0.0, 1000.0) and len(serial[5][1]) == 26


def test_traces_without_memory_events_are_not_read_again_for_curves(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import gzip
    import os

    import stepcli.traces.engine as engine
    from stepcli.traces import memorycurve as memory

    # GIVEN a job's traces recorded without --profile-memory (plain JSON), an empty file, a FIFO and
    # a folder
    event = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}
    plain = [tmp_path / f"rank{r}.pt.trace.json" for r in range(4)]
    for path in plain:
        path.write_text(json.dumps({"traceEvents": [event] * 100}))
    (tmp_path / "empty.json").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    odd = [
        str(tmp_path / name) for name in ("empty.json", "fifo.json", "folder.json", "missing.json")
    ]
    # WHEN their memory curves are asked THEN no file is read again (no worker, no read_curves):
    # none can have one
    monkeypatch.setattr(engine, "map_files", lambda *a, **k: pytest.fail("read again"))
    assert memory.memory_curves([str(p) for p in plain] + odd, jobs=2) == []
    # AND a file that holds the marker, or a compressed one (whose marker cannot be seen), is read
    marked = tmp_path / "marked.json"
    marked.write_text(json.dumps({"traceEvents": [dict(event, name="[memory]", ph="i")]}))
    packed = tmp_path / "packed.json.gz"
    packed.write_bytes(gzip.compress(plain[0].read_bytes()))
    unnamed = tmp_path / "packed_without_suffix.json"
    unnamed.write_bytes(gzip.compress(plain[0].read_bytes()))
    assert [
        memory._may_hold_memory_events(str(p)) for p in (marked, packed, unnamed, plain[0])
    ] == [
        True,
        True,
        True,
        False,
    ]
    # AND a file over the input limit is not searched (read_curves refuses it): a huge sparse file
    # costs nothing
    monkeypatch.setenv("STEPCLI_MAX_INPUT_BYTES", str(marked.stat().st_size - 1))
    assert not memory._may_hold_memory_events(str(marked))


def _hang_summary(tmp_path: Path, hang: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "schema": "stepcli.run",
        "command": ["torchrun", "t.py"],
        "exit_status": 124,
        "out_dir": str(tmp_path / "out"),
        "processes": [
            {"worker": "rank0", "rank": 0, "step_times_ms": [100.0, 10.0, 10.0], "phases": "000"}
        ],
        "hang": hang,
    }


HOSTILE = "<img src=x onerror=alert(1)>"


def test_the_hang_section_comes_first_verdict_first_everything_escaped(tmp_path: Path) -> None:
    from stepcli.report.page import render

    stuck = {"function": f"stuck{HOSTILE}", "file": f"/w/{HOSTILE}.py", "line": 12}
    hang = {
        "reports": [
            {
                "folder": str(tmp_path / "out" / "hang-1"),
                "idle_s": 10.4,
                "verdict": f"-> rank 1 (pid 101) is in stuck{HOSTILE} (/w/{HOSTILE}.py:12) while 1 "
                f"process waits in "
                "all_reduce #6: it holds the job back",
                "processes": [
                    {
                        "rank": 0,
                        "pid": 100,
                        "host": "h",
                        "step": 5,
                        "waiting": True,
                        "collective": {
                            "name": "all_reduce",
                            "seq": 6,
                            "entered_s_ago": 10.2,
                            "returned": False,
                        },
                        "where": "main (/w/t.py:20)",
                    },
                    {
                        "rank": 1,
                        "pid": 101,
                        "host": "h",
                        "step": 5,
                        "waiting": False,
                        "collective": {"name": "all_reduce", "seq": 5, "returned": True},
                        "where": f"{stuck['function']} ({stuck['file']}:12)",
                        "frame": stuck,
                        "source": "faulthandler",
                    },
                ],
            }
        ],
        "timeout_s": 10.0,
        "on_hang": "kill",
        "ended_job": True,
    }
    page = render(
        build(msgspec.convert(_hang_summary(tmp_path, hang), RunSummary), [], []),
        str(tmp_path / "out" / "report.html"),
    )
    assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    # before the advice
    section = page[page.index('<h2 id="hang">') : page.index('<h2 id="advice">')]
    verdict = re.search(
        r'<div class="card advice hang-verdict" id="hang-verdict-1"><b>(.*?)</b>(.*?)</div>',
        section,
    )
    # the verdict first
    assert verdict and section.index("hang-verdict-1") < section.index("<table")
    assert verdict.group(1).startswith(
        "rank 1 (pid 101) is in stuck&lt;img"
    ) and "holds the job back" in verdict.group(1)
    assert verdict.group(2) == (  # when, and what --on-hang did
        "The hang was called at step 5: no process completed a step for 10.4 s (--hang-timeout 10 "
        "s). "
        '<span id="hang-outcome"><strong>stepcli ended the job after the dump</strong> (--on-hang '
        "kill, exit status 124).</span>"
    )
    # relative to the page, so the folder opens from it
    assert '<a href="hang-1/"><code>' in section
    rows = [
        (kind, re.findall(r"<td[^>]*>(.*?)</td>", cells))
        for kind, cells in re.findall(r'<tr class="(\w+)">(.*?)</tr>', section)
    ]
    # process, pid, host, step, waiting, collective, where
    assert [(kind, cells[0], cells[3]) for kind, cells in rows] == [
        ("waiting", "rank 0", "5"),
        ("elsewhere", "rank 1", "5"),
    ]
    assert rows[0][1][5] == "<code>all_reduce #6</code> entered 10.2 s before the dump"
    assert (
        rows[1][1][4] == "<b>not in a collective</b>"
        and rows[1][1][5] == "<code>all_reduce #5</code> returned"
    )
    assert rows[1][1][6].startswith("<code>stuck&lt;img src=x onerror=alert(1)&gt; (/w/&lt;img")
    assert "C code holding the GIL" in section


def test_no_hang_no_section(tmp_path: Path) -> None:
    from stepcli.report.page import render

    for hang in (None, {"reports": []}):
        page = render(
            build(msgspec.convert(_hang_summary(tmp_path, hang), RunSummary), [], []),
            str(tmp_path / "report.html"),
        )
        assert 'id="hang"' not in page and "hang-verdict" not in page
