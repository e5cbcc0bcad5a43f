"""A new user's first day: output that reads in 80 columns and CI logs, notes that point at the real
cause, no silent pauses, and the small things around `run`, `table`, `demo` and CI."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import REPO, run_stepcli, stepcli_env, write_script

LONG_NAME = "preprocess_the_batch_with_a_very_long_annotation_name_that_cannot_fit"
NARROW = {"COLUMNS": "80"}
BOX = tuple("┏┃┡│└")

ANNOTATED = f"""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        with torch.profiler.record_function("{LONG_NAME}"):
            x = torch.randn(32, 64)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
"""


@pytest.fixture(scope="module")
def narrow_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str], dict]:
    """One run at 80 columns into a deep output folder (a long path), output piped (not a
    terminal)."""
    tmp = tmp_path_factory.mktemp("narrow")
    script = write_script(tmp, "annotated.py", ANNOTATED)
    out = (
        tmp
        / "a_rather_long_folder_name_for_the_output"
        / "of_this_run_which_will_not_fit_in_80_columns"
    )
    result = run_stepcli(
        "run", "--active", "2", "-o", out, "--json", tmp / "run.json", script, cwd=tmp, env=NARROW
    )
    assert result.returncode == 0, result.stderr
    return out, result, json.loads((tmp / "run.json").read_text())


def _table_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith(BOX)]


def test_run_summary_fits_80_columns_and_keeps_paths_whole(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict],
) -> None:
    out, result, summary = narrow_run
    lines = result.stderr.splitlines()
    (trace,) = summary["traces"]
    assert len(trace) > 80
    assert f"  {trace}" in lines  # the path, whole, on a line of its own
    relative = os.path.relpath(out, out.parent.parent)  # relative to the run's working folder
    assert (
        f"  stepcli table {relative}" in lines
        and "  open a trace in https://ui.perfetto.dev or chrome://tracing" in lines
    )
    # TensorBoard shows nothing without its plugin
    assert not [line for line in lines if "tensorboard" in line]
    assert any(
        line.startswith("command python ") and line.endswith("annotated.py") for line in lines
    )
    assert _table_lines(result.stderr) and all(
        len(line) <= 80 for line in _table_lines(result.stderr)
    )
    assert not [line for line in lines if "…" in line and "/" in line]  # no path is cut


def test_table_and_compare_fit_80_columns_and_shorten_names_alike(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path
) -> None:
    out, _, summary = narrow_run
    table = run_stepcli("table", out, env=NARROW, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    # (a run against itself, 5 steps: too few to decide; inconclusive passes here, this test is
    # about the columns)
    compare = run_stepcli("compare", "--allow-inconclusive", out, out, env=NARROW, cwd=tmp_path)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    for text in (table.stdout, compare.stdout):
        rows = _table_lines(text)
        assert rows and all(len(row) <= 80 for row in rows), text
    # table: the long name is shortened in the middle (both ends kept), never wrapped onto a second
    # line
    rows = _table_lines(table.stdout)
    named = [row for row in rows if LONG_NAME[:10] in row]
    assert len(named) == 1 and "…" in named[0] and LONG_NAME[-4:] in named[0], table.stdout
    assert not [row for row in rows if LONG_NAME[-12:-4] in row and LONG_NAME[:10] not in row]
    # compare: where a table would squeeze names, each name gets a line of its own, whole when it
    # fits in 80
    assert f"  {LONG_NAME}" in compare.stdout.splitlines(), compare.stdout


def test_options_after_the_script_are_explained(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "mlp.py",
        """
        import argparse
        import torch
        argparse.ArgumentParser().parse_args()
    """,
    )
    result = run_stepcli("run", "-o", tmp_path / "out", script, "--active", "2", cwd=tmp_path)
    assert result.returncode == 2
    flat = " ".join(result.stderr.split())
    assert "the program exited with status 2 before its first step" in flat
    assert (
        "--active came after the script" in flat
        and "stepcli's options go before the script" in flat
    )
    assert "--step-on" not in flat


def test_run_python_script_hints_at_the_right_command(tmp_path: Path) -> None:
    script = write_script(tmp_path, "mlp.py", "print('hi')\n")
    result = run_stepcli("run", "python", script.name, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "stepcli run mlp.py" in result.stderr and "stepcli run -- python mlp.py" in result.stderr
    assert not (tmp_path / "stepcli-runs").exists()


def test_saving_line_comes_before_the_save(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict],
) -> None:
    _, result, _ = narrow_run
    lines = result.stderr.splitlines()
    saving = lines.index("stepcli: saving trace of steps 2-3 ...")
    assert any(line.startswith("stepcli: saved trace of steps 2-3") for line in lines[saving + 1 :])


def test_end_of_run_analysis_shows_progress_on_a_terminal_only_and_command_mode_names_the_folder(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict], train_script: Path
) -> None:
    # GIVEN a command-mode run (`-- python train.py`, no -o) whose stderr is a terminal (a pty)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepcli",
            "run",
            "--active",
            "1",
            "--",
            "python",
            train_script.name,
            "4",
        ],
        cwd=train_script.parent,
        env=stepcli_env({"TERM": "xterm"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=240) == 0
    os.close(master)
    # WHEN the run ends THEN a spinner says the traces are being read
    said = b"".join(chunks).decode("utf-8", "replace")
    assert "reading the traces" in said
    # (and --active 1 records one step: "recording step 2", never "recording steps 2")
    assert "stepcli: recording step 2 (wait 1, warmup 1, active 1)" in said, said
    # and not in a pipe (the narrow run's output, read from a pipe, never shows it)
    assert "reading the traces" not in narrow_run[1].stderr
    # AND command mode names the run's folder after the script
    (folder,) = (train_script.parent / "stepcli-runs").iterdir()
    assert folder.name.endswith("-train")


def test_sparkline_has_a_scale_and_no_colour_legend_without_colour(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict],
) -> None:
    _, result, _ = narrow_run
    timeline = next(line for line in result.stderr.splitlines() if line.startswith("timeline"))
    assert re.search(r"\d m?s \.\. [\d.]+ m?s", timeline)
    assert "magenta" not in result.stderr  # NO_COLOR is set by the test environment


def test_help_texts(tmp_path: Path) -> None:
    run_help = run_stepcli("run", "--help", env=NARROW, cwd=tmp_path).stdout
    flat = " ".join(run_help.split())
    assert "A step is one training iteration" in flat and "records steps 2-4" in flat
    table_help = " ".join(run_stepcli("table", "--help", cwd=tmp_path).stdout.split())
    assert "Order of operator rows" in table_help


def test_table_formats_are_exclusive(
    narrow_run: tuple[Path, subprocess.CompletedProcess[str], dict], tmp_path: Path
) -> None:
    out, _, _ = narrow_run
    result = run_stepcli("table", "--json", "--csv", out, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "--json and --csv cannot be used together" in result.stderr


def test_unwritable_json_is_rejected_before_the_program_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = write_script(tmp_path, "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    result = run_stepcli("run", "--json", "/proc/x.json", script, cwd=tmp_path)
    assert result.returncode == 2 and "--json /proc/x.json" in result.stderr
    assert not marker.exists()


def test_demo_extra_installs_numpy_and_ci_cleans_up() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # `pip install '.[demo]'` brings numpy (a dependency of stepcli): torch does not warn about it
    # on every run
    assert any(req.startswith("numpy") for req in project["dependencies"])
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"""trap 'rm -rf "\$venv_root" "\$smoke"' EXIT""", ci)
    # a newcomer's install: a fresh virtual environment, README's test command run inside it
    assert re.search(r'python3 -m venv "\$venv"\n.*\n\. "\$venv/bin/activate"', ci)
    readme = (REPO / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    assert re.search(r"\d+ minutes on 2 cores", readme), (
        "README says how long the suite takes on 2 cores"
    )


def test_python_floor_is_torchs_and_one_number_everywhere() -> None:
    # the agent runs in the program's Python: stepcli's floor is that of the torch it pins
    # (CONTRIBUTING)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(3\.\d+)", pyproject["project"]["requires-python"])
    assert floor, "requires-python is one floor, >=3.N"
    version = floor.group(1)
    torch_floor = importlib.metadata.distribution("torch").metadata["Requires-Python"]
    assert torch_floor.replace(" ", "") == f">={version}", torch_floor
    # every tool that checks the code checks it at that floor
    assert pyproject["tool"]["mypy"]["python_version"] == version
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + version.replace(".", "")
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(
        rf"^vermin --no-tips --violations --eval-annotations -t={re.escape(version)}- stepcli$",
        ci,
        re.M,
    )
    assert any(
        req.startswith("vermin==") for req in pyproject["project"]["optional-dependencies"]["test"]
    )
    # and the install instructions say it
    assert f"needs Python {version}+ and PyTorch" in (REPO / "README.md").read_text()
    assert f"needs Python {version} or later" in (REPO / "docs" / "getting-started.md").read_text()


def test_every_rich_renderer_fits_80_columns_with_many_ranks() -> None:
    # GIVEN a summary of 8 ranks, two windows each, with long operator and kernel names (no
    # subprocess: pure render)
    import io

    from rich.console import Console

    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.events import Event
    from stepcli.traces.read.tracereader import Trace
    from stepcli.traces.render.terminal import print_rich_report

    traces = []
    for rank in range(8):
        for window in range(2):
            base = 1_790_000_000_000.0 + window * 1000
            events = [
                Event(
                    name=f"ProfilerStep#{window * 2 + n}",
                    cat="user_annotation",
                    pid=rank,
                    tid=1,
                    ts=base + n * 100,
                    dur=100,
                )
                for n in range(2)
            ]
            events += [
                Event(name=LONG_NAME * 2, cat="cpu_op", pid=rank, tid=1, ts=base + 10, dur=50),
                Event(
                    name="void at::native::" + LONG_NAME,
                    cat="kernel",
                    pid=99,
                    tid=7,
                    ts=base + 20,
                    dur=30,
                ),
            ]
            traces.append(
                Trace.from_events(
                    events,
                    path=f"/very/long/folder/name/rank{rank}.{window}.pt.trace.json",
                    rank=rank,
                )
            )
    buffer = io.StringIO()
    print_rich_report(
        summarize(traces).to_dict(), Console(file=buffer, width=80, no_color=True), limit=5
    )
    text = buffer.getvalue()
    # THEN no line is wider than 80 columns, each rank is one row with its windows inside, steps are
    # per process
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "rank 7" in text and "  steps 0-1" in text and "  steps 2-3" in text
    assert "Process" in text and "…" in text
