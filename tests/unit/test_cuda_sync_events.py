"""The profiler's CUDA sync events are asked for only when CUDA work is recorded and the torch has
them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stepcli.agent.torchprofiler import cuda_sync_events

CPU, CUDA = "cpu", "cuda"


class _Config:
    def __init__(self, **options: Any) -> None:
        self.options = options


def _profiler(supported: list[str], config: Any = _Config) -> SimpleNamespace:
    namespace = SimpleNamespace(
        ProfilerActivity=SimpleNamespace(CPU=CPU, CUDA=CUDA), supported_activities=lambda: supported
    )
    if config is not None:
        namespace._ExperimentalConfig = config
    return namespace


def test_cuda_recorded_turns_the_sync_events_on() -> None:
    # torch's default activities: all supported
    chosen = cuda_sync_events(_profiler([CPU, CUDA]), None)
    assert chosen["experimental_config"].options == {"enable_cuda_sync_events": True}
    assert cuda_sync_events(_profiler([CPU]), [CPU, CUDA])["experimental_config"].options


def test_cpu_runs_and_older_torch_are_left_as_they_were() -> None:
    # no CUDA in this build or on this machine
    assert cuda_sync_events(_profiler([CPU]), None) == {}
    assert cuda_sync_events(_profiler([CPU, CUDA]), [CPU]) == {}  # --activities cpu

    def no_option() -> None:  # a torch whose _ExperimentalConfig has no enable_cuda_sync_events
        raise TypeError("unexpected keyword")

    assert cuda_sync_events(_profiler([CPU, CUDA], lambda **_: no_option()), None) == {}
    assert cuda_sync_events(_profiler([CPU, CUDA], None), None) == {}
