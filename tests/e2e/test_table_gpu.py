"""`stepcli table --json` device figures on real GPU traces recorded by others (../shared/traces/),
checked against Holistic Trace Analysis 0.5.0 where its definitions match.

HTA covers the whole trace (the kernels launched up to the last step), stepcli the recorded steps.
So HTA reads a copy of each trace whose device events are cut to the ProfilerStep windows (an event
crossing a window's edge keeps only its part inside, one piece per window): on that copy HTA's
compute union, kernel-type partition and communication/computation overlap are the same quantities
as stepcli's figures over the steps. Tolerance: 1e-6 relative (both sides add the same integer
microseconds; stepcli in integer nanoseconds, HTA in floats).
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_stepcli, stepcli_env

TRACES = REPO.parent / "shared" / "traces"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

pytestmark = [
    pytest.mark.skipif(not TRACES.is_dir(), reason=f"no real GPU traces at {TRACES}"),
    pytest.mark.filterwarnings("ignore"),  # HTA's pandas deprecations
]


def _read(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        document: dict[str, Any] = json.load(f)
    return document


def _write(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=1) as f:  # (level 9 took seconds per copy)
        json.dump(document, f)


def cut_to_steps(source: Path, dest: Path) -> None:
    """A copy of a trace whose device events keep only their parts inside the ProfilerStep
    windows."""
    document = _read(source)
    events = document["traceEvents"]
    windows = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    kept: list[dict[str, Any]] = []
    for event in events:
        if event.get("cat") not in DEVICE_CATEGORIES:
            kept.append(event)
            continue
        for lo, hi in windows:
            start, end = max(event["ts"], lo), min(event["ts"] + event["dur"], hi)
            if end > start:
                kept.append(dict(event, ts=start, dur=end - start))
    document["traceEvents"] = kept
    _write(document, dest)


def hta_figures(trace_dir: Path) -> dict[int, dict[str, float]]:
    """Per rank, in microseconds over the whole (cut) trace: HTA's compute time, its kernel-type
    partition summed into the union per class, the union of all device work, and the overlap
    percentage."""
    hta = pytest.importorskip("hta.trace_analysis")
    logging.disable(logging.WARNING)
    try:
        analysis = hta.TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    figures: dict[int, dict[str, float]] = {}
    for _, row in temporal.iterrows():
        figures[int(row["rank"])] = {
            "compute_us": float(row["compute_time(us)"]),
            "busy_us": float(row["kernel_time(us)"] - row["idle_time(us)"]),
        }
    for _, row in overlap.iterrows():
        figures[int(row["rank"])]["overlap_pct"] = float(row["comp_comm_overlap_pctg"])
    # get_gpu_kernel_breakdown's type table covers every rank together: kept for one-rank traces
    # only
    if len(figures) == 1:
        parts = dict(zip(kernel_types["kernel_type"], kernel_types["sum"]))
        (only,) = figures.values()
        for label, name in (("comm_us", "COMMUNICATION"), ("memory_us", "MEMORY")):
            only[label] = float(sum(v for k, v in parts.items() if name in k))
    return figures


def steps_of(data: dict[str, Any], process: str) -> int:
    return sum(1 for s in data["steps"] if s["process"] == process)


@pytest.mark.parametrize(
    "name",
    ["dlrm_control.rank3.pt.trace.json.gz", "two_ranks_of_128"],
    ids=["dlrm_rank3", "two_ranks_of_128"],
)
def test_kernel_classes_equal_hta_over_the_steps(name: str, tmp_path: Path) -> None:
    # GIVEN a real NCCL trace (or folder of ranks) and HTA's figures on its copy cut to the recorded
    # steps
    source = TRACES / name
    files = sorted(source.glob("*.json.gz")) if source.is_dir() else [source]
    for file in files:
        cut_to_steps(file, tmp_path / "cut" / file.name)
    expected = hta_figures(tmp_path / "cut")
    # WHEN stepcli summarizes the original traces
    result = run_stepcli("table", "--json", source)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # THEN every rank's device figures over its steps equal HTA's
    assert {int(r["rank"]) for r in data["ranks"]} == set(expected)
    for rank in data["ranks"]:
        device, hta = rank["device"], expected[int(rank["rank"])]
        steps = steps_of(data, rank["process"])
        span_ms = device["busy_ms"] / device["busy_share"]
        assert device["compute_ms"] * steps * 1000 == pytest.approx(hta["compute_us"], rel=1e-6)
        assert device["busy_ms"] * steps * 1000 == pytest.approx(hta["busy_us"], rel=1e-6)
        assert device["compute_share"] * span_ms * steps * 1000 == pytest.approx(
            hta["compute_us"], rel=1e-6
        )
        # HTA rounds
        assert 100 * device["comm_overlap_share"] == pytest.approx(hta["overlap_pct"], abs=0.006)
        if "comm_us" in hta:
            assert device["comm_ms"] * steps * 1000 == pytest.approx(hta["comm_us"], rel=1e-6)
            assert device["memory_ms"] * steps * 1000 == pytest.approx(hta["memory_us"], rel=1e-6)
        exposed = device["comm_ms"] * (1 - device["comm_overlap_share"])
        assert device["exposed_comm_ms"] == pytest.approx(exposed, rel=1e-9)
        assert device["idle_share"] == pytest.approx(1 - device["busy_share"], rel=1e-9)
    # AND the job's figures are the ranks' pooled over all their steps
    if len(data["ranks"]) > 1:
        total_steps = len(data["steps"])
        comm = sum(r["device"]["comm_ms"] * steps_of(data, r["process"]) for r in data["ranks"])
        assert data["device"]["comm_ms"] * total_steps == pytest.approx(comm, rel=1e-9)


def test_every_collective_kernel_naming_is_communication(tmp_path: Path) -> None:
    # GIVEN the same real trace with its NCCL kernels named as NCCL >= 2.19 and as RCCL name them
    source = TRACES / "two_ranks_of_128" / "rank-0.pt.trace.json.gz"
    document = _read(source)
    for naming, prefix in (("dev", "ncclDevKernel_"), ("rccl", "rccl_")):
        renamed = json.loads(json.dumps(document))
        for event in renamed["traceEvents"]:
            if event.get("cat") == "kernel" and event["name"].startswith("ncclKernel_"):
                event["name"] = prefix + event["name"][len("ncclKernel_") :]
        _write(renamed, tmp_path / naming / "rank-0.pt.trace.json.gz")
    shutil.copy(source, tmp_path / "rank-0.pt.trace.json.gz")
    # WHEN stepcli summarizes each
    devices = []
    for path in (tmp_path / "rank-0.pt.trace.json.gz", tmp_path / "dev", tmp_path / "rccl"):
        result = run_stepcli("table", "--json", path)
        assert result.returncode == 0, result.stderr
        devices.append(json.loads(result.stdout)["device"])
    # THEN the communication figures are the same under every naming, and there is communication to
    # find
    assert devices[0]["comm_share"] > 0.1 and devices[0]["comm_overlap_share"] is not None
    assert devices[1] == devices[0] and devices[2] == devices[0]


def test_a_trace_without_device_work_has_no_device_figures(tmp_path: Path) -> None:
    # GIVEN a real CPU trace (no kernels) WHEN summarized THEN device is null for the job and every
    # rank
    result = run_stepcli("table", "--json", REPO / "tests" / "data" / "train_cpu.pt.trace.json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device"] is None and all(r["device"] is None for r in data["ranks"])


def without_steps(source: Path, dest: Path) -> None:
    """A copy of a trace whose ProfilerStep#N annotations are renamed: stepcli then measures the
    whole trace."""
    document = _read(source)
    for event in document["traceEvents"]:
        if str(event.get("name", "")).startswith("ProfilerStep#"):
            event["name"] = "Step " + event["name"][len("ProfilerStep#") :]
    _write(document, dest)


def hta_idle_and_launches(trace_dir: Path) -> tuple[dict[str, dict[str, float]], Any]:
    """HTA's idle time breakdown per stream (us by category) and its kernel launch statistics (one
    row per launched device event) for the only rank of `trace_dir`."""
    hta = pytest.importorskip("hta.trace_analysis")
    logging.disable(logging.WARNING)
    try:
        analysis = hta.TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
        (rank,) = analysis.t.traces
        idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
        launches = analysis.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
    finally:
        logging.disable(logging.NOTSET)
    streams: dict[str, dict[str, float]] = {}
    for _, row in idle.iterrows():
        streams.setdefault(str(int(row["stream"])), {})[str(row["idle_category"])] = float(
            row["idle_time"]
        )
    return streams, launches


@pytest.mark.parametrize(
    "name",
    ["dlrm_control.rank3.pt.trace.json.gz", "two_ranks_of_128/rank-0.pt.trace.json.gz"],
    ids=["dlrm_rank3", "rank0_of_128"],
)
def test_idle_by_cause_and_launch_statistics_equal_hta(name: str, tmp_path: Path) -> None:
    # GIVEN a real trace without its step annotations, so that stepcli and HTA both measure the
    # whole trace
    copy = tmp_path / "whole" / Path(name).name
    without_steps(TRACES / name, copy)
    streams, launches = hta_idle_and_launches(copy.parent)
    # WHEN stepcli summarizes it
    result = run_stepcli("table", "--json", copy)
    assert result.returncode == 0, result.stderr
    device = json.loads(result.stdout)["device"]
    # THEN each stream's idle time by cause equals HTA's (one measured span: ms per step = ms)
    mine = {s["stream"]: s for s in device["idle_by_cause"]["streams"]}
    assert set(mine) == set(streams)
    for stream, expected in streams.items():
        for cause in ("host_wait", "kernel_wait", "other"):
            assert mine[stream][f"{cause}_ms"] * 1000 == pytest.approx(
                expected.get(cause, 0.0), rel=1e-6, abs=1e-6
            )
    # AND the launch statistics are HTA's: kernels, delay percentiles (numpy's linear), short
    # kernels, CPU time
    launch, delay = device["launch"], launches["launch_delay"]
    assert launch["kernels_per_step"] == len(launches)
    for q in (50, 90, 99):
        assert launch["delay_us"][f"p{q}"] == pytest.approx(
            float(delay.quantile(q / 100)), rel=1e-9
        )
    assert launch["delay_us"]["max"] == pytest.approx(float(delay.max()))
    short = float((launches["gpu_duration"] < launches["cpu_duration"]).mean())
    assert launch["short_kernel_share"] == pytest.approx(short, rel=1e-9)
    assert launch["cpu_launch_us_per_kernel"] == pytest.approx(
        float(launches["cpu_duration"].mean()), rel=1e-9
    )
    # AND the device's idle causes add up to its idle time
    causes = device["idle_by_cause"]
    total = causes["host_wait_ms"] + causes["kernel_wait_ms"] + causes["other_ms"]
    assert total == pytest.approx(device["idle_ms"], rel=1e-9)


def test_terminal_gpu_table_fits_80_columns_with_the_json_figures() -> None:
    # GIVEN the real folder of two ranks WHEN `stepcli table` prints to an 80-column terminal
    source = TRACES / "two_ranks_of_128"
    env = stepcli_env({"COLUMNS": "80"})
    text = run_stepcli("table", source, "--limit", "3", env=env)
    data = json.loads(run_stepcli("table", "--json", source).stdout)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    # THEN the device table is there, no line is wider than 80, and its rows are the job's and each
    # rank's figures
    start = lines.index(next(line for line in lines if line.startswith("Device time per step")))
    section = lines[start : start + 12]
    assert all(len(line.rstrip()) <= 80 for line in lines)
    rows = {
        cells[0]: cells[1:]
        for cells in (line.strip("│ ").split("│") for line in section if line.startswith("│"))
    }
    rows = {label.strip(): [c.strip() for c in cells] for label, cells in rows.items()}
    assert set(rows) == {"job", "rank 0", "rank 1"}
    for label, device in [("job", data["device"])] + [
        (r["process"], r["device"]) for r in data["ranks"]
    ]:
        compute, comm, overlap, exposed, memory, idle, host = rows[label]
        assert (
            compute == f"{device['compute_share'] * 100:.1f}%"
            and comm == f"{device['comm_share'] * 100:.1f}%"
        )
        assert (
            overlap == f"{device['comm_overlap_share'] * 100:.1f}%"
            and idle == f"{device['idle_share'] * 100:.1f}%"
        )
        assert (
            exposed == f"{device['exposed_comm_ms']:,.0f}"
            and memory == f"{device['memory_share'] * 100:.1f}%"
        )
        assert host == f"{device['idle_by_cause']['host_wait_ms']:,.0f}"
    # AND one line gives the launch statistics
    launch = next(line for line in lines if line.startswith("launches:"))
    assert f"{data['device']['launch']['kernels_per_step']:,.0f} kernels/step" in launch


def test_cpu_table_has_no_gpu_section() -> None:
    # GIVEN a real CPU trace WHEN printed THEN no device section appears
    result = run_stepcli("table", REPO / "tests" / "data" / "train_cpu.pt.trace.json")
    assert (
        result.returncode == 0
        and "Device time per step" not in result.stdout
        and "launches:" not in result.stdout
    )


def test_copies_on_a_real_trace_equal_their_bytes_over_their_time() -> None:
    # GIVEN the real dlrm trace: its copies' sizes in args["bytes"], and its steps
    source = TRACES / "dlrm_control.rank3.pt.trace.json.gz"
    events = _read(source)["traceEvents"]
    windows = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    expected: dict[tuple[str, str | None], list[float]] = {}
    for e in events:
        if e.get("cat") == "gpu_memcpy" and any(lo <= e["ts"] < hi for lo, hi in windows):
            direction, memory = e["name"].split()[1], e["name"].split("(")[1].split(" -> ")
            host = (
                memory[0]
                if direction.startswith("H")
                else memory[1].rstrip(")")
                if direction.endswith("H")
                else None
            )
            row = expected.setdefault((direction, host), [0, 0.0, 0])
            row[0] += 1
            row[1] += e["dur"]
            row[2] += e["args"]["bytes"]
    # WHEN stepcli summarizes it
    result = run_stepcli("table", "--json", source)
    assert result.returncode == 0, result.stderr
    copies = {
        (c["copy"], c["host_memory"]): c for c in json.loads(result.stdout)["device"]["copies"]
    }
    # THEN per direction and host memory: calls, time and bandwidth (bytes / time) as counted from
    # the file
    assert (
        set(copies) == set(expected)
        and ("HtoD", "Pinned") in copies
        and ("DtoH", "Pageable") in copies
    )
    steps = len(windows)
    for key, (calls, dur_us, size) in expected.items():
        assert copies[key]["calls_per_step"] * steps == pytest.approx(calls)
        assert copies[key]["ms_per_step"] * steps == pytest.approx(dur_us / 1000)
        assert copies[key]["gbps"] == pytest.approx(size / (dur_us * 1000))


def test_collective_metadata_in_a_trace_file_gives_sizes_and_bus_bandwidth(tmp_path: Path) -> None:
    # GIVEN a trace file whose NCCL kernels carry the metadata recent torch records (the real traces
    # predate it)
    def kernel(ts: float, corr: int, name: str, **args: Any) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": ts,
            "dur": 1000.0,
            "args": {"correlation": corr, "stream": 7, **args},
        }

    metadata = {"Collective name": "allreduce", "In msg nelems": 262144, "Out msg nelems": 262144}
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 3000.0,
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 5.0,
            "dur": 5.0,
            "args": {"correlation": 11},
        },
        kernel(
            100.0,
            11,
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            **metadata,
            **{"Group size": 4, "dtype": "BFloat16"},
        ),
    ]
    path = tmp_path / "meta.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # WHEN summarized
    result = run_stepcli("table", "--json", path)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["device"]["collectives"]
    # THEN 512 KiB of bf16 over 4 ranks in 1 ms: algbw 0.524 GB/s, busbw x 2*3/4
    assert (row["collective"], row["bytes"], row["ranks"], row["dtype"]) == (
        "allreduce",
        524288,
        4,
        "BFloat16",
    )
    assert row["algbw_gbps"] == pytest.approx(0.524288) and row["busbw_gbps"] == pytest.approx(
        0.524288 * 1.5
    )


def test_flops_a_trace_carries_reach_table_json_with_mfu(tmp_path: Path) -> None:
    from tests.unit.test_traces_flops import _flops_trace

    # GIVEN a GPU trace recorded with with_flops=True elsewhere (counts in its operators' args, no
    # NAME.flops)
    trace = _flops_trace(tmp_path / "gpu.pt.trace.json")
    result = run_stepcli("table", "--json", trace)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # THEN table --json has its FLOPs per step and its MFU against the H100 it names, under flops
    # and device
    total = 4_000_000_000 + 2_000_000_000 + 1000
    for figures in (data["flops"], data["device"]):
        assert figures["flops_per_step"] == total / 2 and figures["flops_source"] == "trace"
        assert figures["mfu"] == pytest.approx(total / 2e-3 / 989e12)
        assert figures["mfu_dtype"] == "bf16" and figures["mfu_dtype_assumed"] is True


def test_mfu_of_a_trace_whose_gemms_run_in_fp32_is_against_the_fp32_peak(tmp_path: Path) -> None:
    from tests.unit.test_traces_flops import _flops_trace

    # GIVEN a GPU trace with FLOP counts whose GEMM kernels are cuBLAS FP32 sgemms (and a shorter
    # TF32 one)
    kernels = (
        ("volta_sgemm_128x32_nt", 20, 500),
        ("ampere_tf32_s1688gemm_tf32_128x128_nn", 1100, 100),
    )
    trace = _flops_trace(tmp_path / "gpu.pt.trace.json", kernels=kernels)
    # WHEN summarized by stepcli table
    result = run_stepcli("table", "--json", trace)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["flops"]
    # THEN its MFU is against the H100's dense FP32 peak, the dtype inferred (not assumed)
    total = 4_000_000_000 + 2_000_000_000 + 1000
    assert figures["mfu_dtype"] == "fp32" and figures["mfu_dtype_assumed"] is False
    assert figures["mfu"] == pytest.approx(total / 2e-3 / 67e12)
    # AND the terminal names the dtype
    text = run_stepcli("table", trace)
    assert text.returncode == 0, text.stderr
    assert "dense FP32 peak (dtype of its GEMM kernels)" in " ".join(text.stdout.split())
