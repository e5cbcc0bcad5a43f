"""FLOPs per step, FLOP/s and MFU (stepcli.traces.analyses.flops) from the counts written beside
traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepcli.runfolder.layout import flops_path
from stepcli.traces.analyses.flops import flops_figures, peak_of, read_flops
from stepcli.traces.read.names import gemm_dtype


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-PG509-200", 312e12),
        ("Tesla V100-SXM2-16GB", 125e12),  # no BF16: the FP16 tensor peak
        ("AMD Instinct MI300X", 1307.4e12),
        ("NVIDIA GeForce GTX 1080", None),
        (None, None),
    ],
)
def test_dense_bf16_peaks_by_device_name(device: str | None, peak: float | None) -> None:
    assert peak_of(device) == peak


def test_figures_over_the_recorded_steps() -> None:
    # GIVEN 3e12 FLOPs over 3 steps taking 2 s in all, on an A100 (312 TFLOP/s dense BF16)
    figures = flops_figures(3_000_000_000_000, 3, 2_000_000_000, {"NVIDIA A100-SXM4-80GB"})
    assert figures["flops_per_step"] == 1e12 and figures["achieved_flops_per_s"] == 1.5e12
    assert figures["mfu"] == pytest.approx(1.5e12 / 312e12)
    # AND on CPU, or with two kinds of device, no MFU
    assert (
        flops_figures(10, 1, 10, {""})["mfu"] is None
        and flops_figures(10, 1, 10, {""})["device_name"] is None
    )
    assert (
        flops_figures(10, 1, 10, {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"})["mfu"] is None
    )


def test_reads_the_file_beside_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "w.123.pt.trace.json.gz"
    assert flops_path(str(trace)) == str(tmp_path / "w.123.flops")
    assert read_flops(str(trace)) is None
    Path(flops_path(str(trace))).write_text(
        json.dumps({"flops": 42, "device": "NVIDIA H100 80GB HBM3"})
    )
    assert read_flops(str(trace)) == (42, "NVIDIA H100 80GB HBM3")
    for bad in ('{"flops": -1}', '{"flops": true}', "[1]", "not json", '{"flops": 1.5}'):
        Path(flops_path(str(trace))).write_text(bad)
        assert read_flops(str(trace)) is None


def _flops_trace(
    path: Path,
    *,
    device: str | None = "NVIDIA H100 80GB HBM3",
    null_args: bool = False,
    kernels: tuple[tuple[str, float, float], ...] = (("gemm", 20, 500),),
) -> Path:
    """Two complete steps of 1 ms, FLOP-carrying operators inside and outside them, like a trace
    recorded with `with_flops=True` on a GPU (torch writes `flops` into the args of the operators it
    counts); `kernels` are (name, start, duration) in microseconds from the first step's start."""
    t0 = 1_700_000_000_000.0

    def op(name: str, ts: float, flops: int | None) -> dict[str, object]:
        args: dict[str, object] = {
            "External id": 1,
            "Input type": ["c10::BFloat16", "c10::BFloat16"],
        }
        if flops is not None:
            args["flops"] = flops
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": t0 + ts,
            "dur": 10,
            "args": args,
        }

    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": t0,
            "dur": 1000,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#2",
            "pid": 1,
            "tid": 1,
            "ts": t0 + 1000,
            "dur": 1000,
        },
        op("aten::mm", 10, 4_000_000_000),
        op("aten::addmm", 1100, 2_000_000_000),
        op("aten::add", 1200, 1000),
        op("aten::relu", 1300, None),
        op("aten::mm", 5000, 7_000_000_000),  # after the last step: not the recorded steps' work
    ]
    events += [
        {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": t0 + ts,
            "dur": dur,
            "args": None,
        }
        for name, ts, dur in kernels
    ]
    if null_args:
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::empty",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 30,
                "dur": 1,
                "args": None,
            }
        )
    document: dict[str, object] = {"traceEvents": events}
    if device:
        document["deviceProperties"] = [{"id": 0, "name": device, "totalGlobalMem": 1}]
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("null_args", [False, True])
def test_flops_in_a_traces_operator_args_count_over_the_recorded_steps(
    tmp_path: Path, null_args: bool
) -> None:
    from stepcli.traces.engine import summarize_paths

    # GIVEN a trace whose operators carry torch's FLOP counts, and no NAME.flops beside it
    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", null_args=null_args)
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    # THEN the counts of the operators inside the two steps are summed (not the one after them)
    # against the H100 the trace names, with the dtype of the peak said to be assumed
    total = 4_000_000_000 + 2_000_000_000 + 1000
    assert flops["flops_per_step"] == total / 2 and flops["achieved_flops_per_s"] == pytest.approx(
        total / 2e-3
    )
    assert flops["device_name"] == "NVIDIA H100 80GB HBM3" and flops["mfu"] == pytest.approx(
        total / 2e-3 / 989e12
    )
    assert flops["flops_source"] == "trace"
    assert flops["mfu_dtype"] == "bf16" and flops["mfu_dtype_assumed"] is True


def test_the_side_file_wins_over_the_traces_own_counts(tmp_path: Path) -> None:
    from stepcli.traces.engine import summarize_paths

    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", device=None)
    Path(flops_path(str(trace))).write_text(json.dumps({"flops": 8_000, "device": None}))
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    assert flops["flops_per_step"] == 4_000 and flops["flops_source"] == "file"
    assert (
        flops["mfu"] is None and flops["mfu_dtype"] is None and flops["mfu_dtype_assumed"] is None
    )


def test_a_trace_without_counts_has_no_flops(tmp_path: Path) -> None:
    from stepcli.traces.engine import summarize_paths

    trace = tmp_path / "plain.pt.trace.json"
    document = json.loads(_flops_trace(tmp_path / "x.pt.trace.json").read_text())
    for event in document["traceEvents"]:
        if event.get("args"):
            event["args"].pop("flops", None)
    trace.write_text(json.dumps(document))
    assert summarize_paths([str(trace)], jobs=1).to_dict()["flops"] is None


def test_flops_of_a_large_trace_read_in_slices_and_in_ranges(tmp_path: Path) -> None:
    """Decoded in 1 MB slices, and cut in ranges for several processes: every operator's count is
    kept once."""
    from stepcli.traces.engine import summarize_paths

    t0 = 1_700_000_000_000.0
    events: list[dict[str, object]] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": t0,
            "dur": 1e6,
        }
    ]
    for i in range(40_000):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": t0 + 10 + i * 20,
                "dur": 5,
                "args": {"External id": i, "Sequence number": i, "flops": 1000 + i},
            }
        )
    trace = tmp_path / "big.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}, indent=1))
    assert trace.stat().st_size > 4_000_000
    expected = sum(1000 + i for i in range(40_000))
    for jobs in (1, 2):
        assert (
            summarize_paths([str(trace)], jobs=jobs).to_dict()["flops"]["flops_per_step"]
            == expected
        )


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [
        # cuBLAS / cuBLASLt
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "bf16"),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel",
            "bf16",
        ),
        ("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn", "fp16"),
        ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", "fp16"),  # not CUTLASS's TF32 s1688gemm
        ("ampere_sgemm_128x64_nn", "fp32"),
        ("volta_sgemm_128x32_nt", "fp32"),
        ("void gemmk1_kernel<float, 256, 5, false, false, false, false>(float const*)", "fp32"),
        ("ampere_tf32_s1688gemm_tf32_128x128_ldg8_f2f_stages_32x5_nn", "tf32"),
        (
            "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
            "tf32",
        ),
        (
            "sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128_cluster1x2x1_execute_kernel",
            "fp8",
        ),
        # CUTLASS
        ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x5_nn_align8", "bf16"),
        (
            "void "
            "cutlass::Kernel<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x1_tn_align8>(Params)",
            "fp16",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)",
            "tf32",
        ),
        # cuDNN convolutions
        (
            "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4",
            "bf16",
        ),
        (
            "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, "
            "false>(int)",
            "fp32",
        ),
        ("volta_scudnn_128x64_relu_interior_nn_v1", "fp32"),
        ("turing_fp16_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_interior_nhwc2nchw_tn_v1", "fp16"),
        # rocBLAS / hipBLASLt (Tensile)
        ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1", "bf16"),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1", "bf16"),
        ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "fp16"),
        ("Cijk_Ailk_Bljk_SB_MT64x64x8_SN_1LDSB0", "fp32"),
        ("Custom_Cijk_Alik_Bljk_F8B8BS_BH_UserArgs_MT256x256x128", "fp8"),
        ("Cijk_Ailk_Bljk_DB_MT64x64x8", None),  # FP64: no peak of ours
        # not a GEMM, or a GEMM whose name says no dtype
        (
            "void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(int, "
            "int)",
            None,
        ),
        (
            "void fbgemm_gpu::(anonymous "
            "namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*)",
            None,
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::CUDAFunctor_add<c10::BFloat16>>",
            None,
        ),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(float)", None),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None),
        ("triton_tem_fused_mm_0", None),
        ("gemm", None),
    ],
)
def test_the_dtype_of_a_gemm_kernel_from_its_name(kernel: str, dtype: str | None) -> None:
    assert gemm_dtype(kernel) == dtype


def test_mfu_against_the_peak_of_the_dtype_whose_gemms_took_longest() -> None:
    a100 = {"NVIDIA A100-SXM4-80GB"}
    # GIVEN FP32 sgemm time only: the FP32 peak, said not to be assumed
    figures = flops_figures(3_000_000_000_000, 3, 2_000_000_000, a100, gemm_ns={"fp32": 5})
    assert (
        figures["mfu"] == pytest.approx(1.5e12 / 19.5e12) and figures["peak_flops_per_s"] == 19.5e12
    )
    assert figures["mfu_dtype"] == "fp32" and figures["mfu_dtype_assumed"] is False
    # AND BF16 and FP32 GEMMs: the one with more time
    assert flops_figures(1, 1, 1, a100, gemm_ns={"bf16": 7, "fp32": 5})["mfu_dtype"] == "bf16"
    assert flops_figures(1, 1, 1, a100, gemm_ns={"bf16": 5, "fp32": 7})["mfu_dtype"] == "fp32"
    # AND no GEMM recognised: BF16, assumed
    figures = flops_figures(1, 1, 1, a100, gemm_ns={})
    assert (figures["mfu_dtype"], figures["mfu_dtype_assumed"], figures["peak_flops_per_s"]) == (
        "bf16",
        True,
        312e12,
    )
    # AND a dtype the part has no peak for (FP8 on an A100): no MFU, but the dtype is said
    figures = flops_figures(1, 1, 1, a100, gemm_ns={"fp8": 9})
    assert (
        figures["mfu"] is None
        and figures["mfu_dtype"] == "fp8"
        and figures["mfu_dtype_assumed"] is False
    )
    assert peak_of("NVIDIA H100 80GB HBM3", "fp8") == 1979e12


@pytest.mark.parametrize(
    ("kernels", "dtype", "peak"),
    [
        # FP32 sgemm time dominates inside the steps; the long BF16 GEMM after the last step does
        # not count
        (
            (
                ("ampere_sgemm_128x64_nn", 20, 500),
                ("ampere_bf16_s16816gemm_bf16_64x64_nn", 1100, 200),
            )
            + (("ampere_bf16_s16816gemm_bf16_64x64_nn", 5000, 900),),
            "fp32",
            67e12,
        ),
        # BF16 and FP32 GEMMs, BF16 longer; a long non-GEMM kernel does not count
        (
            (
                ("ampere_sgemm_128x64_nn", 20, 200),
                ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1100, 300),
            )
            + (("void at::native::vectorized_elementwise_kernel<4, float>", 1400, 500),),
            "bf16",
            989e12,
        ),
    ],
)
def test_mfu_dtype_from_the_kernels_of_the_recorded_steps(
    tmp_path: Path, kernels: tuple[tuple[str, float, float], ...], dtype: str, peak: float
) -> None:
    from stepcli.traces.engine import summarize_paths

    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", kernels=kernels)
    flops = summarize_paths([str(trace)], jobs=1).to_dict()["flops"]
    total = 4_000_000_000 + 2_000_000_000 + 1000
    assert flops["mfu_dtype"] == dtype and flops["mfu_dtype_assumed"] is False
    assert flops["peak_flops_per_s"] == peak and flops["mfu"] == pytest.approx(total / 2e-3 / peak)
