"""FLOPs per step, achieved FLOP/s and MFU, from the FLOP counts `stepcli run --with-flops` writes
beside each trace, or those a trace carries itself.

torch 2.13 estimates FLOPs of matmuls and convolutions (`with_flops=True`) but on CPU writes none
into the exported trace; only `key_averages()` has them. So the agent writes the window's sum beside
the trace `NAME.pt.trace.json` as `NAME.flops` ({"flops": N, "device": name or null},
stepcli.agent.recorder). A trace recorded elsewhere with `with_flops=True` on a GPU carries
`"flops": N` in the args of the operators torch counts (aten::mm, addmm, bmm, baddbmm, conv2d, mul,
add: none calls another, so their sum counts nothing twice); the reader sums them over the recorded
steps (stepcli.traces.analyses.traceanalysis), and the side file wins when both exist. The device is
the side file's, else the trace's `deviceProperties`. Over the recorded steps of the traces that
have counts: flops_per_step = FLOPs / steps, achieved_flops_per_s = FLOPs / recorded step time, and
mfu = achieved / the device's dense tensor peak for a dtype (PEAKS; docs/concepts/gpu.md lists them
with sources), null when the device is unknown (CPU included); `pace` "recorded", the same figures
under `*_recorded`. `stepcli run` then puts them at the untouched steps' pace (at_untouched_pace:
FLOPs per step / their median time), the profiler's cost left out.

The dtype of that peak comes from the GPU's GEMM and convolution kernels' names (`gemm_dtype`:
cuBLAS, cuBLASLt, CUTLASS, cuDNN, rocBLAS/hipBLASLt's Tensile name their input dtype): the dtype
whose kernels ran longest inside the recorded steps. Each unique name is read once (names are
interned in the columns), so no event costs Python time. A GEMM kernel whose name says no dtype
(cuBLAS 12.8+'s `nvjet_*`, `undtyped_gemm`) takes its launching operator's (`op_dtype`: FP8 for the
scaled matmuls, else the operator's first `Input type`, recorded with record_shapes), matched by the
`External id` both carry; the reader keeps those ids and dtypes only for GEMM operators and such
kernels (stepcli.traces.read.columns). With no kernel recognised (CPU, Triton kernels, an nvjet
kernel whose operator says no dtype) it stays BF16 and is said to be assumed (`mfu_dtype_assumed`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from stepcli.runfolder.layout import flops_path
from stepcli.traces.read.names import DTYPES

_MAX_BYTES = 1 << 16
# The most FLOPs a side file may count: 10^30 is a million years of an exaFLOP machine, and any sum
# or ratio of such counts stays a finite float (a 401-digit count made `flops / steps` raise
# OverflowError: exit 70).
MAX_FLOPS = 10**30
# Dense (not 2:4 sparse) peak FLOP/s by device-name fragment and dtype, from the vendors' datasheets
# (docs/concepts/gpu.md).
PEAKS: dict[str, dict[str, float]] = {
    "B200": {"fp8": 4500e12, "bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 75e12},
    # per GPU
    "GB200": {"fp8": 5000e12, "bf16": 2500e12, "fp16": 2500e12, "tf32": 1250e12, "fp32": 80e12},
    "H200": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 SXM": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 PCIe": {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    # H100 80GB HBM3 is the SXM part
    "H100": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    # (H200 wins: longer)
    "H20": {"fp8": 296e12, "bf16": 148e12, "fp16": 148e12, "tf32": 74e12, "fp32": 44e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"fp8": 733e12, "bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "MI300X": {
        "fp8": 2614.9e12,
        "bf16": 1307.4e12,
        "fp16": 1307.4e12,
        "tf32": 653.7e12,
        "fp32": 163.4e12,
    },
    "MI250X": {"bf16": 383e12, "fp16": 383e12, "fp32": 95.7e12},
}
# without a recognised GEMM kernel: the dense BF16 peak (FP16 where the part has none)
MFU_DTYPE = "bf16"


def read_flops(trace: str) -> tuple[int, str | None] | None:
    """(FLOPs, device name) written beside `trace`, or None when there is no usable file. A side
    file that is there but unusable (a FIFO, a link to `/dev/zero`, a huge file, not JSON, a count
    that is no whole number from 0 to MAX_FLOPS: `1e400`, 401 digits) is left out with one warning,
    never waited on, never fatal: the trace is still summarized, from the FLOPs its operators carry
    if any (stepcli.inputs.read_side_json)."""
    from stepcli.errors import TraceError
    from stepcli.inputs import read_side_json

    path = flops_path(trace)
    try:
        document = read_side_json(path, _MAX_BYTES)
    except TraceError as exc:
        _unusable(path, exc.problem)
        return None
    if document is None:
        return None
    flops = document.get("flops") if isinstance(document, dict) else None
    if not isinstance(flops, int) or isinstance(flops, bool) or not 0 <= flops <= MAX_FLOPS:
        _unusable(path, "no FLOP count from 0 to 10^30 in it")
        return None
    device = document.get("device")
    return flops, device[:200] if isinstance(device, str) else None


_warned: set[str] = set()


def _unusable(path: str, problem: str) -> None:
    """One warning per side file and process: its FLOPs are left out."""
    if path in _warned:
        return
    _warned.add(path)
    from stepcli.fmt import say

    say(f"warning: {path}: {problem}; its FLOPs are left out")


def _peaks(device: str | None) -> dict[str, float] | None:
    """The PEAKS row of a device, by the longest name fragment that matches."""
    if not device:
        return None
    for fragment in sorted(PEAKS, key=len, reverse=True):
        if fragment.lower() in device.lower():
            return PEAKS[fragment]
    return None


def peak_of(device: str | None, dtype: str | None = None) -> float | None:
    """The dense peak FLOP/s of a device for a dtype; without one, BF16 (else FP16)."""
    peaks = _peaks(device)
    if peaks is None:
        return None
    return peaks.get(dtype) if dtype else peaks.get(MFU_DTYPE) or peaks.get("fp16")


def flops_figures(
    flops: int,
    steps: int,
    step_ns: int,
    devices: set[str],
    sources: AbstractSet[str] = frozenset({"file"}),
    gemm_ns: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The `flops` figures of a summary: per step, per second of recorded step time, and MFU when
    one known device ran them all; where the counts came from, and the dtype whose peak MFU is
    against: the one whose GEMM/convolution kernels took the most time (`gemm_ns`, by dtype), else
    BF16, assumed."""
    achieved = flops / (step_ns / 1e9) if step_ns > 0 else None
    device = (next(iter(devices)) or None) if len(devices) == 1 else None
    dtype = dominant_dtype(gemm_ns or {})
    peak = peak_of(device, dtype)
    known = _peaks(device) is not None
    mfu = achieved / peak if achieved is not None and peak else None
    return {
        "flops_per_step": flops / steps if steps else None,
        "achieved_flops_per_s": achieved,
        "mfu": mfu,
        "pace": "recorded",
        "pace_step_ms": step_ns / steps / 1e6 if steps and step_ns > 0 else None,
        "achieved_flops_per_s_recorded": achieved,
        "mfu_recorded": mfu,
        "peak_flops_per_s": peak,
        "device_name": device,
        "flops_source": "+".join(sorted(sources)),
        "mfu_dtype": (dtype or peak_dtype(device)) if known else None,
        "mfu_dtype_assumed": dtype is None if known else None,
    }


def at_untouched_pace(
    figures: dict[str, Any] | None, untouched_median_ms: float | None
) -> dict[str, Any] | None:
    """The `flops` figures at the program's own pace: `achieved_flops_per_s` and `mfu` from the
    FLOPs per step over the untouched steps' median time (a step's FLOPs do not change when it is
    profiled; its time does), `pace` "untouched"; the recorded steps' figures stay under
    `*_recorded`. Unchanged without untouched steps."""
    if (
        not figures
        or not untouched_median_ms
        or untouched_median_ms <= 0
        or figures.get("flops_per_step") is None
    ):
        return figures
    achieved = figures["flops_per_step"] / (untouched_median_ms / 1e3)
    peak = figures.get("peak_flops_per_s")
    return figures | {
        "achieved_flops_per_s": achieved,
        "mfu": achieved / peak if peak else None,
        "pace": "untouched",
        "pace_step_ms": untouched_median_ms,
    }


def dominant_dtype(gemm_ns: dict[str, int]) -> str | None:
    """The dtype with the most GEMM/convolution kernel time (ties: the first of DTYPES), None
    without any."""
    timed = [dtype for dtype in DTYPES if gemm_ns.get(dtype, 0) > 0]
    return max(timed, key=lambda dtype: gemm_ns[dtype]) if timed else None


def peak_dtype(device: str | None) -> str | None:
    """The dtype whose peak `peak_of` takes for a device without a dtype: BF16, else FP16."""
    peaks = _peaks(device)
    if peaks is None:
        return None
    return MFU_DTYPE if MFU_DTYPE in peaks else "fp16"
