"""A window's trace that swamps the job is said to (issue 46.7): two LSTM steps made a 785 MiB trace
whose save paused the program 31.6 s, and nothing said so. After the first window, its size and save
pause are told in one line with the cheaper way, and kept as a note (terminal, --json, report.html
alike); every window's pause is in `windows[].save_s`. A real torch program, which lowers the size
threshold inside its own process (the agent is loaded there as `_stepcli_agent`) so that a small
real trace stands for a large one."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_stepcli, write_script

SCRIPT = """
    import sys

    import torch

    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # arms stepcli's recorder in this process
    sys.modules["_stepcli_agent.tracecost"].LARGE_BYTES = 1000  # this window's few KiB stand for hundreds of MB
    for _ in range(8):
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
"""  # noqa: E501


def test_a_large_first_window_is_told_with_the_cheaper_way(tmp_path: Path) -> None:
    script = write_script(tmp_path, "train.py", SCRIPT)
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--active",
        "3",
        "--with-stack",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    (window,) = summary["windows"]
    # THEN the save's pause is measured
    assert isinstance(window["save_s"], float) and window["save_s"] > 0
    # AND after the first window one line says how large it is, what its save cost, and the cheaper
    # way
    (line,) = [line for line in result.stderr.splitlines() if "read it for about as long" in line]
    assert (
        line.startswith("stepcli: the trace of steps 2-4 is ")
        and " and saving it paused the program " in line
    )
    assert line.endswith("cheaper: --active 1 (now 3), no --with-stack"), line
    # AND the run summary keeps it as a note: the terminal's note, --json's and report.html's say
    # the same
    said = line.removeprefix("stepcli: ")
    (note,) = [note for note in summary["notes"] if said in note]
    assert note == f"{summary['processes'][0]['worker']}: {said}"
    assert f"note: {note}" in " ".join(result.stderr.split())
    html = (out / "report.html").read_text()
    assert (
        "read it for about as long" in html
        and "cheaper: --active 1 (now 3), no --with-stack" in html
    )
