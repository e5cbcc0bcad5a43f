"""The dtype of MFU's peak when the GEMM kernels' names say none (cuBLAS 12.8+'s `nvjet_*` on Hopper
and Blackwell): the dtype of the operator that launched them, matched by `External id`
(stepcli.traces.analyses.flops.op_dtype).

The real fixture `tests/data/h200_gpt_bf16.pt.trace.json.gz` (with its `.flops`) is
../shared/traces/h200_gpt_bf16/: `stepcli run --with-flops --gzip` of a GPT training step in bf16
autocast on one NVIDIA H200 (torch 2.11.0+cu130, cuBLAS 13), whose matmuls all run as `nvjet_sm90_*`
kernels; its analytic matmul count is 6.185e12 FLOPs per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepcli.traces.analyses.flops import peak_of
from stepcli.traces.read.names import gemm_dtype, gemm_op, op_dtype, undtyped_gemm

H200_TRACE = Path(__file__).resolve().parent.parent / "data" / "h200_gpt_bf16.pt.trace.json.gz"
NVJET = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


@pytest.mark.parametrize(
    "kernel",
    [
        NVJET,
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT",
        "nvjet_sm100_tst_256x256_64x4_2x1_v_bz_coopB_TNT",
        "nvjet_sm100_ooo_128x256_128x6_1x2_h_bz_coopB_TNT",
    ],
)
def test_nvjet_kernels_are_gemms_whose_names_say_no_dtype(kernel: str) -> None:
    assert gemm_dtype(kernel) is None and undtyped_gemm(kernel)


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [
        (
            "cutlass3x_sm100_tensorop_s256x128x16gemm_bf16_bf16_f32_bf16_bf16_256x128x64_2x1x1_0_tnt_align8",
            "bf16",
        ),
        (
            "sm100_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize256x128x128_cluster2x1x1_execute_kernel",
            "fp8",
        ),
        (
            "cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_1x1x1_0_tnt_align16",
            "fp8",
        ),
    ],
)
def test_blackwell_names_that_say_their_dtype(kernel: str, dtype: str) -> None:
    assert gemm_dtype(kernel) == dtype and not undtyped_gemm(kernel)


@pytest.mark.parametrize(
    ("op", "first", "dtype"),
    [
        ("aten::mm", "c10::BFloat16", "bf16"),
        ("aten::addmm", "c10::Half", "fp16"),
        ("aten::bmm", "float", "fp32"),
        ("aten::mm", "c10::Float8_e4m3fn", "fp8"),
        ("aten::mm", "c10::Float8_e5m2", "fp8"),
        ("aten::_scaled_mm", "c10::Float8_e4m3fn", "fp8"),
        ("aten::_scaled_mm", None, "fp8"),  # recorded without record_shapes: the name says FP8
        ("fbgemm::f8f8bf16_rowwise", "", "fp8"),
        ("aten::mm", "double", None),
        ("aten::mm", "", None),
        ("aten::mm", ["c10::BFloat16"], None),  # an odd value is no dtype, never an error
    ],
)
def test_the_dtype_of_a_gemm_operator(op: str, first: Any, dtype: str | None) -> None:
    assert gemm_op(op) and op_dtype(op, first) == dtype


def test_non_gemm_operators_are_not_gemm_operators() -> None:
    assert not any(
        gemm_op(op) for op in ("aten::add", "aten::copy_", "aten::contiguous", "aten::conj", "mm")
    )


@pytest.mark.parametrize(
    ("device", "dtype", "peak"),
    [
        ("NVIDIA B200", "bf16", 2250e12),
        ("NVIDIA B200", "fp8", 4500e12),
        ("NVIDIA B200", "tf32", 1100e12),
        ("NVIDIA B200", "fp32", 75e12),
        ("NVIDIA GB200", "bf16", 2500e12),  # not the B200 row: the longest name fragment wins
        ("NVIDIA GB200", "fp8", 5000e12),
        ("NVIDIA GB200", "tf32", 1250e12),
        ("NVIDIA H20", "bf16", 148e12),
        ("NVIDIA H20", "fp8", 296e12),
        ("NVIDIA H20", "tf32", 74e12),
        ("NVIDIA H20", "fp32", 44e12),
        ("NVIDIA H200", "bf16", 989e12),  # not the H20 row
        ("NVIDIA H200 NVL", "fp8", 1979e12),
    ],
)
def test_dense_peaks_of_blackwell_and_h20(device: str, dtype: str, peak: float) -> None:
    assert peak_of(device, dtype) == peak


def _trace(
    path: Path,
    device: str,
    kernel: str,
    op: str,
    input_type: str | None,
    *,
    odd_time: bool = False,
) -> Path:
    """Two 1 ms steps; in each, `op` (External id 10 and 20, with `flops`) launches `kernel` (same
    External id) for 600 µs, and an FP32 sgemm of another operator runs 100 µs: the linked kernel's
    dtype must win."""
    t0 = 1_700_000_000_000.0
    events: list[dict[str, Any]] = []
    for step, external in ((0, 10), (1, 20)):
        start = t0 + step * 1000
        args: dict[str, Any] = {"External id": external, "flops": 1_000_000_000}
        if input_type is not None:
            args["Input type"] = [input_type, input_type, "", "Scalar"]
        name = f"ProfilerStep#{step + 1}"
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": 1000,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": op,
                "pid": 1,
                "tid": 1,
                "ts": start + 10,
                "dur": 50,
                "args": args,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": start + 100,
                "dur": 20,
                "args": {"External id": external + 1, "Input type": ["float", "float"]},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": 7,
                "ts": start + 200,
                "dur": 600,
                "args": {"External id": external, "correlation": external * 100},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ampere_sgemm_128x64_nn",
                "pid": 0,
                "tid": 7,
                "ts": start + 850,
                "dur": 100,
                "args": {"External id": external + 1, "correlation": external * 100 + 1},
            },
        ]
    # a numeric string: valid for stepcli, but it sends the file down the lenient decoding path
    if odd_time:
        events[0]["ts"] = str(events[0]["ts"])
    document = {"traceEvents": events, "deviceProperties": [{"id": 0, "name": device}]}
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("device", "kernel", "op", "input_type", "dtype", "peak"),
    [
        # torchao float8 / torch._scaled_mm on Hopper: nvjet kernels, FP8 by the operator's inputs
        # or name
        (
            "NVIDIA H100 80GB HBM3",
            "nvjet_sm90_ooo_128x256_128x6_1x2_h_bz_coopB_TNT",
            "aten::_scaled_mm",
            "c10::Float8_e4m3fn",
            "fp8",
            1979e12,
        ),
        (
            "NVIDIA H100 80GB HBM3",
            "nvjet_sm90_ooo_128x256_128x6_1x2_h_bz_coopB_TNT",
            "aten::_scaled_mm",
            None,
            "fp8",
            1979e12,
        ),
        # Blackwell: nvjet_sm100 kernels of bf16 and fp16 matmuls
        (
            "NVIDIA B200",
            "nvjet_sm100_tst_256x256_64x4_2x1_v_bz_coopB_TNT",
            "aten::mm",
            "c10::BFloat16",
            "bf16",
            2250e12,
        ),
        (
            "NVIDIA GB200",
            "nvjet_sm100_hsh_256x256_64x4_2x1_v_bz_coopB_NNT",
            "aten::addmm",
            "c10::Half",
            "fp16",
            2500e12,
        ),
        # an FP8 matmul on a B200 through aten::mm on float8 tensors
        (
            "NVIDIA B200",
            "nvjet_sm100_qqtst_256x256_128x4_2x1_v_bz_TNT",
            "aten::mm",
            "c10::Float8_e5m2",
            "fp8",
            4500e12,
        ),
    ],
)
@pytest.mark.parametrize("read", ["columns", "events", "lenient"])
def test_the_dtype_of_undtyped_gemm_kernels_is_their_operators(
    tmp_path: Path,
    device: str,
    kernel: str,
    op: str,
    input_type: str | None,
    dtype: str,
    peak: float,
    read: str,
) -> None:
    from stepcli.traces.analyses.traceanalysis import summarize_file
    from stepcli.traces.engine import summarize_paths
    from stepcli.traces.read.tracereader import load_trace

    # GIVEN a trace whose longest GEMM kernel's name says no dtype, launched by an operator that
    # does
    trace = _trace(
        tmp_path / "gpu.pt.trace.json", device, kernel, op, input_type, odd_time=read == "lenient"
    )
    # WHEN summarized (typed columns, the per-event objects, or the lenient decoding of odd field
    # types)
    if read == "events":
        from stepcli.traces.analyses.mergeparts import merge_parts

        flops = merge_parts([summarize_file(load_trace(str(trace)))]).to_dict()["flops"]
    else:
        flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    # THEN MFU is against that operator's dtype's dense peak, not assumed
    assert flops["mfu_dtype"] == dtype and flops["mfu_dtype_assumed"] is False
    assert flops["peak_flops_per_s"] == peak
    assert flops["mfu"] == pytest.approx(1e9 / 1e-3 / peak)


def test_an_undtyped_gemm_whose_operator_says_no_dtype_stays_assumed(tmp_path: Path) -> None:
    from stepcli.traces.engine import summarize_paths

    # GIVEN nvjet kernels of an aten::mm recorded without record_shapes (no Input type), and no
    # other GEMM
    trace = _trace(tmp_path / "gpu.pt.trace.json", "NVIDIA H200", NVJET, "aten::mm", None)
    document = json.loads(trace.read_text())
    document["traceEvents"] = [e for e in document["traceEvents"] if "sgemm" not in e["name"]]
    trace.write_text(json.dumps(document))
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    # THEN the dtype stays BF16, said to be assumed
    assert flops["mfu_dtype"] == "bf16" and flops["mfu_dtype_assumed"] is True


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_real_h200_trace_has_bf16_gemms(jobs: int) -> None:
    from stepcli.traces.engine import summarize_paths

    # GIVEN the real H200 trace of a bf16 GPT step (nvjet_sm90 GEMMs only) WHEN summarized
    flops = summarize_paths([str(H200_TRACE)], jobs=jobs).to_dict()["flops"]
    # THEN its MFU is against the H200's dense BF16 peak, from its GEMMs' operators (not assumed)
    assert flops["mfu_dtype"] == "bf16" and flops["mfu_dtype_assumed"] is False
    assert flops["device_name"] == "NVIDIA H200" and flops["peak_flops_per_s"] == 989e12
    # AND the FLOPs per step are the analytic count's (6.185e12) within 0.1%
    assert flops["flops_per_step"] == pytest.approx(6.185e12, rel=1e-3)


def test_every_nvjet_kernel_of_the_real_h200_trace_finds_its_bf16_operator() -> None:
    from stepcli.traces.read.columns import load_columns

    columns = load_columns(str(H200_TRACE)).columns
    kernels = [
        i for i in range(len(columns)) if columns.names[columns.name[i]].startswith("nvjet_")
    ]
    # (40 of the 481 ran at the first step's start, launched before the profiler started: no
    # External id)
    assert (
        len(kernels) == 481
        and len(columns.gemm_kernels) == 441
        and set(columns.gemm_kernels) <= set(kernels)
    )
    dtypes = {external: dtype for external, dtype in columns.gemm_ops.values()}
    assert {dtypes.get(external) for external in columns.gemm_kernels.values()} == {"bf16"}
