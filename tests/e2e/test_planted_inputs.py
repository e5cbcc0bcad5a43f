"""A run reads only what it wrote (issue 30): snapshots, hang dumps and links planted in the output
folder by someone who can write there never reach its summary, its report.html, or its memory.

Planted here by the same user: what matters is that the run never reads them, whoever put them
there.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_stepcli, stepcli_env, write_script

from stepcli.runfolder.layout import STACKS_SCHEMA


def _snapshot(note: str) -> bytes:
    return pickle.dumps(
        {"segments": [], "device_traces": [], "stepcli": {"step": 3, "phase": note}}, protocol=4
    )


def test_a_run_reads_no_snapshot_hang_dump_or_link_it_did_not_write(
    tmp_path: Path, train_script: Path
) -> None:
    # GIVEN an output folder where another user planted an OOM snapshot, a 10-byte memo bomb, a link
    # to a private file under a snapshot's name, and a hang dump naming a function of theirs (items
    # 2, 6, 11)
    out = tmp_path / "out"
    out.mkdir()
    (out / "oom-rank7.pickle").write_bytes(_snapshot("planted_phase"))
    (out / "oom-rank8.pickle").write_bytes(
        b"\x80\x02K\x01r" + (1 << 24).to_bytes(4, "little") + b"."
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("root-only first line\n")
    secret.chmod(0o600)
    (out / "oom-rank9.pickle").symlink_to(secret)
    hang = out / "hang-7"
    hang.mkdir()
    frames = [{"function": "exfiltrate_weights", "file": "/srv/evil.py", "line": 1}]
    dump = {
        "schema": STACKS_SCHEMA,
        "worker": "rank0",
        "rank": 0,
        "pid": 1,
        "host": "h",
        "time": time.time() + 3600,  # "written during the run"
        "step": 3,
        "last_step_s_ago": 700.0,
        "collective": None,
        "collectives_hooked": False,
        "threads": [{"name": "MainThread", "main": True, "frames": frames}],
    }
    (hang / "rank0.h.1.json").write_text(json.dumps(dump))
    # WHEN a run without --memory or --hang-timeout writes into it
    result = run_stepcli(
        "run", "--active", "1", "--json", tmp_path / "run.json", "-o", out, train_script, "4"
    )
    # THEN none of it is in the summary, the --json document or the page
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()
    document = json.loads((tmp_path / "run.json").read_text())
    for text in (result.stderr, page, json.dumps(document)):
        assert "exfiltrate_weights" not in text and "planted_phase" not in text
        assert "oom-rank7" not in text and "oom-rank9" not in text and "root-only" not in text
    assert document["hang"] is None and document["memory_snapshots"] == []
    # and `stepcli report OUT` later reads the same: the run's saved summary lists no snapshot
    later = run_stepcli("report", out, "-o", tmp_path / "later.html")
    assert later.returncode == 0, later.stderr
    assert "oom-rank7" not in (tmp_path / "later.html").read_text()


def _capped_stepcli(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m stepcli ARGS` in a process whose address space is capped at `limit` bytes."""
    code = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * "
        "2); sys.argv = ['stepcli', *sys.argv[2:]]; runpy.run_module('stepcli', "
        "run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(limit), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=stepcli_env(),
    )


def test_a_memo_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    # GIVEN 10-byte pickles whose memo index is 2^30: the C unpickler would size its memo at 8 GB
    # (item 2)
    bombs = {
        "streamed.pickle": b"\x80\x02K\x01r" + (1 << 30).to_bytes(4, "little") + b".",
        # read by the C unpickler (the streaming decoder has no PUT)
        "protocol0.pickle": b"I1\np1073741824\n.",
    }
    for name, data in bombs.items():
        (tmp_path / name).write_bytes(data)
        started = time.monotonic()
        # WHEN `stepcli memory` reads each, in a process that may not take more than 1 GiB
        result = _capped_stepcli(1 << 30, "memory", str(tmp_path / name))
        # THEN one line and exit 2, at once, without running out of memory
        assert result.returncode == 2, result.stderr
        assert "MemoryError" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert time.monotonic() - started < 60


def test_a_window_folder_link_sends_no_trace_outside_the_output_folder(
    tmp_path: Path, train_script: Path
) -> None:
    # GIVEN OUT/window-step5 planted as a link to a folder outside OUT (item 12)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "window-step5").symlink_to(elsewhere)
    # WHEN a run records the windows of steps 2 and 5 into window folders (--repeat 2)
    args = ("--wait", "2", "--warmup", "0", "--active", "1", "--repeat", "2")
    result = run_stepcli("run", *args, "-o", out, train_script, "8")
    # THEN nothing is written outside OUT: that window is refused in one line, the other saved as
    # usual
    assert result.returncode == 0, result.stderr
    assert list(elsewhere.iterdir()) == []
    assert (out / "window-step5").is_symlink()
    assert len(list((out / "window-step2").glob("*.pt.trace.json"))) == 1
    assert "window-step5" in result.stderr and "link" in result.stderr


def test_files_holding_stacks_are_private_whatever_the_umask(tmp_path: Path) -> None:
    # (item 17) a snapshot written by the agent: 0600 under umask 022
    code = (
        "import os, sys; os.umask(0o022); from stepcli.agent import cudamemory; "
        "print(cudamemory._write_snapshot(sys.argv[1], {'segments': [], 'stepcli': {}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(done.stdout.strip()).st_mode) == 0o600


# Trains, then (standing in for another user of a shared output folder) plants a FIFO as the FLOPs
# side file of the run's first trace and a 401-digit count as the second's, once both are written.
PLANTS_SIDE_FILES = """
    import glob, os, sys, time
    import torch

    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
    deadline = time.monotonic() + 120
    while len(traces := sorted(glob.glob(os.path.join(sys.argv[1], "**", "*.pt.trace.json"), recursive=True))) < 2:
        assert time.monotonic() < deadline, "no two traces written"
        time.sleep(0.05)
    stems = [t[: t.rindex(".pt.trace.json")] for t in traces]
    os.mkfifo(stems[0] + ".flops")
    with open(stems[1] + ".flops", "w") as handle:
        handle.write('{"flops": 1' + "0" * 400 + '}')
    print("planted")
"""  # noqa: E501


def test_a_planted_flops_side_file_costs_the_run_nothing(tmp_path: Path) -> None:
    # GIVEN a run whose two traces get a FIFO and a 401-digit count planted as their FLOPs side
    # files while it runs (issue 47, items 1 and 3: the end of the run blocked for ever, or exited
    # 70 without report.html)
    script = write_script(tmp_path, "plants.py", PLANTS_SIDE_FILES)
    out = tmp_path / "out"
    args = ("--wait", "2", "--warmup", "0", "--active", "1", "--repeat", "2")
    # WHEN it ends
    result = run_stepcli(
        "run", *args, "-o", out, "--json", tmp_path / "run.json", script, out, timeout=180
    )
    # THEN it ends as usual: its summary, --json and report.html, each side file left out with one
    # warning
    assert result.returncode == 0, result.stderr
    assert "planted" in result.stdout
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if ".flops" in line]
    assert len(warnings) == 2 and all("FLOPs are left out" in line for line in warnings), (
        result.stderr
    )
    assert any("not a regular file" in line for line in warnings), result.stderr
    assert json.loads((tmp_path / "run.json").read_text())["flops"] is None
    assert (out / "report.html").is_file()
