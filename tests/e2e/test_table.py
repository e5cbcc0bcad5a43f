"""`stepcli table` end to end: real traces from plain torch.profiler and torchrun, every output
format, bad input."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    assert_matches_key_averages,
    markdown_tables,
    run_stepcli,
    stepcli_env,
    write_script,
)

DATA = Path(__file__).resolve().parent.parent / "data"

PLAIN_PROFILER = """
    import json, sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(48, 32), torch.randn(48, 4)), batch_size=8)

    def ready(prof):
        prof.export_chrome_trace(out)
        rows = [dict(name=e.key, count=e.count, self_us=e.self_cpu_time_total, total_us=e.cpu_time_total)
                for e in prof.key_averages() if str(e.device_type) == "DeviceType.CPU"]
        with open(out + ".key_averages.json", "w") as f:
            json.dump(rows, f)

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1), on_trace_ready=ready) as prof:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
"""  # noqa: E501

TWO_RANKS = """
    import sys, time
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    # active=10: a straggler is named from 10 common steps or more (stepcli.traces.analyses.ranks)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=10, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{rank}")) as prof:
        for _ in range(12):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if rank == 1:
                time.sleep(0.03)  # rank 1 is the straggler; no collective per step hides it
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
"""  # noqa: E501


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace written by plain torch.profiler, with torch's own key_averages() beside it."""
    tmp = tmp_path_factory.mktemp("plain")
    script = write_script(tmp, "train.py", PLAIN_PROFILER)
    out = tmp / "plain.pt.trace.json"
    subprocess.run(
        [sys.executable, str(script), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        env=stepcli_env(),
    )
    return out


@pytest.fixture(scope="module")
def two_rank_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Traces of a real `torchrun --nproc-per-node 2` run (gloo on CPU), one per rank."""
    tmp = tmp_path_factory.mktemp("ranks")
    script = write_script(tmp, "ddp.py", TWO_RANKS)
    out = tmp / "traces"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=stepcli_env({"OMP_NUM_THREADS": "1"}),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(out.glob("rank*.pt.trace.json"))) == 2
    return out


def table_json(*args: Any) -> dict[str, Any]:
    proc = run_stepcli("table", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_matches_torch_key_averages(plain_trace: Path) -> None:
    # GIVEN a trace and key_averages() from the same plain torch.profiler run
    expected = json.loads(Path(str(plain_trace) + ".key_averages.json").read_text())
    # WHEN stepcli summarizes the trace file alone
    data = table_json(plain_trace)
    # THEN the operator names, call counts, self and total times agree
    assert_matches_key_averages(data["cpu_ops"], expected)
    assert [s["step"] for s in data["steps"]] == [2, 3, 4]
    assert data["breakdown_ms"]["dataloader"] > 0 and data["breakdown_ms"]["backward"] > 0
    assert data["breakdown_ms"]["optimizer"] > 0 and data["breakdown_ms"]["forward"] > 0
    assert sum(data["breakdown_ms"].values()) == pytest.approx(data["step_ms"]["mean"])


def test_gzip_gives_the_same_summary(plain_trace: Path, tmp_path: Path) -> None:
    gz = tmp_path / "plain.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(plain_trace.read_bytes()))
    plain, zipped = table_json(plain_trace), table_json(gz)
    assert zipped["files"] == [str(gz)]
    for key in ("cpu_ops", "steps", "step_ms", "breakdown_ms", "events"):
        assert zipped[key] == plain[key]


# Imported by `table` before this change and needed by none of its work on one file: a pool's
# machinery (no pool is made for one file), numpy.ma (np.unique's masked-array check), orjson (+
# zoneinfo), json, html, the per-event reference analysis (only for times past 64-bit nanoseconds),
# rich (only for the terminal table).
UNUSED_BY_TABLE_JSON = (
    "multiprocessing",
    "concurrent.futures",
    "numpy.ma",
    "orjson",
    "zoneinfo",
    "json",
    "html",
    "stepcli.traces.analyses.reference",
    "rich",
)


def test_table_json_of_one_file_imports_only_what_it_uses(
    plain_trace: Path, tmp_path: Path
) -> None:
    # GIVEN one gzip trace (the shape of the real 100k-event traces scripts/bench_gpu.py measures)
    gz = tmp_path / "plain.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(plain_trace.read_bytes()))
    # WHEN `stepcli table --json` reads it, Python listing every module it imports
    proc = run_stepcli("table", "--json", gz, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = [
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    ]
    # (what the interpreter's start-up hooks import is not ours)
    imported = set(listed[listed.index("stepcli") :])
    # THEN start-up time goes to nothing the work does not use (each one costs 3-30 ms of a 0.5 s
    # run)
    assert "numpy" in imported and "stepcli.traces.engine" in imported  # (the listing works)
    assert sorted(set(UNUSED_BY_TABLE_JSON) & imported) == []
    assert json.loads(proc.stdout)["files"] == [str(gz)]


def test_two_ranks_from_torchrun(two_rank_dir: Path) -> None:
    data = table_json(two_rank_dir)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["slowest_rank"] == 1
    assert sorted({(s["rank"], s["step"]) for s in data["steps"]}) == [
        (r, n) for r in (0, 1) for n in range(2, 12)
    ]
    # the terminal report names the slowest rank in words
    proc = run_stepcli("table", two_rank_dir)
    assert proc.returncode == 0, proc.stderr
    assert "rank 1 (slowest)" in proc.stdout and "slowest rank: rank 1: compute" in proc.stdout
    assert "rank 0 ms" in proc.stdout and "rank 1 ms" in proc.stdout


def test_traces_of_jobs_of_different_sizes_name_no_slowest_rank(
    two_rank_dir: Path, tmp_path: Path
) -> None:
    # GIVEN the two ranks' traces, one of them edited to say it came from a job of 8 ranks (another
    # job's trace)
    mixed = tmp_path / "mixed"
    shutil.copytree(two_rank_dir, mixed)
    rank1 = next(mixed.glob("rank1*.pt.trace.json"))
    document = json.loads(rank1.read_text())
    assert document["distributedInfo"]["world_size"] == 2
    document["distributedInfo"]["world_size"] = 8
    rank1.write_text(json.dumps(document))
    # THEN nobody is named across them, and the terminal, --json and Markdown say why
    data = table_json(mixed)
    assert data["slowest_rank"] is None and data["straggler"] is None and data["culprit"] is None
    assert data["mixed_jobs"].startswith("traces of different jobs (world size 2 in rank0")
    assert "8 in rank1" in data["mixed_jobs"]
    text = run_stepcli("table", mixed, env={"COLUMNS": "80"}).stdout
    assert "traces of different jobs (world size 2 in" in text and "slowest rank:" not in text
    assert "Traces of different jobs" in run_stepcli("table", "--markdown", mixed).stdout
    # AND merge aligns them by their base times only, and says why
    merged = run_stepcli("merge", mixed, "-o", tmp_path / "merged.json")
    assert merged.returncode == 0, merged.stderr
    assert (
        "clocks from the traces' base times (traces of different jobs: their world sizes differ)"
        in merged.stdout
    )
    # AND one job's traces say nothing of it
    assert table_json(two_rank_dir)["mixed_jobs"] is None


def test_rich_output_plain_when_not_a_terminal(plain_trace: Path) -> None:
    proc = run_stepcli("table", plain_trace, "--limit", "3", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    assert "CPU operators" in proc.stdout and "3 of " in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines() if "│" in line) <= 80


def test_sort_and_limit(plain_trace: Path) -> None:
    proc = run_stepcli("table", "--csv", "--sort-by", "calls", "--limit", "5", plain_trace)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    calls = [int(r["calls"]) for r in rows]
    assert len(rows) == 5 and calls == sorted(calls, reverse=True)
    proc = run_stepcli("table", "--csv", "--sort-by", "name", "--limit", "4", plain_trace)
    names = [r["name"] for r in csv.DictReader(io.StringIO(proc.stdout))]
    assert names == sorted(names)


def test_csv_parses(plain_trace: Path) -> None:
    proc = run_stepcli("table", "--csv", "--limit", "1000", plain_trace)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert rows and set(rows[0]) == {
        "kind",
        "name",
        "calls",
        "self_ms",
        "total_ms",
        "avg_ms",
        "self_share",
    }
    assert {r["kind"] for r in rows} == {"cpu"}
    assert len(rows) == len(table_json(plain_trace)["cpu_ops"])
    float(rows[0]["self_ms"]), int(rows[0]["calls"])
    # times to the microsecond, shares to 6 places: no float noise such as 3.1879690000000003 (issue
    # 49)
    decimals = {
        k: max(len(r[k].partition(".")[2]) for r in rows)
        for k in ("self_ms", "total_ms", "avg_ms", "self_share")
    }
    assert (
        all(decimals[k] <= 3 for k in ("self_ms", "total_ms", "avg_ms"))
        and decimals["self_share"] <= 6
    ), decimals


def test_markdown_tables_are_well_formed(two_rank_dir: Path) -> None:
    proc = run_stepcli("table", "--markdown", two_rank_dir)
    assert proc.returncode == 0, proc.stderr
    assert len(markdown_tables(proc.stdout)) >= 4  # steps, ranks, breakdown, CPU operators
    assert "### Ranks" in proc.stdout and "(slowest)" in proc.stdout


def test_json_parses_and_has_the_contract_keys(two_rank_dir: Path) -> None:
    data = table_json(two_rank_dir)
    assert {
        "files",
        "step_ms",
        "steps",
        "ranks",
        "slowest_rank",
        "breakdown_ms",
        "device",
        "cpu_ops",
        "device_kernels",
        "events",
    } <= set(data)
    assert len(data["files"]) == 2 and data["events"] > 0 and data["device"] is None


def test_group_by_shape(plain_trace: Path) -> None:
    rows = table_json("--group-by-shape", plain_trace)["cpu_ops"]
    assert any(r["name"] == "aten::addmm" and r["shape"].startswith("[[") for r in rows)


@pytest.mark.parametrize(
    "kind",
    ["missing", "empty", "truncated", "non-json", "corrupt-gzip", "not-a-trace", "empty-dir"],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path: Path, kind: str) -> None:
    text = (DATA / "train_cpu.pt.trace.json").read_text()
    paths = {
        "missing": tmp_path / "missing.json",
        "empty": tmp_path / "empty.json",
        "truncated": tmp_path / "truncated.json",
        "non-json": tmp_path / "notjson.json",
        "corrupt-gzip": tmp_path / "corrupt.json.gz",
        "not-a-trace": tmp_path / "other.json",
        "empty-dir": tmp_path / "empty_dir",
    }
    paths["empty"].write_text("")
    paths["truncated"].write_text(text[: len(text) // 3])
    paths["non-json"].write_text("<html>not json</html>")
    paths["corrupt-gzip"].write_bytes(gzip.compress(text.encode())[:500])
    paths["not-a-trace"].write_text('{"hello": "world"}')
    paths["empty-dir"].mkdir()
    proc = run_stepcli("table", paths[kind])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("stepcli: error: ") and str(paths[kind]) in lines[0]
    assert proc.stdout == ""


def test_one_bad_file_among_good_ones_fails(plain_trace: Path, tmp_path: Path) -> None:
    shutil.copy(plain_trace, tmp_path / "good.pt.trace.json")
    (tmp_path / "bad.pt.trace.json").write_text("{")
    proc = run_stepcli("table", tmp_path)
    assert (
        proc.returncode != 0
        and "bad.pt.trace.json" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_step_number_repeated_in_one_process_shows_every_duration(tmp_path: Path) -> None:
    # GIVEN one process whose trace holds ProfilerStep#1 twice (a profiler restarted inside one
    # trace), 1 ms and 5 ms
    events = [
        {
            "name": "ProfilerStep#1",
            "ph": "X",
            "cat": "user_annotation",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        },
        {"name": "aten::mm", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 500},
        {
            "name": "ProfilerStep#1",
            "ph": "X",
            "cat": "user_annotation",
            "pid": 1,
            "tid": 1,
            "ts": 2000,
            "dur": 5000,
        },
        {
            "name": "aten::mm",
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 1,
            "ts": 2010,
            "dur": 4000,
        },
    ]
    trace = tmp_path / "restarted.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    proc = run_stepcli("table", trace)
    assert proc.returncode == 0, proc.stderr
    # THEN the steps table has a row for each (one cell per step number would have kept only the
    # last)
    steps = proc.stdout[proc.stdout.index("Steps") : proc.stdout.index("Step breakdown")]
    rows = [line.split("│")[1:4] for line in steps.splitlines() if line.startswith("│")]
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["pid 1", "1", "1.00"],
        ["pid 1", "1", "5.00"],
    ], steps
    # and on a pipe (80 columns) the long path of the one file read stands whole on its own line
    deep = tmp_path / ("x" * 60) / trace.name
    deep.parent.mkdir()
    trace.rename(deep)
    lines = run_stepcli("table", deep, env={"COLUMNS": "80"}).stdout.splitlines()
    assert lines[:2] == ["1 trace file, 4 events:", str(deep)], lines[:3]


def test_render_treats_names_as_text_and_shortens_in_the_middle() -> None:
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.events import Event
    from stepcli.traces.read.tracereader import Trace
    from stepcli.traces.render.formats import print_table_report
    from stepcli.traces.render.terminal import shorten

    long_name = "void at::native::elementwise_kernel<" + "x" * 200 + ">(int, functor)"
    events = [
        Event(name="[bold]odd[/bold] name", cat="cpu_op", ts=0.0, dur=5.0),
        Event(name=long_name, cat="kernel", pid=0, tid=7, ts=1.0, dur=2.0),
    ]
    out = io.StringIO()
    print_table_report(
        summarize([Trace.from_events(events)]), sort_by="self", limit=5, fmt="rich", file=out
    )
    text = out.getvalue()
    assert "[bold]odd[/bold] name" in text
    assert (
        "void at::native::" in text and "functor)" in text and "…" in text and long_name not in text
    )
    assert shorten("abcdefghij", 5) == "ab…ij" and shorten("short", 5) == "short"
    csv_out = io.StringIO()
    print_table_report(
        summarize([Trace.from_events(events)]), sort_by="self", limit=5, fmt="csv", file=csv_out
    )
    assert long_name in csv_out.getvalue()  # machines get full names


def test_names_that_would_shorten_alike_stand_whole() -> None:
    from rich.console import Console

    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.events import Event
    from stepcli.traces.read.tracereader import Trace
    from stepcli.traces.render.terminal import print_rich_report

    # GIVEN two optimizers' zero_grad, whose names differ only in their middle, at 80 columns
    names = ["Optimizer.zero_grad#Adam.zero_grad", "Optimizer.zero_grad#SGD.zero_grad", "aten::mm"]
    events = [Event(name=name, cat="cpu_op", ts=10.0 * i, dur=5.0) for i, name in enumerate(names)]
    out = io.StringIO()
    print_rich_report(
        summarize([Trace.from_events(events)]).to_dict(),
        Console(file=out, width=80),
        sort_by="name",
        limit=5,
    )
    # THEN each can still be told from the other: over two lines, whole (both were
    # `Optimizer.zero_gra….zero_grad`)
    cells = "".join(
        line.split("│")[1].strip() for line in out.getvalue().splitlines() if line.startswith("│")
    )
    assert (
        "Optimizer.zero_grad#Adam.zero_grad" in cells
        and "Optimizer.zero_grad#SGD.zero_grad" in cells
    )
    assert all(len(line) <= 80 for line in out.getvalue().splitlines())


@pytest.mark.parametrize("width", [80, 72, 64])
def test_the_ranks_table_never_cuts_a_figure(width: int) -> None:
    from rich.console import Console

    from stepcli.traces.render.terminal import ranks_table

    # GIVEN two ranks with 5-digit figures, the slower one labelled so, on a terminal narrower than
    # 80 columns
    stats = {"count": 12, "mean": 55.82, "p90": 59.3, "max": 12345.67}
    ranks = [
        {"rank": 0, "process": "rank 0", "step_ms": stats, "compute_ms": 4.31, "comm_ms": 51.51},
        {"rank": 1, "process": "rank 1", "step_ms": stats, "compute_ms": 52.5, "comm_ms": 3.76},
    ]
    out = io.StringIO()
    Console(file=out, width=width).print(ranks_table(ranks, 1))
    text = out.getvalue()
    # THEN every figure stands whole (at 72 columns the Wait cell read `51.…`); the label wraps
    # instead
    for figure in ("55.82", "59.30", "12,345.7", "4.31", "51.51", "52.50", "3.76"):
        assert figure in text, text
    assert "…" not in text and all(len(line) <= width for line in text.splitlines())


@pytest.mark.parametrize("bad", ["1e308", "1e400", "1" + "0" * 400, '"nan"'])
def test_non_finite_times_are_skipped_not_a_traceback(tmp_path: Path, bad: str) -> None:
    # GIVEN the smallest trace that used to crash (round(inf)), and a trace with steps and one such
    # event
    lone = tmp_path / "lone.json"
    lone.write_text(
        '{"traceEvents":[{"name":"a","ph":"X","ts":0,"dur":' + bad + ',"cat":"cpu_op"}]}'
    )
    doc = json.loads((DATA / "train_cpu.pt.trace.json").read_text())
    doc["traceEvents"].append(
        {"name": "aten::odd", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 0}
    )
    stepped = tmp_path / "stepped.json"
    stepped.write_text(json.dumps(doc).replace('"dur": 0}', f'"dur": {bad}}}'))
    for path in (lone, stepped):
        # WHEN summarized
        proc = run_stepcli("table", path)
        # THEN a clean report that says an event was skipped
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert (
            "skipped 1 event with a missing, non-numeric, negative or out-of-range ts/dur (left "
            "out of every figure)" in proc.stdout
        )
    assert table_json(lone)["skipped_events"] == 1 and table_json(lone)["cpu_ops"] == []
    good = table_json(DATA / "train_cpu.pt.trace.json")
    assert (
        table_json(stepped)["steps"] == good["steps"] and table_json(stepped)["skipped_events"] == 1
    )
    # compare reads traces with the same reader and sniffs by content with it too: the same verdict
    # for every value (1e400 included), never a traceback (2 steps against themselves: inconclusive,
    # exit 4)
    for path, status in ((stepped, 4), (lone, 3)):
        proc = run_stepcli("compare", path, path)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == status, proc.stderr


@pytest.mark.parametrize("fmt", ["rich", "--json", "--csv", "--markdown"])
def test_reader_closing_the_pipe_early_is_not_an_error(tmp_path: Path, fmt: str) -> None:
    # GIVEN a trace whose report is far bigger than a pipe buffer (64 KiB)
    events = [
        {
            "name": f"op_{i:05d}_" + "x" * 40,
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 1,
            "ts": i * 10,
            "dur": 5,
        }
        for i in range(4000)
    ]
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"traceEvents": events}))
    args = ["table", str(path), "--limit", "5000"] + ([] if fmt == "rich" else [fmt])
    # WHEN the reader takes one line and goes away, like `stepcli table TRACE | head -1`
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepcli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=stepcli_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=60)
    # THEN the report stops quietly and the command succeeds
    assert first
    assert proc.returncode == 0, stderr
    assert stderr == ""


CUT_SHORT = """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)

    def train_step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=5))
    prof.start()
    for _ in range(3):  # step 0 (warmup), then steps 1 and 2 recorded in full
        train_step()
        prof.step()
    model(x)  # step 3 has only begun when the window is cut short
    prof.add_metadata("stepcli_incomplete_step", str(prof.step_num))
    prof.stop()
    prof.export_chrome_trace(sys.argv[1])
"""


def test_incomplete_step_of_a_real_trace_is_left_out(tmp_path: Path) -> None:
    # GIVEN a plain torch.profiler trace cut short in step 3, marked the way stepcli's agent marks
    # it
    script = write_script(tmp_path, "cut.py", CUT_SHORT)
    out = tmp_path / "cut.pt.trace.json"
    subprocess.run(
        [sys.executable, str(script), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        env=stepcli_env(),
    )
    raw = json.loads(out.read_text())
    # top level, a JSON string: what the reader expects
    assert raw["stepcli_incomplete_step"] == "3"
    assert sorted(
        e["name"] for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    ) == [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]
    # WHEN summarized
    data = table_json(out)
    # THEN step 3 is in no step figure, and neither it nor the forward pass begun in it is in the
    # operator table
    assert [s["step"] for s in data["steps"]] == [1, 2]
    assert data["step_ms"]["count"] == 2 and data["ranks"][0]["step_ms"]["count"] == 2
    calls = {r["name"]: r["calls"] for r in data["cpu_ops"]}
    assert calls["ProfilerStep*"] == 2
    assert calls["aten::addmm"] == 2  # one forward per recorded step, not the third begun in step 3
    assert data["outside_steps"]["events"] > 0


def test_a_gpu_trace_without_profiler_steps_is_said_to_be_one_whole_trace(tmp_path: Path) -> None:
    # GIVEN a GPU trace with no ProfilerStep#N annotation (a profiler used without step(), HTA's
    # sample traces)
    with gzip.open(DATA / "cuda_small.pt.trace.json.gz", "rt") as handle:
        document = json.load(handle)
    document["traceEvents"] = [
        e for e in document["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    trace = tmp_path / "nostep.json"
    trace.write_text(json.dumps(document))
    # WHEN table summarizes it THEN its figures are said to be the whole trace's, never "per step"
    # (issue 49: `host wait 12,854 ms/step` for the whole trace taken as one step)
    result = run_stepcli("table", trace, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "the figures below are for the whole trace, not per step" in text
    assert "Device time, whole trace" in text and "Device activity (whole trace)" in text
    assert (
        "/step" not in text
        and "ms / step" not in text
        and "per step" not in text.replace("not per step", "")
    )


STUB_AT_THE_END = """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 64), torch.randn(128, 1)
    # The loop ends while the schedule still records: `with` stops the profiler just after the last step() opened
    # ProfilerStep#6, which it closes at once with nothing in it.
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=10),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
"""  # noqa: E501


def test_the_profilers_closing_stub_is_no_step_and_says_it_was_left_out(tmp_path: Path) -> None:
    # GIVEN a plain torch.profiler trace whose last ProfilerStep#N is the profiler's stub
    # (microseconds, no operator)
    script = write_script(tmp_path, "stub.py", STUB_AT_THE_END)
    out = tmp_path / "traces"
    subprocess.run(
        [sys.executable, str(script), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        env=stepcli_env(),
    )
    (trace,) = out.glob("*.pt.trace.json")
    steps = {
        e["name"]: e["dur"]
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("name", "").startswith("ProfilerStep#")
    }
    assert sorted(steps) == [f"ProfilerStep#{n}" for n in (2, 3, 4, 5, 6)]
    # WHEN summarized
    data = table_json(out)
    # THEN step 6 is in no step figure (the minimum was its 0.01 ms), and the JSON says why it was
    # left out
    assert [s["step"] for s in data["steps"]] == [2, 3, 4, 5]
    assert data["step_ms"]["count"] == 4 and data["step_ms"]["min"] * 1000 > steps["ProfilerStep#6"]
    assert data["left_out_steps"] == [
        {"file": str(trace), "step": 6, "why": data["left_out_steps"][0]["why"]}
    ]
    why = data["left_out_steps"][0]["why"]
    assert "stub" in why
    # ... and the terminal and the report say the same, once
    text = run_stepcli("table", out)
    assert text.returncode == 0, text.stderr
    assert text.stdout.count(f"left out ProfilerStep#6: {why}") == 1
    assert "step time over 4 steps" in text.stdout
    page = tmp_path / "page.html"
    report = run_stepcli("report", "-o", page, out)
    assert report.returncode == 0, report.stderr
    assert f"left out ProfilerStep#6: {why}".replace("'", "&#x27;") in page.read_text()
