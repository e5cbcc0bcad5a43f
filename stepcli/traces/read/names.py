"""What the names in a trace mean, where reading needs it: torch.profiler's step annotation, and
which operators and kernels are matrix multiplies or convolutions, in which dtype. The reader keeps
the `External id` and first `Input type` of GEMM operators only (stepcli.traces.read.columns); FLOPs
and MFU use the dtypes (stepcli.traces.analyses.flops).
"""

from __future__ import annotations

import re
from typing import Any

# torch.profiler's step annotation, ProfilerStep#N: the one definition of a step
STEP_PREFIX = "ProfilerStep#"


def step_of(name: str) -> int | None:
    """N of a `ProfilerStep#N` annotation, None for any other name. ASCII digits only, as torch
    writes them: Python's int() would also read other scripts' digits ("ProfilerStep#١٢" as 12).
    More than 19 digits is no step (the reader drops such names)."""
    if not name.startswith(STEP_PREFIX):
        return None
    number = name[len(STEP_PREFIX) :]
    return int(number) if number.isascii() and number.isdecimal() and len(number) <= 19 else None


# what gemm_dtype tells apart; an index is a dtype's code
DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")

# A GEMM or convolution kernel: cuBLAS/CUTLASS/cuDNN/MIOpen names (`gemm`, `gemv`, `convolve`,
# xmma's fprop/dgrad/ wgrad, `scudnn`...), cuBLAS 12.8+'s `nvjet_sm90_...`/`nvjet_sm100_...`,
# rocBLAS/hipBLASLt's Tensile `Cijk_...`; fbgemm_gpu's embedding kernels are not.
_GEMM = re.compile(
    r"gemm|gemv|convol|conv[123]d|naive_conv|miopenconv|fprop|dgrad|wgrad|winograd|[0-9s]cudnn|"
    r"cijk_|^nvjet_"
)
# Tensile names its types after the index letters: Cijk_Ailk_Bljk_BBS_BH_... (A/B type first: B
# bf16, H fp16, S fp32, X xf32, F8/B8 fp8; D fp64 and I8 int8 are none of DTYPES).
_TENSILE = re.compile(r"cijk_a[a-z]+_b[a-z]+_([a-z0-9]+)")
_TENSILE_TYPES = (
    ("f8", "fp8"),
    ("b8", "fp8"),
    ("b", "bf16"),
    ("h", "fp16"),
    ("x", "tf32"),
    ("s", "fp32"),
)
# Otherwise the first of these found, in this order: FP8 names may name a BF16 output, "bf16" holds
# "f16", "tf32" holds "f32", and Turing's fp16 s1688gemm must not be taken for CUTLASS's TF32
# s1688gemm (FP32 in, TF32 cores).
_TOKENS = (
    ("fp8", re.compile(r"e4m3|e5m2|fp8")),
    ("bf16", re.compile(r"bf16|bfloat16")),
    ("fp16", re.compile(r"fp16|f16|float16|half|h884|h1688|h16816|hgemm|hmma")),
    ("tf32", re.compile(r"tf32|s1688gemm|s1688cudnn")),
    ("fp32", re.compile(r"f32|sgemm|scudnn|float")),
)


def gemm_dtype(name: str) -> str | None:
    """The input dtype of a GEMM or convolution kernel from its name (one of DTYPES), None for any
    other kernel and for one whose name says no dtype we tell apart (FP64, INT8, Triton's, a bare
    `gemm`)."""
    lowered = name.lower().replace("fbgemm", "")
    if not _GEMM.search(lowered):
        return None
    tensile = _TENSILE.search(lowered)
    if tensile:
        types = tensile.group(1)
        return next((dtype for prefix, dtype in _TENSILE_TYPES if types.startswith(prefix)), None)
    return next((dtype for dtype, token in _TOKENS if token.search(lowered)), None)


def undtyped_gemm(name: str) -> bool:
    """Whether a kernel is a GEMM or convolution whose name says no dtype (cuBLAS 12.8+'s `nvjet_*`,
    a bare `gemm`): its dtype is then the launching operator's (`op_dtype`)."""
    lowered = name.lower().replace("fbgemm", "")
    return bool(_GEMM.search(lowered)) and gemm_dtype(name) is None


# The operators that launch GEMM and convolution kernels (the innermost one a kernel's `External id`
# names): aten's matmuls and convolutions, FP8 scaled matmuls (torch._scaled_mm, torchao float8),
# fbgemm's FP8 GEMMs.
_GEMM_OP = re.compile(
    r"aten::(_?addmm|mm|bmm|baddbmm|matmul|linear|addmv|mv|dot|_addmm_activation|_int_mm|"
    r"_scaled_mm|_scaled_grouped_mm|_grouped_mm|_?convolution|cudnn_convolution\w*|conv\w*|"
    r"miopen_convolution\w*|mkldnn_convolution|_fused_\w*mm\w*)$|^fbgemm::\w*f8\w*$"
)
_FP8_OP = re.compile(r"_scaled_(grouped_)?mm$|^fbgemm::\w*f8")
# An operator's first `Input type` (torch's C++ type names, as the trace records them with
# record_shapes)
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
    """Whether a host operator launches GEMM or convolution kernels (aten::mm, addmm, bmm,
    _scaled_mm...)."""
    return bool(_GEMM_OP.search(name))


def op_dtype(name: str, first_input_type: Any) -> str | None:
    """The dtype of a GEMM operator's kernels: FP8 for the scaled matmuls (whatever their inputs),
    else its first input's (`Input type`: c10::BFloat16 bf16, c10::Half fp16, float fp32,
    c10::Float8_* fp8); None otherwise."""
    if _FP8_OP.search(name):
        return "fp8"
    return _INPUT_TYPES.get(first_input_type) if isinstance(first_input_type, str) else None
