"""The end of `stepcli run` reads each trace once: the run summary and report.html share one read
(stepcli.traces.runtraces), and the page equals what `stepcli report` builds from the folder
afterwards."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import TRAIN_LOOP, trace_files, write_script

from stepcli.errors import TraceError
from stepcli.traces.analyses.mergeparts import merge_parts
from stepcli.traces.engine import summarize_paths
from stepcli.traces.runtraces import RunTraces

REAL = Path(__file__).resolve().parent.parent / "data" / "train_cpu.pt.trace.json"


@pytest.fixture
def counted_decodes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every trace decode in this process (stepcli.traces.engine's reader), counted per path; one
    worker, in-process."""
    import stepcli.traces.engine as engine

    calls: Counter[str] = Counter()
    real = engine.load_columns

    def counting(path: str, *, shapes: bool = False, decode: Any = None) -> Any:
        calls[path] += 1
        return real(path, shapes=shapes, decode=decode)

    monkeypatch.setattr(engine, "load_columns", counting)
    monkeypatch.setattr(engine, "available_cores", lambda: 1)
    return calls


def test_plain_parts_of_a_read_with_shapes_summarize_as_before(tmp_path: Path) -> None:
    # GIVEN two copies of a real torch trace (two ranks) WHEN read once with shapes for the summary
    # and the page
    for rank in (0, 1):
        document = json.loads(REAL.read_text())
        document["distributedInfo"] = {"rank": rank}
        (tmp_path / f"host_1.{rank}.pt.trace.json").write_text(json.dumps(document))
    paths = sorted(str(p) for p in tmp_path.iterdir())
    parts = RunTraces(shapes=True).parts(paths)
    # THEN the plain parts give exactly the run summary's former answer (a read without shapes)
    assert merge_parts([p[0] for p in parts]).to_dict() == summarize_paths(paths).to_dict()
    # AND the by-shape parts are there for the page, keyed by shape
    assert len(parts) == 2 and all(len(p) == 2 for p in parts)
    shaped = merge_parts([p[1] for p in parts], group_by_shape=True).to_dict()["cpu_ops"]
    assert any(op.get("shape") for op in shaped)


def test_each_file_is_read_once_for_every_caller(
    tmp_path: Path, counted_decodes: Counter[str]
) -> None:
    traces = RunTraces(shapes=True)
    # GIVEN a summary's read (plain parts asked) WHEN the page then asks for by-shape parts of the
    # same files
    first = traces.parts([str(REAL)])
    again = traces.parts([str(REAL)], shapes=True)
    # THEN the file was decoded once, and both got the same parts
    assert counted_decodes == Counter({str(REAL): 1})
    assert again is first and len(first[0]) == 2
    # AND a holder that read without shapes reads again when shapes are asked (never a wrong answer)
    plain = RunTraces(shapes=False)
    assert len(plain.parts([str(REAL)])[0]) == 1
    assert len(plain.parts([str(REAL)], shapes=True)[0]) == 2
    assert counted_decodes[str(REAL)] == 3
    # AND other files are other reads
    copy = tmp_path / "copy.pt.trace.json"
    copy.write_bytes(REAL.read_bytes())
    traces.parts([str(copy)])
    assert counted_decodes[str(copy)] == 1


def test_a_trace_error_is_read_once_and_given_to_every_caller(
    tmp_path: Path, counted_decodes: Counter[str]
) -> None:
    broken = tmp_path / "cut.pt.trace.json"
    broken.write_bytes(REAL.read_bytes()[:5000])
    traces = RunTraces()
    with pytest.raises(TraceError) as first:
        traces.parts([str(broken)])
    with pytest.raises(TraceError) as second:
        traces.parts([str(broken)], shapes=True)
    assert counted_decodes == Counter({str(broken): 1})
    assert (
        second.value.message == first.value.message and "cut.pt.trace.json" in first.value.message
    )


def test_memory_curves_need_no_read_when_memory_was_not_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import stepcli.traces.memorycurve as memory

    def never(_paths: Any, _jobs: Any = None) -> Any:
        raise AssertionError("memory curves read although the run recorded no memory")

    monkeypatch.setattr(memory, "memory_curves", never)
    assert RunTraces(memory=False).memory_curves([str(REAL)]) == []
    with pytest.raises(AssertionError):
        RunTraces(memory=True).memory_curves([str(REAL)])


@pytest.fixture
def counted_file_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every time a trace file's bytes are read in this process (traces' and the memory curves'
    reader)."""
    import stepcli.inputs as inputs
    import stepcli.traces.read.tracereader as traces

    calls: Counter[str] = Counter()
    real = inputs.read_input

    def counting(path: str, *, gunzip: bool = True, midway: Any = None) -> Any:
        if ".pt.trace.json" in str(path):
            calls[str(path)] += 1
        return real(path, gunzip=gunzip, midway=midway)

    monkeypatch.setattr(inputs, "read_input", counting)
    monkeypatch.setattr(traces, "read_input", counting)
    return calls


@pytest.mark.parametrize("memory", [False, True], ids=["plain", "profile-memory"])
def test_run_end_reads_each_trace_once_and_the_page_equals_stepcli_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    counted_decodes: Counter[str],
    counted_file_reads: Counter[str],
    memory: bool,
) -> None:
    """The launcher's end of run in this process (the program itself is a real child), readers
    counted."""
    import stepcli.report.data as report_data
    from stepcli.cli import main
    from stepcli.run.summary.htmlreport import gather

    built: list[report_data.ReportData] = []
    real_build = report_data.build

    def keep(*args: Any, **kwargs: Any) -> report_data.ReportData:
        built.append(real_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(report_data, "build", keep)
    script = write_script(tmp_path, "train.py", TRAIN_LOOP)
    out = tmp_path / "out"
    options = ["--profile-memory"] if memory else []
    # GIVEN a run that records two windows with shapes WHEN it ends (summary, --json, report.html)
    status = main(
        [
            "run",
            "--quiet",
            "--wait",
            "0",
            "--warmup",
            "0",
            "--active",
            "1",
            "--repeat",
            "2",
            "--record-shapes",
            *options,
            "-o",
            str(out),
            "--json",
            str(tmp_path / "run.json"),
            str(script),
            "4",
        ]
    )
    assert status == 0
    traces = [str(p) for p in trace_files(out)]
    assert len(traces) == 2
    summary = json.loads((tmp_path / "run.json").read_text())
    assert sorted(summary["traces"]) == traces and summary["top_operators"]
    # THEN each trace was decoded once for the summary and the page together
    assert counted_decodes == Counter({path: 1 for path in traces})
    # AND its bytes were read once (with --profile-memory, the memory curve reads its events on its
    # own)
    assert counted_file_reads == Counter({path: 2 if memory else 1 for path in traces})
    assert (out / "report.html").is_file() and len(built) == 1
    run_end = built[0]
    assert run_end.shape_ops and run_end.cpu_ops and bool(run_end.memory_curves) == memory
    # AND `stepcli report OUT` afterwards builds the same page data from the folder
    counted_decodes.clear()
    again = gather([str(out)])
    assert counted_decodes == Counter({path: 1 for path in traces})
    assert dataclasses.asdict(again) == dataclasses.asdict(run_end)
