"""`stepcli table`'s short-run settings (stepcli.traces.read.shortcommand): one OpenBLAS thread and
no cyclic GC, put back after."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from stepcli.traces.read.shortcommand import BLAS_THREADS, short_run


def test_one_blas_thread_and_no_cyclic_gc_inside_and_all_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN no OpenBLAS setting and the collector on
    monkeypatch.delenv(BLAS_THREADS, raising=False)
    assert gc.isenabled()
    # WHEN a short run goes on
    with short_run():
        # THEN numpy imported now would start one OpenBLAS thread, and the collector is off
        assert os.environ[BLAS_THREADS] == "1"
        assert not gc.isenabled()
    # AND afterwards both are as they were
    assert BLAS_THREADS not in os.environ
    assert gc.isenabled()


def test_a_thread_count_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BLAS_THREADS, "4")
    with short_run():
        assert os.environ[BLAS_THREADS] == "4"
    assert os.environ[BLAS_THREADS] == "4"


def test_put_back_when_the_body_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BLAS_THREADS, raising=False)
    with pytest.raises(RuntimeError), short_run():
        raise RuntimeError("boom")
    assert BLAS_THREADS not in os.environ
    assert gc.isenabled()


def test_table_imports_numpy_inside_the_short_run() -> None:
    # GIVEN `stepcli table` in a fresh process, numpy not yet imported (the setting only counts
    # before it is)
    code = (
        "import os, sys\n"
        "from stepcli.cli import main\n"
        "import stepcli.traces.read.shortcommand as s\n"
        "seen = []\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy' and not seen:\n"
        "            seen.append(os.environ.get(s.BLAS_THREADS))\n"
        "sys.meta_path.insert(0, Watch())\n"
        "main(['table', '--json', sys.argv[1]])\n"
        "print(seen, file=sys.stderr)\n"
    )
    trace = os.path.join(os.path.dirname(__file__), "..", "data", "train_cpu.pt.trace.json")
    env = {k: v for k, v in os.environ.items() if k != BLAS_THREADS}
    proc = subprocess.run(
        [sys.executable, "-c", code, trace], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # THEN OpenBLAS saw one thread asked for when numpy loaded
    assert proc.stderr.strip().splitlines()[-1] == "['1']"
