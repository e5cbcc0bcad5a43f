"""The first step after a profiler window pays for its stop and save (issue 46.2): on several ranks,
a rank that has saved its trace waits in the next collective for a rank still saving a larger one.
That step is not the program's own time: it is named `after a window`, left out of the untouched
statistics, the stall advice and `compare`'s populations, and counted, alike in the terminal,
`--json` and report.html. A real 2-rank gloo DDP job under torchrun, in which rank 1's trace is much
larger than rank 0's."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_stepcli, write_script

STEPS = 40
# one window: warmup step 6, recorded steps 7-8; step 9 is the first after it
WAIT, WARMUP, ACTIVE = 6, 1, 2

# While a profiler records (and only then), rank 1 runs many tiny extra operators: its trace is much
# larger than rank 0's, so it saves later, and rank 0 waits for it in the first all-reduce after the
# window.
DDP = f"""
    import torch
    import torch.autograd.profiler as autograd_profiler
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, tiny = torch.randn(16, 32), torch.zeros(1)
    for _ in range({STEPS}):
        opt.zero_grad()
        if rank == 1 and autograd_profiler._is_profiler_enabled:
            for _ in range(4000):
                tiny = tiny + 1
        model(x).square().mean().backward()
        opt.step()
    dist.barrier()
    del model, opt  # DDP's reducer holds gloo's group: freed here, not at exit, where torch 2.13 can abort
    import gc; gc.collect()
    dist.destroy_process_group()
"""  # noqa: E501


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any], str]:
    """(working folder, terminal summary, --json, report.html) of one 2-rank run: shared by this
    module."""
    tmp = tmp_path_factory.mktemp("after_window")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert torchrun, "torchrun comes with torch"
    script = write_script(tmp, "ddp.py", DDP)
    result = run_stepcli(
        "run", "--wait", str(WAIT), "--warmup", str(WARMUP), "--active", str(ACTIVE), "-o", "out",
        "--json", tmp / "run.json", "--",
        torchrun, "--standalone", "--nproc-per-node", "2", script,
        timeout=400, cwd=tmp, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return (
        tmp,
        result.stderr,
        json.loads((tmp / "run.json").read_text()),
        (tmp / "out" / "report.html").read_text(),
    )


def test_the_step_after_a_window_is_named_and_set_aside(
    ddp: tuple[Path, str, dict[str, Any], str],
) -> None:
    _, stderr, summary, html = ddp
    after = WAIT + WARMUP + ACTIVE
    # THEN on both ranks, the step after the window is marked 5 ("after a window"), its neighbours
    # untouched
    for process in summary["step_times"]:
        phases = process["phases"]
        assert phases[WAIT : after + 2] == "1" + "2" * (ACTIVE - 1) + "3" + "5" + "0", (
            process["worker"],
            phases,
        )
        assert phases.count("5") == 1
    # AND they are counted apart: in neither the untouched nor the profiled statistics
    times = summary["step_time_ms"]
    assert times["after_window"]["count"] == 2
    assert times["untouched"]["count"] == 2 * (STEPS - 1 - WARMUP - ACTIVE - 1)
    assert times["profiled"]["count"] == 2 * (WARMUP + ACTIVE)
    # AND rank 0's wait for rank 1's larger save (there: its slowest step by far) blames no step of
    # the program
    rank0 = next(p for p in summary["step_times"] if p["rank"] == 0)
    assert rank0["durations_ms"][after] > 3 * sorted(rank0["durations_ms"])[STEPS // 2], rank0[
        "durations_ms"
    ]
    # (this busy machine's noise may still make a few untouched steps stall: never this one)
    stalls = [item["evidence"] for item in summary["advice"] if item["rule"] == "stalls"]
    assert not any(f"about step {after})" in evidence for evidence in stalls), stalls
    assert f"about step {after})" not in stderr and f"about step {after})" not in html
    # AND the terminal and report.html say how many were set aside, as --json does
    assert re.search(
        r"after a window +n=2 +median .* \(set aside: the first step after each window pays", stderr
    ), stderr
    assert "set aside after a window" in html and "2 steps" in html
    assert "after a window (set aside)" in html  # the step-time chart's legend


def test_compare_leaves_the_step_after_a_window_out_and_says_so(
    ddp: tuple[Path, str, dict[str, Any], str],
) -> None:
    tmp, _, summary, _ = ddp
    # WHEN the run is compared with itself
    result = run_stepcli(
        "compare", tmp / "run.json", tmp / "run.json", "--allow-inconclusive", cwd=tmp
    )
    assert result.returncode == 0, result.stderr
    # THEN the steps used are the untouched ones only, and the lines say the steps after a window
    # were set aside
    assert (
        "2 step times after a window set aside (the profiler's stop and save)" in result.stdout
    ), result.stdout
    untouched = summary["step_time_ms"]["untouched"]["count"]
    assert f"({untouched} step times)" in result.stdout or "warm-up detected" in result.stdout, (
        result.stdout
    )
