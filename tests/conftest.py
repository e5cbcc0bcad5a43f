"""Shared helpers: run the real `stepcli` in a subprocess and write small real torch scripts."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the session's headless Chromium, a fixture for every test
from browser import browser  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
RANKS = 4  # ranks in the shared rank_folder fixture


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile stepcli once per session. Where PYTHONDONTWRITEBYTECODE is set (these machines
    set it), every stepcli subprocess of the suite would otherwise compile ~100 modules from source
    again (~0.1 s each time, some 700 processes); a .pyc is still read when present. Users' `pip
    install` compiles them the same way."""
    import compileall

    compileall.compile_dir(str(REPO / "stepcli"), quiet=2)
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored, and so
    # would every process it starts: the Ctrl-C tests would then test nothing a terminal does. Give
    # them a terminal's SIGINT.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: four workers more than the cores. Many end-to-end tests wait (for a hang timeout,
    a capture, a slow step) rather than compute; extra workers overlap those waits, and on a busy
    machine they keep the suite's share of the CPU (measured on 2 cores beside a CPU burner: 4
    workers beat 2, and 6 beat 4 by 6%)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ) + 4


def stepcli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a stepcli subprocess: faulthandler on, no colour, no inherited stepcli
    config.

    One intra-op thread per torch process, as torchrun gives each rank: the suite runs several
    programs at once on a few cores, and torch's OpenMP threads spin-wait after each parallel region
    (measured on 2 cores: 0.4 of a 3.3 CPU-second test program). A test that needs more threads
    passes OMP_NUM_THREADS in `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPCLI_")}
    env.update(
        {"PYTHONFAULTHANDLER": "1", "NO_COLOR": "1", "COLUMNS": "160", "PYTHONUNBUFFERED": "1"}
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("GITHUB_STEP_SUMMARY", None)
    if extra:
        env.update(extra)
    return env


def _run(
    argv: list[str], cwd: object, env: dict[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run in a new session so that a timeout kills the whole tree (torchrun ranks too), never
    leaving orphans."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=stepcli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {argv}\n{stdout}\n{stderr}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def run_stepcli(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """`python -m stepcli ARGS` with captured text output; never `shell=True`, never bare `python`.

    A torchrun job whose rank died in torch's own native code (gloo's teardown race of torch 2.13:
    "terminate called without an active exception", a corrupted heap; seen in plain torchrun runs
    without stepcli too) is run once more: a stepcli defect that aborts every time still fails. The
    retry starts clean: the output folders and files the first attempt was given (`-o/--out`,
    `--json`) are removed first, so none of its traces stay."""
    argv = [sys.executable, "-m", "stepcli", *map(str, args)]
    result = _run(argv, cwd, env, timeout)
    if (
        result.returncode != 0
        and any(Path(str(a)).name == "torchrun" for a in args)
        and _native_abort(result.stderr)
    ):
        for output in _outputs(argv, cwd):
            if output.is_dir() and not output.is_symlink():
                shutil.rmtree(output)
            elif output.exists() or output.is_symlink():
                output.unlink()
        result = _run(argv, cwd, env, timeout)
    return result


def _outputs(argv: list[str], cwd: object) -> list[Path]:
    """The paths a stepcli command line writes to (`-o DIR`, `--out DIR`, `--out=DIR`, `--json
    PATH`), up to the program's own arguments (from `--` or the torchrun command on)."""
    base = Path(str(cwd)) if cwd is not None else Path.cwd()
    found: list[Path] = []
    for index, arg in enumerate(argv):
        if arg == "--" or Path(arg).name == "torchrun":
            break
        if arg in ("-o", "--out", "--json") and index + 1 < len(argv):
            found.append(base / argv[index + 1])
        elif arg.startswith(("--out=", "--json=")):
            found.append(base / arg.split("=", 1)[1])
    return found


_NATIVE_ABORTS = (
    "terminate called without an active exception",
    "malloc(): ",
    "double free or corruption",
)


def _native_abort(stderr: str) -> bool:
    """A rank killed by SIGABRT from torch's C++ side, as torchrun reports it."""
    return "(SIGABRT)" in stderr and any(mark in stderr for mark in _NATIVE_ABORTS)


def run_python(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """The same program under plain `python`, for equivalence tests."""
    return _run([sys.executable, *map(str, args)], cwd, env, timeout)


def write_script(directory: Path, name: str, source: str) -> Path:
    """Write a dedented script into `directory` and return its path."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def ddp_script(steps: int = 6) -> str:
    """The one small DDP training script (gloo, CPU) for torchrun tests: `steps` optimizer steps per
    rank.

    The model is freed before destroy_process_group(): DDP's reducer holds gloo's process group, and
    torch 2.13 can abort at interpreter exit when that group is destroyed there (1 in 25 plain
    torchrun runs here)."""
    return f"""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range({steps}):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    dist.barrier()
    del model, opt
    import gc; gc.collect()
    dist.destroy_process_group()
"""


def trace_files(directory: Path) -> list[Path]:
    """Every trace a run wrote under `directory`, sorted by name."""
    return sorted(p for p in directory.rglob("*.pt.trace.json*") if not p.name.startswith("."))


def load_trace(path: Path) -> dict[str, Any]:
    """Parse a .json or .json.gz trace with the standard library (independent of stepcli's
    reader)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:  # type: ignore[operator]
        return json.load(handle)


def profiler_steps(path: Path) -> list[int]:
    """The N of every `ProfilerStep#N` annotation on the host in a trace, sorted."""
    events = load_trace(path)["traceEvents"]
    return sorted(
        int(e["name"].split("#", 1)[1])
        for e in events
        if isinstance(e.get("name"), str)
        and e["name"].startswith("ProfilerStep#")
        and e.get("ph") == "X"
        # on a GPU, Kineto mirrors each step on the device timeline
        and e.get("cat") != "gpu_user_annotation"
    )


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every GitHub-flavoured table in `text` as [header, *body] rows of cells, asserting it is well
    formed: a header row, a separator row, at least one body row, equal column counts, closing
    pipes."""
    tables: list[list[list[str]]] = []
    block: list[str] = []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            rows = [
                [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]
                for row in block
            ]
            assert len(rows) >= 3, block  # header, separator, at least one body row
            assert all(re.fullmatch(r":?-{3,}:?", cell) for cell in rows[1]), block[1]
            assert len({len(row) for row in rows}) == 1, block
            assert all(row.rstrip().endswith("|") for row in block), block
            tables.append([rows[0], *rows[2:]])
            block = []
    return tables


def assert_matches_key_averages(
    cpu_ops: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    """stepcli's CPU operator rows agree with torch's key_averages(): names, counts, self/total
    within 1%."""
    rows = {r["name"]: r for r in cpu_ops}
    assert set(rows) == {e["name"] for e in expected}
    for e in expected:
        row = rows[e["name"]]
        assert row["calls"] == e["count"], e["name"]
        assert row["self_ms"] * 1000 == pytest.approx(e["self_us"], rel=0.01, abs=1e-6), e["name"]
        assert row["total_ms"] * 1000 == pytest.approx(e["total_us"], rel=0.01), e["name"]


TRAIN_LOOP = """
    import sys
    import torch

    def main(iterations: int) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(32, 16)
        for i in range(iterations):
            opt.zero_grad()
            loss = model(data).square().mean()
            loss.backward()
            opt.step()
            print(f"iter {i}")

    if __name__ == "__main__":
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
"""


@pytest.fixture
def train_script(tmp_path: Path) -> Path:
    """A 10-iteration, one-optimizer training loop that prints one line per iteration."""
    return write_script(tmp_path, "train.py", TRAIN_LOOP)


@pytest.fixture(autouse=True)
def _no_leaked_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("STEPCLI_"):
            monkeypatch.delenv(key)
    yield


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the children this process forks during the test (os.fork is wrapped for every
    module)."""
    pids: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


@pytest.fixture(scope="session")
def rank_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks of a real torch trace, each slowed by its own factor (rank 2 the most), rank 3
    gzipped."""
    folder = tmp_path_factory.mktemp("ranks")
    document = json.loads((DATA / "train_cpu.pt.trace.json").read_text())
    for rank in range(RANKS):
        copy: dict[str, Any] = json.loads(json.dumps(document))
        copy["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": RANKS}
        factor = 1.0 + 0.1 * rank + (0.5 if rank == 2 else 0.0)
        t0 = min(e["ts"] for e in copy["traceEvents"] if "ts" in e)
        for event in copy["traceEvents"]:
            if "ts" in event:
                event["ts"] = round(t0 + (event["ts"] - t0) * factor + rank * 7.0, 3)
            if "dur" in event:
                event["dur"] = round(event["dur"] * factor, 3)
        name = f"host_{100 + rank}.{rank}.pt.trace.json"
        text = json.dumps(copy).encode()
        if rank == 3:
            (folder / (name + ".gz")).write_bytes(gzip.compress(text))
        else:
            (folder / name).write_bytes(text)
    return folder


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A local Dask cluster of two worker processes (`--scheduler` of `table`, `whatif`), started by
    the test module that asks for it and closed after it."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        yield str(cluster.scheduler_address)
    finally:
        cluster.close()
