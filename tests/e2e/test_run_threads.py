"""More intra-op threads than cores (issue 46.8): on 2 cores, two ranks of 2 threads each ran their
operators 8-10x slower than with OMP_NUM_THREADS=1, and nothing said so. The summary, `--json` and
report.html now say it, with the setting that fixes it, and stay silent at one thread per core. A
real torch program, pinned to one core."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_stepcli, write_script

PINNED = """
    import os
    import sys

    import torch

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the cores stepcli sees: one
    torch.set_num_threads(int(sys.argv[1]))
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(6):
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
"""


def _run(tmp_path: Path, threads: int) -> tuple[str, dict[str, Any], str]:
    script = write_script(tmp_path, "pinned.py", PINNED)
    out = tmp_path / f"out{threads}"
    result = run_stepcli(
        "run", "--active", "1", "-o", out, "--json", f"{out}.json", script, str(threads)
    )
    assert result.returncode == 0, result.stderr
    return (
        result.stderr,
        json.loads(Path(f"{out}.json").read_text()),
        (out / "report.html").read_text(),
    )


@pytest.mark.skipif(
    not hasattr(__import__("os"), "sched_setaffinity"), reason="needs CPU affinity (Linux)"
)
def test_threads_beyond_the_cores_are_named_with_the_fix(tmp_path: Path) -> None:
    # GIVEN a program pinned to one core that runs torch with 2 intra-op threads
    stderr, summary, html = _run(tmp_path, 2)
    # THEN --json counts them against the core
    (host,) = summary["threads"]["hosts"]
    assert (host["processes"], host["intra_op_threads"], host["cores"], host["oversubscribed"]) == (
        1,
        2,
        1,
        True,
    )
    assert summary["processes"][0]["intra_op_threads"] == 2
    # AND the advice says so with the setting that fixes it, alike in the terminal, --json and
    # report.html
    (advice,) = [item for item in summary["advice"] if item["rule"] == "threads"]
    assert advice["evidence"].startswith("2 intra-op threads on 1 core stepcli sees")
    assert (
        "OMP_NUM_THREADS=1" in advice["suggestion"]
        and "torch.set_num_threads(1)" in advice["suggestion"]
    )
    assert "advice: More CPU threads than cores: 2 intra-op threads on 1 core" in " ".join(
        stderr.split()
    )
    assert "threads" in stderr and "oversubscribed, see the advice" in stderr
    assert "More CPU threads than cores" in html and "OMP_NUM_THREADS=1" in html


@pytest.mark.skipif(
    not hasattr(__import__("os"), "sched_setaffinity"), reason="needs CPU affinity (Linux)"
)
def test_one_thread_per_core_is_not_named(tmp_path: Path) -> None:
    stderr, summary, html = _run(tmp_path, 1)
    assert summary["threads"]["oversubscribed"] is False
    assert "threads" not in [item["rule"] for item in summary["advice"]]
    assert "More CPU threads than cores" not in stderr + html and "oversubscribed" not in stderr
