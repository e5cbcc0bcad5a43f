"""FLOPs per step, achieved FLOP/s and MFU, from the FLOP counts `stepcli run --with-flops` writes beside each
trace, or those a trace carries itself.

torch 2.13 estimates FLOPs of matmuls and convolutions (`with_flops=True`) but on CPU writes none into the exported
trace; only `key_averages()` has them. So the agent writes the window's sum beside the trace `NAME.pt.trace.json`
as `NAME.flops` ({"flops": N, "device": name or null}, stepcli.agent.recorder). A trace recorded elsewhere with
`with_flops=True` on a GPU carries `"flops": N` in the args of the operators torch counts (aten::mm, addmm, bmm,
baddbmm, conv2d, mul, add: none calls another, so their sum counts nothing twice); the reader sums them over the
recorded steps (stepcli.traces.analysis), and the side file wins when both exist. The device is the side file's,
else the trace's `deviceProperties`. Over the recorded steps of the traces that have counts: flops_per_step =
FLOPs / steps, achieved_flops_per_s = FLOPs / recorded step time, and mfu = achieved / the device's dense BF16
tensor peak (PEAKS; README lists them with sources), null when the device is unknown (CPU included). The dtype is
assumed (`mfu_dtype_assumed`): a trace names its operators' input dtypes only with record_shapes, and reading them
would slow every such trace's decoding.
"""

from __future__ import annotations

import os
from collections.abc import Set as AbstractSet
from typing import Any

FLOPS_SUFFIX = ".flops"  # as stepcli.agent.recorder writes it
_MAX_BYTES = 1 << 16
# Dense (not 2:4 sparse) peak FLOP/s by device-name fragment and dtype, from the vendors' datasheets (README).
PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 SXM": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},  # H100 80GB HBM3 is the SXM part
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "MI300X": {"bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12},
    "MI250X": {"bf16": 383e12, "fp16": 383e12, "fp32": 95.7e12},
}
MFU_DTYPE = "bf16"  # MFU is against the dense BF16 peak (FP16 where the part has no BF16), as usually reported


def flops_path(trace: str) -> str:
    at = trace.rfind(".pt.trace.json")
    return (trace[:at] if at >= 0 else trace) + FLOPS_SUFFIX


def read_flops(trace: str) -> tuple[int, str | None] | None:
    """(FLOPs, device name) written beside `trace`, or None when there is no usable file."""
    path = flops_path(trace)
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return None
        import json  # (only when the file is there: most traces have none)

        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    flops, device = document.get("flops"), document.get("device")
    if not isinstance(flops, int) or isinstance(flops, bool) or flops < 0:
        return None
    return flops, device if isinstance(device, str) else None


def peak_of(device: str | None) -> float | None:
    """The dense BF16 (else FP16) peak FLOP/s of a device, by the longest name fragment that matches."""
    if not device:
        return None
    for fragment in sorted(PEAKS, key=len, reverse=True):
        if fragment.lower() in device.lower():
            peaks = PEAKS[fragment]
            return peaks.get(MFU_DTYPE) or peaks.get("fp16")
    return None


def flops_figures(
    flops: int, steps: int, step_ns: int, devices: set[str], sources: AbstractSet[str] = frozenset({"file"})
) -> dict[str, Any]:
    """The `flops` figures of a summary: per step, per second of recorded step time, and MFU when one known
    device ran them all; where the counts came from, and the dtype whose peak MFU is against."""
    achieved = flops / (step_ns / 1e9) if step_ns > 0 else None
    device = (next(iter(devices)) or None) if len(devices) == 1 else None
    peak = peak_of(device)
    return {
        "flops_per_step": flops / steps if steps else None,
        "achieved_flops_per_s": achieved,
        "mfu": achieved / peak if achieved is not None and peak else None,
        "peak_flops_per_s": peak,
        "device_name": device,
        "flops_source": "+".join(sorted(sources)),
        "mfu_dtype": peak_dtype(device) if peak else None,
        "mfu_dtype_assumed": True if peak else None,
    }


def peak_dtype(device: str | None) -> str | None:
    """The dtype whose peak `peak_of` takes for a device: BF16, else FP16."""
    for fragment in sorted(PEAKS, key=len, reverse=True):
        if device and fragment.lower() in device.lower():
            return MFU_DTYPE if MFU_DTYPE in PEAKS[fragment] else "fp16"
    return None
