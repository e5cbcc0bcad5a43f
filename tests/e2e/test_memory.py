"""`stepcli memory` on built snapshots and run folders, and `stepcli run --memory` on a CPU-only
torch."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
from dataclasses import dataclass
from pathlib import Path

import memory_snapshots as fx
import pytest
from conftest import TRAIN_LOOP, run_stepcli, write_script

MiB = fx.MiB


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_memory_of_an_oom_snapshot(tmp_path: Path) -> None:
    builder, info = fx.oom_in_forward(steps=4)
    path = builder.write(tmp_path / "oom-rank0.pickle", info)
    result = run_stepcli("memory", path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "out of memory at step 4, in forward" in out
    assert "failed request: 512.00 MiB, with 3.00 MiB free on the device of 8.00 GiB" in out
    assert "activations        240.00 MiB   88%" in out
    assert "largest free block 20.00 MiB < the failed request of 512.00 MiB" in out
    sites = out.split("top allocation sites")[1].splitlines()
    assert "/work/train.py:20 main  [activations]" in sites[1]
    assert "advice: activations dominate: use activation checkpointing" in out
    assert result.stderr == ""


def test_odd_figures_in_the_agents_record_are_shown_as_unknown(tmp_path: Path) -> None:
    # GIVEN the agent's record in a snapshot with free or total memory that is no count of bytes
    # (untrusted input)
    for bad in ("a", float("nan"), -5, True, 2**70, [1]):
        builder, info = fx.oom_in_forward(steps=4)
        path = builder.write(
            tmp_path / "oom-rank0.pickle",
            info | {"device_free_bytes": bad, "device_total_bytes": bad},
        )
        # WHEN shown and written as JSON THEN "?" in the text, null in valid JSON, never an internal
        # error
        result = run_stepcli("memory", path, cwd=tmp_path)
        assert result.returncode == 0 and result.stderr == "", (bad, result.stderr)
        assert "failed request: 512.00 MiB, with ? free on the device\n" in result.stdout, (
            bad,
            result.stdout,
        )
        result = run_stepcli("memory", "--json", path, cwd=tmp_path)
        assert result.returncode == 0, (bad, result.stderr)
        (report,) = json.loads(
            result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON")
        )["snapshots"]
        assert report["oom"] == {
            "requested_bytes": 512 * MiB,
            "device_free_bytes": None,
            "device_total_bytes": None,
        }
    # GIVEN more free on the device than the total torch reported (its cap under
    # set_per_process_memory_fraction)
    builder, info = fx.oom_in_forward(steps=4)
    path = builder.write(tmp_path / "oom-rank0.pickle", info | {"device_free_bytes": 100 << 30})
    result = run_stepcli("memory", path, cwd=tmp_path)
    # THEN the total is said to be what this process may use
    assert (
        "with 100.00 GiB free on the device, of which this process may use 8.00 GiB"
        in result.stdout
    )


def test_a_record_naming_a_negative_device_is_one_line(tmp_path: Path) -> None:
    # GIVEN a snapshot whose stepcli record names device -1, -5 or 2^40 (issue 47, item 13: -5
    # exited 70 with IndexError, -1 silently analysed the last device)
    for device in (-1, -5, 2**40):
        builder, info = fx.oom_in_forward(steps=4)
        path = builder.write(tmp_path / "oom-rank0.pickle", info | {"device": device})
        # WHEN read THEN one line naming it, exit 2
        result = run_stepcli("memory", path, cwd=tmp_path)
        assert result.returncode == 2, (device, result.stderr)
        assert f"names device {device}, which is no device index" in _one_error_line(result.stderr)


def test_memory_json_of_a_run_folder_with_every_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    builder, info = fx.oom_in_forward()
    builder.write(run / "oom-rank0.pickle", info)
    (run / "oom-rank1.pickle.gz").write_bytes(
        gzip.compress(pickle.dumps(fx.training(steps=6, leak=2 * MiB).snapshot()))
    )
    (run / "report.html").write_text("<html></html>")  # other files of the run are not snapshots
    result = run_stepcli("memory", run, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "stepcli.memory" and document["schema_version"] == 1
    first, second = document["snapshots"]
    assert first["file"].endswith("oom-rank0.pickle") and second["file"].endswith(
        "oom-rank1.pickle.gz"
    )
    assert first["moment"] == {
        "kind": "oom",
        "step": 4,
        "phase": "forward",
        "allocated_bytes": 272 * MiB,
        "reserved_bytes": 360 * MiB,
    }
    assert [a["rule"] for a in first["advice"]] == ["activations"]
    assert second["leak"]["site"] == {"file": fx.SCRIPT, "line": 31, "function": "main"}
    assert "leak" in [a["rule"] for a in second["advice"]]
    assert {"parameters", "gradients", "optimizer_state", "activations", "other"} == set(
        second["split"]
    )


def test_memory_of_a_fragmented_oom_advises_expandable_segments(tmp_path: Path) -> None:
    builder, info = fx.fragmented()
    result = run_stepcli("memory", builder.write(tmp_path / "frag.pickle", info))
    assert result.returncode == 0, result.stderr
    assert (
        "advice: fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        in result.stdout
    )
    assert (
        "would fit in the 320.00 MiB reserved but unallocated, yet the largest free block is 10.00 "
        "MiB" in (result.stdout)
    )


def test_memory_bad_inputs_are_one_line(tmp_path: Path) -> None:
    missing = run_stepcli("memory", tmp_path / "nope.pickle")
    assert missing.returncode == 2
    assert _one_error_line(missing.stderr).endswith("nope.pickle: no such file or folder")

    text = tmp_path / "notes.pickle"
    text.write_text("hello, not a pickle\n")
    result = run_stepcli("memory", text)
    assert result.returncode == 2
    assert "notes.pickle: not a pickle" in _one_error_line(result.stderr)

    listing = tmp_path / "list.pickle"
    listing.write_bytes(pickle.dumps([1, 2, 3]))
    result = run_stepcli("memory", listing)
    assert result.returncode == 2
    assert "a pickle, but not a CUDA memory snapshot" in _one_error_line(result.stderr)

    empty_run = tmp_path / "run"
    empty_run.mkdir()
    result = run_stepcli("memory", empty_run)
    assert result.returncode == 3
    assert "no memory snapshot here" in _one_error_line(result.stderr)


class _System:
    """Unpickled by a plain pickle.load, this runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


def test_memory_refuses_a_hostile_pickle_without_running_it(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    hostile = tmp_path / "oom-rank0.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "x": _System(f"touch {planted}")}))
    result = run_stepcli("memory", hostile)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert "refused: the pickle asks to build posix.system, which is not plain data" in line
    assert not planted.exists()


@dataclass
class MemoryRun:
    result: subprocess.CompletedProcess[str]
    out: Path
    snapshots: list[Path]  # the oom-* files in its folder once it ended
    page: str  # its report.html as the run wrote it


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory: pytest.TempPathFactory) -> MemoryRun:
    """`stepcli run --memory` of a training loop whose process also starts a second Python that
    imports torch."""
    tmp = tmp_path_factory.mktemp("memory")
    (tmp / "loop.py").write_text(TRAIN_LOOP.replace("\n    ", "\n"))
    script = write_script(
        tmp,
        "train.py",
        """
        import subprocess, sys
        import loop

        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        loop.main(int(sys.argv[1]))
        """,
    )
    out = tmp / "out"
    result = run_stepcli("run", "--memory", "--memory-entries", "5000", "-o", out, script, "6")
    page = out / "report.html"
    return MemoryRun(
        result, out, sorted(out.glob("oom-*")), page.read_text() if page.exists() else ""
    )


def test_run_memory_on_cpu_only_torch_says_so_once_and_runs(memory_run: MemoryRun) -> None:
    """--memory with a torch built without CUDA: one line for the whole run (here two processes
    import torch), and the program runs as without it."""
    result = memory_run.result
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("iter ") == 6
    notes = [line for line in result.stderr.splitlines() if "no CUDA memory to record" in line]
    assert len(notes) == 1, result.stderr
    assert notes[0].startswith("stepcli: --memory: this torch (2.13.0+cpu) has no CUDA")
    assert memory_run.snapshots == []
    assert "Traceback" not in result.stderr


def test_memory_entries_needs_memory(tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", TRAIN_LOOP)
    result = run_stepcli("run", "--memory-entries", "10", script)
    assert result.returncode == 2
    assert "--memory-entries needs --memory" in _one_error_line(result.stderr)


def test_report_shows_the_runs_memory_snapshots(memory_run: MemoryRun) -> None:
    # GIVEN a run's folder (here of the --memory run on a CPU-only torch: it wrote no snapshot)
    out = memory_run.out
    assert memory_run.result.returncode == 0, memory_run.result.stderr
    # no snapshot, no section
    assert "</html>" in memory_run.page and 'id="memory-snapshots"' not in memory_run.page
    # WHEN snapshots land in it (one good, one broken) and `stepcli report` runs again
    builder, info = fx.oom_in_forward(steps=4)
    builder.write(out / "oom-rank0.pickle", info)
    # a broken snapshot: one line on the page, not a failure
    (out / "oom-rank1.pickle").write_text("cut short")
    # (files the run did not write are never read: its saved summary lists none, so none is shown
    # yet)
    result = run_stepcli("report", out)
    assert result.returncode == 0, result.stderr
    assert 'id="memory-snapshots"' not in (out / "report.html").read_text()
    # ... as if the run's processes had written them: its saved summary names them
    (saved,) = out.glob(".stepcli/*/summary.json")
    summary = json.loads(saved.read_text())
    summary["memory_snapshots"] = ["oom-rank0.pickle", "oom-rank1.pickle"]
    saved.write_text(json.dumps(summary))
    result = run_stepcli("report", out)
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()
    section = page.split('id="memory-snapshots"', 1)[1]
    assert "oom-rank0.pickle: Out of memory at step 4, in forward: asked for 512.00 MiB" in section
    assert 'class="chart memory-steps"' in section and "<polyline" in section
    assert "activations 240.00 MiB (88%)" in section
    assert "/work/train.py:20 main" in section
    assert 'data-rule="memory-activations"' in section
    assert "oom-rank1.pickle: not a pickle" in section


def test_real_h200_leak_snapshot_puts_the_leak_first(tmp_path: Path) -> None:
    """A snapshot recorded by scripts/gpu_check.py on an H200 (torch 2.11, CUDA 13): a loop that
    keeps each step's forward output in a list until it runs out of memory. The leak holds 74% of
    the memory: its advice comes first, before activation checkpointing (which would not help), and
    names the line that made the kept tensors."""
    snapshot = Path(__file__).parent.parent / "data" / "gpu" / "h200_leak_oom.pickle"
    result = run_stepcli("memory", snapshot, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    advice = [line for line in result.stdout.splitlines() if line.startswith("advice:")]
    assert advice and advice[0].startswith("advice: a leak holds most of the memory (74%)"), (
        result.stdout
    )
    assert "leak.py:11" in advice[0]
    assert any("activation checkpointing" in line for line in advice[1:])


def test_real_h200_batch_doubling_is_no_leak(tmp_path: Path) -> None:
    """Recorded by scripts/gpu_check.py on an H200: the batch doubles every step until forward runs
    out of memory. Memory at each step's start grows with the batch, but nothing of an earlier step
    stays alive: no leak advice."""
    snapshot = Path(__file__).parent.parent / "data" / "gpu" / "h200_batch_doubling_oom.pickle"
    result = run_stepcli("memory", snapshot, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "out of memory at step 9, in forward" in result.stdout
    advice = [line for line in result.stdout.splitlines() if line.startswith("advice:")]
    assert advice and advice[0].startswith("advice: activations dominate"), result.stdout
    assert not any("leak" in line or "step over step" in line for line in advice), advice


def test_real_h200_snapshot_of_issue_47_reads_with_what_is_known_of_it(tmp_path: Path) -> None:
    """/work/shared/snapshots' H200 snapshot (torch 2.11: every event its own frame dicts), what its
    README says: an OOM at step 10 in forward, allocated bytes equal to the active blocks,
    activations over 80%, the top site oom.py:10, no leak."""
    snapshot = (
        Path(__file__).parent.parent / "data" / "gpu" / "h200_batch_doubling_step10_oom.pickle.gz"
    )
    result = run_stepcli("memory", "--json", snapshot, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["snapshots"]
    moment = report["moment"]
    assert (moment["kind"], moment["step"], moment["phase"]) == ("oom", 10, "forward")
    raw = pickle.loads(gzip.decompress(snapshot.read_bytes()))  # a fixture we trust: plain pickle
    active = [b for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    # the bytes asked for
    assert moment["allocated_bytes"] == sum(b["requested_size"] for b in active)
    assert report["split"]["activations"] > 0.8 * moment["allocated_bytes"]
    assert report["top_sites"][0]["site"] == {
        "file": "/home/user/train/oom.py",
        "line": 10,
        "function": "<module>",
    }
    assert report["leak"] is None and [a["rule"] for a in report["advice"]] == ["activations"]


@pytest.fixture(scope="module")
def long_job_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot the size of the long H200 job's of issue 47 (62,000 events, 12 MB), shaped like
    torch's."""
    path = tmp_path_factory.mktemp("long") / "oom-rank0.pickle"
    path.write_bytes(pickle.dumps(fx.torch_shaped(62_000)))
    return path


def test_a_long_jobs_snapshot_reads(long_job_snapshot: Path) -> None:
    # (issue 47) refused after 15 s as "outgrew what the file's size explains": 17x its size is
    # normal
    result = run_stepcli("memory", "--json", long_job_snapshot)
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["snapshots"]
    assert report["history_entries"] == 62_000 and report["moment"]["kind"] == "oom"
    assert all(
        line.startswith("stepcli: reading oom-rank0.pickle: ")
        for line in result.stderr.splitlines()
    )


def test_max_memory_is_an_absolute_budget(long_job_snapshot: Path) -> None:
    result = run_stepcli("memory", "--max-memory", "1MiB", long_job_snapshot)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert (
        "refused: decoding it took more than the 1.0 MiB memory budget" in line
        and "--max-memory" in line
    )
    assert run_stepcli("memory", "--max-memory", "64MiB", long_job_snapshot).returncode == 0
    wrong = run_stepcli("memory", "--max-memory", "lots", long_job_snapshot)
    assert wrong.returncode == 2 and "expected a size of at least 1MiB" in wrong.stderr


def test_memory_refuses_a_flood_of_empty_lists_in_one_line(tmp_path: Path) -> None:
    # (issue 47) 5 million empty lists in 5 MB of a snapshot's device_traces: ~800 MB before the old
    # guard fired
    head = pickle.dumps({"segments": [], "device_traces": "PLACEHOLDER"})
    body = b"]" + (b"(" + b"]" * 1000 + b"e") * 5000
    path = tmp_path / "oom-rank0.pickle"
    path.write_bytes(head.replace(b"\x8c\x0bPLACEHOLDER", body))
    result = run_stepcli("memory", path)
    assert result.returncode == 2
    assert "refused: more than 4096 lists held in lists" in _one_error_line(result.stderr)
