"""A short command stopped mid-write (SIGTERM from a scheduler, SIGHUP from a closed terminal,
Ctrl-C) leaves no half-written `.NAME.<random>.tmp` behind: `stepcli merge -o` on a job big enough
to be caught writing."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, stepcli_env


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks of 60 steps (~18 MB of traces): merge writes for a second or more on a busy
    machine."""
    spec = importlib.util.spec_from_file_location("make_job", REPO / "scripts" / "make_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_job"] = module
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("job")
    assert (
        module.main(["--ranks", "8", "--steps", "60", "--collectives", "20", "--out", str(folder)])
        == 0
    )
    return folder


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name
)
def test_a_signal_during_merges_write_leaves_no_temporary_file(
    job: Path, tmp_path: Path, signum: int
) -> None:
    # GIVEN `stepcli merge -o OUT/merged.json` writing its output
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepcli", "merge", str(job), "-o", str(out / "merged.json")],
        env=stepcli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(".merged.json.*.tmp")):
            assert proc.poll() is None, (
                f"merge ended before it was caught writing (exit {proc.returncode})"
            )
            assert time.monotonic() < deadline, "merge never started writing"
            time.sleep(0.005)
        # WHEN the signal arrives mid-write (issue 47, defect 14)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # THEN it stops as that signal stops it, and the folder holds neither half a file nor a
    # temporary one
    assert proc.returncode in (-signum, 130), stderr
    assert list(out.iterdir()) == [], (list(out.iterdir()), stderr)
