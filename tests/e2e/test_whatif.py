"""`stepcli whatif` end to end: real runs of real torch programs, replayed and answered.

One demo run and one two-rank gloo DDP job with a rank slowed by a known sleep are shared by the
file's tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import load_trace, profiler_steps, run_stepcli, trace_files, write_script

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


def _shared_trace(*parts: str) -> Path:
    """A trace of ../shared/traces (skipped where the checkout has none beside it)."""
    trace = SHARED.joinpath(*parts)
    if not trace.exists():
        pytest.skip(f"{trace} not found (../shared/traces beside the checkout)")
    return trace


def _answered(out: Path, *args: str | Path) -> tuple[Any, dict[str, Any]]:
    """`stepcli whatif ARGS --json OUT`, answered (exit 0): the process and the document."""
    result = run_stepcli("whatif", *args, "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, json.loads(out.read_text())


SLEEP_MS = 20

SLOW_RANK = f"""
import time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for _ in range(8):
    if dist.get_rank() == 1:
        time.sleep({SLEEP_MS} / 1000)  # rank 1's extra work, which idealizing it must buy back
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
del model, opt
import gc; gc.collect()
dist.destroy_process_group()
"""  # noqa: E501


@pytest.fixture(scope="module")
def demo_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("whatif") / "demo"
    summary = out.parent / "summary.json"
    result = run_stepcli(
        "demo", "--active", "3", "-o", out, "--json", summary, "--", "--iterations", "16"
    )
    assert result.returncode == 0, result.stderr
    return out, result.stderr


@pytest.fixture(scope="module")
def demo_run(demo_result: tuple[Path, str]) -> Path:
    return demo_result[0]


def test_the_run_summary_says_what_would_help_most(demo_result: tuple[Path, str]) -> None:
    out, stderr = demo_result
    helps = json.loads((out.parent / "summary.json").read_text())["what_would_help"]
    assert helps["verdict"] == "ok" and abs(helps["replay_error"]) <= 0.05
    best = helps["opportunities"][0]
    assert best["saved_ms"] == max(o["saved_ms"] for o in helps["opportunities"])
    line = next(s for s in stderr.splitlines() if s.startswith("what would help: "))
    assert (
        line.startswith(f"what would help: {best['change']}: step ")
        and f"({-best['saved_share']:+.0%})" in line
    )
    assert f"  stepcli whatif {out}" in stderr.splitlines() or "  stepcli whatif " in stderr


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("whatif_ddp")
    script = write_script(folder, "slow_rank.py", SLOW_RANK)
    out = folder / "out"
    result = run_stepcli(
        "run",
        "--quiet",
        "--active",
        "3",
        "-o",
        out,
        "--",
        "torchrun",
        "--nproc-per-node",
        "2",
        script,
        cwd=folder,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_a_run_folder_is_replayed_checked_and_ranked(demo_run: Path, tmp_path: Path) -> None:
    answer = tmp_path / "whatif.json"
    result = run_stepcli("whatif", demo_run, "--json", answer)
    assert result.returncode == 0, result.stderr
    assert "the graph explains the step" in result.stdout and "what would help" in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines()), result.stdout
    doc = json.loads(answer.read_text())
    assert doc["schema"] == "stepcli.whatif/1" and doc["verdict"] == "ok" and doc["reason"] is None
    assert doc["ranks"] == [] and doc["steps"] == [2, 3, 4]
    assert abs(doc["replay_error"]) <= 0.05 and doc["untouched_ms"] > 0
    # the measured step is the mean of the steps' own times in the trace (the profiler's transition
    # between two steps is in no step)
    (trace,) = trace_files(demo_run)
    own = [
        e["dur"] / 1000
        for e in load_trace(trace)["traceEvents"]
        if e.get("name") in {f"ProfilerStep#{n}" for n in doc["steps"]}
        and e.get("cat") != "gpu_user_annotation"
    ]
    assert len(own) == 3 and doc["measured_ms"] == pytest.approx(sum(own) / 3, rel=1e-6)
    path = doc["critical_path"]
    assert sum(s["ms"] for s in path["segments"]) == pytest.approx(path["ms"])
    # one process: its critical path is the whole step
    assert path["ms"] == pytest.approx(doc["replayed_ms"], rel=1e-6)
    saved = [o["saved_ms"] for o in doc["opportunities"]]
    assert saved == sorted(saved, reverse=True) and saved[0] > 0
    removed = {o["change"]: o for o in doc["opportunities"]}["--scale phase:dataloader=0"]
    assert (
        removed["predicted_ms"] < doc["measured_ms"]
        and removed["predicted_untouched_ms"] < doc["untouched_ms"]
    )
    # the program's pace: the prediction scaled by the untouched median over the measured step
    assert removed["predicted_untouched_ms"] == pytest.approx(
        removed["predicted_ms"] * doc["untouched_ms"] / doc["measured_ms"]
    )
    assert doc["changes"] == []


def test_changes_are_answered_alone_and_together(demo_run: Path, tmp_path: Path) -> None:
    answer = tmp_path / "whatif.json"
    result = run_stepcli(
        "whatif",
        demo_run,
        "--scale",
        "phase:optimizer=0",
        "--scale",
        "re:^aten::=0.5",
        "--json",
        answer,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(answer.read_text())
    assert [c["change"] for c in doc["changes"]] == [
        "--scale phase:optimizer=0",
        "--scale re:^aten::=0.5",
        "--scale phase:optimizer=0 --scale re:^aten::=0.5",
    ]
    alone_a, alone_b, both = (c["saved_ms"] for c in doc["changes"])
    assert 0 < alone_a < both and 0 < alone_b < both
    assert doc["opportunities"] == []
    again = run_stepcli("whatif", demo_run, "--scale", "phase:optimizer=0", "--json", answer)
    assert again.returncode == 0, again.stderr  # its own earlier answer is replaced


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--scale", "aten::mmm=0.5"],
            "matches no operator on the steps' thread of these traces; near names:",
        ),
        (["--comm", "0.5"], "these traces are one process"),
        (["--idealize-rank", "0"], "these traces are one process"),
        (["--step", "99"], "--step 99: not a step every trace recorded (steps 2-4)"),
        # groups nested 5,000 deep: Python's regex compiler ran out of stack (an internal error)
        (["--scale", "re:" + "(x" * 5_000 + ")" * 5_000 + "=0.5"], "too deeply nested"),
        # a selector of 100k characters: quoted by its start, not a screenful
        (["--scale", "x" * 100_000 + "=0.5"], "xxx...: matches no operator"),
    ],
)
def test_bad_changes_get_one_line_and_exit_2(demo_run: Path, argv: list[str], words: str) -> None:
    result = run_stepcli("whatif", demo_run, *argv)
    assert result.returncode == 2 and result.stdout == ""
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert len(result.stderr) < 300, result.stderr[:300]


def test_whatif_never_replaces_a_users_file(demo_run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": true}')
    result = run_stepcli("whatif", demo_run, "--json", mine)
    assert result.returncode == 2 and "not replaced" in result.stderr
    assert mine.read_text() == '{"mine": true}'


@pytest.mark.parametrize(
    ("outputs", "words"),
    [
        (["--json", "{tmp}/same.json", "--trace", "{tmp}/./same.json"], "both name"),
        (["--json", "{tmp}/answer.json", "--trace", "{tmp}/mine.json"], "not replaced"),
        (["--json", "{tmp}/answer.json", "--trace", "{tmp}/no/such/trace.json"], "no folder"),
        (["--json", "{tmp}/answer.json", "--trace", "-"], "give a FILE"),
    ],
)
def test_outputs_that_cannot_be_written_are_refused_before_anything_is_written(
    demo_run: Path, tmp_path: Path, outputs: list[str], words: str
) -> None:
    # GIVEN a user's own file beside where the answer would go
    (tmp_path / "mine.json").write_text('{"mine": true}')
    argv = [o.replace("{tmp}", str(tmp_path)) for o in outputs]
    # WHEN one of the two outputs cannot be written
    result = run_stepcli("whatif", demo_run, *argv, cwd=tmp_path)
    # THEN one line and exit 2, and the other output is not written either (it was, before the
    # refusal)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]
    assert (tmp_path / "mine.json").read_text() == '{"mine": true}'


def test_json_dash_prints_the_document_alone_on_stdout(demo_run: Path, tmp_path: Path) -> None:
    # as `compare --json -`: a pipe gets the JSON (it wrote a file named "-" in the working folder)
    result = run_stepcli(
        "whatif", demo_run, "--scale", "phase:optimizer=0", "--json", "-", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "stepcli.whatif/1" and doc["changes"][0]["change"].endswith("=0")
    assert list(tmp_path.iterdir()) == []


def test_a_run_whose_summary_cannot_be_read_is_answered_and_says_why_no_pace(
    demo_run: Path, tmp_path: Path
) -> None:
    # GIVEN the demo's run folder with its run summary cut short (a full disk, a bad copy)
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    (summary,) = run.glob(".stepcli/*/summary.json")
    summary.write_text(summary.read_text()[:100])
    answer = tmp_path / "answer.json"
    # WHEN whatif reads it
    result = run_stepcli("whatif", run, "--json", answer)
    # THEN the traces are answered at the profiler's pace, and a note says why not the program's
    assert result.returncode == 0, result.stderr
    assert json.loads(answer.read_text())["untouched_ms"] is None
    note = " ".join(result.stdout.split()).split("note: ", 1)[1]
    assert note.startswith(f"{summary}: ") and "predictions at the profiler's pace only" in note


def test_a_slow_rank_idealized_buys_its_sleep_back_and_the_fast_one_buys_nothing(
    ddp_run: Path,
) -> None:
    result = run_stepcli("whatif", ddp_run, "--idealize-rank", "1", "--idealize-rank", "0")
    assert result.returncode in (0, 4), result.stderr
    assert "2 ranks" in result.stdout
    # a loaded machine can skew a replay: then it must say why, never a number
    if result.returncode == 4:
        assert "INCONCLUSIVE" in result.stdout and "predicted" not in result.stdout
        return
    line = next(s for s in result.stdout.splitlines() if s.strip().startswith("--idealize-rank 1 "))
    assert "->" in line
    text = result.stdout
    assert "critical path" in text and "collective" in text


def test_the_ranks_answer_in_json(ddp_run: Path, tmp_path: Path) -> None:
    answer = tmp_path / "ddp.json"
    result = run_stepcli(
        "whatif", ddp_run, "--idealize-rank", "1", "--idealize-rank", "0", "--json", answer
    )
    if result.returncode == 4:
        doc = json.loads(answer.read_text())
        assert doc["verdict"] == "inconclusive" and doc["reason"] and doc["changes"] == []
        return
    assert result.returncode == 0, result.stderr
    doc = json.loads(answer.read_text())
    assert doc["ranks"] == [0, 1]
    slow, fast = doc["changes"][0], doc["changes"][1]
    # rank 1 sleeps 20 ms a step: idealized, most of it comes back; rank 0 idealized buys nothing
    # (it waits).
    assert slow["saved_ms"] > 0.5 * SLEEP_MS, slow
    assert fast["saved_ms"] <= 0.05 * doc["measured_ms"], fast
    assert any(s["kind"] == "collective" for s in doc["critical_path"]["segments"])
    assert doc["critical_path"]["segments"][0]["rank"] in (0, 1)


def test_one_rank_of_a_gpu_job_is_inconclusive_with_the_reason() -> None:
    trace = _shared_trace("dlrm_control.rank3.pt.trace.json.gz")
    result = run_stepcli("whatif", trace)
    assert result.returncode == 4, result.stderr
    assert "INCONCLUSIVE: only rank 3 of a 8-rank job was read" in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines()), result.stdout


def test_a_real_gpu_step_is_replayed_and_a_kernel_off_its_critical_path_buys_nothing(
    tmp_path: Path,
) -> None:
    # the H200 GPT step: under the profiler the host launching it is slower than the device running
    # it
    trace = _shared_trace("h200_gpt_bf16", "gpt_bf16.pt.trace.json.gz")
    out = tmp_path / "gpt.json"
    result, doc = _answered(out, trace, "--scale", "re:^nvjet=0.5", "--scale", "phase:backward=0.5")
    assert abs(doc["replay_error"]) <= 0.05
    kernels, backward = doc["changes"][0], doc["changes"][1]
    # the GEMM kernels halved: the host still launches as slowly
    assert abs(kernels["saved_share"]) < 0.01, kernels
    assert backward["saved_share"] > 0.1, backward
    assert {"gpu", "launch", "sync"} <= {seg["kind"] for seg in doc["critical_path"]["segments"]}
    assert all(len(line) <= 80 for line in result.stdout.splitlines()), result.stdout
    # step 2 alone begins with 13 ms of device work the host waits for (a device sync): there the
    # GEMMs halved buy
    _, doc = _answered(out, trace, "--step", "2", "--scale", "re:^nvjet=0.5")
    gpu_ms = sum(seg["ms"] for seg in doc["critical_path"]["segments"] if seg["kind"] == "gpu")
    assert abs(doc["replay_error"]) <= 0.05 and gpu_ms > 10
    assert 0.5 < doc["changes"][0]["saved_ms"] < gpu_ms / 2, doc["changes"]


def test_everything_twice_as_slow_is_at_most_twice_the_step(tmp_path: Path) -> None:
    # `re:.` names every operator and every kernel: a kernel launched inside an operator is scaled
    # once (it ran 4 times as long, and the H200 step came out 2.9 times as long)
    trace = _shared_trace("h200_gpt_bf16", "gpt_bf16.pt.trace.json.gz")
    _, doc = _answered(tmp_path / "slow.json", trace, "--scale", "re:.=2")
    assert doc["measured_ms"] < doc["changes"][0]["predicted_ms"] <= 2 * doc["measured_ms"]


def test_kernels_on_the_critical_path_buy_at_most_their_time_there(tmp_path: Path) -> None:
    # HTA's cuda_event_sync fixture: a ProfilerStep whose host waits on the device in an event sync
    trace = _shared_trace("hta_critical_path", "cuda_event_sync", "event_sync_trace.json.gz")
    _, doc = _answered(tmp_path / "sync.json", trace, "--scale", "re:^(void|Memcpy)=0")
    assert doc["replay_error"] == pytest.approx(0.0, abs=0.01)
    segments = doc["critical_path"]["segments"]
    on_device = sum(seg["ms"] for seg in segments if seg["kind"] == "gpu")
    assert on_device > 0
    # the kernels removed: the step gets shorter by no more than their stretch of the critical path
    assert 0 < doc["changes"][0]["saved_ms"] <= on_device + 1e-6


def test_a_trace_without_steps_is_refused_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "nosteps.json"
    trace.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "name": "aten::mm",
                        "ph": "X",
                        "cat": "cpu_op",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 5,
                    }
                ]
            }
        )
    )
    result = run_stepcli("whatif", trace)
    assert result.returncode == 2 and "no complete ProfilerStep" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_inconclusive_answer_with_trace_still_shows_the_answer(
    ddp_run: Path, tmp_path: Path
) -> None:
    # GIVEN one rank of the two-rank job
    rank0 = trace_files(ddp_run)[0]
    trace, answer = tmp_path / "critical.json", tmp_path / "answer.json"
    # WHEN whatif is asked for a trace of it
    result = run_stepcli("whatif", rank0, "--trace", trace, "--json", answer)
    # THEN inconclusive: the answer on stdout as without --trace (it printed nothing), no trace,
    # and one line on why
    assert result.returncode == 4, result.stderr
    assert result.stdout.startswith("whatif: rank 0, steps 2-4\nINCONCLUSIVE: only rank 0 of a")
    assert result.stderr.startswith(f"stepcli: error: --trace {trace}: not written: only rank 0")
    assert not trace.exists() and json.loads(answer.read_text())["verdict"] == "inconclusive"


def test_a_rank_without_steps_beside_one_with_steps_is_named(ddp_run: Path, tmp_path: Path) -> None:
    # GIVEN the DDP job's two ranks, rank 1's trace written before its first step ended
    rank0, rank1 = trace_files(ddp_run)
    shutil.copy(rank0, tmp_path / rank0.name)
    doc = load_trace(rank1)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    (tmp_path / rank1.name).write_text(json.dumps(doc))
    # WHEN whatif reads them
    result = run_stepcli("whatif", tmp_path)
    # THEN the line names the trace without steps (it said only that the traces share none)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"stepcli: error: {tmp_path / rank1.name}: no complete ProfilerStep, where another trace "
        "has steps: give traces of one run, each with its steps"
    )


def test_whatifs_own_outputs_saved_beside_the_traces_are_left_out(
    ddp_run: Path, tmp_path: Path
) -> None:
    # GIVEN the job's traces under plain names, and whatif's own outputs written beside them, one
    # under a name that reads as a trace
    for i, trace in enumerate(trace_files(ddp_run)):
        shutil.copy(trace, tmp_path / f"rank{i}.json")
    critical, answer = tmp_path / "critical.pt.trace.json", tmp_path / "answer.json"
    first = run_stepcli("whatif", tmp_path, "--trace", critical, "--json", answer)
    if first.returncode == 4:  # a loaded machine skewed the replay: no trace to trip on
        pytest.skip("the replay was inconclusive on this machine")
    assert first.returncode == 0, first.stderr
    # WHEN whatif and table read the folder again
    again = run_stepcli("whatif", tmp_path, "--json", answer)
    table = run_stepcli("table", tmp_path)
    # THEN the outputs are not taken for traces (the answer failed the folder: "not a profiler
    # trace"), and named alone they are one line
    assert again.returncode == 0 and again.stdout.startswith("whatif: 2 ranks"), again.stderr
    assert table.returncode == 0 and table.stdout.startswith("2 trace files"), table.stderr
    named = run_stepcli("whatif", critical)
    assert named.returncode == 2 and named.stderr.strip() == (
        f"stepcli: error: {critical}: a stepcli output (whatif --trace, or a --json document), "
        "not a profiler trace; give the traces it was made from"
    )


def test_a_trace_without_a_rank_among_a_jobs_traces_is_named(
    ddp_run: Path, demo_run: Path, tmp_path: Path
) -> None:
    # GIVEN the job's traces and another program's trace in one folder
    for trace in trace_files(ddp_run):
        shutil.copy(trace, tmp_path / trace.name)
    (stray,) = trace_files(demo_run)
    shutil.copy(stray, tmp_path / stray.name)
    # WHEN whatif reads the folder
    result = run_stepcli("whatif", tmp_path)
    # THEN the line names the odd one out (it said only that a trace without a rank was there)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"stepcli: error: these traces mix a trace without a rank ({tmp_path / stray.name}) "
        "with ranked ones: give one job's traces"
    )


def test_the_trace_marks_the_critical_path_over_every_rank(ddp_run: Path, tmp_path: Path) -> None:
    trace = tmp_path / "critical.json"
    result = run_stepcli("whatif", ddp_run, "--trace", trace)
    # a loaded machine can skew the replay: then no trace, and it says why
    if result.returncode == 4:
        assert "--trace" in result.stderr and "not written" in result.stderr and not trace.exists()
        return
    assert result.returncode == 0, result.stderr
    doc = json.loads(trace.read_text())
    assert next(iter(doc)) == "stepcli_whatif_trace"
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("ProfilerStep#")]
    assert {e["pid"] for e in steps} == {0, 1} and len(steps) == 6
    path = [e for e in events if e.get("cat") == "stepcli_critical_path" and e["ph"] == "X"]
    assert path and any(e["name"].startswith("collective: ") for e in path)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts and starts == {e["id"] for e in events if e["ph"] == "f"}
    again = run_stepcli("whatif", ddp_run, "--trace", trace)  # its own earlier trace is replaced
    assert again.returncode in (0, 4), again.stderr
    # NAME.json.gz is gzipped, as its name says, and replaced as its own trace too
    packed = tmp_path / "critical.json.gz"
    for _ in range(2):
        result = run_stepcli("whatif", ddp_run, "--trace", packed)
        assert result.returncode in (0, 4), result.stderr
    if result.returncode == 0:
        assert packed.read_bytes()[:2] == b"\x1f\x8b"
        assert next(iter(load_trace(packed))) == "stepcli_whatif_trace"
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    refused = run_stepcli("whatif", ddp_run, "--trace", mine)
    assert refused.returncode == 2 and "not replaced" in refused.stderr and mine.read_text() == "{}"


def test_on_a_dask_cluster_the_lanes_are_read_there_and_the_answer_is_the_local_one(
    scheduler: str, ddp_run: Path, tmp_path: Path
) -> None:
    # GIVEN a two-rank gloo job and a cluster WHEN whatif reads its traces there, with a change and
    # without
    for change in (["--idealize-rank", "1", "--comm", "0.5"], []):
        local, remote = tmp_path / "local.json", tmp_path / "remote.json"
        here = run_stepcli("whatif", ddp_run, *change, "--json", local)
        there = run_stepcli("whatif", ddp_run, *change, "--json", remote, "--scheduler", scheduler)
        # THEN the answer is the local one, byte for byte, on the terminal and in the document
        assert there.returncode == here.returncode, there.stderr
        assert here.returncode in (0, 4), here.stderr
        assert there.stdout == here.stdout and there.stderr == here.stderr
        assert remote.read_bytes() == local.read_bytes()
        assert json.loads(remote.read_text())["ranks"] == [0, 1]


def test_on_a_dask_cluster_a_bad_trace_is_named_in_one_line(scheduler: str, tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    result = run_stepcli("whatif", "--scheduler", scheduler, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"{tmp_path / 'rank0.json'}: truncated JSON (the file "
            "ends in the middle of the trace; was it still being written?)"
        )
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--scheduler", "tcp://127.0.0.1:1"],
            "stepcli: error: cannot reach the Dask scheduler at tcp://127.0.0.1:1",
        ),
        (["--scheduler-wait", "5s"], "--scheduler-wait needs --scheduler ADDRESS"),
    ],
)
def test_a_scheduler_that_cannot_be_used_is_one_line(
    demo_run: Path, argv: list[str], words: str
) -> None:
    pytest.importorskip("distributed")
    result = run_stepcli("whatif", *argv, demo_run, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert words in result.stderr and len(result.stderr.strip().splitlines()) <= 2, result.stderr


TWO_OPTIMIZERS = """
import time, torch
from torch.profiler import record_function
torch.manual_seed(0)
gen, disc = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)
opt_d, opt_g = torch.optim.Adam(disc.parameters()), torch.optim.Adam(gen.parameters())
for _ in range(8):  # a GAN's step: two optimizers, one step (the larger of their counts)
    fake = gen(torch.randn(64, 16))
    disc(fake.detach()).mean().backward()
    opt_d.step()
    opt_d.zero_grad()
    with record_function("generator_extra"):
        time.sleep(0.01)
    disc(fake).mean().backward()
    opt_g.step()
    opt_g.zero_grad()
"""


def test_a_step_of_two_optimizers_is_replayed_as_one_step(tmp_path: Path) -> None:
    script = write_script(tmp_path, "gan.py", TWO_OPTIMIZERS)
    out, answer = tmp_path / "gan", tmp_path / "whatif.json"
    assert (
        run_stepcli("run", "--quiet", "--wait", "2", "--active", "3", "-o", out, script).returncode
        == 0
    )
    result = run_stepcli("whatif", out, "--scale", "generator_extra=0", "--json", answer)
    assert result.returncode == 0, result.stderr
    doc = json.loads(answer.read_text())
    assert doc["verdict"] == "ok" and doc["steps"] == [3, 4, 5], doc["steps"]
    assert abs(doc["replay_error"]) <= 0.05
    (trace,) = trace_files(out)
    # one ProfilerStep per iteration, not one per optimizer
    assert profiler_steps(trace) == [3, 4, 5]
    slept = [
        e["dur"] / 1000
        for e in load_trace(trace)["traceEvents"]
        if e.get("name") == "generator_extra"
    ]
    assert len(slept) == 3 and doc["measured_ms"] > sum(slept) / 3 >= 10  # both halves in one step
    assert doc["changes"][0]["saved_ms"] == pytest.approx(sum(slept) / 3, rel=0.05)
