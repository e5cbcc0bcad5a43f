"""FLOPs per step, achieved FLOP/s and MFU, from the FLOP counts `stepcli run --with-flops` writes beside each
trace, or those a trace carries itself.

torch 2.13 estimates FLOPs of matmuls and convolutions (`with_flops=True`) but on CPU writes none into the exported
trace; only `key_averages()` has them. So the agent writes the window's sum beside the trace `NAME.pt.trace.json`
as `NAME.flops` ({"flops": N, "device": name or null}, stepcli.agent.recorder). A trace recorded elsewhere with
`with_flops=True` on a GPU carries `"flops": N` in the args of the operators torch counts (aten::mm, addmm, bmm,
baddbmm, conv2d, mul, add: none calls another, so their sum counts nothing twice); the reader sums them over the
recorded steps (stepcli.traces.analyses.analysis), and the side file wins when both exist. The device is the side file's,
else the trace's `deviceProperties`. Over the recorded steps of the traces that have counts: flops_per_step =
FLOPs / steps, achieved_flops_per_s = FLOPs / recorded step time, and mfu = achieved / the device's dense tensor
peak for a dtype (PEAKS; README lists them with sources), null when the device is unknown (CPU included); `pace`
"recorded", the same figures under `*_recorded`. `stepcli run` then puts them at the untouched steps' pace
(at_untouched_pace: FLOPs per step / their median time), the profiler's cost left out.

The dtype of that peak comes from the GPU's GEMM and convolution kernels' names (`gemm_dtype`: cuBLAS, cuBLASLt,
CUTLASS, cuDNN, rocBLAS/hipBLASLt's Tensile name their input dtype): the dtype whose kernels ran longest inside
the recorded steps. Each unique name is read once (names are interned in the columns), so no event costs Python
time. A GEMM kernel whose name says no dtype (cuBLAS 12.8+'s `nvjet_*`, `undtyped_gemm`) takes its launching
operator's (`op_dtype`: FP8 for the scaled matmuls, else the operator's first `Input type`, recorded with
record_shapes), matched by the `External id` both carry; the reader keeps those ids and dtypes only for GEMM
operators and such kernels (stepcli.traces.read.columns). With no kernel recognised (CPU, Triton kernels, an nvjet
kernel whose operator says no dtype) it stays BF16 and is said to be assumed (`mfu_dtype_assumed`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Set as AbstractSet
from typing import Any

FLOPS_SUFFIX = ".flops"  # as stepcli.agent.recorder writes it
_MAX_BYTES = 1 << 16
# Dense (not 2:4 sparse) peak FLOP/s by device-name fragment and dtype, from the vendors' datasheets (README).
PEAKS: dict[str, dict[str, float]] = {
    "B200": {"fp8": 4500e12, "bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 75e12},
    "GB200": {"fp8": 5000e12, "bf16": 2500e12, "fp16": 2500e12, "tf32": 1250e12, "fp32": 80e12},  # per GPU
    "H200": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 SXM": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 PCIe": {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    # H100 80GB HBM3 is the SXM part
    "H100": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H20": {"fp8": 296e12, "bf16": 148e12, "fp16": 148e12, "tf32": 74e12, "fp32": 44e12},  # (H200 wins: longer)
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"fp8": 733e12, "bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "MI300X": {"fp8": 2614.9e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12},
    "MI250X": {"bf16": 383e12, "fp16": 383e12, "fp32": 95.7e12},
}
MFU_DTYPE = "bf16"  # without a recognised GEMM kernel: the dense BF16 peak (FP16 where the part has none)
DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")  # what gemm_dtype tells apart; an index is a dtype's code

# A GEMM or convolution kernel: cuBLAS/CUTLASS/cuDNN/MIOpen names (`gemm`, `gemv`, `convolve`, xmma's fprop/dgrad/
# wgrad, `scudnn`...), cuBLAS 12.8+'s `nvjet_sm90_...`/`nvjet_sm100_...`, rocBLAS/hipBLASLt's Tensile `Cijk_...`;
# fbgemm_gpu's embedding kernels are not.
_GEMM = re.compile(
    r"gemm|gemv|convol|conv[123]d|naive_conv|miopenconv|fprop|dgrad|wgrad|winograd|[0-9s]cudnn|cijk_|^nvjet_"
)
# Tensile names its types after the index letters: Cijk_Ailk_Bljk_BBS_BH_... (A/B type first: B bf16, H fp16,
# S fp32, X xf32, F8/B8 fp8; D fp64 and I8 int8 are none of DTYPES).
_TENSILE = re.compile(r"cijk_a[a-z]+_b[a-z]+_([a-z0-9]+)")
_TENSILE_TYPES = (("f8", "fp8"), ("b8", "fp8"), ("b", "bf16"), ("h", "fp16"), ("x", "tf32"), ("s", "fp32"))
# Otherwise the first of these found, in this order: FP8 names may name a BF16 output, "bf16" holds "f16", "tf32"
# holds "f32", and Turing's fp16 s1688gemm must not be taken for CUTLASS's TF32 s1688gemm (FP32 in, TF32 cores).
_TOKENS = (
    ("fp8", re.compile(r"e4m3|e5m2|fp8")),
    ("bf16", re.compile(r"bf16|bfloat16")),
    ("fp16", re.compile(r"fp16|f16|float16|half|h884|h1688|h16816|hgemm|hmma")),
    ("tf32", re.compile(r"tf32|s1688gemm|s1688cudnn")),
    ("fp32", re.compile(r"f32|sgemm|scudnn|float")),
)


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


def gemm_dtype(name: str) -> str | None:
    """The input dtype of a GEMM or convolution kernel from its name (one of DTYPES), None for any other kernel
    and for one whose name says no dtype we tell apart (FP64, INT8, Triton's, a bare `gemm`)."""
    lowered = name.lower().replace("fbgemm", "")
    if not _GEMM.search(lowered):
        return None
    tensile = _TENSILE.search(lowered)
    if tensile:
        types = tensile.group(1)
        return next((dtype for prefix, dtype in _TENSILE_TYPES if types.startswith(prefix)), None)
    return next((dtype for dtype, token in _TOKENS if token.search(lowered)), None)


def undtyped_gemm(name: str) -> bool:
    """Whether a kernel is a GEMM or convolution whose name says no dtype (cuBLAS 12.8+'s `nvjet_*`, a bare
    `gemm`): its dtype is then the launching operator's (`op_dtype`)."""
    lowered = name.lower().replace("fbgemm", "")
    return bool(_GEMM.search(lowered)) and gemm_dtype(name) is None


# The operators that launch GEMM and convolution kernels (the innermost one a kernel's `External id` names):
# aten's matmuls and convolutions, FP8 scaled matmuls (torch._scaled_mm, torchao float8), fbgemm's FP8 GEMMs.
_GEMM_OP = re.compile(
    r"aten::(_?addmm|mm|bmm|baddbmm|matmul|linear|addmv|mv|dot|_addmm_activation|_int_mm|_scaled_mm|"
    r"_scaled_grouped_mm|_grouped_mm|_?convolution|cudnn_convolution\w*|conv\w*|miopen_convolution\w*|"
    r"mkldnn_convolution|_fused_\w*mm\w*)$|^fbgemm::\w*f8\w*$"
)
_FP8_OP = re.compile(r"_scaled_(grouped_)?mm$|^fbgemm::\w*f8")
# An operator's first `Input type` (torch's C++ type names, as the trace records them with record_shapes)
_INPUT_TYPES = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "float": "fp32",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}


def gemm_op(name: str) -> bool:
    """Whether a host operator launches GEMM or convolution kernels (aten::mm, addmm, bmm, _scaled_mm...)."""
    return bool(_GEMM_OP.search(name))


def op_dtype(name: str, first_input_type: Any) -> str | None:
    """The dtype of a GEMM operator's kernels: FP8 for the scaled matmuls (whatever their inputs), else its first
    input's (`Input type`: c10::BFloat16 bf16, c10::Half fp16, float fp32, c10::Float8_* fp8); None otherwise."""
    if _FP8_OP.search(name):
        return "fp8"
    return _INPUT_TYPES.get(first_input_type) if isinstance(first_input_type, str) else None


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
    """The `flops` figures of a summary: per step, per second of recorded step time, and MFU when one known
    device ran them all; where the counts came from, and the dtype whose peak MFU is against: the one whose
    GEMM/convolution kernels took the most time (`gemm_ns`, by dtype), else BF16, assumed."""
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


def at_untouched_pace(figures: dict[str, Any] | None, untouched_median_ms: float | None) -> dict[str, Any] | None:
    """The `flops` figures at the program's own pace: `achieved_flops_per_s` and `mfu` from the FLOPs per step over
    the untouched steps' median time (a step's FLOPs do not change when it is profiled; its time does), `pace`
    "untouched"; the recorded steps' figures stay under `*_recorded`. Unchanged without untouched steps."""
    if not figures or not untouched_median_ms or untouched_median_ms <= 0 or figures.get("flops_per_step") is None:
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
    """The dtype with the most GEMM/convolution kernel time (ties: the first of DTYPES), None without any."""
    timed = [dtype for dtype in DTYPES if gemm_ns.get(dtype, 0) > 0]
    return max(timed, key=lambda dtype: gemm_ns[dtype]) if timed else None


def peak_dtype(device: str | None) -> str | None:
    """The dtype whose peak `peak_of` takes for a device without a dtype: BF16, else FP16."""
    peaks = _peaks(device)
    if peaks is None:
        return None
    return MFU_DTYPE if MFU_DTYPE in peaks else "fp16"
