"""stepcli.agent.cpuwait: each recorded step's time on a CPU and waiting for one, from Linux's
schedstat."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import pytest

from stepcli.agent import cpuwait

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")


class _Profiler:
    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {}

    def add_metadata_json(self, key: str, value: str) -> None:
        self.metadata[key] = json.loads(value)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_step_of_cpu_work_is_measured_and_written_as_it_ends() -> None:
    prof, times = _Profiler(), cpuwait.CpuWait()
    times.begin(5)
    _spin(0.03)  # 30 ms on a CPU
    times.end(prof)
    times.begin(6)
    time.sleep(0.01)  # asleep: neither on a CPU nor waiting for one
    times.end(prof)
    written = prof.metadata["stepcli_cpu_ms"]
    assert sorted(written) == ["5", "6"]
    assert written["5"][0] >= 29.0 and written["6"][0] < 5.0
    assert all(waited >= 0.0 for _, waited in written.values())
    # AND a step that did not begin while recording is not written; a new window starts empty
    times.end(prof)
    assert sorted(prof.metadata["stepcli_cpu_ms"]) == ["5", "6"]
    times.reset()
    times.begin(9)
    times.end(prof)
    assert sorted(prof.metadata["stepcli_cpu_ms"]) == ["9"]


def test_the_steps_thread_is_measured_not_the_others() -> None:
    prof, times = _Profiler(), cpuwait.CpuWait()
    times.begin(1)
    worker = threading.Thread(target=_spin, args=(0.05,))
    worker.start()
    worker.join()
    times.end(prof)
    # another thread's 50 ms are not this thread's
    assert prof.metadata["stepcli_cpu_ms"]["1"][0] < 20.0


def test_without_schedstat_nothing_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpuwait, "_SCHEDSTAT", "/nonexistent/schedstat")
    prof, times = _Profiler(), cpuwait.CpuWait()
    times.begin(1)
    times.end(prof)
    assert prof.metadata == {}
