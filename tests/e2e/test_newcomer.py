"""Rough edges a newcomer hits (issue 29, items 10-17): 80 columns, one step count everywhere,
machine formats whole, operator changes compare cannot judge, tracebacks and notes, a clean test
retry (a 2-rank job's summary at 80 columns, its merge hint and what the gc counts cover:
test_straggler.py, on its balanced run)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_stepcli, write_script

PIPE_80 = {"COLUMNS": "80"}  # run_stepcli's output is a pipe (no TTY)


def test_a_torchrun_retry_starts_with_a_clean_output_folder(tmp_path: Path) -> None:
    # GIVEN a "torchrun" that dies in torch's gloo teardown the first time, after writing into the
    # output folder
    out = tmp_path / "out"
    counter = tmp_path / "attempts"
    fake = write_script(
        tmp_path / "bin",
        "torchrun",
        f"""
        #!{sys.executable}
        import sys
        from pathlib import Path
        counter = Path({str(counter)!r})
        attempt = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempt))
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        (Path(sys.argv[1]) / f"attempt{{attempt}}.txt").write_text("trace")
        if attempt == 1:
            print("terminate called without an active exception", file=sys.stderr)
            print("Signal 6 (SIGABRT) received by PID 1", file=sys.stderr)
            sys.exit(1)
        """,
    )
    os.chmod(fake, 0o755)
    # WHEN the suite's helper runs it and retries after the native abort
    result = run_stepcli("run", "-q", "-o", out, "--", fake, out / "mine")
    # THEN the retry found a clean folder: only the second attempt's files are there
    assert result.returncode == 0, result.stderr
    assert counter.read_text() == "2"
    assert sorted(p.name for p in (out / "mine").iterdir()) == ["attempt2.txt"]


TRAIN = """
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(int(sys.argv[1])):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y) + 0.01 * model[0].weight.abs().sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
"""


@pytest.fixture(scope="module")
def run80(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """40 steps of a small model with many operators, shapes recorded, summary at 80 columns on a
    pipe."""
    root = tmp_path_factory.mktemp("newcomer")
    script = write_script(root, "train.py", TRAIN)
    result = run_stepcli(
        "run",
        "--record-shapes",
        "--json",
        "run.json",
        "-o",
        "out",
        script,
        "40",
        cwd=root,
        env=PIPE_80,
    )
    assert result.returncode == 0, result.stderr
    return root, result.stderr


def _summary_lines(stderr: str) -> list[str]:
    return stderr[stderr.index("stepcli summary") :].splitlines()


def test_whole_run_lines_fit_80_columns_before_next_and_count_every_step(
    run80: tuple[Path, str],
) -> None:
    root, stderr = run80
    lines = _summary_lines(stderr)
    whole = [i for i, line in enumerate(lines) if line.startswith("whole run")]
    # part of the summary, not after `next:`
    assert whole and whole[-1] < lines.index("next:"), lines
    text = " ".join(lines[whole[0] :]).split(" advice:")[0].split(" next:")[0]
    # one count everywhere: the terminal's is the record's and report.html's
    record = json.loads((root / "run.json").read_text())["step_record"][0]
    assert record["steps"] == 40
    assert re.search(r"whole run \S+: 40 steps", text), text
    html = (root / "out" / "report.html").read_text()
    assert "<td>40</td>" in html
    # nothing in the summary is wider than 80 columns but a path or a command that must stay whole
    wide = [line for line in lines if len(line) > 80 and not re.match(r"  (/|python -c )", line)]
    assert not wide, wide


def test_next_points_to_where_a_trace_opens_not_tensorboard(run80: tuple[Path, str]) -> None:
    _root, stderr = run80
    lines = _summary_lines(stderr)
    assert "  open a trace in https://ui.perfetto.dev or chrome://tracing" in lines
    assert not [line for line in lines if "tensorboard" in line.lower()], lines


def test_table_csv_holds_every_operator_and_says_when_limit_cuts_it(
    run80: tuple[Path, str],
) -> None:
    root, _ = run80
    whole = json.loads(run_stepcli("table", "--json", root / "out").stdout)
    operators = len(whole["cpu_ops"]) + len(whole["device_kernels"])
    assert operators > 20
    result = run_stepcli("table", "--csv", root / "out")
    assert result.returncode == 0, result.stderr
    # not the terminal's 20
    assert len(list(csv.DictReader(io.StringIO(result.stdout)))) == operators
    assert "stepcli: note" not in result.stderr
    cut = run_stepcli("table", "--csv", "--limit", "5", root / "out")
    assert len(list(csv.DictReader(io.StringIO(cut.stdout)))) == 5
    assert f"the CSV holds 5 of {len(whole['cpu_ops'])} CPU operators (--limit 5)" in cut.stderr
    markdown = run_stepcli("table", "--markdown", root / "out").stdout
    assert f"20 of {len(whole['cpu_ops'])} rows, sorted by self (--limit)" in markdown


def test_group_by_shape_at_80_columns_keeps_rows_apart(run80: tuple[Path, str]) -> None:
    root, _ = run80
    result = run_stepcli("table", "--group-by-shape", root / "out", env=PIPE_80)
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("CPU operators", 1)[1]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    keys: list[list[str]] = []
    for line in table.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        text = [cell for cell in cells if cell and not re.fullmatch(r"[\d.,%]+", cell)]
        if any(re.fullmatch(r"[\d.,%]+", cell) for cell in cells):
            keys.append(text)
        elif keys:  # a shape on the line under its name
            keys[-1] += text
    assert len(keys) >= 10
    # every row can be told from the others
    assert len({tuple(key) for key in keys}) == len(keys), keys


def test_compare_at_80_columns_wraps_and_does_not_judge_operators_on_3_steps(
    run80: tuple[Path, str],
) -> None:
    root, _ = run80
    result = run_stepcli("compare", "run.json", "run.json", cwd=root, env=PIPE_80)
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    verdicts = [
        line
        for line in lines
        if re.match(r"(NO CHANGE|IMPROVEMENT|INCONCLUSIVE|REGRESSION): ", line)
    ]
    assert len(verdicts) == 1, result.stdout
    assert any(line.startswith("method:   ") for line in lines)
    # 3 recorded steps: operators cannot be judged, so no change of theirs is printed (+0.0% here,
    # +66% of noise between two runs), and the note says why
    operators = result.stdout.split("Top operators", 1)[1].split("note:", 1)[0]
    assert "aten::" in operators and "%" not in operators, operators
    assert "operators 20 per side" in " ".join(result.stdout.split())


def test_a_run_that_measured_nothing_leaves_a_note_in_its_folder(tmp_path: Path) -> None:
    script = write_script(tmp_path, "nostep.py", "import torch\nprint(torch.ones(2).sum())\n")
    result = run_stepcli("run", "--no-report", "-o", tmp_path / "out", script)
    assert result.returncode == 0, result.stderr
    visible = [p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")]
    assert visible == ["NOTHING-MEASURED.txt"], visible
    note = (tmp_path / "out" / "NOTHING-MEASURED.txt").read_text()
    assert "no steps observed" in note and ".stepcli/" in note and "stepcli report" in note


def test_ctrl_c_traceback_shows_no_stepcli_frames(tmp_path: Path) -> None:
    # GIVEN Ctrl-C arriving inside the program's own code, called from a patched optimizer.step
    # (LBFGS's closure)
    script = write_script(
        tmp_path,
        "interrupted.py",
        """
        import torch
        model = torch.nn.Linear(4, 1)
        def closure():
            raise KeyboardInterrupt
        torch.optim.LBFGS(model.parameters()).step(closure)
        """,
    )
    result = run_stepcli("run", "-q", "-o", tmp_path / "out", script)
    # THEN the traceback is plain python's: the program's frames and torch's, none of stepcli's
    # wrappers
    assert result.returncode == 130, result.stderr
    frames = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', result.stderr, re.M)
    assert frames[0] == (str(script), "<module>") and frames[-1] == (str(script), "closure"), frames
    assert not [f for f in frames if "stepcli" in f[0]], frames
    assert "KeyboardInterrupt" in result.stderr


def test_top_on_a_finished_run_has_no_trailing_spaces_on_a_pipe(run80: tuple[Path, str]) -> None:
    root, _ = run80
    result = run_stepcli("top", "--once", root / "out", env=PIPE_80)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("stepcli top: run"), result.stdout
    assert all(line == line.rstrip() for line in result.stdout.splitlines()), result.stdout


def test_on_hang_kill_condenses_torchruns_signal_traceback(tmp_path: Path) -> None:
    # GIVEN a torchrun job that hangs after 3 steps, ended by --on-hang kill
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(
        tmp_path,
        "hang.py",
        """
        import time
        import torch
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(1, 2)).sum().backward()
            opt.step()
        time.sleep(600)
        """,
    )
    result = run_stepcli(
        "run", "--hang-timeout", "5s", "--on-hang", "kill", "-o", "out", "--",
        torchrun, "--standalone", "--nproc-per-node", "1", script,
        cwd=tmp_path, env=PIPE_80, timeout=300,
    )  # fmt: skip
    assert result.returncode == 124, result.stderr[-3000:]
    # THEN between stepcli's kill line and the summary, torchrun's SignalException is one line, not
    # a traceback
    between = result.stderr.split("--on-hang kill: ending the job", 1)[1].split(
        "stepcli summary", 1
    )[0]
    assert "Traceback" not in between and "File " not in between, between
    assert re.search(r"^SignalException: Process \d+ got signal: 15 \(SIGTERM; ", between, re.M), (
        between
    )
